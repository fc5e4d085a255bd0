"""The database connection object of a Zope site (a Zope database
adapter), and the database its ZSQL Methods' calls run on.

A ZSQL Method calls its connection object by ``connection_id`` and gets
a database whose ``query()`` runs the SQL it rendered. Here that runs
through the package: a read on the read pool (or a replica), cached in
the package's cache under the method's own cache time; a write on the
writer, in a write slot, in a session joined to Zope's ``transaction``,
whose commit drops the cached reads of the tables it wrote.
"""

import contextlib
import datetime
import decimal
import threading

import sqlalchemy as sa
import transaction
from AccessControl.class_init import InitializeClass
from App.config import getConfiguration
from pyramid.exceptions import ConfigurationError
from Shared.DC.ZRDB import DA
from Shared.DC.ZRDB.Connection import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session
from zope.globalrequest import getRequest
from zope.sqlalchemy import mark_changed, register

from ..registry import DBTune
from ..routing.connect import fetch
from ..routing.errors import WriteInReadError, is_read_only_refusal
from ..routing.lag import NO_POSITION, read_pin, sign_pin
from ..routing.work import PIN_COOKIE, PIN_FOR
from ..settings import parse
from ..sql.analysis import analyse
from ..sql.conditions import any_row, foreign_reach
from ..sql.method import call_key
from .quoting import quote, server_dialect, takes_backslashes

#: The ``<product-config>`` section of ``zope.conf`` that holds the
#: ``dbtune.*`` settings.
PRODUCT = 'pyramid_dbtune'

_made = threading.Lock()
_database = None
#: SQL methods ZCML registered before the database was made.
_pending = []


def database():
    """The process's :class:`Database`, made at first use from
    ``<product-config pyramid_dbtune>`` (or before, by :func:`configure`),
    with the SQL methods ZCML registered."""
    with _made:
        if _database is None:
            _make(parse(_section() or {}), folded=True)
        while _pending:
            _database.dbtune.register(_pending.pop(0))
        return _database


def configure(text):
    """Make the process's :class:`Database` from ``text``, the ``dbtune.*``
    settings of the WSGI pipeline's filter; a
    :class:`~pyramid.exceptions.ConfigurationError` for a bad setting, or
    for settings given twice (``zope.conf`` too)."""
    with _made:
        if _database is not None or _section() is not None:
            raise ConfigurationError(
                "pyramid_dbtune's settings are in zope.conf's "
                '<product-config pyramid_dbtune> section and in the WSGI '
                "pipeline's dbtune filter: give them in one place"
            )
        _make(parse(text))
    return database()


def has_settings():
    """True when ``zope.conf`` holds the settings (then they are checked
    as Zope starts); else they are to come from the WSGI pipeline."""
    return _section() is not None


def add_method(method):
    """Register ``method`` (a :class:`~pyramid_dbtune.SQLMethod`) with the
    process's database when it is next asked for (:func:`database`): as
    Zope starts, before its settings may have been read."""
    _pending.append(method)


def _section():
    sections = getattr(getConfiguration(), 'product_config', None) or {}
    return sections.get(PRODUCT)


def _make(settings, folded=False):
    global _database
    if settings.url is None:
        raise ConfigurationError(
            'pyramid_dbtune.zope needs a database: set dbtune.url in '
            "zope.conf's <product-config pyramid_dbtune> section, or in "
            "the WSGI pipeline's dbtune filter"
        )
    dbtune = DBTune(settings)
    # ZConfig gives zope.conf's keys lower-cased.
    dbtune.folded = folded
    if settings.cache_listen:
        # Writes made anywhere (see "Writes made anywhere").
        from ..cache import changes

        changes.start(dbtune)
    _database = Database(dbtune)


