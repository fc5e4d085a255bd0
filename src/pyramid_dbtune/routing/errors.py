"""The errors pyramid_dbtune raises, and how it reads the drivers' errors.

Driver errors are told apart by the codes the databases give them, not by
their texts: PostgreSQL's SQLSTATE (psycopg 3's ``sqlstate``, psycopg2's
``pgcode``), MySQL's and MariaDB's error number (``args[0]``), and Oracle's
ORA- number (``args[0].code``, from cx_Oracle and python-oracledb alike).
"""

from pyramid.httpexceptions import HTTPServiceUnavailable
from pyramid_retry import mark_error_retryable


class WriteInReadError(RuntimeError):
    """A SQL method taken for a read tried to write (see ``writes=``), or a
    statement of ``request.dbsession`` before the request's first write
    (see the ``dbtune_writes`` execution option)."""


class WriteSlotTimeout(HTTPServiceUnavailable):
    """No write slot came free within ``dbtune.write_timeout`` seconds.

    An HTTP 503 answer: the request wrote nothing, and its transaction is
    aborted.
    """

    def __init__(self, waited, slots):
        super().__init__(
            f'the database is busy: no write slot came free in {waited:g} s '
            f'({slots} per process); nothing was written, try again'
        )


#: SQLSTATEs of serialisation failures and deadlocks (PostgreSQL).
RETRYABLE_SQLSTATES = frozenset(['40001', '40P01'])
#: MySQL and MariaDB: deadlock found; lock wait timeout exceeded.
RETRYABLE_MYSQL = frozenset([1213, 1205])
#: Oracle: ORA-08177 can't serialize access; ORA-00060 deadlock detected.
RETRYABLE_ORACLE = frozenset([8177, 60])

_READ_ONLY_SQLSTATE = '25006'  # PostgreSQL: read_only_sql_transaction
_READ_ONLY_MYSQL = frozenset([1792])  # in a READ ONLY transaction
_READ_ONLY_ORACLE = frozenset([1456])  # ORA-01456: in a READ ONLY txn


def _codes(orig):
    """``(sqlstate, number)`` of a driver error; either may be None."""
    sqlstate = getattr(orig, 'sqlstate', None) or getattr(orig, 'pgcode', None)
    args = getattr(orig, 'args', ())
    first = args[0] if args else None
    number = getattr(first, 'code', first)  # Oracle: an _Error with .code
    if not isinstance(number, int) or isinstance(number, bool):
        number = None
    return sqlstate, number


def _dialect_of(orig):
    return type(orig).__module__.split('.')[0]


def is_retryable(orig):
    """Whether a driver error is a serialisation failure or a deadlock."""
    sqlstate, number = _codes(orig)
    if sqlstate in RETRYABLE_SQLSTATES:
        return True
    # MySQL's lock wait timeout is no SQLSTATE of its own (HY000, which
    # PyMySQL 1.1 and later tell): its number says it.
    if number is None:
        return False
    if _dialect_of(orig) in ('cx_Oracle', 'oracledb'):
        return number in RETRYABLE_ORACLE
    return number in RETRYABLE_MYSQL


def is_timeout(orig):
    """Whether a driver error is the client having stopped waiting for an
    answer on a connection that had answered (PyMySQL's ``read_timeout``
    or ``write_timeout``: a lost connection, raised from the socket's
    timeout, within the driver's handling of it). Its statement ran too
    long: the server is up."""
    cause = getattr(orig, '__cause__', None) or getattr(
        orig, '__context__', None
    )
    return isinstance(cause, TimeoutError)


def is_read_only_refusal(orig):
    """Whether a driver error refuses a write in a read-only transaction."""
    sqlstate, number = _codes(orig)
    if sqlstate is not None:
        return sqlstate == _READ_ONLY_SQLSTATE
    if _dialect_of(orig) in ('cx_Oracle', 'oracledb'):
        return number in _READ_ONLY_ORACLE
    if number in _READ_ONLY_MYSQL:
        return True
    return 'readonly database' in str(orig)  # SQLite: SQLITE_READONLY


def mark_retryable(context):
    """SQLAlchemy's ``handle_error`` hook: tag serialisation failures and
    deadlocks with pyramid_retry's ``IRetryableError``, so that
    pyramid_retry runs the request again."""
    error = context.sqlalchemy_exception
    if error is not None and is_retryable(context.original_exception):
        mark_error_retryable(error)
