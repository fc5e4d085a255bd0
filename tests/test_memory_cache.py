"""The in-process cache on its own: bounds, staleness, single flight, and
invalidation racing a fill. Real threads throughout."""

import threading

import pytest

from pyramid_dbtune import Rows
from pyramid_dbtune.cache import (
    HIT,
    MISS,
    STALE,
    WAITED,
    MemoryCache,
    NullCache,
    Watch,
)
from pyramid_dbtune.cache import memory as memory_module
from pyramid_dbtune.sql.shapes import Change, read_shape

T = frozenset(['t'])


def rows(*values):
    return Rows(('v',), [(v,) for v in values])


def key(name):
    return ('m\0' + name, ())


def fill(value):
    return value


@pytest.fixture
def clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(memory_module, 'monotonic', lambda: now[0])
    return now


def test_hit_and_miss():
    cache = MemoryCache()
    assert cache.get_or_fill(key('a'), 10, T, fill, rows(1)) == (rows(1), MISS)
    assert cache.get_or_fill(key('a'), 10, T, fill, rows(2)) == (rows(1), HIT)
    assert (cache.hits, cache.misses, len(cache)) == (1, 1, 1)


def test_lru_bound_on_entries_evicts_least_recently_used():
    cache = MemoryCache(max_entries=2)
    for name in 'abc'[:2]:
        cache.get_or_fill(key(name), 10, T, fill, rows(name))
    cache.get_or_fill(key('a'), 10, T, fill, None)  # a is now recent
    cache.get_or_fill(key('c'), 10, T, fill, rows('c'))
    assert len(cache) == 2 and cache.evictions == 1
    assert cache.get_or_fill(key('a'), 10, T, fill, None)[1] == HIT
    assert cache.get_or_fill(key('b'), 10, T, fill, rows('b'))[1] == MISS


def test_bound_on_bytes():
    one = memory_module.estimate_size(key('a'), rows(*range(100)))
    cache = MemoryCache(max_bytes=int(one * 2.5))
    for name in 'abc':
        cache.get_or_fill(key(name), 10, T, fill, rows(*range(100)))
    assert len(cache) == 2 and cache.evictions == 1
    assert cache.bytes <= cache.max_bytes


def test_what_json_values_and_arrays_hold_counts_toward_the_bound():
    text = 'x' * 100_000
    for value in ({'html': text}, [text], [[{'deep': text}]]):
        cache = MemoryCache(max_bytes=50_000)
        cache.get_or_fill(key('a'), 10, T, fill, rows(value))
        assert len(cache) == 0 and cache.too_big == 1, value


def test_rows_that_a_change_grows_count_toward_the_bound():
    shape = read_shape(
        'SELECT id, body FROM doc WHERE area = :area ORDER BY id', {'doc'}
    )

    def read(area, fill=None):
        watch = Watch({'doc'}, shape, {'area': area}, 100)
        return cache.get_or_fill(('docs', (area,), (int,)), 600, watch, fill)

    def grow(area, xid, was='short', size=10_000):
        for i in range(5):
            old = {'id': area * 100 + i, 'area': area, 'body': was}
            new = {**old, 'body': 'y' * size}
            cache.invalidate({'doc'}, [Change('doc', (old,), (new,), xid + i)])

    cache = MemoryCache(max_bytes=200_000)
    for area in range(4):
        held = Rows(
            ('id', 'body'),
            [(area * 100 + i, 'short') for i in range(5)],
            snapshot=(10, 10, ()),
        )
        read(area, lambda held=held: held)
    before = cache.bytes
    grow(0, 20)
    value, status = read(0)
    assert status == HIT and value[0].body == 'y' * 10_000
    assert cache.bytes > before + 49_000
    # Past the bound: the others make room, the least recently used first
    # (areas 2 and 3, of 1.6 kB each: one is not room enough), as much as
    # it takes.
    cache.max_bytes = cache.bytes + (cache.bytes - before) - 2_000
    grow(1, 40)
    assert read(1)[1] == HIT
    assert (len(cache), cache.evictions) == (2, 2)
    assert cache.bytes <= cache.max_bytes
    # Grown past it alone: it goes.
    grow(1, 60, was='y' * 10_000, size=30_000)
    assert read(1, lambda: rows(1)) == (rows(1), MISS)
    assert cache.too_big == 1 and cache.bytes <= cache.max_bytes
    assert len(cache) == 2  # area 0 made no room for it


