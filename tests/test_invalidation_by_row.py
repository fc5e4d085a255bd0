"""Invalidation by row: a write drops the cached reads whose rows it could
have changed, and keeps the others.

On SQLite, PostgreSQL and MariaDB, in process and through memcached: what
each write drops is asserted by the hits of the calls after it.
"""

import contextlib
import datetime
import enum
import logging
import threading
import uuid
from decimal import Decimal

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    mapped_column,
    relationship,
)

from pyramid_dbtune.cache.triggers import tags_of
from pyramid_dbtune.routing.stored import Stores, stored_as_given, stores
from pyramid_dbtune.routing.touched import ROWS_TOLD
from pyramid_dbtune.sql.conditions import (
    foreign_reach,
    read_pins,
    told,
    value_tag,
    write_shape,
)
from pyramid_dbtune.sql.shapes import compare

from conftest import (
    AREAS,
    GET,
    HEADINGLEY,
    READS,
    SEARCH,
    SET_RENT,
    Property,
    call,
    run_sql,
    shared_settings,
)

MOVE = {
    'name': 'move',
    'sql': 'UPDATE property SET area = :area WHERE id = :id',
}
SHOUT = {
    'name': 'shout',
    'sql': 'UPDATE property SET area = upper(area) WHERE id = :id',
}
ADD = {
    'name': 'add',
    'sql': 'INSERT INTO property (id, area, rent) VALUES (:id, :area, :rent)',
}
STATS = {'dbtune.stats': 'true', 'dbtune.stats.token': 'a token, long enough'}
REMOVE = {'name': 'remove', 'sql': 'DELETE FROM property WHERE id = :id'}
METHODS = [SEARCH, GET, AREAS, SET_RENT, MOVE, SHOUT, ADD, REMOVE]


def dropped(app, write, other=None):
    """Which of READS a committed ``write`` dropped: their indexes, from
    the hits of the reads after it (in ``other``, another process's app,
    if given)."""
    other = other or app
    call(other, *READS)
    call(app, write)
    dropped = []
    for i, read in enumerate(READS):
        if call(other, read)['cache']['hit'] == 0:
            dropped.append(i)
    return dropped


@pytest.fixture
def app(db_url, apps):
    return apps(db_url, METHODS)


def test_a_write_drops_the_reads_of_its_rows(app):
    # id 1 is in Headingley: its page, its area's search and the areas.
    assert dropped(app, ('set_rent', {'id': 1, 'rent': 95})) == [0, 3, 5]
    assert call(app, ('get', {'id': 1}))['results'][0]['rows'] == [
        [1, 'Headingley', 95]
    ]


def test_a_row_that_moves_drops_both_areas(app):
    move = ('move', {'id': 4, 'area': 'Hyde Park'})
    assert dropped(app, move) == [1, 2, 4, 5]
    answer = call(app, ('search', {'area': 'Hyde Park'}))
    assert answer['results'][0]['rows'] == [[3, 80], [4, 70]]


def test_inserts_and_deletes_drop_their_rows(app):
    add = ('add', {'id': 5, 'area': 'Burley', 'rent': 1})
    assert dropped(app, add) == [1, 5]
    remove = ('remove', {'id': 3})
    assert dropped(app, remove) == [2, 5]


def test_a_write_whose_rows_cannot_be_told_drops_the_table(app):
    assert dropped(app, ('shout', {'id': 3})) == [0, 1, 2, 3, 4, 5]


def test_a_write_that_declares_its_tables_drops_every_read_of_them(
    sqlite_url, apps
):
    # As docs/sqlmethods.rst tells a write through a view, a partition or
    # a trigger to: the rows it touches in the tables named are not told.
    declared = {**SET_RENT, 'name': 'declared', 'tables': ['property']}
    app = apps(sqlite_url, [*METHODS, declared])
    write = ('declared', {'id': 1, 'rent': 95})
    assert dropped(app, write) == [0, 1, 2, 3, 4, 5]


def test_the_rows_a_write_touches_are_found_in_its_transaction(app):
    log = []
    engine = app.app.registry.dbtune.router.writer
    sa.event.listen(
        engine,
        'before_cursor_execute',
        lambda conn, cursor, statement, *args: log.append(statement),
    )
    call(app, ('set_rent', {'id': 1, 'rent': 95}))
    # Locked where another writer could change the rows first, as the
    # UPDATE locks them.
    lock = {
        'sqlite': '?',
        'postgresql': '%(id)s\nFOR NO KEY UPDATE',
        'mysql': '%(id)s\nFOR UPDATE',
    }[engine.dialect.name]
    assert [s for s in log if s.startswith(ROWS_TOLD)] == [
        f'{ROWS_TOLD}SELECT area, id, rent FROM property WHERE id = {lock}'
    ]


def test_writes_in_one_process_drop_rows_in_another(
    sqlite_url, memcached, apps
):
    settings = shared_settings(memcached)
    writer = apps(sqlite_url, METHODS, settings)
    reader = apps(sqlite_url, METHODS, settings, tables=False)
    write = ('set_rent', {'id': 4, 'rent': 75})
    assert dropped(writer, write, reader) == [1, 4, 5]


def orm_write(request):
    """Change property 1's rent, or with ``area``, move it, or with
    ``new``, add one, by the ORM."""
    params = request.json_body
    session = request.dbsession
    one = session.get(Property, 1)
    if 'new' in params:
        session.add(Property(**params['new']))
    if 'expire' in params:
        session.expire(one)
    for name in ('rent', 'area'):
        if name in params:
            setattr(one, name, params[name])
    if 'delete' in params:
        session.delete(one)
    return 'ok'


@pytest.fixture
def orm_app(sqlite_url, apps):
    return apps(sqlite_url, METHODS, views={'/orm': orm_write})


def orm_dropped(app, body):
    call(app, *READS)
    app.post_json('/orm', body)
    return [
        i
        for i, read in enumerate(READS)
        if not call(app, read)['cache']['hit']
    ]


DEAR = {
    'name': 'dear',
    'sql': 'SELECT id FROM property WHERE rent >= :least ORDER BY id',
    'cache_time': 20,
}


def test_a_value_the_database_rounds_drops_the_table(server_url, apps):
    # 99.6 into an INTEGER column is 100: the write's rows as they will be
    # cannot be matched with a read of the rents of 100 and more.
    app = apps(server_url, [DEAR, SET_RENT])
    assert call(app, ('dear', {'least': 100}))['results'][0]['rows'] == [[2]]
    call(app, ('set_rent', {'id': 1, 'rent': 99.6}))
    assert call(app, ('dear', {'least': 100}))['results'][0]['rows'] == [
        [1], [2],
    ]  # fmt: skip


@pytest.mark.parametrize(
    'since, written',
    [
        # PostgreSQL reads a date month first (DateStyle MDY), and drops
        # the offset of a time written into a TIMESTAMP column.
        ('12/01/2025', '01/15/2026'),
        ('2026-01-01T10:00:00+00:00', '2026-01-01T10:30:00+05:00'),
    ],
)
def test_a_date_the_column_parses_otherwise_is_not_patched_in(
    postgresql_url, apps, since, written
):
    run_sql(
        postgresql_url,
        'CREATE TABLE listing (id INTEGER PRIMARY KEY, day TIMESTAMP)',
        "INSERT INTO listing VALUES (1, '2026-01-01 11:00')",
    )
    since_ = {
        'name': 'since',
        'sql': 'SELECT id FROM listing WHERE day >= :since ORDER BY id',
        'cache_time': 300,
    }
    add = {
        'name': 'add',
        'sql': 'INSERT INTO listing (id, day) VALUES (:id, :day)',
    }
    app = apps(postgresql_url, [since_, add], tables=False)
    read = ('since', {'since': since})
    assert call(app, read)['results'][0]['rows'] == [[1]]
    call(app, ('add', {'id': 3, 'day': written}))
    assert call(app, read)['results'][0]['rows'] == [[1], [3]]


#: A value each column stores otherwise than it is given, and the read
#: that finds its row only as stored: ``{database: table}``, the read's
#: condition and argument, the first row's value, the row written.
STORED_OTHERWISE = {
    'a number as text, which the column rounds': (
        dict.fromkeys(
            ['postgresql', 'mysql'],
            'listing (id INTEGER PRIMARY KEY, v DECIMAL(10, 1))',
        ),
        ('v > :p', '1.58'), '2.5', {'id': 2, 'v': '1.55'},
    ),
    'a time of day, which a DATE cuts': (
        {'mysql': 'listing (id INTEGER PRIMARY KEY, v DATE)'},
        ('v < :p', '2026-01-05 12:00'), "'2026-01-01'",
        {'id': 2, 'v': '2026-01-05 23:59'},
    ),
    'no id, which the database assigns': (
        {
            'sqlite': 'listing (id INTEGER PRIMARY KEY, v INTEGER)',
            'mysql': 'listing (id INTEGER PRIMARY KEY AUTO_INCREMENT, '
            'v INTEGER)',
        },
        ('id > :p', 0), '10', {'id': None, 'v': 20},
    ),
    'a number, which a TEXT column stores as text': (
        {'sqlite': 'listing (id INTEGER PRIMARY KEY, v TEXT)'},
        ('v > :p', 10), "'50'", {'id': 2, 'v': 9},
    ),
}  # fmt: skip