class Database:
    """What a :class:`DBTuneConnection` gives the ZSQL Methods that call
    it: ``query()``, as every Zope database adapter's."""

    def __init__(self, dbtune):
        self.dbtune = dbtune

    def query(self, query_string, max_rows=None, query_data=None):
        """Run the statements of ``query_string`` (separated by ``\\0``);
        the ``(columns, rows)`` of the last, uncached."""
        answer = ((), [])
        for sql in _statements(query_string):
            answer = self._run(sql, max_rows)
        return answer

    def cached_query(self, query_string, max_rows, cache_time, name):
        """:meth:`query`, a read's rows kept in the package's cache for
        the cache time of the ZSQL Method ``name`` (``cache_time``) or its
        ``dbtune.cache_time.<name>``, and dropped by the writes of its
        tables unless its ``dbtune.invalidate.<name>`` is false."""
        statements = _statements(query_string)
        if len(statements) != 1 or self._work(make=False) is not None:
            return self.query(query_string, max_rows)
        (sql,) = statements
        writes, tables = self._analyse(sql)
        settings, override = self.dbtune.settings, self.dbtune.override
        time = override(settings.cache_times, name)
        cache_time = cache_time if time is None else time
        if writes or not cache_time:
            return self.query(query_string, max_rows)
        invalidate = override(settings.invalidates, name) is not False
        tags = tables if invalidate else frozenset()
        # As the package's own SQL methods' keys: the name first (the
        # stats count what writes dropped by it), the values, their types.
        values = (self.dbtune.router.key, sql, max_rows or 0)
        key = (f'zsql {name}', values, (str, str, int))
        return _answer(
            self._cached(
                key, cache_time, tags, self._read, sql, max_rows, tables
            )
        )

    def call(self, registered, params):
        """Call the SQL method ``registered`` (a
        :class:`~pyramid_dbtune.registry.Registered`) with ``params`` in
        Zope's current transaction: its :class:`Rows`."""
        method = registered.method
        statement, bound = method.bind(params)
        work = self._work(make=method.writes)
        if work is not None:
            if method.writes:
                work.wrote(method.tables, statement.text)
            result = work.session.connection().execute(statement, bound)
            if method.writes:
                mark_changed(work.session)
            return fetch(result, method.max_rows)
        if not registered.cache_time:
            position = pin(self.dbtune.router)
            return self._read_method(statement, bound, method, position)
        values = method.values(params)
        key = call_key(registered.key, values)
        return self._cached(
            key,
            registered.cache_time,
            registered.tags(params),
            self._read_method,
            statement,
            bound,
            method,
        )

    def _cached(self, key, cache_time, tags, read, *args):
        """The rows of ``read(*args, position, fill)`` through the cache;
        with causal reads, read past cached rows from a replica that had
        not replayed the client's pin (``position``)."""
        position = pin(self.dbtune.router)
        rows, _ = self.dbtune.cache.get_or_fill(
            key, cache_time, tags, read, *args, position, True
        )
        if (
            position
            and rows.position is not None
            and not rows.position.covers(position)
        ):
            rows = read(*args, position)
        return rows.own()  # the cache's are every caller's

    def _read_method(self, statement, params, method, position, fill=False):
        with _read_only(lambda: f'SQL method {method.name}()', _DECLARE):
            return self.dbtune.router.read(
                statement,
                params,
                method.max_rows,
                method.tables,
                position=position,
                fill=fill,
            )

    def _analyse(self, sql):
        """:func:`~pyramid_dbtune.sql.analysis.analyse` ``sql`` as its
        server reads the strings :func:`.quote` put in it: a visitor's
        backslash does not end a string where the server takes it as
        itself (else the read may read as a write, of any table)."""
        router = self.dbtune.router
        escapes = takes_backslashes(server_dialect(router))
        return analyse(sql, router.dialect, escapes)

    def _run(self, sql, max_rows):
        writes, tables = self._analyse(sql)
        work = self._work(make=writes)
        if work is None:
            position = pin(self.dbtune.router)
            return _answer(self._read(sql, max_rows, tables, position))
        if writes:
            work.wrote(tables, sql)
        result = work.session.connection().execute(_text(sql))
        rows = fetch(result, max_rows)
        if writes:
            mark_changed(work.session)
        return _answer(rows)

    def _read(self, sql, max_rows, tables, position, fill=False):
        with _read_only(
            lambda: f'the ZSQL Method of {" ".join(sql.split())!r}', _MOVE
        ):
            return self.dbtune.router.read(
                _text(sql),
                {},
                max_rows,
                tables,
                position=position,
                fill=fill,
            )

    def _work(self, make):
        """The writing side of Zope's current transaction: made at its
        first write (``make``), then None until it ends."""
        txn = transaction.get()
        try:
            return txn.data(self)
        except KeyError:
            if not make:
                return None
        work = _Work(self.dbtune)
        txn.set_data(self, work)
        txn.addAfterCommitHook(work.ended)
        txn.addAfterAbortHook(work.ended, (False,))
        return work


