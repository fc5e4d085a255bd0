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

from time import perf_counter

import sqlalchemy as sa
from pyramid.decorator import reify
from pyramid.exceptions import ConfigurationError
from pyramid.interfaces import IRequestExtensions
from sqlalchemy import event
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import MANYTOONE, Session
from sqlalchemy.sql.expression import TextClause, TextualSelect

from ..sql import analysis
from ..sql.conditions import foreign_reach, value_tag
from .errors import WriteInReadError, is_read_only_refusal
from .schema import aliases
from .work import UNIT

_WHAT = 'request.dbsession'


class RoutingSession(Session):
    """The package's own ``request.dbsession``: a session whose reads go to
    a reader until its unit of work writes (:meth:`UnitOfWork.adopt
    <pyramid_dbtune.routing.work.UnitOfWork.adopt>`).

    It is not two-phase: a reader is never asked to prepare a commit.
    """

    def __init__(self, unit, **kw):
        super().__init__(**kw)
        unit.adopt(self)


# On every session, so that an application's own ``request.dbsession``,
# adopted, is routed as the package's is; a session no unit adopted has no
# ``UNIT`` in its ``info`` and is left alone.
@event.listens_for(Session, 'before_flush')
def _before_flush(session, flush_context, instances):
    unit = session.info.get(UNIT)
    if unit is None:
        return
    # An attribute set to the value it had is in session.dirty, but its
    # flush sends nothing: no write slot for it, and no pin.
    changed = [o for o in session.dirty if session.is_modified(o)]
    deleted = set(map(id, session.deleted))
    flushed = [
        (sa.inspect(obj), id(obj) in deleted)
        for obj in (*session.new, *changed, *session.deleted)
    ]
    pinned = unit.request.registry.dbtune.pinned
    touched = {}  # table name: the tags of the rows, None if untold
    stored = {}  # table: the states of its rows in the database
    deleting = set()  # the tables of those that go
    related = {}  # tables whose rows relationships write, untold
    keyed = {}  # state: its own columns a many-to-one sets
    for state, going in flushed:
        keyed[state], tables = _related(state, going)
        for table in tables:
            related[table.name.lower()] = table
    for name in related:
        touched[name] = None
    for state, going in flushed:
        for table in state.mapper.tables:
            name = table.name.lower()
            if touched.get(name, ()) is not None:
                columns = pinned.get(name, ())
                schema = unit.router.schema
                enums = schema.enums(session, name) if columns else {}
                updating = not (going or state.pending)
                tags = _tags(
                    state, table, columns, enums, keyed[state], updating
                )
                if columns and tags is not None:
                    # What the database sets itself is not what is given.
                    itself = schema.sets_itself(session, name)
                    if itself is None or not itself.isdisjoint(columns):
                        tags = None
                touched[name] = (
                    None if tags is None else tags | touched.get(name, set())
                )
                if name in pinned and not state.pending:
                    stored.setdefault(table, []).append(state)
                    if going:
                        deleting.add(table)
    for name, tags in touched.items():
        unit.begin_write({name}, _WHAT, tags)
        if tags is None:
            unit.count_untold(f'ORM {name}', name in pinned)
    # What the database changes in turn, by foreign keys' actions.
    for state, going in flushed:
        tables = {table.name.lower() for table in state.mapper.tables}
        updated = None  # deleted
        if state.pending:  # inserted: changes no row already there
            updated = frozenset()
        elif not going:
            updated = {
                column.name.lower()
                for prop in state.mapper.column_attrs
                if state.attrs[prop.key].history.has_changes()
                for column in prop.columns
            } | {column.name.lower() for column in keyed[state]}
        unit.cascade(session, tables, updated)
    if related:  # rows set to NULL, deleted or inserted: as deletes
        unit.cascade(session, set(related), None)
    for table, states in stored.items():
        name = table.name.lower()
        if touched[name] is not None:
            found = _stored(
                session, table, states, sorted(pinned[name]),
                updating=table not in deleting,
            )  # fmt: skip
            unit.begin_write({name}, _WHAT, found)
            if found is None:
                unit.count_untold(f'ORM {name}', True)
    if touched:
        session.info['dbtune_flush'] = perf_counter()


def _related(state, deleting):
    """What the flush of ``state`` writes by relationships, which the
    history of its columns does not tell: its own foreign key columns
    that a many-to-one sets (to a key known only as the flush runs), and
    the tables whose rows a one-to-many or many-to-many writes (the rows
    that refer to it, set or set to NULL, orphans deleted; its secondary
    table's). ``deleting``: ``state`` is deleted."""
    keyed, tables = set(), set()
    for rel in state.mapper.relationships:
        if rel.viewonly:
            continue
        changed = state.attrs[rel.key].history.has_changes()
        if rel.direction is MANYTOONE:
            if changed and not deleting:
                keyed.update(rel.local_columns)
        elif changed or (
            # Its secondary rows go with it; the rows that refer to it
            # are set to NULL, unless they go with it (then they are in
            # session.deleted) or are left to the database.
            deleting
            and (
                rel.secondary is not None
                or not (rel.cascade.delete or rel.passive_deletes == 'all')
            )
        ):
            tables.update(_written_for(rel))
    if not (deleting or state.pending) and _rekeyed(state):
        tables.update(_rekeying(state.mapper))
    return keyed, tables


def _rekeyed(state):
    """Whether the flush of ``state`` changes its primary key."""
    mapper = state.mapper
    return any(
        state.attrs[mapper.get_property_by_column(c).key].history.has_changes()
        for c in mapper.primary_key
    )