@pytest.mark.parametrize(
    'case, database',
    [(c, d) for c, (tables, *_) in STORED_OTHERWISE.items() for d in tables],
)
def test_a_value_the_column_stores_otherwise_drops_the_table(
    request, apps, case, database
):
    # The row the write adds is among the read's rows as stored, not as
    # given: the cached read is dropped, not kept.
    tables, (condition, argument), first, row = STORED_OTHERWISE[case]
    url = request.getfixturevalue(f'{database}_url')
    run_sql(
        url,
        f'CREATE TABLE {tables[database]}',
        f'INSERT INTO listing (id, v) VALUES (1, {first})',
    )
    found = {
        'name': 'found',
        'sql': f'SELECT id FROM listing WHERE {condition} ORDER BY id',
        'cache_time': 300,
    }
    add = {
        'name': 'add',
        'sql': 'INSERT INTO listing (id, v) VALUES (:id, :v)',
    }
    app = apps(url, [found, add], tables=False)
    read = ('found', {'p': argument})
    assert call(app, read)['results'][0]['rows'] == [[1]]
    call(app, ('add', row))
    assert call(app, read)['results'][0]['rows'] == [[1], [2]]


PHOTOS = {
    'name': 'photos',
    'sql': 'SELECT id FROM photo WHERE property_id = :pid',
    'cache_time': 20,
}
CAPTIONS = {
    'name': 'captions',
    'sql': 'SELECT count(*) AS n FROM caption',
    'cache_time': 20,
}


def orm_write_of(how, what):
    """A view that writes property 1 through ``request.dbsession``: by a
    flush, a bulk statement or a text one; ``what``: ``'rent'`` (a
    column no key refers to) or ``'delete'``."""
    rent = sa.text('UPDATE property SET rent = 95 WHERE id = 1')

    def view(request):
        session = request.dbsession
        if how == 'flush' and what == 'rent':
            session.get(Property, 1).rent = 95
        elif how == 'flush':
            session.delete(session.get(Property, 1))
        elif how == 'bulk' and what == 'rent':
            session.execute(sa.update(Property).where(Property.id == 1)
                            .values(rent=95))  # fmt: skip
        elif how == 'bulk':
            session.execute(sa.delete(Property).where(Property.id == 1))
        elif what == 'rent':
            session.execute(rent)
        else:
            session.execute(sa.text('DELETE FROM property WHERE id = 1'))
        return 'written'

    return view


def foreign_keys_on(app):
    """Have SQLite act on foreign keys, as each of ``app``'s connections
    asks it to (``PRAGMA foreign_keys``)."""
    for engine in app.app.registry.dbtune.router.engines():
        sa.event.listen(
            engine,
            'connect',
            lambda dbapi, record: dbapi.execute('PRAGMA foreign_keys = ON'),
        )
        engine.dispose()


@pytest.mark.parametrize('how', ['method', 'flush', 'bulk', 'text'])
def test_a_write_drops_the_reads_its_foreign_keys_change(db_url, apps, how):
    # The database deletes a property's photos with it, and their captions
    # with them (ON DELETE CASCADE: a key of a column, then of the table);
    # an insert, and an update of columns no key refers to, change no
    # other table.
    views = {f'/{w}': orm_write_of(how, w) for w in ('rent', 'delete')}
    methods = [PHOTOS, CAPTIONS, REMOVE, ADD, SET_RENT]
    app = apps(db_url, methods, views=views)
    if db_url.startswith('sqlite'):
        foreign_keys_on(app)
    # The key of a column refers to the primary key, but on MariaDB,
    # which needs it named.
    refers = 'property (id)' if db_url.startswith('mysql') else 'property'
    engine = sa.create_engine(db_url)
    with engine.begin() as connection:
        for statement in (
            'CREATE TABLE photo (id INTEGER PRIMARY KEY, property_id INTEGER '
            f'REFERENCES {refers} ON DELETE CASCADE)',
            'CREATE TABLE caption (photo_id INTEGER, FOREIGN KEY (photo_id) '
            'REFERENCES photo (id) ON UPDATE CASCADE ON DELETE CASCADE)',
            'INSERT INTO photo VALUES (10, 1), (11, 2)',
            'INSERT INTO caption VALUES (10), (11)',
        ):
            connection.exec_driver_sql(statement)
    engine.dispose()
    reads = [('photos', {'pid': 1}), ('captions', {})]
    call(app, *reads)
    call(app, ('add', {'id': 7, 'area': 'Burley', 'rent': 1}))
    if how == 'method':
        call(app, ('set_rent', {'id': 1, 'rent': 95}))
    elif how != 'bulk':  # which columns a bulk UPDATE sets: not told
        app.post('/rent')
    assert [call(app, r)['cache']['hit'] for r in reads] == [1, 1]
    if how == 'method':
        call(app, ('remove', {'id': 1}))
    else:
        app.post('/delete')
    rows = [call(app, r)['results'][0]['rows'] for r in reads]
    assert rows == [[], [[1]]]


@contextlib.contextmanager
def referenced_property(postgresql_url):
    """Property 1, referenced by a row another transaction is adding and
    has not committed: its foreign key check holds FOR KEY SHARE."""
    engine = sa.create_engine(postgresql_url)
    with engine.begin() as connection:
        connection.exec_driver_sql(
            'CREATE TABLE booking (property_id INTEGER REFERENCES property)'
        )
    with engine.connect() as booking:
        booking.exec_driver_sql('INSERT INTO booking VALUES (1)')
        yield
        booking.rollback()
    with engine.begin() as connection:
        connection.exec_driver_sql('DROP TABLE booking')
    engine.dispose()


@pytest.mark.parametrize('orm', [False, True])
def test_a_write_does_not_wait_for_a_reference_being_made(
    postgresql_url, apps, orm
):
    # PostgreSQL: an UPDATE of columns no key names does not wait for a
    # reference to its row being made; the rows told are locked no more.
    settings = {'dbtune.statement_timeout': '3'}
    app = apps(postgresql_url, METHODS, settings, views={'/orm': orm_write})
    with referenced_property(postgresql_url):
        if orm:
            assert orm_dropped(app, {'rent': 95}) == [0, 3, 5]
        else:
            assert dropped(app, ('set_rent', {'id': 1, 'rent': 95})) == [
                0, 3, 5,
            ]  # fmt: skip


def test_an_orm_flush_drops_the_reads_of_its_rows(orm_app):
    assert orm_dropped(orm_app, {'rent': 95}) == [0, 3, 5]
    assert orm_dropped(orm_app, {'area': 'Burley'}) == [0, 1, 3, 5]
    assert orm_dropped(
        orm_app, {'new': {'id': 7, 'area': 'Hyde Park', 'rent': 1}}
    ) == [2, 5]
    assert orm_dropped(orm_app, {'delete': True}) == [1, 3, 5]  # in Burley


def test_an_orm_flush_of_values_not_loaded_drops_the_table(orm_app):
    new = {'id': 7, 'area': 'Hyde Park', 'rent': 1}
    body = {'expire': True, 'area': 'Burley', 'new': new}
    assert orm_dropped(orm_app, body) == [0, 1, 2, 3, 4, 5]


def test_an_orm_flush_of_a_value_that_is_no_tag_drops_the_table(orm_app):
    new = {'id': 7, 'area': 'x' * 201, 'rent': 1}
    body = {'new': new, 'rent': 95}
    assert orm_dropped(orm_app, body) == [0, 1, 2, 3, 4, 5]


class Rent(DeclarativeBase):
    pass


class Token(Rent):
    __tablename__ = 'token'
    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    n: Mapped[int]


def set_token(request):
    """Set a token's ``n`` by the ORM, found by its uuid."""
    params = request.json_body
    request.dbsession.get(Token, uuid.UUID(params['id'])).n = params['n']
    return 'ok'


def test_an_orm_flush_by_uuid_drops_the_reads_of_its_row(
    postgresql_url, memcached, apps
):
    """The rows an ORM flush touches by their uuids (``uuid.UUID``
    objects) drop the reads pinned by them, in any form, and no other."""
    one, other = (
        'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
        'b1ffcd88-' + ('0000-4000-8000-000000000000'),
    )
    run_sql(
        postgresql_url,
        'CREATE TABLE token (id uuid PRIMARY KEY, n int)',
        f"INSERT INTO token VALUES ('{one}', 1), ('{other}', 1)",
    )
    get = {'name': 'get', 'cache_time': 300,
           'sql': 'SELECT n FROM token WHERE id = :id'}  # fmt: skip
    app = apps(
        postgresql_url, [get], shared_settings(memcached),
        tables=False, views={'/token': set_token},
    )  # fmt: skip
    read = ('get', {'id': '{' + one.upper() + '}'})
    assert call(app, read)['results'][0]['rows'] == [[1]]
    app.post_json('/token', {'id': other, 'n': 2})
    assert call(app, read)['cache']['hit'] == 1
    app.post_json('/token', {'id': one, 'n': 3})
    assert call(app, read)['results'][0]['rows'] == [[3]]