class _Work:
    """A transaction's writes: its write slot, its session on the writer,
    the tables it wrote."""

    def __init__(self, dbtune):
        self.dbtune = dbtune
        self.tables = frozenset()
        router = dbtune.router
        router.acquire_write_slot()
        self.holds_slot = True
        self.session = Session(bind=router.writer)
        register(self.session)
        # The SQL may commit while Zope's transaction fails after it (at a
        # later resource's vote): its writes are in the database then.
        self.committed = False
        sa.event.listen(self.session, 'after_commit', self._committed)

    def _committed(self, session):
        self.committed = True

    def wrote(self, tables, sql):
        """Note a write ``sql`` of ``tables`` (None: which, it cannot
        tell): it drops every read of them, pinned to rows or not, and of
        the tables foreign keys change in turn."""
        known = tables is not None and self.tables is not None
        if known:
            router = self.dbtune.router
            tables = tables | router.schema.cascades(
                self.session, tables, foreign_reach(sql)
            )
        self.tables = (
            self.tables | tables | {any_row(t) for t in tables}
            if known
            else None
        )

    def ended(self, committed):
        """After the commit (or abort): drop what the session's commit
        changed, though a later resource failed Zope's commit, and give
        the write slot back, once (a commit that fails is aborted too)."""
        try:
            if committed or self.committed:
                self.committed = False
                # Noted before the rows are dropped (and they are dropped
                # whatever noting does): causal reads, this process's fills
                # of the tables wait for a replica that has replayed it.
                try:
                    router = self.dbtune.router
                    position = router.positions and router.position()
                    if position:
                        router.pins.wrote(self.tables, position)
                        _pin_client(router, position)
                    else:  # dbtune.pin_after_write: reads to the writer
                        router.pins.wrote(self.tables)
                finally:
                    self.dbtune.cache.invalidate(self.tables)
        finally:
            if self.holds_slot:
                self.holds_slot = False
                self.dbtune.router.write_slots.release()


def pin(router):
    """Causal reads: the log position that the current request's client
    has seen committed (its ``dbtune_pin`` cookie, as in Pyramid), which
    its reads must see; none without one, or without causal reads."""
    request = getRequest()
    if not router.positions or request is None:
        return NO_POSITION
    return read_pin(request.cookies.get(PIN_COOKIE, ''), router.pin_key)


def _pin_client(router, position):
    """After a commit that ended at ``position``: its client's reads, in
    any process, must see it (the cookie of :func:`pin`)."""
    request = getRequest()
    if request is not None:
        request.response.setCookie(
            PIN_COOKIE,
            sign_pin(pin(router) | position, router.pin_key),
            max_age=PIN_FOR,
            http_only=True,
            same_site='Lax',
            path='/',
        )


_DECLARE = (
    'declare it with writes=True (or a "-- writes: true" line in its file)'
)
_MOVE = (
    'a ZSQL Method cannot be declared a write: move its SQL to a '
    'code-first SQL method with a "-- writes: true" line (see "Code-first '
    'sites" in the Zope docs)'
)


