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
from decimal import Decimal
from time import monotonic

from ..deploy import forks
from ..sql.analysis import ANY_TABLE
from ..sql.conditions import any_row
from ..sql.patch import patch
from ..sql.shapes import tests_of, touches, visible

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
            if isinstance(item, _HOLDERS):  # a JSON value, an array
                size += _held_size(item)
    return size


_HOLDERS = (dict, list, tuple, set, frozenset)


def _held_size(value):
    """The bytes of what ``value``, a dict or a list (say), holds."""
    items = [*value, *value.values()] if isinstance(value, dict) else value
    size = 0
    for item in items:
        size += sys.getsizeof(item)
        if isinstance(item, _HOLDERS):
            size += _held_size(item)
    return size


class Watch(frozenset):
    """The tags of a read whose rows have a shape, with the shape, the
    arguments its conditions compare with, and its ``max_rows``: a change
    told by row images is matched against them, and patched in."""

    # No __dict__: a cache holds one per entry, for the collector to walk.
    __slots__ = ('shape', 'params', 'max_rows', 'tests')

    def __new__(cls, tags, shape, params, max_rows):
        watch = super().__new__(cls, tags)
        watch.shape, watch.params, watch.max_rows = shape, params, max_rows
        # Its conditions with their arguments, made once: every change of
        # its table is matched against them.
        watch.tests = tests_of(shape, params)
        return watch


#: Changes an entry may have waiting to be applied; with one more, they
#: are applied then (a read asked for rarely is kept, not dropped).
MAX_PENDING = 64


class _Entry:
    __slots__ = (
        'value', 'expires', 'size', 'tables', 'table', 'pending', 'edge',
    )  # fmt: skip

    def __init__(self, value, expires, size, tables):
        self.value = value
        self.expires = expires
        self.size = size
        self.tables = tables
        #: The table of a read with a shape (None for another): a write
        #: that tells its rows looks at it for each read of the table.
        self.table = _table(tables)
        #: The changes told for its rows since, applied when next read.
        self.pending = None
        self.edge = _edge(tables, value)


def _edge(watch, rows):
    """Where the rows of a read of ``watch`` end: ``(column, descending,
    value)``, the first column it is ordered by and its value in the last
    row held, where the read had rows beyond those held and the value is
    a number; else None. A change whose rows all come after it changes
    none of the rows held (a change never moves it later)."""
    shape = getattr(watch, 'shape', None)
    if shape is None or shape.kind != 'rows' or not shape.order:
        return None
    last, more = rows.edge()
    if not more or last is None:
        return None
    position, descending = shape.order[0]
    value = last[position]
    if not _ordered_number(value):
        return None  # NULLs, NaN, and strings a collation orders
    return shape.items[position][1], descending, value


def _ordered_number(value):
    """Whether ``value`` is one Python orders as databases do: an int
    or a Decimal, but not NaN (which Python does not order)."""
    kind = type(value)
    return kind is int or (kind is Decimal and not value.is_nan())


def _past(edge, change):
    """Whether every row image of ``change`` comes after ``edge``."""
    column, descending, last = edge
    for images in (change.old, change.new):
        for image in images:
            value = image.get(column)
            if not _ordered_number(value):
                return False
            if value <= last if not descending else value >= last:
                return False
    return True


def _table(watch):
    """The table of a read with a shape; None for another read."""
    shape = getattr(watch, 'shape', None)
    return None if shape is None else shape.table


def _told(watch, told, tables):
    """The changes told of a watched read's table, or None where it must
    be dropped: not watched, not told, or written where rows were not."""
    shape = getattr(watch, 'shape', None)
    if shape is None or any_row(shape.table) in tables:
        return None
    return told.get(shape.table)


