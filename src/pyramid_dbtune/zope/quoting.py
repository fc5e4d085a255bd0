"""How ZSQL Methods' strings become literals of the database they run on."""

from DocumentTemplate.DT_Var import sql_quote
from sqlalchemy.exc import DBAPIError


def quote(value, dialect):
    """``value`` as a string literal of ``dialect``'s database, as the
    ZSQL Methods' ``<dtml-sqlvar>`` and ``<dtml-sqltest>`` put strings
    into their SQL: quotes doubled, and backslashes too where the
    database takes them as escapes (MySQL and MariaDB, unless their
    ``sql_mode`` has ``NO_BACKSLASH_ESCAPES``), as their own adapters
    quote. Zope's generic quoting doubles quotes alone, and on MySQL a
    backslash before a quote would end the string."""
    text = sql_quote(value)
    if takes_backslashes(dialect):
        text = text.replace('\\', '\\\\')
    return f"'{text}'"


def takes_backslashes(dialect):
    """Whether the server of ``dialect`` takes a backslash in a string as
    an escape: MySQL and MariaDB unless their ``sql_mode`` has
    ``NO_BACKSLASH_ESCAPES``, PostgreSQL without
    ``standard_conforming_strings``."""
    # SQLAlchemy's MySQL and PostgreSQL dialects read this from the server
    # as they first connect (MySQL's is on before that, PostgreSQL's
    # off): there is no public name for it.
    return getattr(dialect, '_backslash_escapes', False)


def server_dialect(router):
    """A dialect of ``router``'s database that has read from its server
    how it takes a backslash: of the first of its engines that has
    connected, else of the first that connects now, the readers before
    the writer (the replicas are configured as the writer is, and a
    read, which runs on them, must not need the writer)."""
    readers = [reader.engine for reader in router.readers]
    engines = [router.writer, *readers]
    for engine in engines:
        if engine.dialect.server_version_info is not None:
            return engine.dialect
    for engine in [*readers, router.writer]:
        try:
            with engine.connect():
                return engine.dialect
        except DBAPIError as exc:
            error = exc
    raise error
