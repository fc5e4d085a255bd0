"""How the package's engines are made: the drivers' bounds on connecting
and on statements, readers made read-only for good, and a result read
into :class:`~pyramid_dbtune.sql.rows.Rows`."""

import functools
import math
import re

from pyramid.exceptions import ConfigurationError
from sqlalchemy import create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from ..sql.analysis import tokens
from ..sql.rows import Rows, reserve_for
from .errors import mark_retryable

#: How a read on the writer is made read-only, and the connection made
#: writable again after, by dialect. PostgreSQL's driver does it by an
#: execution option. SET TRANSACTION applies to the transaction the read is
#: about to begin.
_SET_TRANSACTION = ('mysql', 'mariadb', 'oracle')
READ_ONLY_STATEMENTS = {
    'sqlite': ('PRAGMA query_only = ON', 'PRAGMA query_only = OFF'),
    **dict.fromkeys(_SET_TRANSACTION, ('SET TRANSACTION READ ONLY', None)),
}


def fetch(result, max_rows, position=None, snapshot=None):
    """Read a SQLAlchemy result into :class:`Rows`, keeping ``max_rows``;
    ``position``: the replica's log position it was read at, at least;
    ``snapshot``: the snapshot it was read in. A read with a snapshot (a
    cache fill whose rows changes are applied to) holds a reserve of
    rows beyond ``max_rows`` (:func:`~pyramid_dbtune.sql.rows.reserve_for`).
    """
    if not result.returns_rows:
        return Rows(rowcount=result.rowcount)
    columns = tuple(result.keys())
    if not max_rows:
        data = result.fetchall()
        return Rows(columns, data, position=position, snapshot=snapshot)
    held = max_rows + (0 if snapshot is None else reserve_for(max_rows))
    data = result.fetchmany(held + 1)
    result.close()
    more = len(data) > held
    del data[held:]
    if len(data) > max_rows:
        rows = Rows(columns, (), position=position, snapshot=snapshot)
        return rows.derive(data, more, max_rows)
    return Rows(
        columns, data, truncated=more, position=position, snapshot=snapshot
    )


#: How each driver is told to give up connecting, by its name, and how
#: the seconds are given: libpq takes whole seconds, 2 at the least.
_CONNECT_TIMEOUT = {
    'psycopg': ('connect_timeout', lambda s: max(2, math.ceil(s))),
    'psycopg2': ('connect_timeout', lambda s: max(2, math.ceil(s))),
    'pymysql': ('connect_timeout', float),
    'mysqldb': ('connect_timeout', lambda s: max(1, math.ceil(s))),
    'oracledb': ('tcp_connect_timeout', float),
}


def connect_args(url, connect_timeout, statement_timeout=0):
    """The driver's arguments that bound how long a connection may take
    to open (``connect_timeout`` seconds) and a statement to run
    (``statement_timeout``; 0: no bound). A database that accepts a
    connection and never answers would otherwise hold the request, and a
    thread, for good. A bound the URL names itself wins."""
    url = make_url(url)
    driver = url.get_driver_name()
    args = {}
    name, seconds = _CONNECT_TIMEOUT.get(driver, (None, None))
    if connect_timeout and name is not None and name not in url.query:
        args[name] = seconds(connect_timeout)
    if statement_timeout and driver == 'pymysql':
        # PyMySQL reads the server's greeting, and every answer, under its
        # read_timeout: connect_timeout bounds only the TCP connect.
        for name in ('read_timeout', 'write_timeout'):
            if name not in url.query:
                args[name] = float(statement_timeout)
        # A write waiting for a row lock gives up before the client does
        # (or sooner, as the server says): InnoDB's error 1205 is
        # retryable, a read timeout's 2013 is not.
        read = url.query.get('read_timeout', statement_timeout)
        try:
            read = float(read)
        except ValueError:
            shown = url.render_as_string(hide_password=True)
            raise ConfigurationError(
                f'read_timeout={read!r} in the database URL {shown} is not '
                'a number of seconds'
            ) from None
        if 'init_command' not in url.query:
            lock_wait = max(1, math.ceil(read) - 1)
            args['init_command'] = (
                'SET SESSION innodb_lock_wait_timeout = '
                f'LEAST(@@GLOBAL.innodb_lock_wait_timeout, {lock_wait})'
            )
    elif statement_timeout and driver in ('psycopg', 'psycopg2'):
        # The server's own limit, added to the URL's options (which the
        # driver's arguments would otherwise replace).
        limit = f'-c statement_timeout={math.ceil(statement_timeout * 1000)}'
        options = url.query.get('options', '')
        if 'statement_timeout' not in options:
            args['options'] = f'{options} {limit}'.strip()
    return args


#: The drivers :func:`connect_args` bounds statements for.
_STATEMENT_TIMEOUT = ('pymysql', 'psycopg', 'psycopg2')


def unbounded(url, connect_timeout, statement_timeout):
    """The settings of the two bounds that the driver of ``url`` is not
    given (SQLite needs neither: no server to wait on)."""
    url = make_url(url)
    driver = url.get_driver_name()
    if url.get_backend_name() == 'sqlite':
        return []
    return [
        f'dbtune.{name}'
        for name, bound, drivers in (
            ('connect_timeout', connect_timeout, _CONNECT_TIMEOUT),
            ('statement_timeout', statement_timeout, _STATEMENT_TIMEOUT),
        )
        if bound and driver not in drivers
    ]


