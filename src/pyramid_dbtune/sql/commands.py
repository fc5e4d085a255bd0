"""Statements that change no table, read from their lower-cased words:
settings (``SET``), notifications (``NOTIFY``, ``LISTEN``, ``UNLISTEN``)
and table locks (``LOCK``, ``UNLOCK``).

None of them changes a row that a cached read holds. Each takes effect in
its own transaction, or on its own connection: a notification is sent,
and a listener starts to listen, as their transaction commits; a lock
guards the writes of its transaction. So :func:`~.analysis.analyse` reads
them as writes of no table, as it reads a locking read: they run in the
request's writing transaction, and drop no cached read.

A setting of the session's connection or of its transaction
(:func:`is_setting`) is what ``request.dbsession`` may make where its
reads run, before it writes.
"""

#: The first words of the statements that change no table.
FIRST_WORDS = frozenset('set notify listen unlisten lock unlock'.split())

# Words that make a SET more than a setting that a read-only transaction
# may make for the reads that follow: one of the server's (GLOBAL,
# PERSIST), of the grants (PASSWORD, DEFAULT ROLE), one that wraps a
# statement or names another thread (FOR), and those of the transaction
# itself (SET TRANSACTION, SET SESSION CHARACTERISTICS, SET CONSTRAINTS),
# made for the writes that follow: a reader's transaction must not be
# made to write, and a writer's must be made so before it writes.
_NOT_SETTINGS = frozenset(
    """global persist persist_only password for transaction characteristics
    constraints""".split()
)
# How the names of the transaction's own settings begin: MySQL's
# transaction_read_only and tx_isolation, PostgreSQL's
# default_transaction_read_only.
_OF_THE_TRANSACTION = ('transaction_', 'tx_', 'default_transaction_')


def one_statement(words):
    """Whether ``words`` hold one statement: no ``;`` but at their end."""
    return ';' not in words[:-1]


def wrapped(words, depth):
    """Where MariaDB's ``SET STATEMENT name = value [, ...] FOR statement``
    begins the statement it runs (``depth``: how deep in parentheses each
    word stands), at the end if it has none; None for any other
    statement."""
    if words[:2] != ['set', 'statement']:
        return None
    for i, word in enumerate(words):
        if word == 'for' and not depth[i]:
            return i + 1
    return len(words)


def is_setting(words):
    """Whether ``words`` are one ``SET`` of the session's connection or of
    its transaction, that a read-only transaction may make for the reads
    that follow: ``SET [LOCAL | SESSION] name = value``, ``SET @x =
    (SELECT ...)``, ``SET NAMES``, ``SET ROLE``..., not one of
    ``_NOT_SETTINGS`` nor of a setting of the transaction."""
    if words[:1] != ['set'] or not one_statement(words):
        return False
    before = ''
    for word in words:
        name = word.strip('"`')
        if (
            name in _NOT_SETTINGS
            or name.startswith(_OF_THE_TRANSACTION)
            or (before, name) == ('default', 'role')
        ):
            return False
        before = name
    return True
