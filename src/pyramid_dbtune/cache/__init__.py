"""Result caches for SQL methods.

A cache backend has two operations:

``get_or_fill(key, ttl, tables, fill, *args)``
    Return ``(value, status)``: the cached value for ``key`` if it is fresh,
    else ``fill(*args)``, stored for ``ttl`` seconds. ``status`` is one of
    :data:`HIT`, :data:`MISS` (this caller ran ``fill``), :data:`STALE` (an
    expired value, served while another caller refreshes it) or
    :data:`WAITED` (another caller's ``fill``, awaited: single flight).
    ``tables`` names the tables the value was read from.

``invalidate(tables, changes=())``
    Forget every value read from any of ``tables`` (``None``: all), and
    make sure that a ``fill`` that started before the call stores nothing.
    ``changes`` (:class:`~pyramid_dbtune.sql.shapes.Change`) tell the rows
    written, old and new, where known: a backend may patch the values
    they reach instead (the in-process one does).

A backend counts, in ``dropped``, the values each SQL method lost to
writes, by ``key[0]`` (the method's key, its name first): in process, as
they are dropped; with memcached, as a read finds its value dropped.
"""

from .memory import HIT, MISS, STALE, WAITED, MemoryCache, Watch

__all__ = [
    'HIT',
    'MISS',
    'STALE',
    'WAITED',
    'Watch',
    'MemoryCache',
    'NullCache',
    'make_cache',
]


#: memcached reads an expiry above 30 days as a date.
MAX_EXPIRY = 30 * 24 * 3600


class NullCache:
    """The ``none`` backend: every call runs the query."""

    def get_or_fill(self, key, ttl, tables, fill, *args):
        return fill(*args), MISS

    def invalidate(self, tables, changes=(), later=frozenset()):
        pass


def make_cache(settings):
    """The cache backend that ``settings`` (parsed) asks for."""
    if settings.cache_backend == 'none':
        return NullCache()
    if settings.cache_backend == 'memcached':
        from .memcached import MemcachedCache

        return MemcachedCache(settings)
    return MemoryCache(
        max_entries=settings.cache_max_entries,
        max_bytes=settings.cache_max_bytes,
    )