class RentOnly(Rent):
    """The property table mapped without its area."""

    __tablename__ = 'property'
    id: Mapped[int] = mapped_column(primary_key=True)
    rent: Mapped[int]


class Item(Rent):
    __tablename__ = 'item'
    id: Mapped[int] = mapped_column(primary_key=True)
    qty: Mapped[int]
    band: Mapped[int]


BY_BAND = {
    'name': 'by_band',
    'sql': 'SELECT id FROM item WHERE band = :band ORDER BY id',
    'cache_time': 20,
}
SET_QTY = {
    'name': 'set_qty',
    'sql': 'UPDATE item SET qty = :qty WHERE id = :id',
}
#: The band of an item, by a generated column, then by a trigger.
BANDS = {
    'postgresql': [
        'band INTEGER GENERATED ALWAYS AS (qty / 10 + 1) STORED',
        'band INTEGER',
        'CREATE FUNCTION set_band() RETURNS trigger LANGUAGE plpgsql AS '
        '$$ BEGIN NEW.band := NEW.qty / 10 + 1; RETURN NEW; END $$',
        'CREATE TRIGGER item_band BEFORE INSERT OR UPDATE ON item '
        'FOR EACH ROW EXECUTE FUNCTION set_band()',
    ],
    'mysql': [
        'band INTEGER AS (qty DIV 10 + 1) STORED',
        'band INTEGER',
        'CREATE TRIGGER item_band BEFORE UPDATE ON item '
        'FOR EACH ROW SET NEW.band = NEW.qty DIV 10 + 1',
    ],
    # SQLite's triggers cannot set NEW: a later one writes its own table.
    'sqlite': [
        'band INTEGER GENERATED ALWAYS AS (qty / 10 + 1) STORED',
        'band INTEGER',
        'CREATE TRIGGER item_band AFTER UPDATE ON item FOR EACH ROW BEGIN '
        'UPDATE item SET band = NEW.qty / 10 + 1 WHERE id = NEW.id; END',
    ],
}


def orm_set_qty(request):
    request.dbsession.get(Item, 1).qty = 12
    return 'set'


@pytest.mark.parametrize('how', ['generated', 'trigger'])
@pytest.mark.parametrize('orm', [False, True])
def test_a_column_the_database_sets_itself_drops_the_table(
    db_url, apps, how, orm
):
    # Item 1 moves from band 1 to band 2 as its quantity changes: the
    # database sets the band, whatever the write gives.
    app = apps(db_url, [BY_BAND, SET_QTY], tables=False,
               views={'/set': orm_set_qty})  # fmt: skip
    generated, plain, *trigger = BANDS[app.app.registry.dbtune.router.dialect]
    engine = sa.create_engine(db_url)
    with engine.begin() as connection:
        band = generated if how == 'generated' else plain
        connection.exec_driver_sql(
            f'CREATE TABLE item (id INTEGER PRIMARY KEY, qty INTEGER, {band})'
        )
        for statement in trigger if how == 'trigger' else ():
            connection.exec_driver_sql(statement)
        connection.exec_driver_sql(
            'INSERT INTO item (id, qty) VALUES (1, 5), (2, 15)'
        )
        if how == 'trigger':  # it sets the band of the rows it writes
            connection.exec_driver_sql('UPDATE item SET band = qty / 10 + 1')
    engine.dispose()
    assert call(app, ('by_band', {'band': 2}))['results'][0]['rows'] == [[2]]
    if orm:
        app.post('/set')
    else:
        call(app, ('set_qty', {'id': 1, 'qty': 12}))
    answer = call(app, ('by_band', {'band': 2}))
    assert answer['results'][0]['rows'] == [[1], [2]]


def test_a_trigger_of_a_table_named_in_another_case_is_found(sqlite_url, apps):
    # SQLite's names are the same in any case: a trigger ON Item is one
    # of the table that the methods write as item.
    app = apps(sqlite_url, [BY_BAND, SET_QTY], tables=False)
    run_sql(
        sqlite_url,
        'CREATE TABLE Item (id INTEGER PRIMARY KEY, qty INTEGER, '
        'band INTEGER)',
        'CREATE TRIGGER item_band AFTER UPDATE ON Item FOR EACH ROW '
        'BEGIN UPDATE Item SET band = NEW.qty / 10 + 1 '
        'WHERE id = NEW.id; END',
        'INSERT INTO Item (id, qty, band) VALUES (1, 5, 1), (2, 15, 2)',
    )
    assert call(app, ('by_band', {'band': 2}))['results'][0]['rows'] == [[2]]
    call(app, ('set_qty', {'id': 1, 'qty': 12}))
    answer = call(app, ('by_band', {'band': 2}))
    assert answer['results'][0]['rows'] == [[1], [2]]


@pytest.mark.parametrize('stamp', [
    'TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP',
    'DATETIME NULL ON UPDATE CURRENT_TIMESTAMP',  # no default reflected
])  # fmt: skip
def test_a_column_mysql_stamps_on_update_drops_the_table(
    mysql_url, apps, stamp
):
    # MariaDB sets the stamp of each row an UPDATE changes, whatever it
    # sets: item 1 is among those changed since 2024 once its quantity is.
    since = {
        'name': 'since', 'sql': 'SELECT id FROM item WHERE changed >= '
        ':since ORDER BY id', 'cache_time': 20,
    }  # fmt: skip
    app = apps(mysql_url, [since, SET_QTY], tables=False)
    run_sql(
        mysql_url,
        f'CREATE TABLE item (id INTEGER PRIMARY KEY, qty INTEGER, '
        f'changed {stamp})',
        "INSERT INTO item VALUES (1, 5, '2020-01-01'), (2, 15, '2020-01-01')",
    )
    read = ('since', {'since': '2024-01-01T00:00:00'})
    assert call(app, read)['results'][0]['rows'] == []
    call(app, ('set_qty', {'id': 1, 'qty': 12}))
    assert call(app, read)['results'][0]['rows'] == [[1]]


class Region(Rent):
    __tablename__ = 'region'
    name: Mapped[str] = mapped_column(primary_key=True)
    code: Mapped[int]


def orm_add_region(request):
    request.dbsession.add(Region(name='Hyde Park', code=1))
    return 'added'


REPLACING = {
    'plain': ('INSERT INTO region (name, code) VALUES (:name, :code)',
              {'name': 'Hyde Park', 'code': 1}),
    'or replace': ('INSERT OR REPLACE INTO region (name, code) VALUES '
                   '(:name, :code)', {'name': 'Burley', 'code': 3}),
    'update': ('UPDATE region SET code = :code WHERE name = :name',
               {'name': 'Headingley', 'code': 1}),
    'orm': None,
}  # fmt: skip


@pytest.mark.parametrize('how', REPLACING)
def test_a_write_that_replaces_rows_drops_what_they_held(
    sqlite_url, apps, how
):
    # SQLite deletes the rows a write conflicts with where the write says
    # INSERT OR REPLACE or the constraint ON CONFLICT REPLACE: Burley (its
    # code, 1, taken or its name written again), and flat 4 with it.
    methods = [
        {'name': 'code_of', 'sql': 'SELECT code FROM region WHERE name = '
         ':name', 'cache_time': 20},
        {'name': 'flats', 'sql': 'SELECT id FROM flat ORDER BY id',
         'cache_time': 20},
    ]  # fmt: skip
    if REPLACING[how]:
        methods.append({'name': 'write', 'sql': REPLACING[how][0]})
    app = apps(sqlite_url, methods, tables=False,
               views={'/add': orm_add_region})  # fmt: skip
    foreign_keys_on(app)
    engine = sa.create_engine(sqlite_url)
    with engine.begin() as connection:
        for statement in (
            'CREATE TABLE region (name VARCHAR(40) PRIMARY KEY, code INTEGER '
            'UNIQUE ON CONFLICT REPLACE)',
            'CREATE TABLE flat (id INTEGER PRIMARY KEY, region VARCHAR(40) '
            'REFERENCES region ON DELETE CASCADE)',
            "INSERT INTO region VALUES ('Burley', 1), ('Headingley', 2)",
            "INSERT INTO flat VALUES (1, 'Headingley'), (4, 'Burley')",
        ):
            connection.exec_driver_sql(statement)
    engine.dispose()
    reads = [('code_of', {'name': 'Burley'}), ('flats', {})]
    call(app, *reads)
    if REPLACING[how]:
        call(app, ('write', REPLACING[how][1]))
    else:
        app.post('/add')
    rows = [call(app, r)['results'][0]['rows'] for r in reads]
    assert rows == [[] if how != 'or replace' else [[3]], [[1]]]


class Order(Rent):
    __tablename__ = 'orders'
    id: Mapped[int] = mapped_column(primary_key=True)
    status: Mapped[str]
    tags: Mapped[str | None]


def orm_ship(request):
    request.dbsession.get(Order, 1).status = 'shipped'
    return 'shipped'


