"""The in-process cache: LRU, bounded by entries and bytes, single flight.

Written by hand rather than with ``functools.lru_cache`` or a dogpile.cache
memory region: neither bounds the memory its values take, nor forgets the
results read from a table when a write to it commits; and dogpile's hit
costs more than twice this one (``benchmarks/bench_cache.py``).
"""

import sys
import threading
from collections import OrderedDict
from concurrent.futures import Future
from time import monotonic

from ..deploy import forks
from ..sql.analysis import ANY_TABLE

HIT = 'hit'
MISS = 'miss'
STALE = 'stale'
WAITED = 'waited'

# What one cached entry costs besides its values: the record objects, the
# tuples and this module's bookkeeping. An estimate; it need not be exact.
_ROW_OVERHEAD = 120
_ENTRY_OVERHEAD = 400


def _deep_size(value):
    """The bytes of a key's part: its arguments, lists of them included.
    Types are shared by every key that names them: they count nothing."""
    if isinstance(value, type):
        return 0
    size = sys.getsizeof(value)
    if isinstance(value, tuple | frozenset):
        size += sum(_deep_size(item) for item in value)
    return size


def key_size(key):
    """Roughly how many bytes a cache key holds: the call's arguments."""
    return sum(_deep_size(part) for part in key)


def estimate_size(key, value):
    """Roughly how many bytes an entry holds in memory: its ``key`` (the
    arguments of the call within it) and ``value`` (a :class:`Rows`)."""
    size = _ENTRY_OVERHEAD + key_size(key)
    getsizeof = sys.getsizeof
    for record in value:
        size += _ROW_OVERHEAD
        for item in record:
            size += getsizeof(item)
    return size


class _Entry:
    __slots__ = ('value', 'expires', 'size', 'tables')

    def __init__(self, value, expires, size, tables):
        self.value = value
        self.expires = expires
        self.size = size
        self.tables = tables


class MemoryCache:
    """A thread-safe, in-process cache of query results.

    Least recently used entries are evicted beyond ``max_entries`` entries
    or ``max_bytes`` bytes; a single value larger than ``max_bytes`` is not
    stored. Counters (``hits``, ``misses``, ``stale``, ``waited``,
    ``evictions``, ``invalidations``, ``too_big``, ``discarded``) are plain
    integers, read without a lock.
    """

    def __init__(self, max_entries=10000, max_bytes=64 * 1024 * 1024):
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = self.misses = self.stale = self.waited = 0
        self.evictions = self.invalidations = 0
        self.too_big = self.discarded = 0
        #: ``key[0]`` (a SQL method's key): its entries dropped by writes
        self.dropped = {}
        self._lock = threading.Lock()
        self._data = OrderedDict()
        self._inflight = {}
        self._by_table = {}
        # Generations: a fill stores its value only if no table it read
        # was invalidated while it ran (it may have read the old rows).
        self._epoch = 0
        self._generations = {}
        forks.renew_after_fork(self)

    def __len__(self):
        return len(self._data)

    def after_fork(self):
        """In a forked child: a new lock, and no fills in flight."""
        self._lock = threading.Lock()
        self._inflight = {}

    def get_or_fill(self, key, ttl, tables, fill, *args):
        now = monotonic()
        with self._lock:
            entry = self._data.get(key)
            if entry is not None and now < entry.expires:
                self._data.move_to_end(key)
                self.hits += 1
                return entry.value, HIT
            flight = self._inflight.get(key)
            if flight is None:
                flight = self._inflight[key] = (Future(), tables)
                before = self._snapshot(tables)
                self.misses += 1
            elif entry is not None:
                self.stale += 1
                return entry.value, STALE
            else:
                self.waited += 1
                before = None
        future = flight[0]
        if before is None:
            return future.result(), WAITED
        try:
            value = fill(*args)
            size = estimate_size(key, value)
            with self._lock:
                if self._snapshot(tables) != before:
                    self.discarded += 1
                elif size > self.max_bytes:
                    self.too_big += 1
                else:
                    self._store(key, _Entry(value, now + ttl, size, tables))
        except BaseException as exc:
            future.set_exception(exc)
            raise
        else:
            future.set_result(value)
        finally:
            # Whatever happened, the next caller must not wait on this
            # fill; an invalidation may have detached it already.
            with self._lock:
                if self._inflight.get(key) is flight:
                    del self._inflight[key]
        return value, MISS

    def invalidate(self, tables):
        with self._lock:
            if tables is None:
                self._epoch += 1
                self.invalidations += len(self._data)
                for key in self._data:
                    self.dropped[key[0]] = self.dropped.get(key[0], 0) + 1
                self._data.clear()
                self._by_table.clear()
                self._inflight.clear()
                self.bytes = 0
                return
            # Results whose tables could not be told go with any write.
            tables = set(tables) | {ANY_TABLE}
            for table in tables:
                self._generations[table] = self._generations.get(table, 0) + 1
                for key in self._by_table.pop(table, ()):
                    self._remove(key)
                    self.invalidations += 1
                    self.dropped[key[0]] = self.dropped.get(key[0], 0) + 1
            # A fill running now may hold rows from before the write: who
            # asks from now on gets a fill of their own, not that one.
            for key, (_, read) in list(self._inflight.items()):
                if not tables.isdisjoint(read):
                    del self._inflight[key]

    def _snapshot(self, tables):
        generations = self._generations
        return self._epoch, [generations.get(t, 0) for t in tables]

    def _store(self, key, entry):
        if key in self._data:
            self._remove(key)
        self._data[key] = entry
        self.bytes += entry.size
        for table in entry.tables:
            self._by_table.setdefault(table, set()).add(key)
        while len(self._data) > self.max_entries or (
            self.bytes > self.max_bytes
        ):
            self._remove(next(iter(self._data)))
            self.evictions += 1

    def _remove(self, key):
        entry = self._data.pop(key)
        self.bytes -= entry.size
        for table in entry.tables:
            keys = self._by_table.get(table)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_table[table]
