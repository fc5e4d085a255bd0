"""The triggers that tell every process of the changes committed to the
database by anyone: what ``dbtune triggers`` installs, and what a
listener (:mod:`.changes`) reads.

PostgreSQL: statement triggers ``NOTIFY`` on :data:`CHANNEL` at commit,
with the watched columns of the rows changed, old and new (their
transition tables), and the id of their transaction. MySQL and MariaDB:
row triggers add a row to the table :data:`CHANNEL`, with the keys of the
row changed, old and new.
Both send the writer's :data:`ORIGIN`, so that a listener can pass over
what the app's own commits dropped already: PostgreSQL's only for a
change the app's statement made itself, not one a trigger of the user's
made in turn; on MySQL, where a trigger cannot tell, the app's commit
adds a row (:data:`MARK`) that names the tags it dropped.
"""

import hashlib
import json
import logging
import re
from decimal import Decimal

from ..sql.conditions import PLAIN, any_row, value_tag

log = logging.getLogger(__name__)

#: PostgreSQL's channel, and MySQL's table of changes.
CHANNEL = 'dbtune_changes'
#: Rows a PostgreSQL notice tells at the most (more: the whole table).
MAX_ROWS = 100
#: Digits a number a change tells may have, either side of its point.
MAX_DIGITS = 1000
#: A transaction's id, as a PostgreSQL notice tells it.
_XID = re.compile('[0-9]{1,20}')
#: The session variable that names where a write comes from: the app's
#: writer connections set it, so that a listener can pass over the changes
#: its own cache has dropped already (``@dbtune_origin`` on MySQL).
ORIGIN = 'dbtune.origin'
#: MySQL's name of :data:`ORIGIN`: a user variable.
MY_ORIGIN = ORIGIN.replace('.', '_')
#: MySQL: the ``tbl`` of a row of the app's commit that names, in
#: ``cols``, the tags it drops itself (tables, rows).
MARK = ''
#: The table of a question of :mod:`.shared`, a process's that asks who
#: listens (a name no table has that a plain name finds).
PROBE = '?'


def tables_to_watch(dbtune):
    """Table: ``(keys, extra)``, for every table a cached SQL method
    reads, by a plain name (a read whose tables cannot be told has none;
    a quoted name is read as a whole by writes through the app alone).
    ``keys``: the columns that find which cached reads a change touches
    (pinned, compared, grouped by); ``extra``: the columns more that
    patching them takes (PostgreSQL sends them where they fit)."""
    tables = {}
    for registered in dbtune.methods.values():
        if registered.cache_time and not registered.method.writes:
            for table in registered.invalidated_by:
                if PLAIN.match(table):
                    tables[table] = _columns(dbtune, table)
    return dict(sorted(tables.items()))


_WHY = {
    'schema': 'with its schema',
    'quoted': 'quoted, in capitals',
    'capitals': 'in capitals, on a database that tells names by case',
}


def misnamed(dbtune, connection):
    """Table: why it cannot be watched, for the tables of
    :func:`tables_to_watch` that a cached SQL method names in a way that
    triggers on the plain name may miss: with a schema (``b.item``: the
    search path may find another ``item``, or none), or in capitals where
    case tells tables apart (PostgreSQL's ``"Item"``, MySQL's ``Item``
    with ``lower_case_table_names = 0``). Rather than watch another
    table, such a table is watched not at all, unless PostgreSQL finds the
    same table by both names (``public.item`` where ``public`` is on the
    search path)."""
    dialect = connection.dialect.name
    unsure = {'schema'}
    if dialect == 'postgresql':
        unsure.add('quoted')
    elif dialect in ('mysql', 'mariadb') and not int(
        connection.exec_driver_sql('SELECT @@lower_case_table_names').scalar()
    ):
        unsure |= {'quoted', 'capitals'}
    found = {}
    for name, registered in sorted(dbtune.methods.items()):
        if not registered.cache_time or registered.method.writes:
            continue
        for table, written, how in sorted(registered.method.names):
            if (
                how in unsure
                and table in registered.invalidated_by
                and PLAIN.match(table)
                and not (
                    dialect == 'postgresql'
                    and connection.exec_driver_sql(
                        'SELECT to_regclass(%s) = to_regclass(%s)',
                        (written, table),
                    ).scalar()
                )
            ):
                found.setdefault(
                    table,
                    f'SQL method {name!r} names it {written}, {_WHY[how]}',
                )
    return found