@pytest.mark.parametrize('how', ['method', 'orm'])
def test_an_enum_read_by_its_place_is_dropped_by_name(mysql_url, apps, how):
    # MariaDB compares an ENUM with a number by the member's place: a read
    # of status 2 is one of 'shipped', and a write of either drops it.
    methods = [
        {'name': 'by_status', 'sql': 'SELECT id FROM orders WHERE status = '
         ':status ORDER BY id', 'cache_time': 20},
        {'name': 'ship', 'sql': 'UPDATE orders SET status = :status '
         'WHERE id = :id'},
    ]  # fmt: skip
    app = apps(mysql_url, methods, tables=False, views={'/ship': orm_ship})
    run_sql(
        mysql_url,
        'CREATE TABLE orders (id INTEGER PRIMARY KEY, status ENUM('
        "'pending', 'shipped') NOT NULL, tags SET('a', 'b'))",
        "INSERT INTO orders VALUES (1, 'pending', 'a'), (2, 'shipped', 'b')",
    )
    for status in (2, 'Shipped'):
        call(app, ('by_status', {'status': status}))
    if how == 'method':
        call(app, ('ship', {'id': 1, 'status': 'shipped'}))
    else:
        app.post('/ship')
    for status in (2, 'Shipped'):
        answer = call(app, ('by_status', {'status': status}))
        assert answer['results'][0]['rows'] == [[1], [2]], status
    # A write by the place: the reads by the name are dropped.
    pending = call(app, ('by_status', {'status': 'pending'}))
    assert pending['results'][0]['rows'] == []
    call(app, ('ship', {'id': 2, 'status': 1}))
    answer = call(app, ('by_status', {'status': 'pending'}))
    assert answer['results'][0]['rows'] == [[2]]


def test_a_set_read_by_a_number_is_dropped_by_any_write(mysql_url, apps):
    # A MySQL SET compared with a number is compared by its bits.
    methods = [
        {'name': 'tagged', 'sql': 'SELECT id FROM label WHERE tags = :tags',
         'cache_time': 20},
        {'name': 'tag', 'sql': 'UPDATE label SET tags = :tags WHERE id = :id'},
    ]  # fmt: skip
    app = apps(mysql_url, methods, tables=False)
    run_sql(
        mysql_url,
        "CREATE TABLE label (id INTEGER PRIMARY KEY, tags SET('a', 'b'))",
        "INSERT INTO label VALUES (1, 'a')",
    )
    assert call(app, ('tagged', {'tags': 2}))['results'][0]['rows'] == []
    call(app, ('tag', {'id': 1, 'tags': 'b'}))
    assert call(app, ('tagged', {'tags': 2}))['results'][0]['rows'] == [[1]]


def test_a_mapping_without_a_pinned_column_drops_the_table(sqlite_url, apps):
    def view(request):
        request.dbsession.get(RentOnly, 4).rent = 1
        return 'ok'

    app = apps(sqlite_url, METHODS, views={'/orm': view})
    assert orm_dropped(app, {}) == [0, 1, 2, 3, 4, 5]


def test_a_written_value_that_is_no_tag_drops_the_table(sqlite_url, apps):
    app = apps(sqlite_url, METHODS)
    write = ('add', {'id': 9, 'area': 'x' * 201, 'rent': 1})
    assert dropped(app, write) == [0, 1, 2, 3, 4, 5]


def test_a_write_of_a_table_not_there_is_the_databases_error(sqlite_url, apps):
    ghost = {'name': 'ghost', 'sql': 'SELECT a FROM ghost WHERE a = :a'}
    haunt = {'name': 'haunt', 'sql': 'UPDATE ghost SET b = :b WHERE a = :a'}
    app = apps(sqlite_url, [ghost, haunt])
    with pytest.raises(sa.exc.OperationalError, match='no such table: ghost'):
        call(app, ('haunt', {'a': 1, 'b': 2}))


def test_a_read_of_a_function_too_is_dropped_by_any_write(sqlite_url, apps):
    # Its tables cannot be told (json_each in FROM): its area pins it to
    # no rows, and a write of any row of any table drops it.
    both = {
        'name': 'both',
        'sql': "SELECT p.id, p.rent FROM property p, json_each('[1]') j "
        'WHERE p.area = :area ORDER BY p.id',
        'cache_time': 20,
    }
    app = apps(sqlite_url, [both, SET_RENT])
    read = ('both', {'area': 'Headingley'})
    assert call(app, read)['results'][0]['rows'] == HEADINGLEY
    call(app, ('set_rent', {'id': 1, 'rent': 95}))
    answer = call(app, read)
    assert answer['cache']['hit'] == 0
    assert answer['results'][0]['rows'] == [[1, 95], [2, 120]]


def rent_of_4_after_a_write(app, read):
    """The rows of a cached ``read`` after a committed write of property
    4's rent, which must have dropped it."""
    call(app, read)
    call(app, ('set_rent', {'id': 4, 'rent': 75}))
    answer = call(app, read)
    assert answer['cache']['hit'] == 0
    return answer['results'][0]['rows']


@pytest.mark.parametrize(
    'sql, rows',
    [
        ("SELECT p.id, p.rent FROM area # Tom's list\n"
         "JOIN property p ON p.area = area.name WHERE p.area <> 'x' "
         'ORDER BY p.id', [[1, 90], [2, 120], [4, 75]]),
        ('SELECT id, rent--1 AS r FROM property WHERE id = 4', [[4, 76]]),
        ('SELECT a.name, p.rent FROM area a '
         '/*! JOIN property p ON p.area = a.name */ ORDER BY p.id',
         [['Headingley', 90], ['Headingley', 120], ['Burley', 75]]),
    ],
)  # fmt: skip
def test_a_read_is_dropped_by_the_tables_mysql_reads(
    mysql_url, apps, sql, rows
):
    # A # comment, -- glued to a number, /*! code */: MySQL's reading of
    # the text names property too.
    read = {'name': 'read', 'sql': sql, 'cache_time': 20}
    app = apps(mysql_url, [read, SET_RENT])
    assert rent_of_4_after_a_write(app, ('read', {})) == rows


def test_a_read_is_dropped_by_the_tables_after_a_dollar_quote(
    postgresql_url, apps
):
    read = {
        'name': 'read',
        'sql': "SELECT $$it's$$ AS label, p.id, p.rent FROM property p "
        "WHERE p.area = 'Burley'",
        'cache_time': 20,
    }
    app = apps(postgresql_url, [read, SET_RENT])
    assert rent_of_4_after_a_write(app, ('read', {})) == [["it's", 4, 75]]


def test_a_table_named_by_a_string_drops_and_is_dropped(sqlite_url, apps):
    # SQLite takes a string where a table is expected: a table not told,
    # read (dropped by any write) or written (dropping every read).
    quoted = {
        'name': 'quoted',
        'sql': "SELECT id, rent FROM 'property' WHERE area = :area",
        'cache_time': 20,
    }
    set_quoted = {
        'name': 'set_quoted',
        'sql': "UPDATE 'property' SET rent = :rent WHERE id = :id",
    }
    app = apps(sqlite_url, [*METHODS, quoted, set_quoted])
    read = ('quoted', {'area': 'Burley'})
    assert rent_of_4_after_a_write(app, read) == [[4, 75]]
    write = ('set_quoted', {'id': 4, 'rent': 76})
    assert dropped(app, write) == [0, 1, 2, 3, 4, 5]


def test_a_read_is_dropped_by_the_table_of_its_table_query(
    postgresql_url, apps
):
    # PostgreSQL's TABLE banned, a query inside a query, names a table.
    read = {
        'name': 'read',
        'sql': 'SELECT id, rent FROM property WHERE area = :area '
        'AND id NOT IN (TABLE banned) ORDER BY id',
        'cache_time': 20,
    }
    ban = {'name': 'ban', 'sql': 'INSERT INTO banned (id) VALUES (:id)'}
    app = apps(postgresql_url, [read, ban])
    run_sql(
        postgresql_url,
        'CREATE TABLE banned (id INTEGER)',
    )
    headingley = ('read', {'area': 'Headingley'})
    assert call(app, headingley)['results'][0]['rows'] == HEADINGLEY
    call(app, ('ban', {'id': 1}))
    answer = call(app, headingley)
    assert answer['cache']['hit'] == 0
    assert answer['results'][0]['rows'] == [[2, 120]]


def test_a_delete_of_a_table_by_its_schema_drops_the_table(sqlite_url, apps):
    # Not one plain name: its rows are not looked for, the table goes.
    remove = {
        'name': 'remove',
        'sql': 'DELETE FROM main.property WHERE id = :id',
    }
    app = apps(sqlite_url, [SEARCH, GET, remove])
    call(app, ('search', {'area': 'Burley'}), ('get', {'id': 1}))
    call(app, ('remove', {'id': 1}))
    answer = call(app, ('search', {'area': 'Burley'}), ('get', {'id': 1}))
    assert answer['cache']['hit'] == 0
    assert answer['results'][1]['rows'] == []


@pytest.mark.parametrize('action', ['IGNORE', 'REPLACE', 'ABORT'])
def test_an_update_or_action_drops_its_table(sqlite_url, apps, action):
    # SQLite's UPDATE OR IGNORE property: the table is the word after the
    # conflict action, and its rows are not told.
    sql = f'UPDATE OR {action} property SET area = :area WHERE id = :id'
    app = apps(sqlite_url, [*METHODS, {'name': 'move_or', 'sql': sql}])
    write = ('move_or', {'id': 4, 'area': 'Hyde Park'})
    assert dropped(app, write) == [0, 1, 2, 3, 4, 5]
    answer = call(app, ('search', {'area': 'Burley'}))
    assert answer['results'][0]['rows'] == []