def _patched(watch, rows, changes):
    """``rows`` of a read of ``watch`` once ``changes`` of its table
    apply: the same rows, patched rows, or None (drop them)."""
    snapshot = rows.snapshot
    for change in changes:
        if snapshot is None or change.xid is None:
            # Which changes the rows hold cannot be told: any that may
            # touch them drops them.
            if touches(watch.shape, watch.params, change):
                return None
        elif not visible(change.xid, snapshot):
            rows = patch(
                watch.shape, rows, watch.params, change.old, change.new,
                watch.max_rows, watch.tests,
            )  # fmt: skip
            if rows is None:
                return None
    return rows


def _touches(watch, told, tables):
    """Whether ``told`` changes may touch what a fill of ``watch`` reads."""
    changes = _told(watch, told, tables)
    return changes is None or any(
        touches(watch.shape, watch.params, c) for c in changes
    )


class _Flight:
    """A fill under way: who waits for it, what it reads, and whether a
    write has made what it read stale (then it stores nothing)."""

    __slots__ = ('future', 'tables', 'spoiled')

    def __init__(self, tables):
        self.future = Future()
        self.tables = tables
        self.spoiled = False


class MemoryCache:
    """A thread-safe, in-process cache of query results.

    Least recently used entries are evicted beyond ``max_entries`` entries
    or ``max_bytes`` bytes; a single value larger than ``max_bytes`` is not
    stored. Counters (``hits``, ``misses``, ``stale``, ``waited``,
    ``evictions``, ``invalidations``, ``too_big``, ``discarded``,
    ``patches``, ``passed_over``) are plain integers, read without a
    lock.

    A read whose ``tables`` is a :class:`~pyramid_dbtune.cache.Watch`
    (its shape and arguments) is not dropped by a change told by row
    images: the change is matched against its conditions, and applied to
    its rows where :func:`~pyramid_dbtune.sql.patch.patch` can. A write
    whose changed rows all come after the rows an ordered read holds (it
    had more than it holds) is passed over for it (``passed_over``).
    """

    def __init__(self, max_entries=10000, max_bytes=64 * 1024 * 1024):
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = self.misses = self.stale = self.waited = 0
        self.evictions = self.invalidations = 0
        self.too_big = self.discarded = self.patches = 0
        self.passed_over = 0
        #: ``key[0]`` (a SQL method's key): its entries dropped by writes
        self.dropped = {}
        #: ``key[0]``: its entries that writes changed in place
        self.patched = {}
        self._lock = threading.Lock()
        self._data = OrderedDict()
        self._inflight = {}
        self._by_table = {}
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
            if entry is not None and entry.pending:
                entry = self._catch_up(key, entry)
            if entry is not None and now < entry.expires:
                self._data.move_to_end(key)
                self.hits += 1
                return entry.value, HIT
            flight = self._inflight.get(key)
            if flight is None:
                flight = self._inflight[key] = _Flight(tables)
                leader = True
                self.misses += 1
            elif entry is not None:
                self.stale += 1
                return entry.value, STALE
            else:
                self.waited += 1
                leader = False
        if not leader:
            return flight.future.result(), WAITED
        try:
            value = fill(*args)
            size = estimate_size(key, value)
            with self._lock:
                if flight.spoiled:
                    self.discarded += 1
                elif size > self.max_bytes:
                    self.too_big += 1
                else:
                    self._store(key, _Entry(value, now + ttl, size, tables))
        except BaseException as exc:
            flight.future.set_exception(exc)
            raise
        else:
            flight.future.set_result(value)
        finally:
            # Whatever happened, the next caller must not wait on this
            # fill; an invalidation may have detached it already.
            with self._lock:
                if self._inflight.get(key) is flight:
                    del self._inflight[key]
        return value, MISS

    def invalidate(self, tables, changes=(), later=frozenset()):
        """Drop what a write of ``tables`` (tags; None: all) could have
        changed. ``changes`` (:class:`~pyramid_dbtune.sql.shapes.Change`)
        tell its rows, where known: the reads they are told for are
        matched and patched instead of dropped, when next read, or when
        :data:`MAX_PENDING` changes wait (a read nobody asks for again
        costs a change little). The reads with a
        shape of the tables in ``later``, and their fills, are left as
        they are: the listener applies the write's changes to them as it
        hears of them."""
        with self._lock:
            if tables is None:
                self.invalidations += len(self._data)
                for key in self._data:
                    self._count_drop(key)
                for flight in self._inflight.values():
                    flight.spoiled = True
                self._data.clear()
                self._by_table.clear()
                self._inflight.clear()
                self.bytes = 0
                return
            # Results whose tables could not be told go with any write.
            tables = set(tables) | {ANY_TABLE}
            told = {}
            for change in changes:
                told.setdefault(change.table, []).append(change)
            seen = set()
            # What each watched table's reads are told: its changes, or
            # None (drop them); worked out once per write, not per read.
            telling = {}
            for table in tables:
                for key in list(self._by_table.get(table, ())):
                    if key not in seen:
                        seen.add(key)
                        entry = self._data.get(key)
                        if entry is None:
                            continue  # made room for rows a change grew
                        if entry.table not in later:
                            self._apply(key, entry, told, tables, telling)
            # A fill running now may hold rows from before the write: who
            # asks from now on gets a fill of their own, not that one.
            for key, flight in list(self._inflight.items()):
                if (
                    not tables.isdisjoint(flight.tables)
                    and _table(flight.tables) not in later
                    and _touches(flight.tables, told, tables)
                ):
                    flight.spoiled = True
                    del self._inflight[key]

    def _apply(self, key, entry, told, tables, telling):
        """Note the changes ``told`` of its table for the rows of ``key``,
        to apply when next read; drop them where they cannot be.
        ``telling`` remembers, by table, what :func:`_told` found."""
        table = entry.table
        try:
            changes = telling[table]
        except KeyError:
            changes = telling[table] = _told(entry.tables, told, tables)
        if changes is None:
            self._drop(key)
            return
        edge = entry.edge
        if edge is not None:
            # Most changes come after the rows a search holds: they are
            # passed over here, once per edge, not patched in one by one.
            try:
                changes = telling[edge, table]
            except KeyError:
                changes = telling[edge, table] = [
                    c for c in changes if not _past(edge, c)
                ]
            if not changes:
                self.passed_over += 1
                return
        # The reads told of a write share its list of changes (never
        # changed in place): a list per read, kept until it is next read,
        # is more for the garbage collector to walk.
        pending = entry.pending
        entry.pending = changes if pending is None else pending + changes
        if len(entry.pending) > MAX_PENDING:
            self._catch_up(key, entry)

    def _drop(self, key):
        self._remove(key)
        self.invalidations += 1
        self._count_drop(key)

    def _catch_up(self, key, entry):
        """The entry of ``key`` with the changes told since applied to
        its rows; None where they cannot be (it is dropped)."""
        changes, entry.pending = entry.pending, None
        value = _patched(entry.tables, entry.value, changes)
        if value is entry.value:
            return entry
        if value is None:
            self._drop(key)
            return None
        size = estimate_size(key, value)
        self.bytes += size - entry.size
        entry.size = size
        entry.value = value
        entry.edge = _edge(entry.tables, value)
        self.patches += 1
        self.patched[key[0]] = self.patched.get(key[0], 0) + 1
        if size > self.max_bytes:  # too big alone: it goes, no other
            self._remove(key)
            self.too_big += 1
            return None
        # It grew: the others make room, the least recently used first
        # (they are room enough: it is within the bound alone).
        others = (other for other in list(self._data) if other != key)
        while self.bytes > self.max_bytes:
            self._remove(next(others))
            self.evictions += 1
        return entry

    def _count_drop(self, key):
        self.dropped[key[0]] = self.dropped.get(key[0], 0) + 1

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
            keys = self._by_table[table]
            keys.discard(key)
            if not keys:
                del self._by_table[table]