def _columns(dbtune, table):
    keys = set(dbtune.pinned.get(table, ()))
    for registered in dbtune.methods.values():
        if registered.shape is not None and registered.shape.table == table:
            keys |= registered.shape.keys
    extra = dbtune.watched.get(table, set()) - keys
    return tuple(sorted(keys)), tuple(sorted(extra))


def _quote(engine, name):
    return engine.dialect.identifier_preparer.quote(name)


def _literal(name):
    """A plain name (:func:`tables_to_watch`) as a string literal of SQL."""
    return f"'{name}'"


_PG_FUNCTION = f"""
CREATE OR REPLACE FUNCTION dbtune_changed() RETURNS trigger
LANGUAGE plpgsql AS $dbtune$
DECLARE
  split int := array_position(TG_ARGV, '');
  columns text[];
  gone jsonb;
  came jsonb;
  counted_gone int := 0;
  counted_came int := 0;
  message text;
BEGIN
  -- The rows with every watched column, else with the keys alone (a
  -- notice holds 8000 bytes), else the table alone.
  FOR attempt IN 1..2 LOOP
    columns := CASE WHEN attempt = 1 THEN array_remove(TG_ARGV, '')
                    ELSE TG_ARGV[0:split - 1] END;
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
      SELECT count(*), jsonb_agg(picked) INTO counted_gone, gone
      FROM (SELECT (SELECT coalesce(jsonb_object_agg(key, value), '{{}}')
                    FROM jsonb_each(to_jsonb(dbtune_o))
                    WHERE key = ANY(columns))
            AS picked FROM dbtune_old dbtune_o LIMIT {MAX_ROWS + 1}) s;
    END IF;
    IF TG_OP IN ('UPDATE', 'INSERT') THEN
      SELECT count(*), jsonb_agg(picked) INTO counted_came, came
      FROM (SELECT (SELECT coalesce(jsonb_object_agg(key, value), '{{}}')
                    FROM jsonb_each(to_jsonb(dbtune_n))
                    WHERE key = ANY(columns))
            AS picked FROM dbtune_new dbtune_n LIMIT {MAX_ROWS + 1}) s;
    END IF;
    IF TG_OP <> 'TRUNCATE' AND counted_gone + counted_came = 0 THEN
      RETURN NULL;
    END IF;
    message := NULL;
    EXIT WHEN TG_OP = 'TRUNCATE' OR split IS NULL
      OR greatest(counted_gone, counted_came) > {MAX_ROWS};
    message := jsonb_build_object(
      't', TG_TABLE_NAME, 'n', TG_TABLE_SCHEMA,
      -- The app's origin where its own statement made the change, not a
      -- trigger's: the app's commit drops what its statements wrote.
      'o', CASE WHEN pg_trigger_depth() = 1
                THEN current_setting('{ORIGIN}', true) END,
      'x', pg_current_xact_id()::text, 'u', gen_random_uuid(),
      'old', coalesce(gone, '[]'), 'new', coalesce(came, '[]'))::text;
    EXIT WHEN octet_length(message) <= 7900;
    message := NULL;
  END LOOP;
  IF message IS NULL THEN
    message := jsonb_build_object(
      't', TG_TABLE_NAME, 'n', TG_TABLE_SCHEMA,
      'o', CASE WHEN pg_trigger_depth() = 1
                THEN current_setting('{ORIGIN}', true) END)::text;
  END IF;
  PERFORM pg_notify('{CHANNEL}', message);
  RETURN NULL;
END
$dbtune$
"""

_PG_EVENTS = {
    'insert': 'INSERT ON {t} REFERENCING NEW TABLE AS dbtune_new',
    'update': (
        'UPDATE ON {t} REFERENCING OLD TABLE AS dbtune_old '
        'NEW TABLE AS dbtune_new'
    ),
    'delete': 'DELETE ON {t} REFERENCING OLD TABLE AS dbtune_old',
    'truncate': 'TRUNCATE ON {t}',
}

_MY_TABLE = f"""
CREATE TABLE IF NOT EXISTS {CHANNEL} (
  id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
  tbl VARCHAR(64) NOT NULL,
  cols LONGTEXT NULL,
  origin VARCHAR(200) NULL,
  at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE=InnoDB
"""

_MY_EVENTS = {
    'insert': ('NEW',),
    'update': ('OLD', 'NEW'),
    'delete': ('OLD',),
}
#: MySQL's longest name, of a trigger as of a table.
_MY_LONGEST = 64