def test_a_write_of_two_tables_drops_both(sqlite_url, apps):
    both = {
        'name': 'both',
        'sql': 'UPDATE property SET rent = :rent FROM area '
        'WHERE area.name = property.area AND area.name = :name',
    }
    app = apps(sqlite_url, [*METHODS, both])
    write = ('both', {'rent': 1, 'name': 'Burley'})
    assert dropped(app, write) == [0, 1, 2, 3, 4, 5]
    assert app.app.registry.dbtune.router.untold == {'both': 1}
    # Where no read of its tables is pinned or watched, every write drops
    # them all: not one the stats need name.
    plain = apps(sqlite_url, [GET, both], tables=False)
    call(plain, ('get', {'id': 1}), write)
    assert call(plain, ('get', {'id': 1}))['cache']['hit'] == 0
    assert plain.app.registry.dbtune.router.untold == {'both': 1}
    unshaped = {**AREAS, 'sql': 'SELECT 1 + count(*) AS n FROM area'}
    lone = apps(sqlite_url, [unshaped, both], tables=False)
    call(lone, ('areas', {}), write)
    assert lone.app.registry.dbtune.router.untold == {}


def test_writes_whose_rows_cannot_be_told_are_named_at_start_up(
    sqlite_url, apps, caplog
):
    caplog.set_level(logging.INFO, 'pyramid_dbtune')
    some = {
        'name': 'some',
        'sql': 'UPDATE property SET rent = :rent WHERE id IN :ids',
    }
    both = {
        'name': 'both',
        'sql': 'UPDATE property SET rent = :rent FROM area '
        'WHERE area.name = property.area',
    }
    apps(sqlite_url, [*METHODS, some, both])
    named = sorted(
        r.getMessage().split()[2:5:2]
        for r in caplog.records
        if 'cannot be told' in r.getMessage()
    )
    # Not both's area: no read of it is pinned.
    assert named == [
        ['both', 'property,'], ['shout', 'property,'], ['some', 'property,'],
    ]  # fmt: skip


def test_a_read_of_a_table_twice_over_is_not_pinned(sqlite_url, apps):
    # Pinned by one of its names (a.id), a write of the other's rows (b)
    # would leave the read cached.
    neighbours = {
        'name': 'neighbours',
        'sql': 'SELECT b.id, b.rent FROM property a, property b '
        'WHERE a.id = :id AND b.area = a.area ORDER BY b.id',
        'cache_time': 300,
    }
    app = apps(sqlite_url, [neighbours, SET_RENT])
    read = ('neighbours', {'id': 1})
    assert call(app, read)['results'][0]['rows'] == [[1, 90], [2, 120]]
    call(app, ('set_rent', {'id': 2, 'rent': 125}))
    assert call(app, read)['results'][0]['rows'] == [[1, 90], [2, 125]]


def test_pipes_join_strings_but_on_mysql(postgresql_url, apps):
    # PostgreSQL joins strings with ||: the read is pinned by its area,
    # and a write of another area's row leaves it. On MySQL, || is OR.
    from pyramid_dbtune import SQLMethod

    sql = (
        'SELECT id, rent FROM property WHERE area = :area '
        "AND area <> 'x' || :s ORDER BY id"
    )
    assert SQLMethod('m', sql).pins_for('mysql') == ()
    assert SQLMethod('m', sql).pins_for('postgresql') == (('area', 'area'),)
    joined = {'name': 'joined', 'sql': sql, 'cache_time': 300}
    app = apps(postgresql_url, [joined, SET_RENT])
    read = ('joined', {'area': 'Headingley', 's': 'y'})
    assert call(app, read)['results'][0]['rows'] == HEADINGLEY
    call(app, ('set_rent', {'id': 3, 'rent': 81}))  # Hyde Park's
    assert call(app, read)['cache']['hit'] == 1


def test_a_write_of_two_tables_has_no_shape():
    from pyramid_dbtune import SQLMethod

    sql = 'UPDATE t SET a = :a FROM u WHERE u.id = t.id'
    assert SQLMethod('both', sql).write_shape is None


@pytest.mark.parametrize(
    'sql, pins',
    [
        ('SELECT * FROM t WHERE a = :a AND b <= :b', (('a', 'a'),)),
        (
            'SELECT * FROM t x WHERE :p = x.a AND :q = b',
            (('a', 'p'), ('b', 'q')),
        ),
        ('SELECT * FROM t x WHERE x.a = :p', (('a', 'p'),)),
        ('SELECT * FROM t WHERE a = :a OR b = :b', ()),
        ('SELECT * FROM t WHERE c BETWEEN :x AND :y AND a = :a', ()),
        ('SELECT * FROM t JOIN u ON u.id = t.id WHERE a = :a', ()),
        (
            'SELECT * FROM t WHERE a = :a UNION SELECT * FROM t WHERE a = :b',
            (),
        ),
        ('SELECT * FROM t WHERE "A" = :a', ()),
        ("SELECT * FROM t WHERE a = :a AND b = 'it\\'s'", ()),
        ('SELECT * FROM t WHERE (a = :a OR b = :b) AND c = :c', (('c', 'c'),)),
        ('SELECT * FROM t GROUP BY a', ()),
        ('SELECT b.x FROM t a, t b WHERE a.id = :id AND b.c = a.c', ()),
        ('SELECT * FROM t WHERE a = :a AND b = :b || c = :c', ()),
        ('SELECT * FROM t WHERE a = :a AND b = :b XOR c = :c', ()),
        ('SELECT * FROM t WHERE CASE WHEN c THEN b AND a = :a AND d END', ()),
        # A CASE outside the WHERE has no say in its conditions.
        (
            'SELECT CASE WHEN b THEN 1 END AS x FROM t WHERE a = :a '
            'ORDER BY CASE WHEN c THEN 1 AND 2 END',
            (('a', 'a'),),
        ),
        ('SELECT 1 AS x WHERE :a IN (TABLE t)', ()),  # no FROM
        # MySQL's # comment ends with its line, where standard SQL's
        # reading finds a literal that hides the OR after it.
        (
            "SELECT * FROM t WHERE a = :a AND b > 0 # it's\n"
            "OR c = :c AND d <> 'x'",
            (),
        ),
    ],
)
def test_read_pins(sql, pins):
    assert read_pins(sql, frozenset(['t'])) == pins


@pytest.mark.parametrize(
    'sql',
    [
        'UPDATE t SET a = 1',
        'UPDATE s.t SET a = :a WHERE id = :id',
        'UPDATE t SET a = :a FROM u WHERE u.id = t.id',
        'UPDATE t SET a = :a WHERE id IN (SELECT id FROM u)',
        'UPDATE t SET a = :a WHERE id = :id RETURNING id',
        'DELETE t FROM t WHERE id = :id',
        'INSERT INTO t SELECT * FROM u',
        'INSERT INTO t (a) VALUES (:a), (:b)',
        'INSERT INTO t (a) VALUES (:a) ON CONFLICT DO NOTHING',
        'INSERT INTO t (a, b) VALUES (:a)',
        'MERGE INTO t USING u ON t.id = u.id WHEN MATCHED THEN DELETE',
        "UPDATE t SET a = :a WHERE b = 'it\\'s'",
        'INSERT INTO t VALUES (:a)',
        'UPDATE t SET "A" = :a WHERE id = :id',
        'INSERT INTO t (a) VALUES (:a) RETURNING a',
        'INSERT INTO "T" (a) VALUES (:a)',
        'INSERT INTO t (a) SELECT :a',
        'INSERT INTO t (a) DEFAULT VALUES',
        'DELETE FROM s.t WHERE id = :id',
        'DELETE FROM t AS x WHERE x.id = :id',
        'DELETE FROM t x WHERE x.id = :id',
        'DELETE FROM only t WHERE id = :id',
        "UPDATE t SET b = :b # it's\n, a = 'x' WHERE id = :id",
    ],
)
def test_writes_whose_rows_are_not_told(sql):
    assert write_shape(sql) is None


def test_how_each_column_stores_what_a_write_gives(db_url):
    run_sql(
        db_url,
        'CREATE TABLE kinds (id INTEGER PRIMARY KEY, n INTEGER NOT NULL, '
        'd DECIMAL(10, 1), r FLOAT(20), x DOUBLE PRECISION, t VARCHAR(9), '
        'day DATE)',
        'CREATE TABLE pair (a INTEGER, b INTEGER, PRIMARY KEY (a, b))',
    )
    engine = sa.create_engine(db_url)
    with engine.connect() as connection:
        found = sa.inspect(connection).get_columns('kinds')
        pair = sa.inspect(connection).get_columns('pair')
    engine.dispose()
    dialect = engine.dialect.name
    kinds = stores(dialect, found)
    sqlite = dialect == 'sqlite'
    assert {c: kinds[c].kind for c in kinds} == {
        # SQLite assigns an INTEGER PRIMARY KEY; no id of the others is
        # declared to be assigned. SQLite's floats are all doubles.
        'id': 'assigned' if sqlite else 'integer',
        'n': 'integer',
        'd': 'numeric' if sqlite else 'decimal',
        'r': 'float' if sqlite else 'single',
        'x': 'float',
        't': 'text',
        'day': 'other',
    }
    assert kinds['d'].scale == 1 and not kinds['n'].nullable
    assert {s.kind for s in stores(dialect, pair).values()} == {'integer'}


