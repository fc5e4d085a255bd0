"""``request.dbsession``: an ORM session that reads from a reader until it
writes, then uses the writer.

The session is the request's unit of work: registered with zope.sqlalchemy
on ``request.tm``, it commits or aborts with the request. Its first flush,
and its first data-changing statement (ORM ``insert()``/``update()``/
``delete()``, ``text()`` DML, either also wrapped to return rows,
``SELECT ... FOR UPDATE``), take the request's write slot and move it,
and every later read of the request, to the writer. SQL methods that
write run in this same session, so the two see each other's uncommitted
writes. A setting (``SET``) is made where its reads run, with no write
slot, and made again on the writer at its first write. A statement that
writes though it reads as a read is declared so with the ``dbtune_writes``
execution option; undeclared, the reader refuses it, as
:class:`~pyramid_dbtune.WriteInReadError`.
"""

from pyramid.decorator import reify
from pyramid.exceptions import ConfigurationError
from pyramid.interfaces import IRequestExtensions
from sqlalchemy import event
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session
from sqlalchemy.sql.expression import TextClause, TextualSelect

from ..sql import analysis
from ..sql.conditions import foreign_reach
from .errors import WriteInReadError, is_read_only_refusal
from .flush import WHAT  # and flush listens to every session's flushes
from .work import UNIT


class RoutingSession(Session):
    """The package's own ``request.dbsession``: a session whose reads go to
    a reader until its unit of work writes (:meth:`UnitOfWork.adopt
    <pyramid_dbtune.routing.work.UnitOfWork.adopt>`).

    It is not two-phase: a reader is never asked to prepare a commit.
    """

    def __init__(self, unit, **kw):
        super().__init__(**kw)
        unit.adopt(self)


#: The execution option that declares a statement of the session a
#: write: ``True``, or the names of the tables it changes.
WRITES = 'dbtune_writes'
# What _told() says of a setting (SET): made where the reads run.
_SETTING = object()


@event.listens_for(Session, 'do_orm_execute')
def _do_orm_execute(state):
    unit = state.session.info.get(UNIT)
    if unit is None or state.execution_options.get('dbtune_routed'):
        return None  # not adopted, or a SQL method: routed already
    statement = _inner(state)
    written = _written(statement, state.execution_options.get(WRITES))
    if written is _SETTING:
        _setting(unit, state, statement)
    elif written is not None:
        tables, updated = written
        unit.begin_write(tables, WHAT)
        if tables:
            unit.cascade(state.session, tables, updated)
        unit.session_wrote(state.session)
    if state.session.bind is unit.router.writer:
        return None  # the writer's transaction, read-write
    return _on_the_reader(state)


def _written(statement, declared):
    """``(tables, updated)`` for a write of ``statement``: the tables it
    changes (None: untold) and the columns it updates (None: untold); None
    for a read; :data:`_SETTING` for a setting. ``declared``: its
    :data:`WRITES` execution option, if any: a write, of the tables its
    statement tells (if it tells a write) and those it names."""
    told = _told(statement)
    if declared is None:
        return told
    names = None if declared is True else _names(declared)
    if told is None or told is _SETTING:
        return names, None
    tables, updated = told
    if tables is not None and names is not None:
        tables = {*tables, *names}
    return tables, updated


def _told(statement):
    """What ``statement`` writes, as its own text or form tells it (see
    :func:`_written`)."""
    if isinstance(statement, TextClause):
        writes, tables = analysis.analyse(statement.text)  # memoized
        if not writes:
            return None
        if tables == frozenset() and analysis.is_setting(statement.text):
            return _SETTING
        # The columns an UPDATE's SET names, that foreign keys may act on.
        return tables, foreign_reach(statement.text)
    if statement.is_dml:
        # An INSERT changes no row already there.
        updated = frozenset() if statement.is_insert else None
        return {statement.table.name.lower()}, updated
    # SELECT ... FOR UPDATE: SQLAlchemy says so only in this private
    # attribute of a Select (no public reader of with_for_update()).
    if getattr(statement, '_for_update_arg', None) is not None:
        return set(), None  # a locking read: in the writing transaction
    return None


def _names(declared):
    """The table names of a :data:`WRITES` option: a list, or one string
    separated by commas, as a SQL method's ``tables``."""
    if isinstance(declared, str):
        declared = declared.replace(',', ' ').split()
    try:
        return {analysis.table_name(name) for name in declared}
    except (TypeError, AttributeError):
        raise ValueError(
            f'execution option {WRITES} must be True or the names of the '
            f'tables the statement changes, not {declared!r}'
        ) from None


