"""Tables a SQL method names otherwise than plainly (with a schema, or in
capitals where case tells tables apart): ``dbtune triggers`` refuses to
watch them, rather than put its triggers on another table of that plain
name, and a listening process says their outside changes go unheard.
"""

import logging
import uuid

import pytest
import sqlalchemy as sa

from pyramid_dbtune.cache import triggers
from pyramid_dbtune.deploy.cli import main

from conftest import LISTEN, call, run_sql, watched


def app_ini(tmp_path, monkeypatch, url, sql):
    """An ini file of an app whose one cached read runs ``sql``."""
    (tmp_path / 'names_app.py').write_text(
        'from conftest import make_app\n'
        'def main(global_config, **settings):\n'
        "    method = {'name': 'get', 'sql': settings.pop('sql'),\n"
        "              'cache_time': 20}\n"
        "    return make_app(settings['dbtune.url'], [method], settings,\n"
        '                    tables=False).app\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / 'names.ini'
    path.write_text(
        '[app:main]\nuse = call:names_app:main\n'
        f'dbtune.url = {url.replace("%", "%%")}\nsql = {sql}\n'
    )
    return str(path)


@pytest.fixture
def other_schema(postgresql_url):
    """A second schema, off the search path of ``postgresql_url``'s."""
    name = f'dbtune_{uuid.uuid4().hex[:12]}'
    run_sql(postgresql_url, f'CREATE SCHEMA {name}')
    yield name
    run_sql(postgresql_url, f'DROP SCHEMA {name} CASCADE')


def item_tables(url, *names):
    run_sql(
        url,
        *(f'CREATE TABLE {n} (id int PRIMARY KEY, name varchar(20))'
          for n in names),
        *(f"INSERT INTO {n} VALUES (1, 'one')" for n in names),
    )  # fmt: skip


@pytest.mark.parametrize('how', ['schema', 'quoted'])
def test_the_triggers_command_refuses_a_table_it_cannot_tell(
    postgresql_url, other_schema, tmp_path, monkeypatch, capsys, how
):
    # An "item" the search path finds, and the table the method reads.
    read = f'{other_schema}.item' if how == 'schema' else '"Item"'
    item_tables(postgresql_url, 'item', read, 'area')
    sql = f'SELECT id, name FROM {read}, Area WHERE id = :id'
    path = app_ini(tmp_path, monkeypatch, postgresql_url, sql)
    assert main(['triggers', path]) == 2
    said = capsys.readouterr()
    assert said.out == 'dbtune triggers: installed on area\n'
    assert said.err.startswith(
        f"dbtune triggers: cannot watch item: SQL method 'get' names it "
        f'{read}, '
    )
    assert watched(postgresql_url) == {'area'}  # not on the other item
    assert main(['triggers', path, '--drop']) == 2
    assert watched(postgresql_url) == set()


def test_the_triggers_command_refuses_capitals_on_mariadb(
    mysql_url, tmp_path, monkeypatch, capsys
):
    engine = sa.create_engine(mysql_url, poolclass=sa.pool.NullPool)
    with engine.connect() as connection:
        folds = connection.exec_driver_sql(
            'SELECT @@lower_case_table_names'
        ).scalar()
    engine.dispose()
    if int(folds):
        pytest.skip('this server does not tell names by case')
    item_tables(mysql_url, 'Item')
    sql = 'SELECT id, name FROM Item WHERE id = :id'
    path = app_ini(tmp_path, monkeypatch, mysql_url, sql)
    assert main(['triggers', path]) == 2
    assert (
        "cannot watch item: SQL method 'get' names it Item, in capitals"
        in capsys.readouterr().err
    )
    assert watched(mysql_url) == set()


def test_capitals_unquoted_are_watched_on_postgresql(
    postgresql_url, tmp_path, monkeypatch, capsys
):
    # PostgreSQL folds them: FROM Item is item.
    item_tables(postgresql_url, 'item')
    sql = 'SELECT id, name FROM Item WHERE id = :id'
    assert main(['triggers', app_ini(tmp_path, monkeypatch,
                                     postgresql_url, sql)]) == 0  # fmt: skip
    assert watched(postgresql_url) == {'item'}


def test_a_schema_that_names_the_table_the_plain_name_finds_is_watched(
    postgresql_url, tmp_path, monkeypatch
):
    # Its own schema, on its search path, and "item" quoted in lower case:
    # both find the item the triggers go on.
    item_tables(postgresql_url, 'item')
    engine = sa.create_engine(postgresql_url, poolclass=sa.pool.NullPool)
    with engine.connect() as connection:
        schema = connection.exec_driver_sql('SELECT current_schema()').scalar()
    engine.dispose()
    sql = (
        f'SELECT i.id, j.name FROM {schema}.item i, "item" j WHERE i.id = :id'
    )
    assert main(['triggers', app_ini(tmp_path, monkeypatch,
                                     postgresql_url, sql)]) == 0  # fmt: skip
    assert watched(postgresql_url) == {'item'}


def test_a_listener_does_not_trust_triggers_on_another_table(
    postgresql_url, other_schema, apps, caplog
):
    item_tables(postgresql_url, 'item', f'{other_schema}.item')
    # Triggers on the item the search path finds, as an earlier version
    # of the command put them.
    engine = sa.create_engine(postgresql_url, poolclass=sa.pool.NullPool)
    triggers.install(engine, {'item': ['id']})
    engine.dispose()
    methods = [
        {'name': 'get', 'cache_time': 20,
         'sql': f'SELECT name FROM {other_schema}.item WHERE id = :id'},
        {'name': 'rename',
         'sql': f'UPDATE {other_schema}.item SET name = :name '
                'WHERE id = :id'},
    ]  # fmt: skip
    with caplog.at_level(logging.WARNING):
        app = apps(postgresql_url, methods, LISTEN, tables=False)
        listener = app.app.registry.dbtune.listener
        assert listener.listening.wait(10)
    assert (
        'changes made outside the application to item cannot be heard of: '
        f"SQL method 'get' names it {other_schema}.item, with its schema"
    ) in caplog.text
    assert 'no triggers tell of changes to' not in caplog.text
    assert listener.triggered == set()
    # The app's own writes still drop what they change.
    assert call(app, ('get', {'id': 1}))['results'][0]['rows'] == [['one']]
    call(app, ('rename', {'id': 1, 'name': 'two'}))
    assert call(app, ('get', {'id': 1}))['results'][0]['rows'] == [['two']]