@pytest.mark.parametrize(
    'kind, value, given',
    [
        (Stores('integer'), None, True),
        (Stores('integer', nullable=False), None, False),
        (Stores('assigned'), None, False),
        (Stores('assigned'), 0, False),  # MySQL assigns one for 0
        (Stores('assigned'), 7, True),
        (Stores('integer'), 7, True),
        (Stores('integer'), True, True),
        (Stores('decimal', 1), 7, True),
        (Stores('numeric'), 7, True),
        (Stores('text'), 7, False),
        (Stores('enum', members=2), 2, True),
        (Stores('enum', members=2), 3, False),  # '', or MySQL's error
        (Stores('enum', members=2), 0, False),
        (Stores('enum', members=2), 'b', True),
        (Stores('other'), 7, False),
        (Stores('float'), 2**24, True),
        (Stores('single'), -(2**24) - 1, False),
        (Stores('decimal', 1), Decimal('1.5'), True),
        (Stores('decimal', 1), Decimal('1E+3'), True),
        (Stores('decimal', 1), Decimal('1.55'), False),
        (Stores('decimal'), Decimal('1.55'), True),
        (Stores('decimal'), Decimal('NaN'), False),
        (Stores('numeric'), Decimal('1.5'), False),
        (Stores('integer'), Decimal('1'), False),
        (Stores('text'), 'it', True),
        (Stores('text'), '01/15/2026', False),
        (Stores('decimal', 1), '1.5', False),
        (Stores('other'), '2026-01-05', False),
        (Stores('float'), 0.5, False),
        (Stores('other'), datetime.date(2026, 1, 5), False),
    ],
)
def test_which_values_a_column_stores_as_given(kind, value, given):
    assert stored_as_given(kind, value) is given


def test_write_shapes():
    shape = write_shape(
        "UPDATE t SET a = :a, b = b + 1 WHERE c = 'x (' AND d = :d"
    )
    assert shape.table == 't' and shape.sets == {'a': 'a', 'b': None}
    assert shape.where == "c = 'x (' AND d = :d"
    shape = write_shape('UPDATE t SET a = "where" WHERE (b = :b)')
    assert shape.sets == {'a': None} and shape.where == '(b = :b)'
    shape = write_shape('UPDATE t SET a = :where WHERE b = :nowhere')
    assert shape.sets == {'a': 'where'} and shape.where == 'b = :nowhere'
    shape = write_shape('INSERT INTO t (a, b) VALUES (:a, 5)')
    assert shape.where is None and shape.sets == {'a': 'a', 'b': None}
    assert told(shape, ['a']) and not told(shape, ['a', 'b'])
    assert not told(shape, ['c']) and not told(None, ['a'])


def test_how_a_write_may_change_other_tables_by_foreign_keys():
    upsert = 'INSERT INTO t (a) VALUES (1) ON CONFLICT (a) DO UPDATE SET a = 2'
    for sql, reach in (
        ('INSERT INTO t VALUES (1)', frozenset()),
        ('INSERT INTO t (a) SELECT a FROM u', frozenset()),
        (upsert, None),
        ('REPLACE INTO t VALUES (1)', None),  # MySQL: a DELETE too
        ('INSERT OR REPLACE INTO t VALUES (1)', None),  # SQLite's
        ('UPDATE t SET a = :a, b = b + 1 WHERE id = :id', {'a', 'b'}),
        ('UPDATE t SET a = 1', None),
        ('DELETE FROM t WHERE id = :id', None),
    ):
        assert foreign_reach(sql) == reach, sql


def test_equal_values_have_one_tag_and_others_none():
    assert value_tag('t', 'a', '05') == value_tag('t', 'a', 5) == 't.a=5'
    assert value_tag('t', 'a', ' Leeds ') == value_tag('t', 'a', 'LEEDS')
    assert value_tag('t', 'a', 'x' * 200) == f't.a={"x" * 200!r}'

    class Rooms(enum.IntEnum):
        TWO = 2

    assert value_tag('t', 'a', Rooms.TWO) == 't.a=2'
    # A uuid in each form PostgreSQL and MariaDB read: its standard one.
    standard = 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'
    for value in (uuid.UUID(standard), standard.upper(), f'{{{standard}}}',
                  standard.replace('-', ''), ' a0eebc99-9c0b4ef8-bb6d6bb9'
                  '-bd380a11', 'a0e-ebc999c0b4ef8bb6d6bb9bd380a11',
                  'a0ee--bc999c0b4ef8bb6d6bb9bd380a11'):  # fmt: skip
        assert value_tag('t', 'a', value) == f't.a={standard!r}'
    # MySQL finds 5 = '5 rooms' = '5.0', and 0 = 'any word': a uuid that
    # begins with a digit too.
    for value in (None, True, 1.5, b'x', [1], 'x' * 201, '5 rooms', '5.0',
                  '.5', 0, '0', ' ', '',
                  '12345678-1234-5678-1234-567812345678'):  # fmt: skip
        assert value_tag('t', 'a', value) is None


#: Strings that MariaDB's collations find equal (utf8mb4's default, its
#: unicode_ci, unicode_520_ci, which compares as MySQL 8's default, and
#: those of languages), though they differ once case is folded.
EQUAL_IN_MARIADB = [
    ('Straße', 'Strase', 'utf8mb4_general_ci'),
    ('Œuvre', 'OEuvre', 'utf8mb4_unicode_ci'),
    ('Søren', 'Soren', 'utf8mb4_unicode_520_ci'),
    ('Æsir', 'AEsir', 'utf8mb4_unicode_520_ci'),
    ('Łódź', 'Lodz', 'utf8mb4_unicode_520_ci'),
    ('²', '2', 'utf8mb4_unicode_ci'),
    ('Léeds', 'Leeds', 'utf8mb4_general_ci'),
    ('Bär', 'Baer', 'utf8mb4_german2_ci'),
    ('Århus', 'Aarhus', 'utf8mb4_danish_ci'),
    ('a\x01b', 'ab', 'utf8mb4_unicode_ci'),
]


def test_strings_a_collation_may_find_equal_have_no_tag(mysql_url):
    engine = sa.create_engine(mysql_url, poolclass=sa.pool.NullPool)
    with engine.connect() as connection:
        for a, b, collation in EQUAL_IN_MARIADB:
            equal = connection.exec_driver_sql(
                f"SELECT _utf8mb4'{a}' = _utf8mb4'{b}' COLLATE {collation}"
            ).scalar()
            assert equal == 1, (a, b, collation)
            assert value_tag('t', 'a', a) is None, a
            assert compare(a, b) is None, (a, b)
    engine.dispose()


def test_digits_mysql_reads_as_no_number_have_no_tag(mysql_url):
    # Other scripts' digits are digits to Python's int() and \d, not to
    # MySQL: a read of '3' in Arabic-Indic digits finds the rows of 0.
    engine = sa.create_engine(mysql_url, poolclass=sa.pool.NullPool)
    with engine.connect() as connection:
        for text in ('\u0663', '\uff13', '1\u0663'):  # and a wide 3
            number = connection.exec_driver_sql(
                f"SELECT CAST(_utf8mb4'{text}' AS SIGNED)"
            ).scalar()
            assert number != int(text), text
            assert value_tag('t', 'a', text) is None, text
    engine.dispose()


def race_another_writer(app, path, url, ready, go):
    """GET ``path`` in a thread; once its view is ``ready``, move property
    2 to Burley by another connection and cache Burley's search, then let
    the view ``go`` on. Burley's search, to call after."""
    writing = threading.Thread(target=lambda: app.get(path))
    writing.start()
    burley = ('search', {'area': 'Burley'})
    try:
        assert ready.wait(30)
        engine = sa.create_engine(url)
        with engine.begin() as connection:
            connection.execute(
                sa.text("UPDATE property SET area = 'Burley' WHERE id = 2")
            )
        engine.dispose()
        assert call(app, burley)['results'][0]['rows'] == [[2, 120], [4, 70]]
    finally:
        go.set()
        writing.join(30)
    return burley


@pytest.mark.parametrize('server_url', ['postgresql', 'mysql'], indirect=True)
def test_rows_changed_by_another_writer_before_the_write_are_told(
    server_url, apps
):
    # The request has begun its transaction (MySQL's snapshot is taken)
    # when another connection moves property 2 to Burley, and a search of
    # Burley caches it there. The request then moves it on: the rows it
    # tells must be those it changes (Burley's), not its snapshot's.
    ready, go = threading.Event(), threading.Event()

    def two_writes(request):
        request.sql.set_rent(id=1, rent=1)
        ready.set()
        go.wait(30)
        request.sql.move(id=2, area='Hyde Park')
        return 'ok'

    app = apps(server_url, METHODS, views={'/two': two_writes})
    burley = race_another_writer(app, '/two', server_url, ready, go)
    assert call(app, burley)['results'][0]['rows'] == [[4, 70]]