@contextlib.contextmanager
def _read_only(what, advice):
    """The database's refusal of a write in a read, which runs read-only,
    as :class:`~pyramid_dbtune.WriteInReadError`: ``what()`` tried to
    write (told only then), and the ``advice``."""
    try:
        yield
    except DBAPIError as exc:
        if is_read_only_refusal(exc.orig):
            raise WriteInReadError(
                f'{what()} tried to change the database, but its statement '
                f'reads as a read, and reads run read-only: {advice}'
            ) from exc
        raise


def _statements(query_string):
    return [s for s in query_string.split('\0') if s.strip()]


def _text(sql):
    """``sql`` as SQLAlchemy runs it: a colon is not a parameter (the
    ZSQL Method put its values in the text)."""
    return sa.text(sql.replace(':', '\\:'))


#: Zope's type letters for a column, by the type of its first value.
_TYPES = (
    (bool, 'i'),
    (int, 'i'),
    ((float, decimal.Decimal), 'n'),
    ((datetime.date, datetime.datetime), 'd'),
)


def _answer(rows):
    """:class:`~pyramid_dbtune.sql.rows.Rows` as Zope's database adapters
    answer: column descriptions, and the rows as lists."""
    data = [list(row) for row in rows.tuples()]
    items = []
    for i, name in enumerate(rows.columns):
        first = next((r[i] for r in data if r[i] is not None), None)
        kind = next((k for t, k in _TYPES if isinstance(first, t)), 's')
        items.append({'name': name, 'type': kind, 'width': 0, 'null': 1})
    return items, data


class DBTuneConnection(Connection):
    """A Zope database connection on pyramid_dbtune: its settings come
    from ``zope.conf`` (``<product-config pyramid_dbtune>``), the same in
    every connection object of the process."""

    meta_type = 'pyramid_dbtune Database Connection'
    zmi_icon = 'fas fa-database'
    connect_on_load = False
    # What the ZSQL Methods' add and edit forms list as a connection.
    _isAnSQLConnection = True
    # Connected from the start: the package's pools connect as needed.
    _v_connected = "pyramid_dbtune's settings"

    def __init__(self, id, title=''):
        self.id = str(id)
        self.title = title
        self.connection_string = ''

    def __call__(self, v=None):
        return database()

    def connect(self, s):
        self._v_connected = DBTuneConnection._v_connected
        return self

    def sql_quote__(self, v):
        return quote(v, server_dialect(database().dbtune.router))


InitializeClass(DBTuneConnection)


def add_form(self, REQUEST=None):
    """The ZMI's form to add a pyramid_dbtune connection."""
    return (
        '<html><body><h2>Add a pyramid_dbtune database connection</h2>'
        '<form action="manage_addDBTuneConnection" method="post">'
        '<p>Id <input name="id"></p><p>Title <input name="title"></p>'
        '<p><input type="submit" value="Add"></p></form></body></html>'
    )


def manage_addDBTuneConnection(self, id, title='', REQUEST=None):
    """Add a pyramid_dbtune database connection."""
    self._setObject(id, DBTuneConnection(id, title))
    if REQUEST is not None:
        return self.manage_main(self, REQUEST)


# ZSQL Methods keep the rows of a method with a cache time in a dict of
# their own, per thread, that no write drops; that dict is the one thing
# a database adapter cannot turn off. For the methods on a
# DBTuneConnection, their cache is the package's: ``_cached_result``
# hands their reads to Database.cached_query with the method's cache
# time. Every other connection's methods keep their own.
_zsql_cached_result = DA.DA._cached_result


def _cached_result(self, DB__, query, max_rows, conn_id):
    if isinstance(DB__, Database):
        return DB__.cached_query(
            query, max_rows, self.cache_time_, self.getId()
        )
    return _zsql_cached_result(self, DB__, query, max_rows, conn_id)


DA.DA._cached_result = _cached_result