def _my_trigger(event, table):
    """MySQL's name of ``table``'s trigger of ``event``,
    ``dbtune_{event}_{table}``. Trigger names are unique in a database,
    so a name longer than MySQL takes is cut, and ends with a hash of the
    whole table name after a ``$``, which no table the package watches
    holds (:data:`~pyramid_dbtune.sql.conditions.PLAIN`): two tables that
    begin alike never share their triggers."""
    name = f'dbtune_{event}_{table}'
    if len(name) <= _MY_LONGEST:
        return name
    digest = hashlib.sha1(table.encode(), usedforsecurity=False).hexdigest()
    return f'{name[: _MY_LONGEST - 9]}${digest[:8]}'


def trigger_sql(engine, tables, drop=False):
    """The statements that install (or ``drop``) the triggers of
    ``tables`` (table: ``(keys, extra)`` columns, as
    :func:`tables_to_watch` tells them, or a list of keys) on ``engine``'s
    database. Raises :class:`ValueError` for a database that has none."""
    dialect = engine.dialect.name
    if dialect not in ('postgresql', 'mysql', 'mariadb'):
        raise ValueError(
            f'{dialect} cannot tell the package of writes made outside the '
            'application: PostgreSQL, MySQL and MariaDB can'
        )
    statements = []
    for table, columns in tables.items():
        keys, extra = (columns, ()) if isinstance(columns, list) else columns
        quoted = _quote(engine, table)
        for event in _PG_EVENTS if dialect == 'postgresql' else _MY_EVENTS:
            name = (
                f'dbtune_{event}'
                if dialect == 'postgresql'
                else _quote(engine, _my_trigger(event, table))
            )
            on = f' ON {quoted}' if dialect == 'postgresql' else ''
            statements.append(f'DROP TRIGGER IF EXISTS {name}{on}')
            if drop:
                continue
            if dialect == 'postgresql':
                args = ', '.join(map(_literal, [*keys, '', *extra]))
                statements.append(
                    f'CREATE TRIGGER {name} AFTER '
                    + _PG_EVENTS[event].format(t=quoted)
                    + f' FOR EACH STATEMENT EXECUTE FUNCTION '
                    f'dbtune_changed({args})'
                )
                # Fired in a session whose session_replication_role is
                # replica too: logical replication's, a bulk loader's.
                statements.append(
                    f'ALTER TABLE {quoted} ENABLE ALWAYS TRIGGER {name}'
                )
            else:
                # MySQL: the keys alone (a change is matched, not patched:
                # its transaction cannot be placed against a fill's).
                told = (
                    'JSON_OBJECT('
                    + ', '.join(
                        f"'{which.lower()}', JSON_ARRAY(JSON_OBJECT("
                        + ', '.join(
                            f"'{c}', {which}.{_quote(engine, c)}" for c in keys
                        )
                        + '))'
                        for which in _MY_EVENTS[event]
                    )
                    + ')'
                )
                statements.append(
                    f'CREATE TRIGGER {name} AFTER {event.upper()} ON {quoted} '
                    f'FOR EACH ROW INSERT INTO {CHANNEL} (tbl, cols, origin) '
                    f'VALUES ({_literal(table)}, {told}, '
                    f'@{MY_ORIGIN})'
                )
    if drop:
        return statements
    first = _PG_FUNCTION if dialect == 'postgresql' else _MY_TABLE
    return [first.strip(), *statements]


def install(engine, tables, drop=False):
    """Install (or ``drop``) the triggers of ``tables``, in one
    transaction where the database allows."""
    statements = trigger_sql(engine, tables, drop)
    with engine.begin() as connection:
        for statement in statements:
            connection.exec_driver_sql(statement)


def schemas_of(connection):
    """``{table: schema}`` of the tables that ``connection``'s search
    path finds, on PostgreSQL (a notice names its table's schema); none
    elsewhere."""
    if connection.dialect.name != 'postgresql':
        return {}
    found = connection.exec_driver_sql(
        'SELECT c.relname, n.nspname FROM pg_class c JOIN pg_namespace n '
        "ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'p') AND "
        'pg_table_is_visible(c.oid)'
    )
    return dict(found.all())