def test_a_write_whose_changes_grow_rows_past_the_bound_drops_the_rest():
    # Many changes for each read: each catches up as it is told, and the
    # first that grows past the bound has others make room, which the
    # write then need not tell.
    shape = read_shape(
        'SELECT id, body FROM doc WHERE area = :area ORDER BY id', {'doc'}
    )
    count = memory_module.MAX_PENDING + 1
    cache = MemoryCache()
    for area in range(3):
        held = Rows(
            ('id', 'body'),
            [(area * 1000 + i, 'a') for i in range(count)],
            snapshot=(10, 10, ()),
        )
        watch = Watch({'doc'}, shape, {'area': area}, 1000)
        cache.get_or_fill(('docs', (area,)), 60, watch, lambda h=held: h)
    note = frozenset(['note'])
    cache.get_or_fill(key('note'), 60, note, fill, rows(1))
    cache.max_bytes = cache.bytes + 100 * count  # room for one grown
    changes = [
        Change(
            'doc',
            ({'id': area * 1000 + i, 'area': area, 'body': 'a'},),
            ({'id': area * 1000 + i, 'area': area, 'body': 'b' * 300},),
            20 + area * 1000 + i,
        )
        for area in range(3)
        for i in range(count)
    ]
    cache.invalidate({'doc', 'note'}, changes)
    assert cache.bytes <= cache.max_bytes and cache.evictions >= 2
    # The rest of the write was told: the note's read is dropped.
    assert cache.get_or_fill(key('note'), 60, note, fill, rows(2))[1] == MISS


def test_value_larger_than_the_bound_is_returned_not_stored():
    cache = MemoryCache(max_bytes=1000)
    big = rows(*range(1000))
    assert cache.get_or_fill(key('a'), 10, T, fill, big) == (big, MISS)
    assert len(cache) == 0 and cache.too_big == 1 and cache.bytes == 0


def test_refill_of_an_expired_key_replaces_it(clock):
    cache = MemoryCache()
    cache.get_or_fill(key('a'), 10, T, fill, rows(1))
    clock[0] += 11
    assert cache.get_or_fill(key('a'), 10, T, fill, rows(2)) == (rows(2), MISS)
    assert len(cache) == 1
    assert cache.bytes == memory_module.estimate_size(key('a'), rows(2))


class SlowFill:
    """A fill that blocks until released, and says when it has started."""

    def __init__(self, value=None, error=None):
        self.value, self.error = value, error
        self.started = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def __call__(self):
        self.calls += 1
        self.started.set()
        assert self.release.wait(10)
        if self.error:
            raise self.error
        return self.value


def in_thread(function, *args):
    result = {}

    def run():
        try:
            result['value'] = function(*args)
        except Exception as exc:
            result['error'] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def test_expired_entry_is_served_stale_while_one_thread_refreshes(clock):
    cache = MemoryCache()
    cache.get_or_fill(key('a'), 10, T, fill, rows('old'))
    clock[0] += 11
    slow = SlowFill(rows('new'))
    thread, result = in_thread(cache.get_or_fill, key('a'), 10, T, slow)
    assert slow.started.wait(10)
    # Others get the old rows at once rather than queueing behind it.
    for _ in range(3):
        assert cache.get_or_fill(key('a'), 10, T, fill, None) == (
            rows('old'),
            STALE,
        )
    slow.release.set()
    thread.join()
    assert result['value'] == (rows('new'), MISS)
    assert cache.get_or_fill(key('a'), 10, T, fill, None) == (rows('new'), HIT)
    assert slow.calls == 1 and cache.stale == 3


def test_waiters_share_the_fill_and_its_error():
    cache = MemoryCache()
    slow = SlowFill(error=RuntimeError('database down'))
    leader, led = in_thread(cache.get_or_fill, key('a'), 10, T, slow)
    assert slow.started.wait(10)
    waiters = [
        in_thread(cache.get_or_fill, key('a'), 10, T, fill, rows(1))
        for _ in range(4)
    ]
    while cache.waited < 4:
        threading.Event().wait(0.001)
    slow.release.set()
    for thread, _ in [(leader, led), *waiters]:
        thread.join()
    assert str(led['error']) == 'database down'
    assert all(str(r['error']) == 'database down' for _, r in waiters)
    assert slow.calls == 1 and len(cache) == 0
    # Nothing is left in flight: the next caller fills again.
    assert cache.get_or_fill(key('a'), 10, T, fill, rows(1))[1] == MISS


def test_waiters_get_the_leaders_rows():
    cache = MemoryCache()
    slow = SlowFill(rows(7))
    leader, led = in_thread(cache.get_or_fill, key('a'), 10, T, slow)
    assert slow.started.wait(10)
    waiter, got = in_thread(cache.get_or_fill, key('a'), 10, T, fill, None)
    while not cache.waited:
        threading.Event().wait(0.001)
    slow.release.set()
    leader.join()
    waiter.join()
    assert led['value'] == (rows(7), MISS)
    assert got['value'] == (rows(7), WAITED)


