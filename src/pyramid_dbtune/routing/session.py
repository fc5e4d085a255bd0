"""``request.dbsession``: an ORM session that reads from a reader until it
writes, then uses the writer.

The session is the request's unit of work: registered with zope.sqlalchemy
on ``request.tm``, it commits or aborts with the request. Its first flush,
and its first data-changing statement (ORM ``insert()``/``update()``/
``delete()``, ``text()`` DML, ``SELECT ... FOR UPDATE``), take the
request's write slot and move it, and every later read of the request, to
the writer. SQL methods that write run in this same session, so the two
see each other's uncommitted writes.
"""

import functools
from time import perf_counter

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import TextClause

from ..sql import analysis

_WHAT = 'request.dbsession'


class RoutingSession(Session):
    """A session whose reads go to a reader until its unit of work writes.

    It is not two-phase: a reader is never asked to prepare a commit.
    """

    def __init__(self, unit, **kw):
        self.unit = unit
        router = unit.router
        self._reader = router.writer if unit.pinned else router.reader_engine()
        super().__init__(**kw)

    def get_bind(self, mapper=None, clause=None, **kw):
        """The writer once the transaction has written (a flush that
        writes has, as it starts), or while the client is pinned, else this
        session's reader."""
        unit = self.unit
        if unit.dirty or unit.pinned:
            return unit.router.writer
        return self._reader


@functools.lru_cache(maxsize=1024)
def _analyse(text):
    return analysis.analyse(text)


@event.listens_for(RoutingSession, 'before_flush')
def _before_flush(session, flush_context, instances):
    # An attribute set to the value it had is in session.dirty, but its
    # flush sends nothing: no write slot for it, and no pin.
    changed = [o for o in session.dirty if session.is_modified(o)]
    tables = set()
    for obj in (*session.new, *changed, *session.deleted):
        for table in sa.inspect(obj).mapper.tables:
            tables.add(table.name.lower())
    if tables:
        session.unit.begin_write(tables, _WHAT)
        session.info['dbtune_flush'] = perf_counter()


@event.listens_for(RoutingSession, 'after_flush_postexec')
def _after_flush(session, flush_context):
    # The flush's time is the request's database and write time, as a
    # writing SQL method's is (Server-Timing's db-write).
    start = session.info.pop('dbtune_flush', None)
    if start is not None:
        session.unit.wrote_for(perf_counter() - start)


@event.listens_for(RoutingSession, 'do_orm_execute')
def _do_orm_execute(state):
    if state.execution_options.get('dbtune_routed'):
        return  # a SQL method: routed already
    statement = state.statement
    if isinstance(statement, TextClause):
        writes, tables = _analyse(statement.text)
        if not writes:
            return
    elif state.is_insert or state.is_update or state.is_delete:
        tables = {statement.table.name.lower()}
    # SELECT ... FOR UPDATE: SQLAlchemy says so only in this private
    # attribute of a Select (no public reader of with_for_update()).
    elif getattr(statement, '_for_update_arg', None) is not None:
        tables = set()  # a locking read: in the writing transaction
    else:
        return
    session = state.session
    session.unit.begin_write(tables, _WHAT)
    session.unit.session_wrote(session)


def dbsession(request):
    """The :class:`RoutingSession` of the request's transaction, joined to
    ``request.tm`` (a subrequest in that transaction shares it)."""
    return request.dbtune.unit.session