_REFUSED = (
    'a statement of request.dbsession tried to change the database, but '
    'it reads as a read, and until the request writes, the session reads '
    'on a read-only connection: declare it a write with '
    f'execution_options({WRITES}=True), or with the tables it changes '
    f"({WRITES}=['area']; [] for none)"
)


def _on_the_reader(state):
    """Run the statement where the session reads: read-only, until the
    transaction writes. The database's refusal of a write there is a
    :class:`~pyramid_dbtune.WriteInReadError` that says what to do."""
    try:
        return state.invoke_statement()
    except DBAPIError as exc:
        if is_read_only_refusal(exc.orig):
            raise WriteInReadError(_REFUSED) from exc
        raise


def _setting(unit, state, statement):
    """A setting (``SET``) of the session's connection or transaction,
    made where its reads run (a reader, before the transaction writes) so
    that what follows sees it, with no write slot: the request's SQL
    methods then run in the session too, neither served from nor stored
    in the cache (:attr:`UnitOfWork.settings
    <pyramid_dbtune.routing.work.UnitOfWork.settings>`), and its first
    write makes it again on the writer (:func:`_set_again`).

    A setting stays on its connection past a transaction that commits
    (the writer's, or the reader's of a request that writes nothing), and
    on MySQL and MariaDB past any: a connection that made one is closed,
    not pooled, once the request is done with it, so that no other
    request, and no cached rows, see it; a PostgreSQL reader's is reset
    instead, as it returns to its pool (``RESET ALL``). The engines see to
    that, for every statement (:mod:`~pyramid_dbtune.routing.connect`)."""
    if not unit.dirty:  # else made in the writing transaction
        unit.settings.append((statement, state.parameters))


@event.listens_for(Session, 'after_begin')
def _set_again(session, transaction, connection):
    # The writer's connection, taken by the first write after the session
    # made settings on the reader it let go of: it makes them again first.
    unit = session.info.get(UNIT)
    if (
        unit is not None
        and unit.settings
        and unit.dirty
        and connection.engine is unit.router.writer
    ):
        for statement, params in unit.settings:
            connection.execute(statement, params)


def _inner(state):
    """The statement that runs: the text of ``text(...).columns(...)`` (a
    TextualSelect), the statement of ``select(M).from_statement(...)``,
    which may be either in turn. SQLAlchemy keeps what they wrap in their
    ``element``, an attribute it does not document (it has no public
    reader of it)."""
    statement = state.statement
    if state.is_from_statement:
        statement = statement.element
    if isinstance(statement, TextualSelect):
        statement = statement.element
    return statement


def dbsession(request):
    """The :class:`RoutingSession` of the request's transaction, joined to
    ``request.tm`` (a subrequest in that transaction shares it)."""
    return request.dbtune.unit.session


class _Routed(reify):
    """``request.dbsession`` as :func:`provide` gives it."""


def provide(registry):
    """Give requests ``request.dbsession``: the application's own, adopted,
    where it adds one (as Pyramid's starter does), else the package's.

    An action run after the application's own (order 0), so that its
    ``request.dbsession`` is there to be seen: in ``descriptors`` of
    :class:`pyramid.interfaces.IRequestExtensions`, documented as the
    properties added to each request. Run again as the WSGI app is made:
    one the application adds in a later commit is adopted too.
    """
    extensions = registry.getUtility(IRequestExtensions)
    own = extensions.descriptors.get('dbsession')
    if isinstance(own, _Routed):
        return
    added = own is not None or 'dbsession' in extensions.methods
    if added and registry.dbtune.router is None:
        return  # no database of the package's: the session is the app's
    if own is None and 'dbsession' in extensions.methods:
        raise ConfigurationError(
            'the application adds request.dbsession as a method, not a '
            'property, and pyramid_dbtune can only route a property: set '
            'dbtune.dbsession = false to leave it alone'
        )
    registry.dbtune.adopts = own is not None
    extensions.descriptors['dbsession'] = _Routed(
        dbsession if own is None else _adopting(own)
    )


def _adopting(own):
    def dbsession(request):
        session = own.__get__(request, type(request))
        unit = request.dbtune.unit
        writer = unit.router.writer.url
        bind = getattr(session, 'bind', None)
        if not (isinstance(session, Session) and _same_database(bind, writer)):
            raise RuntimeError(
                f"the application's request.dbsession ({session!r}) is not "
                'a SQLAlchemy session bound to the database of dbtune.url '
                f'({writer!r}), so pyramid_dbtune cannot route it: set '
                'dbtune.dbsession = false to leave it alone'
            )
        return unit.adopt(session)

    return dbsession


def _same_database(engine, url):
    def where(url):
        return url.get_backend_name(), url.host, url.port, url.database

    return engine is not None and where(engine.url) == where(url)