def test_invalidation_during_a_fill_discards_its_rows():
    cache = MemoryCache()
    slow = SlowFill(rows('read before the write committed'))
    thread, result = in_thread(cache.get_or_fill, key('a'), 10, T, slow)
    assert slow.started.wait(10)
    cache.invalidate({'t'})
    slow.release.set()
    thread.join()
    assert result['value'][1] == MISS
    assert len(cache) == 0 and cache.discarded == 1


def test_invalidation_of_another_table_keeps_the_fill():
    cache = MemoryCache()
    slow = SlowFill(rows(1))
    thread, _ = in_thread(cache.get_or_fill, key('a'), 10, T, slow)
    assert slow.started.wait(10)
    cache.invalidate({'other'})
    slow.release.set()
    thread.join()
    assert len(cache) == 1


def test_invalidate_by_table_and_all():
    cache = MemoryCache()
    both = frozenset(['t', 'u'])
    cache.get_or_fill(key('t'), 10, T, fill, rows(1))
    cache.get_or_fill(key('tu'), 10, both, fill, rows(2))
    cache.get_or_fill(key('u'), 10, frozenset(['u']), fill, rows(3))
    cache.get_or_fill(key('none'), 10, frozenset(), fill, rows(4))
    cache.invalidate({'t'})
    assert len(cache) == 2 and cache.invalidations == 2
    assert cache.get_or_fill(key('u'), 10, T, fill, None)[1] == HIT
    cache.invalidate({'nothing', 'u'})
    assert len(cache) == 1
    cache.invalidate(None)
    assert len(cache) == 0 and cache.bytes == 0
    assert cache.invalidations == 4


def test_null_cache_always_fills():
    cache = NullCache()
    assert cache.get_or_fill(key('a'), 10, T, fill, 1) == (1, MISS)
    assert cache.get_or_fill(key('a'), 10, T, fill, 2) == (2, MISS)
    cache.invalidate(None)


def test_key_size_counts_the_arguments():
    small = memory_module.estimate_size(('m', ('a',), (str,)), rows())
    big = memory_module.estimate_size(('m', ('a' * 10**6,), (str,)), rows())
    assert big - small >= 10**6 - 1
    listed = memory_module.estimate_size(
        ('m', (((str, 'a' * 10**6),),), (tuple,)), rows()
    )
    assert listed - small >= 10**6 - 1


def test_large_arguments_do_not_outgrow_max_bytes(apps, sqlite_url):
    """150 cached reads whose argument is 1 MB each, under max_bytes = 1MiB:
    the process keeps at most 4 MB more than before them."""
    from conftest import SEARCH, kept_by_large_calls

    app = apps(sqlite_url, [SEARCH], {'dbtune.cache.max_bytes': '1MiB'})
    kept = kept_by_large_calls(app)
    assert kept <= 4 * 2**20, f'{kept / 2**20:.1f} MiB kept'


def test_a_change_reaching_a_read_by_two_tags_is_applied_once():
    from pyramid_dbtune.cache import Watch
    from pyramid_dbtune.sql.shapes import Change, read_shape

    shape = read_shape(
        'SELECT id, rent FROM t WHERE id = :id AND area = :area', {'t'}
    )
    watch = Watch({'id', 'area'}, shape, {'id': 1, 'area': 'x'}, 10)
    cache = MemoryCache()
    held = Rows(('id', 'rent'), [(1, 5)], snapshot=(10, 10, frozenset()))
    cache.get_or_fill(key('a'), 60, watch, fill, held)
    image = {'id': 1, 'area': 'x', 'rent': 5}
    change = Change('t', (image,), ({**image, 'rent': 6},), 11)
    cache.invalidate({'id', 'area'}, [change])
    value, status = cache.get_or_fill(key('a'), 60, watch, fill, None)
    assert status == HIT and value.tuples() == ((1, 6),)
    assert cache.patches == 1 and cache.patched == {'m\0a': 1}