def make_engine(url, connect_timeout=0, statement_timeout=0, **kw):
    args = connect_args(url, connect_timeout, statement_timeout)
    if args:
        kw['connect_args'] = args
    engine = create_engine(url, **kw)
    event.listen(engine, 'handle_error', mark_retryable)
    event.listen(engine, 'before_cursor_execute', _made_setting)
    return engine


def _made_setting(connection, cursor, statement, *args):
    """A statement that leaves a setting on its connection past its
    transaction (``SET``, but ``SET LOCAL``, ``SET TRANSACTION`` and
    ``SET CONSTRAINTS``; ``set_config()``; MySQL's ``USE``), however it
    was run: through a session, a SQL method, Zope's
    ``connection().execute``. Its connection is closed, not pooled, once
    the request is done with it, so that no other request, and no cached
    rows, see the setting; a PostgreSQL reader's is reset instead
    (:func:`_reset_settings`)."""
    if leaves_setting(statement):
        if event.contains(connection.engine, 'reset', _reset_settings):
            connection.info[SETTINGS_MADE] = True
        else:
            connection.detach()


def leaves_setting(sql):
    """Whether ``sql`` may leave a setting on its connection past its
    transaction (see :func:`_made_setting`). Asked of every statement:
    only those that name ``set`` or ``use`` are read, and the short ones'
    answers remembered."""
    if not _MAY_SET.search(sql):
        return False
    if len(sql) > _REMEMBERED:
        return _leaves_setting.__wrapped__(sql)
    return _leaves_setting(sql)


_MAY_SET = re.compile(r'set|\buse\b', re.IGNORECASE)
_REMEMBERED = 4096  # characters


@functools.lru_cache(maxsize=1024)
def _leaves_setting(sql):
    words = [word.lower() for word in tokens(sql)]
    if words[:1] == ['set']:
        return words[1:2] not in (['local'], ['transaction'], ['constraints'])
    return words[:1] == ['use'] or 'set_config' in words


#: Seconds the listener of changes waits for its database to answer, at
#: the most (less where ``dbtune.statement_timeout`` is less): a
#: connection cut unsaid, or to a frozen host, is then given up.
ANSWER_WITHIN = 10.0


def listener_engine(settings):
    """The engine of the listener of changes (:mod:`~pyramid_dbtune.cache.
    changes`): a connection at a time, none kept, in autocommit. Its bounds:
    on connecting, the app's; on each answer, :data:`ANSWER_WITHIN`
    (PyMySQL's ``read_timeout``). libpq has no bound on an answer:
    keepalives probe the connection while it idles, and
    ``tcp_user_timeout`` bounds how long what it sent may go
    unacknowledged. A bound the URL names wins."""
    url = make_url(settings.url)
    within = min(settings.statement_timeout or ANSWER_WITHIN, ANSWER_WITHIN)
    args = connect_args(url, settings.connect_timeout, within)
    if url.get_driver_name() == 'psycopg':  # as listening needs
        from psycopg import pq

        probe = max(1, math.ceil(within / 3))
        libpq = {
            'keepalives': 1,
            'keepalives_idle': probe,
            'keepalives_interval': probe,
            'keepalives_count': 2,
            'tcp_user_timeout': math.ceil(within * 1000),
        }
        if pq.version() < 120000:  # libpq 11 refuses it
            del libpq['tcp_user_timeout']
        args.update((k, v) for k, v in libpq.items() if k not in url.query)
    return create_engine(
        url,
        poolclass=NullPool,
        isolation_level='AUTOCOMMIT',
        connect_args=args,
    )


def make_read_only(engine):
    """Make every transaction on ``engine`` read-only: a statement taken
    for a read that writes then fails, rather than being rolled back
    unseen, and a session that writes through a reader fails too."""
    dialect = engine.dialect.name
    if dialect == 'postgresql':
        engine.update_execution_options(postgresql_readonly=True)
        event.listen(engine, 'reset', _reset_settings)
    elif dialect in _READ_ONLY_SESSION:
        # Once per connection: no statement before each read.
        event.listen(
            engine,
            'connect',
            functools.partial(_read_only_session, _READ_ONLY_SESSION[dialect]),
        )
    elif dialect == 'oracle':  # pragma: no cover (no Oracle server here)
        # Oracle has no read-only session: each transaction says it.
        event.listen(
            engine,
            'begin',
            lambda connection: connection.exec_driver_sql(
                'SET TRANSACTION READ ONLY'
            ),
        )


#: ``Connection.info`` key: a request made a setting (``SET``) on this
#: PostgreSQL reader's connection, undone as it returns to its pool.
SETTINGS_MADE = 'dbtune_settings_made'


def _reset_settings(dbapi_connection, record, state):
    """Undo a request's settings before its reader's connection goes back
    to the pool: a transaction that committed keeps them. A reader holds
    no setting of the package's own. Should it fail, SQLAlchemy closes
    the connection."""
    if record.info.pop(SETTINGS_MADE, False) and not state.terminate_only:
        dbapi_connection.rollback()
        cursor = dbapi_connection.cursor()
        cursor.execute('RESET ALL')
        cursor.close()
        dbapi_connection.commit()


#: How a connection is made read-only for good, by dialect.
_READ_ONLY_SESSION = {
    'sqlite': 'PRAGMA query_only = ON',
    'mysql': 'SET SESSION TRANSACTION READ ONLY',
    'mariadb': 'SET SESSION TRANSACTION READ ONLY',
}


def _read_only_session(sql, dbapi_connection, record):
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(sql)
    finally:
        cursor.close()