def read_notice(payload, schemas):
    """``(token, table, told, origin, xid)`` of a PostgreSQL notice: an
    app's commit heard of (``token``), or a change (``told``: the images
    of its rows, or None; a question of :mod:`.shared`: table
    :data:`PROBE`). None for a change of another schema's table of the
    same name than ``schemas`` (:func:`schemas_of`) finds: another
    tenant's, say.

    Any role may notify the channel: a notice not of the triggers'
    making is logged, and drops at most the table it names, not the
    listener's connection (which would drop every cached result)."""
    try:
        return _read(loads(payload), schemas)
    except (TypeError, ValueError, KeyError, RecursionError):
        log.warning(
            'pyramid_dbtune: a notice on %s that the listener cannot read '
            '(not sent by its triggers?): %.200r', CHANNEL, payload,
        )  # fmt: skip
        table = _named(payload)
        return (None, table, None, None, None) if table else None


def _named(payload):
    """The table a notice names, if it names one, whatever its numbers."""
    try:
        message = json.loads(
            payload, parse_float=_none, parse_int=_none, parse_constant=_none
        )
    except (ValueError, RecursionError):  # [[[[... nested past Python's
        return None
    table = message.get('t') if isinstance(message, dict) else None
    return table if _text(table) else None


def _read(message, schemas):
    if not isinstance(message, dict):
        raise TypeError(message)
    if 's' in message:
        return _checked(message['s']), None, None, None, None
    if 'p' in message:  # a process that asks who listens (.shared.ask)
        return None, PROBE, _checked(message['p']), None, None
    table, schema = _checked(message['t']), message.get('n')
    if schema is not None and schemas.get(table, schema) != schema:
        return None
    told = None
    if 'old' in message:
        told = images({'old': message['old'], 'new': message['new']})
    xid = message.get('x')
    if xid is not None and not (type(xid) is str and _XID.fullmatch(xid)):
        raise ValueError(xid)  # the triggers send it as text
    return None, table, told, message.get('o'), xid and int(xid)


def loads(text):
    """``text``, JSON as the triggers write it: numbers with a point or an
    exponent as decimals; ValueError for a number of more than
    :data:`MAX_DIGITS` digits, NaN or Infinity, which are not the
    triggers' (``1e1000000`` would take every thread of the process
    minutes to turn into a whole number)."""
    return json.loads(
        text, parse_float=_decimal, parse_int=_integer, parse_constant=_refuse
    )


def _decimal(text):
    number = Decimal(text)
    if not -MAX_DIGITS < number.adjusted() < MAX_DIGITS:
        raise ValueError(text)
    return number


def _integer(text):
    if len(text) > MAX_DIGITS:
        raise ValueError(text)
    return int(text)


def _refuse(text):
    raise ValueError(text)


def _none(text):
    return None  # a number, whatever its size: no table's name


def images(told):
    """``told``, what a trigger tells of a change's rows, checked:
    ``{"old": [...], "new": [...]}``, either list missing on MySQL, or a
    list (a trigger made before images), of objects. TypeError for
    anything else: not a trigger's."""
    for rows in told.values() if type(told) is dict else [told]:
        if not (type(rows) is list and all(type(r) is dict for r in rows)):
            raise TypeError(told)
    return told


def _text(value):
    return isinstance(value, str) and value != ''


def _checked(value):
    if not _text(value):
        raise TypeError(value)
    return value


def tags_of(table, rows, pinned):
    """What a change of ``table`` drops: ``rows``, the changed rows'
    pinned columns as the trigger sent them (``None``: not told; old and
    new apart: :func:`images`)."""
    whole = {table, any_row(table)}
    if rows is None:
        return whole
    if type(rows) is dict:
        rows = [*rows.get('old', ()), *rows.get('new', ())]
    tags = {table}
    for row in rows:
        for column in pinned.get(table, ()):
            if column not in row:
                return whole  # a trigger older than the app's pins
            value = row[column]
            if value is None:
                continue  # no read pinned by equality finds NULL
            tag = value_tag(table, column, value)
            if tag is None:
                return whole
            tags.add(tag)
    return tags


def watched(connection):
    """The tables that have the package's triggers."""
    if connection.dialect.name == 'postgresql':
        found = connection.exec_driver_sql(
            'SELECT c.relname FROM pg_trigger t JOIN pg_class c ON '
            "c.oid = t.tgrelid WHERE t.tgname = 'dbtune_update' "
            'AND pg_table_is_visible(c.oid)'
        )
    else:
        found = connection.exec_driver_sql(
            'SELECT event_object_table, trigger_name FROM '
            'information_schema.triggers WHERE trigger_schema = DATABASE()'
        )
        return {
            table
            for table, name in found
            if name == _my_trigger('update', table)
        }
    return set(found.scalars())