def test_changes_apply_when_a_read_is_next_asked_for():
    """A change is noted against the reads it may touch, and applied to
    one when it is next asked for: in order, with those after it. Too
    many changes waiting, and they are applied then; rows they cannot be
    applied to are dropped."""
    from pyramid_dbtune.cache import Watch
    from pyramid_dbtune.cache.memory import MAX_PENDING
    from pyramid_dbtune.sql.shapes import Change, read_shape

    shape = read_shape('SELECT count(*) FROM t WHERE area = :area', {'t'})
    watch = Watch({'area'}, shape, {'area': 'x'}, 0)
    cache = MemoryCache()
    held = Rows(('count',), [(5,)], snapshot=(10, 10, frozenset()))
    for name in ('a', 'b'):
        cache.get_or_fill(key(name), 60, watch, fill, held)
    image = {'area': 'x'}
    for xid in range(11, 14):  # three rows come
        cache.invalidate({'area'}, [Change('t', (), (image,), xid)])
    assert cache.patches == 0  # nothing asked for them yet
    value, status = cache.get_or_fill(key('a'), 60, watch, fill, None)
    assert status == HIT and value.tuples() == ((8,),)
    assert cache.patches == 1
    elsewhere = {'area': 'y'}  # told by tag, but not one of its rows
    for xid in range(14, 14 + MAX_PENDING):
        cache.invalidate({'area'}, [Change('t', (), (elsewhere,), xid)])
    # 'a' has 64 changes waiting; 'b' had 67, applied as the last came.
    assert cache.patches == 2
    value, status = cache.get_or_fill(key('a'), 60, watch, fill, held)
    assert status == HIT and value.tuples() == ((8,),)
    value, status = cache.get_or_fill(key('b'), 60, watch, fill, held)
    assert status == HIT and value.tuples() == ((8,),)
    assert cache.patches == 2 and cache.invalidations == 0
    # Changes that cannot be applied (no snapshot tells which it holds,
    # and they touch it) drop it, as they come or when it is read.
    unsure = {'area': 'x'}
    for _ in range(MAX_PENDING + 1):
        cache.invalidate({'area'}, [Change('t', (), (unsure,), None)])
    assert cache.get_or_fill(key('b'), 60, watch, fill, held)[1] == MISS
    assert cache.invalidations == 2


def test_an_entry_gives_the_garbage_collector_little_to_walk(sqlite_url):
    """A cache of many thousand entries is walked by every full
    collection, which stops the process: what an entry holds beside its
    records is plain tuples, which the collector stops tracking, and its
    watch has no dict."""
    import gc

    import sqlalchemy as sa

    from pyramid_dbtune.cache import Watch
    from pyramid_dbtune.routing.connect import fetch
    from pyramid_dbtune.sql.shapes import parse_snapshot, read_shape

    snapshot = parse_snapshot('100:105:101,103')
    shape = read_shape('SELECT v FROM t WHERE v = :v', {'t'})
    watch = Watch({'t'}, shape, {'v': 1}, 10)
    assert not hasattr(watch, '__dict__')
    engine = sa.create_engine(sqlite_url)
    with engine.connect() as connection:
        result = connection.exec_driver_sql(
            'SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL '
            'SELECT 4 ORDER BY 1'
        )
        held = fetch(result, 2, snapshot=snapshot)
    engine.dispose()
    values = held.held()[0]
    assert values == [(1,), (2,), (3,)] and held.tuples() == ((1,), (2,))
    assert all(type(v) is tuple for v in values)  # no driver rows kept
    gc.collect()
    gc.collect()
    assert not gc.is_tracked(held.snapshot)
    assert not any(gc.is_tracked(v) for v in values)


def _ordered(sqlite_url, sql, values, max_rows):
    """A cache fill of ``values`` (``(id, rent)`` pairs, in order) as
    :func:`~pyramid_dbtune.routing.connect.fetch` holds them."""
    import sqlalchemy as sa

    from pyramid_dbtune.routing.connect import fetch
    from pyramid_dbtune.sql.shapes import parse_snapshot

    engine = sa.create_engine(sqlite_url)
    with engine.connect() as connection:
        result = connection.exec_driver_sql(
            ' UNION ALL '.join(
                f'SELECT {i} AS id, {r} AS rent' for i, r in values
            )
        )
        held = fetch(result, max_rows, snapshot=parse_snapshot('10:10:'))
    engine.dispose()
    return held