@pytest.mark.parametrize('server_url', ['postgresql', 'mysql'], indirect=True)
def test_orm_rows_changed_by_another_writer_since_loaded_are_told(
    server_url, apps
):
    # As above, by the ORM: the request loaded property 2 in Headingley
    # before another connection moved it to Burley; its rent change then
    # lands on a Burley row.
    ready, go = threading.Event(), threading.Event()

    def late_write(request):
        two = request.dbsession.get(Property, 2)
        ready.set()
        go.wait(30)
        two.rent = 5
        return 'ok'

    app = apps(server_url, METHODS, views={'/late': late_write})
    burley = race_another_writer(app, '/late', server_url, ready, go)
    assert call(app, burley)['results'][0]['rows'] == [[2, 5], [4, 70]]


class Keyed(DeclarativeBase):
    pass


class ByAreaAndId(Keyed):
    """The property table mapped with a primary key of two columns."""

    __tablename__ = 'property'
    id: Mapped[int] = mapped_column(primary_key=True)
    area: Mapped[str] = mapped_column(primary_key=True)
    rent: Mapped[int]


def test_orm_rows_not_found_by_one_key_column_drop_the_table(sqlite_url, apps):
    def view(request):
        request.dbsession.get(ByAreaAndId, (4, 'Burley')).rent = 1
        return 'ok'

    app = apps(sqlite_url, METHODS, views={'/orm': view})
    assert orm_dropped(app, {}) == [0, 1, 2, 3, 4, 5]


def test_orm_rows_stored_with_a_value_that_is_no_tag_drop_the_table(
    sqlite_url, apps
):
    def view(request):
        four = request.dbsession.get(Property, 4)
        other = sa.create_engine(sqlite_url)  # another writer, meanwhile
        with other.begin() as connection:
            connection.execute(
                sa.text('UPDATE property SET area = :long WHERE id = 4'),
                {'long': 'x' * 201},
            )
        other.dispose()
        four.rent = 1
        return 'ok'

    app = apps(sqlite_url, METHODS, views={'/orm': view})
    assert orm_dropped(app, {}) == [0, 1, 2, 3, 4, 5]


class Family(DeclarativeBase):
    pass


tagged = sa.Table(
    'tagged',
    Family.metadata,
    sa.Column('parent_id', sa.ForeignKey('parent.id'), primary_key=True),
    sa.Column('tag_id', sa.ForeignKey('tag.id'), primary_key=True),
)


class Parent(Family):
    __tablename__ = 'parent'
    id: Mapped[int] = mapped_column(primary_key=True)
    # No delete cascade: the ORM sets its children's parent_id to NULL.
    children: Mapped[list['Child']] = relationship()
    lines: Mapped[list['Line']] = relationship(cascade='all, delete-orphan')
    tags: Mapped[list['Tag']] = relationship(secondary=tagged)
    seen: Mapped[list['Child']] = relationship(viewonly=True)  # writes none


class Child(Family):
    __tablename__ = 'child'
    id: Mapped[int] = mapped_column(primary_key=True)
    parent_id: Mapped[int | None] = mapped_column(sa.ForeignKey('parent.id'))
    name: Mapped[str | None] = mapped_column(sa.String(20))
    parent: Mapped[Parent | None] = relationship(overlaps='children')


class Line(Family):
    __tablename__ = 'line'
    id: Mapped[int] = mapped_column(primary_key=True)
    parent_id: Mapped[int] = mapped_column(sa.ForeignKey('parent.id'))


class Tag(Family):
    __tablename__ = 'tag'
    id: Mapped[int] = mapped_column(primary_key=True)


#: Cached reads of the rows that refer to a parent, by its id.
OF_PARENT = [
    {
        'name': name,
        'sql': f'SELECT {column} FROM {table} WHERE parent_id = :p '
        f'ORDER BY {column}',
        'cache_time': 20,
    }
    for name, column, table in [
        ('kids', 'id', 'child'),
        ('lines', 'id', 'line'),
        ('tags', 'tag_id', 'tagged'),
    ]
]


def move(session):
    session.get(Child, 1).parent = session.get(Parent, 2)


def remove(session):
    parent = session.get(Parent, 1)  # a collection holds it weakly
    parent.children.remove(session.get(Child, 1))


def orphan(session):
    parent = session.get(Parent, 1)
    del parent.lines[0]


def tag(session):
    parent = session.get(Parent, 1)
    parent.tags.append(session.get(Tag, 2))


def delete(session):
    session.delete(session.get(Parent, 1))


@pytest.mark.parametrize(
    'write, reads',
    [
        # A child moved by its relationship: its parent_id is set as the
        # flush runs.
        pytest.param(
            move, {('kids', 2): [[1]], ('kids', 1): [[2]]}, id='move'
        ),
        # Rows of other tables than the objects': a child taken out of a
        # collection (set to NULL), an orphan deleted, a row of a
        # secondary table; a parent deleted sets its children to NULL
        # and deletes its secondary rows.
        pytest.param(remove, {('kids', 1): [[2]]}, id='remove'),
        pytest.param(orphan, {('lines', 1): [[2]]}, id='orphan'),
        pytest.param(tag, {('tags', 1): [[1], [2]]}, id='tag'),
        pytest.param(
            delete,
            {('kids', 1): [], ('lines', 1): [], ('tags', 1): []},
            id='delete',
        ),
    ],
)
def test_rows_an_orm_relationship_writes_are_dropped(
    db_url, apps, write, reads
):
    app = family_app(db_url, apps, write)
    calls = [(name, {'p': p}) for name, p in reads]
    call(app, *calls)
    assert call(app, *calls)['cache']['hit'] == len(calls)
    app.post('/orm')
    answer = call(app, *calls)
    assert [r['rows'] for r in answer['results']] == list(reads.values())


def test_a_child_written_by_its_columns_keeps_other_parents_reads(
    db_url, apps
):
    # Its relationship unchanged, its rows are told by their columns.
    def rename(session):
        session.get(Child, 1).name = 'one'

    app = family_app(db_url, apps, rename)
    kids = [('kids', {'p': 1}), ('kids', {'p': 2})]
    call(app, *kids)
    app.post('/orm')
    assert [call(app, k)['cache']['hit'] for k in kids] == [0, 1]


def family_app(url, apps, write):
    """An app over parents 1 and 2, parent 1's children, lines and tag 1;
    ``write(session)`` at ``/orm``."""

    def view(request):
        write(request.dbsession)
        return 'ok'

    engine = sa.create_engine(url)
    Family.metadata.create_all(engine)
    with engine.begin() as connection:
        for model, ids in [(Parent, [1, 2]), (Tag, [1, 2])]:
            connection.execute(sa.insert(model), [{'id': i} for i in ids])
        for model in (Child, Line):
            connection.execute(
                sa.insert(model), [{'id': i, 'parent_id': 1} for i in (1, 2)]
            )
        connection.execute(sa.insert(tagged), [{'parent_id': 1, 'tag_id': 1}])
    engine.dispose()
    return apps(url, OF_PARENT, tables=False, views={'/orm': view})


class Rekeyed(DeclarativeBase):
    pass


class Holder(Rekeyed):
    """A parent that has the ORM update its children's keys."""

    __tablename__ = 'parent'
    id: Mapped[int] = mapped_column(primary_key=True)
    children: Mapped[list['Held']] = relationship(passive_updates=False)


class Held(Rekeyed):
    __tablename__ = 'child'
    id: Mapped[int] = mapped_column(primary_key=True)
    parent_id: Mapped[int | None] = mapped_column(sa.ForeignKey('parent.id'))


class Referred(Rekeyed):
    """The same parent, with no relationship of its own."""

    __table__ = Holder.__table__


class Referring(Rekeyed):
    """The same child, that has the ORM update its key to its parent."""

    __table__ = Held.__table__
    parent: Mapped[Referred] = relationship(
        passive_updates=False, overlaps='children'
    )


@pytest.mark.parametrize('by', ['parent', 'child'])
def test_rows_the_orm_updates_as_their_parents_key_changes_are_dropped(
    db_url, apps, by
):
    # passive_updates=False: no foreign key that updates them, the ORM
    # does, by the parent's one-to-many or by its children's many-to-one.
    def view(request):
        session = request.dbsession
        if by == 'parent':
            session.get(Holder, 1).id = 3
        else:
            children = [session.get(Referring, i) for i in (1, 2)]
            session.get(Referred, 1).id = 3
            session.flush()  # while they are loaded, to be found
            assert children[0].parent_id == 3
        return 'ok'

    run_sql(
        db_url,
        'CREATE TABLE parent (id INTEGER PRIMARY KEY)',
        'CREATE TABLE child (id INTEGER PRIMARY KEY, parent_id INTEGER)',
        'INSERT INTO parent VALUES (1)',
        'INSERT INTO child VALUES (1, 1), (2, 1)',
    )
    app = apps(db_url, OF_PARENT[:1], tables=False, views={'/orm': view})
    kids = [('kids', {'p': 1}), ('kids', {'p': 3})]
    call(app, *kids)
    app.post('/orm')
    answer = call(app, *kids)
    assert [r['rows'] for r in answer['results']] == [[], [[1], [2]]]