def _rekeying(mapper):
    """The tables whose rows the ORM itself updates as a row of
    ``mapper`` changes its primary key: by the relationships, from it or
    to it, that do not leave it to the database (``passive_updates``)."""
    return {
        table
        for other in mapper.registry.mappers
        for rel in other.relationships
        if not (rel.viewonly or rel.passive_updates)
        and mapper.isa(rel.mapper if rel.direction is MANYTOONE else other)
        for table in _written_for(rel)
    }


def _written_for(rel):
    """The tables whose rows the ORM writes for relationship ``rel``: its
    secondary table, else that of the foreign key columns it sets."""
    if rel.secondary is not None:
        return {rel.secondary}
    columns = (
        rel.local_columns if rel.direction is MANYTOONE else rel.remote_side
    )
    return {column.table for column in columns}


def _fills(mapper, column):
    """Whether an update of a row of ``mapper`` that does not set
    ``column`` may set it: by its ``onupdate`` or ``server_onupdate``,
    or as the mapper's version counter (``version_id_col``)."""
    return (
        column.onupdate is not None
        or column.server_onupdate is not None
        or column is mapper.version_id_col
    )


def _stored(session, table, states, columns, updating):
    """The tags of the rows of ``states`` as ``table`` holds them now,
    locked until the commit: another transaction may have changed them
    since they were loaded. None where they cannot be found by one
    primary key column. ``updating``: none of them is deleted, and their
    lock is no stronger than their UPDATE's (PostgreSQL's FOR NO KEY
    UPDATE, which a reference being made to a row does not wait for)."""
    key = list(table.primary_key.columns)
    if len(key) != 1 or any(
        len(s.mapper.primary_key) != 1 or s.mapper.primary_key[0] is not key[0]
        for s in states
    ):
        return None
    select = (
        sa.select(*(table.c[c] for c in columns))
        .where(key[0].in_([s.identity[0] for s in states]))
        .with_for_update(key_share=updating)
    )
    rows = session.execute(select, execution_options={'dbtune_routed': True})
    name = table.name.lower()
    tags = {
        value_tag(name, c, v)
        for row in rows
        for c, v in zip(columns, row, strict=True)
    }
    return None if None in tags else tags


def _tags(state, table, columns, enums, keyed, updating):
    """The tags of the rows the flush of ``state`` touches in ``table``,
    as they were and as they will be, by the ``columns`` that reads of it
    are pinned by (and by the other name of a value of MySQL ``ENUM``
    ``enums``); None where they cannot be told (a value not loaded, a
    default the database gives, a column of ``keyed``: a many-to-one's
    foreign key; ``updating``, a column the update fills itself)."""
    tags = set()
    for column in columns:
        try:
            mapped = table.c[column]
            key = state.mapper.get_property_by_column(mapped).key
        except (KeyError, sa.orm.exc.UnmappedColumnError):
            return None
        if mapped in keyed:
            return None
        history = state.attrs[key].history
        values = [*history.added, *history.deleted, *history.unchanged]
        if not values or (
            history.added and not history.deleted and not state.pending
        ):
            return None
        if updating and not history.added and _fills(state.mapper, mapped):
            return None
        members = enums.get(column, ())
        for value in values:
            for name in (value, *aliases(members, value)):
                tag = value_tag(table.name.lower(), column, name)
                if tag is None:
                    return None
                tags.add(tag)
    return tags


@event.listens_for(Session, 'after_flush_postexec')
def _after_flush(session, flush_context):
    # The flush's time is the request's database and write time, as a
    # writing SQL method's is (Server-Timing's db-write).
    start = session.info.pop('dbtune_flush', None)
    if start is not None:
        session.info[UNIT].wrote_for(perf_counter() - start)


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
        unit.begin_write(tables, _WHAT)
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

    MySQL and MariaDB keep a setting on its connection past its
    transaction: that connection is closed, not pooled, once the request
    is done with it, so that no other request's reads, and no cached
    rows, see it. PostgreSQL undoes it as the reader's transaction is
    rolled back."""
    if unit.dirty:
        return  # made in the writing transaction
    unit.settings.append((statement, state.parameters))
    if unit.router.dialect in ('mysql', 'mariadb'):
        state.session.connection().detach()


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


def provide(registry):
    """Give requests ``request.dbsession``: the application's own, adopted,
    where it adds one (as Pyramid's starter does), else the package's.

    An action run after the application's own (order 0), so that its
    ``request.dbsession`` is there to be seen: in ``descriptors`` of
    :class:`pyramid.interfaces.IRequestExtensions`, documented as the
    properties added to each request.
    """
    extensions = registry.getUtility(IRequestExtensions)
    own = extensions.descriptors.get('dbsession')
    if own is None and 'dbsession' in extensions.methods:
        raise ConfigurationError(
            'the application adds request.dbsession as a method, not a '
            'property, and pyramid_dbtune can only route a property: set '
            'dbtune.dbsession = false to leave it alone'
        )
    if own is not None:
        if registry.dbtune.router is None:
            return  # no database of the package's: the session is the app's
        registry.dbtune.adopts = True
    extensions.descriptors['dbsession'] = reify(
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
        unit.adopt(session)
        return session

    return dbsession


def _same_database(engine, url):
    def where(url):
        return url.get_backend_name(), url.host, url.port, url.database

    return engine is not None and where(engine.url) == where(url)