@pytest.mark.parametrize('order', ['rent, id', 'rent DESC, id'])
def test_a_change_after_the_rows_a_read_holds_is_passed_over(
    sqlite_url, order
):
    """An ordered read that had more rows than it holds: a change whose
    rows all come after the last it holds is passed over as it comes
    (not kept waiting, not patched in); one that may come before it, or
    whose place cannot be told, is applied."""
    from pyramid_dbtune.cache import Watch
    from pyramid_dbtune.sql.shapes import Change, read_shape

    descending = 'DESC' in order
    sql = f'SELECT id, rent FROM t WHERE area = :area ORDER BY {order}'
    shape = read_shape(sql, {'t'})
    watch = Watch({'area'}, shape, {'area': 'x'}, 2)
    rents = [10, 20, 30, 40, 50]
    values = list(enumerate(reversed(rents) if descending else rents, 1))
    held = _ordered(sqlite_url, sql, values, 2)  # 2 kept, 1 in reserve
    cache = MemoryCache()
    cache.get_or_fill(key('a'), 60, watch, fill, held)

    def told(*changes):
        cache.invalidate({'area'}, [Change('t', *c, 11) for c in changes])
        return cache.get_or_fill(key('a'), 60, watch, fill, held)[0]

    def image(id_, rent):
        return {'id': id_, 'area': 'x', 'rent': rent}

    # Row 5, beyond the three held, moves: still beyond them.
    last = rents[0] if descending else rents[-1]
    past = 15 if descending else 45
    assert told(((image(5, last),), (image(5, past),))) is held
    assert cache.passed_over == 1 and cache.patches == 0
    # A row that ties with the last held (the third) may come before it.
    edge = held.held()[0][-1]
    assert edge[1] == 30
    patched = told(((), (image(0, 30),)))
    assert patched.held()[0][-1] == (0, 30)
    assert cache.passed_over == 1 and cache.patches == 1
    # A row whose rent is not a number (NULL) is not passed over: where
    # it goes is not told, and the rows are dropped.
    told(((), (image(8, None),)))
    assert cache.passed_over == 1 and cache.invalidations == 1


def test_a_read_that_holds_all_its_rows_passes_no_change_over(sqlite_url):
    from pyramid_dbtune.cache import Watch
    from pyramid_dbtune.sql.shapes import Change, read_shape

    sql = 'SELECT id, rent FROM t WHERE area = :area ORDER BY rent, id'
    watch = Watch({'area'}, read_shape(sql, {'t'}), {'area': 'x'}, 5)
    held = _ordered(sqlite_url, sql, [(1, 10), (2, 20)], 5)
    cache = MemoryCache()
    cache.get_or_fill(key('a'), 60, watch, fill, held)
    came = {'id': 3, 'area': 'x', 'rent': 99}
    cache.invalidate({'area'}, [Change('t', (), (came,), 11)])
    value = cache.get_or_fill(key('a'), 60, watch, fill, None)[0]
    assert value.tuples() == ((1, 10), (2, 20), (3, 99))
    assert cache.passed_over == 0 and cache.patches == 1


def test_a_read_ordered_by_text_passes_no_change_over(sqlite_url):
    """Strings are ordered by the database's collation, not Python's."""
    from pyramid_dbtune.cache import Watch
    from pyramid_dbtune.sql.shapes import Change, read_shape

    sql = 'SELECT id, rent FROM t WHERE area = :area ORDER BY rent, id'
    watch = Watch({'area'}, read_shape(sql, {'t'}), {'area': 'x'}, 1)
    held = _ordered(sqlite_url, sql, [(1, "'a'"), (2, "'b'"), (3, "'c'")], 1)
    cache = MemoryCache()
    cache.get_or_fill(key('a'), 60, watch, fill, held)
    came = {'id': 4, 'area': 'x', 'rent': 'z'}
    cache.invalidate({'area'}, [Change('t', (), (came,), 11)])
    cache.get_or_fill(key('a'), 60, watch, fill, held)
    assert cache.passed_over == 0


def test_a_nan_is_never_passed_over():
    """PostgreSQL's numeric NaN sorts after every number; Python does not
    order it at all: no change is passed over by it."""
    from decimal import Decimal

    from pyramid_dbtune.cache import Watch
    from pyramid_dbtune.sql.shapes import Change, read_shape

    sql = 'SELECT id, rent FROM t WHERE area = :area ORDER BY rent, id'
    watch = Watch({'area'}, read_shape(sql, {'t'}), {'area': 'x'}, 1)
    cache = MemoryCache()
    nan = Decimal('NaN')
    for name, last in (('number', Decimal(3)), ('nan', nan)):
        held = Rows(('id', 'rent'), [(1, Decimal(1))], snapshot=(10, 10, ()))
        held = held.derive([(1, Decimal(1)), (2, last)], True, 1)
        cache.get_or_fill(key(name), 60, watch, fill, held)
    image = {'id': 9, 'area': 'x', 'rent': nan}
    for rents in ((nan, Decimal(50)), (Decimal(50), Decimal(60))):
        old, new = ({**image, 'rent': rent} for rent in rents)
        cache.invalidate({'area'}, [Change('t', (old,), (new,), 11)])
    assert cache.passed_over == 1  # 50 -> 60, after the number's 3 only