class Stamped(DeclarativeBase):
    pass


class Ticket(Stamped):
    __tablename__ = 'ticket'
    id: Mapped[int] = mapped_column(primary_key=True)
    title: Mapped[str] = mapped_column(sa.String(20))
    state: Mapped[str] = mapped_column(
        sa.String(20), default='new', onupdate='edited'
    )
    version: Mapped[int] = mapped_column()
    __mapper_args__ = {'version_id_col': version}  # noqa: RUF012


def edit(session):
    session.get(Ticket, 1).title = 'b'


def open_(session):
    session.add(Ticket(id=2, title='c'))


@pytest.mark.parametrize(
    'write, after',
    [
        # Ticket 1's state becomes 'edited', its version 2.
        pytest.param(edit, [[[1]], [[1]]], id='update'),
        # Ticket 2 is 'new', of version 1.
        pytest.param(open_, [[[1], [2]], [[1], [2]]], id='insert'),
    ],
)
def test_a_pinned_column_the_orm_fills_drops_its_reads(
    db_url, apps, write, after
):
    # onupdate, a default, a version counter: the flush sets them, the
    # object does not.
    def view(request):
        write(request.dbsession)
        return 'ok'

    engine = sa.create_engine(db_url)
    Stamped.metadata.create_all(engine)
    with engine.begin() as connection:
        connection.execute(
            sa.insert(Ticket),
            {'id': 1, 'title': 'a', 'state': 'new', 'version': 1},
        )
    engine.dispose()
    methods = [
        {
            'name': f'by_{column}',
            'sql': f'SELECT id FROM ticket WHERE {column} = :v ORDER BY id',
            'cache_time': 20,
        }
        for column in ('state', 'version')
    ]
    app = apps(db_url, methods, tables=False, views={'/orm': view})
    if write is edit:
        reads = [('by_state', {'v': 'edited'}), ('by_version', {'v': 2})]
    else:
        reads = [('by_state', {'v': 'new'}), ('by_version', {'v': 1})]
    call(app, *reads)
    app.post('/orm')
    assert [r['rows'] for r in call(app, *reads)['results']] == after


def test_a_calls_tags_are_remembered_and_bounded(sqlite_url, apps):
    search = apps(sqlite_url, [SEARCH]).app.registry.dbtune.methods['search']
    tags = search.tags({'area': 'Burley'})
    assert tags == {'property?', "property.area='burley'"}
    assert search.tags({'area': 'Burley'}) is tags
    for i in range(5000):
        search.tags({'area': f'area {i}'})
    # Bounded: the first call's tags were let go, and are made anew.
    again = search.tags({'area': 'Burley'})
    assert again == tags and again is not tags
    # An argument that can be no tag (a list, unhashable too): the table.
    assert search.tags({'area': ['Burley']}) == {'property'}


def test_stats_count_what_each_methods_writes_dropped(sqlite_url, apps):
    app = apps(sqlite_url, METHODS, STATS)
    dbtune = app.app.registry.dbtune
    dropped(app, ('set_rent', {'id': 1, 'rent': 95}))
    dropped(app, ('shout', {'id': 3}))  # untold: every read of the table
    assert dbtune.stats.snapshot()['methods'] == {
        'areas': {'dropped': 2, 'patched': 0, 'untold_writes': 0},
        'get': {'dropped': 3, 'patched': 0, 'untold_writes': 0},
        'search': {'dropped': 4, 'patched': 0, 'untold_writes': 0},
        'shout': {'dropped': 0, 'patched': 0, 'untold_writes': 1},
    }
    metrics = dbtune.stats.exposition()[0].decode()
    assert 'dbtune_cache_dropped_total{method="search"} 4.0' in metrics
    assert 'dbtune_untold_writes_total{method="shout"} 1.0' in metrics


def test_stats_count_what_a_read_finds_dropped_in_memcached(
    sqlite_url, memcached, apps
):
    settings = shared_settings(memcached, **STATS)
    writer = apps(sqlite_url, METHODS, settings)
    reader = apps(sqlite_url, METHODS, settings, tables=False)
    dropped(writer, ('set_rent', {'id': 4, 'rent': 75}), reader)
    methods = reader.app.registry.dbtune.stats.snapshot()['methods']
    assert methods == {
        'areas': {'dropped': 1, 'patched': 0, 'untold_writes': 0},
        'get': {'dropped': 1, 'patched': 0, 'untold_writes': 0},
        'search': {'dropped': 1, 'patched': 0, 'untold_writes': 0},
    }


# Applied in place: PostgreSQL, in process


def test_a_change_already_read_is_not_applied_twice(postgresql_url, apps):
    """A notice that comes after a fill that read its change: the rows
    hold it already (the fill's snapshot says so)."""
    from pyramid_dbtune.sql.shapes import Change

    listen = {'dbtune.cache.listen': 'true'}  # fills tell their snapshot
    app = apps(postgresql_url, METHODS, listen)
    dbtune = app.app.registry.dbtune
    # Listening first: on connecting, it drops what was read before.
    assert dbtune.listener.listening.wait(10)
    assert dbtune.router.snapshots
    deaf = apps(postgresql_url, METHODS, tables=False)
    assert not deaf.app.registry.dbtune.router.snapshots
    engine = sa.create_engine(postgresql_url)
    with engine.begin() as connection:
        connection.exec_driver_sql(
            'UPDATE property SET rent = 50 WHERE id = 1'
        )
        xid = int(
            connection.exec_driver_sql(
                'SELECT pg_current_xact_id()::text'
            ).scalar()
        )
    engine.dispose()
    assert call(app, READS[0])['results'][0]['rows'] == [[1, 50], [2, 120]]
    old = ({'id': 1, 'area': 'Headingley', 'rent': 90},)
    new = ({'id': 1, 'area': 'Headingley', 'rent': 50},)
    late = Change('property', old, new, xid)
    dbtune.cache.invalidate(tags_of('property', new, dbtune.pinned), [late])
    answer = call(app, READS[0])
    assert answer['cache']['hit'] == 1
    assert answer['results'][0]['rows'] == [[1, 50], [2, 120]]
    # A change the rows do not hold is applied.
    later = Change('property', new, ({**new[0], 'rent': 40},), xid + 1)
    dbtune.cache.invalidate(tags_of('property', new, dbtune.pinned), [later])
    assert call(app, READS[0])['results'][0]['rows'] == [[1, 40], [2, 120]]


def test_a_fill_racing_a_change_it_may_hold_is_not_kept(postgresql_url, apps):
    """A change applied while a fill runs: the fill's rows are served to
    its caller, never stored."""
    from pyramid_dbtune.sql.shapes import Change

    app = apps(postgresql_url, METHODS)
    cache = app.app.registry.dbtune.cache
    change = Change(
        'property',
        ({'id': 2, 'area': 'Headingley', 'rent': 120},),
        ({'id': 2, 'area': 'Headingley', 'rent': 99},),
        None,
    )
    burley = Change('property', ({'id': 9, 'area': 'Burley', 'rent': 1},),
                    (), None)  # fmt: skip
    dbtune = app.app.registry.dbtune

    def read(*args):
        # The change comes after the fill has read (and so may hold it,
        # or not): the rows are not kept. One of another area's is not
        # its business.
        rows = dbtune.router.read(*args[:4], fill=True)
        for one in (burley, change):
            tags = tags_of('property', one.old, dbtune.pinned)
            cache.invalidate(tags, [one])
        return rows

    registered = dbtune.methods['search']
    watch = registered.tags({'area': 'Headingley'})
    method = registered.method
    statement, params = method.bind({'area': 'Headingley'})
    key = (registered.key, ('Headingley',), (str,))
    cache.get_or_fill(
        key, 20, watch, read, statement, params, method.max_rows,
        method.tables,
    )  # fmt: skip
    assert key not in cache._data and cache.discarded == 1


def test_rows_a_write_finds_that_its_select_did_not_drop_the_table(
    postgresql_url, apps
):
    """A row committed between the SELECT of the rows a write touches and
    the write, which the write changes too: which rows, is not told."""
    cheap = {
        'name': 'cheap',
        'sql': 'UPDATE property SET rent = :rent WHERE rent < :below',
    }
    app = apps(postgresql_url, [*METHODS, cheap])
    other = sa.create_engine(postgresql_url, isolation_level='AUTOCOMMIT')
    done = []

    def slip_one_in(conn, cursor, statement, *args):
        if statement.startswith('UPDATE property SET rent') and not done:
            done.append(True)
            with other.connect() as connection:
                connection.exec_driver_sql(
                    "INSERT INTO property VALUES (9, 'Hyde Park', 1)"
                )

    engine = app.app.registry.dbtune.router.writer
    sa.event.listen(engine, 'before_cursor_execute', slip_one_in)
    try:
        write = ('cheap', {'rent': 2, 'below': 75})  # finds property 4
        assert dropped(app, write) == [0, 1, 2, 3, 4, 5]
    finally:
        sa.event.remove(engine, 'before_cursor_execute', slip_one_in)
        other.dispose()
    answer = call(app, ('search', {'area': 'Hyde Park'}))
    assert answer['results'][0]['rows'] == [[3, 80], [9, 2]]
