"""The metrics of :mod:`.stats`, as prometheus_client's own types, and
the readers of what the cache and the router count.

One histogram of latencies and a few counters per route, the process's
and the cache's and router's counters, in a registry of the application's.
"""

import os
import threading
from collections import deque
from time import monotonic

#: Held by whoever reads or writes this process's metrics (a request
#: counted, a carry), and around each fork. In multiprocess mode
#: prometheus_client guards every value of the process with one lock: a
#: child forked while another thread held it would find it held for good,
#: and hang in ``os.fork`` as it makes its metrics anew.
updating = threading.RLock()
os.register_at_fork(
    before=updating.acquire,
    after_in_parent=updating.release,
    after_in_child=updating.release,
)

BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
"""Upper bounds of the latency histogram, in seconds (Prometheus ``le``;
prometheus_client adds ``+Inf``)."""
#: One request in this many has its thread's CPU time measured (reading a
#: thread's CPU clock is a system call: under a microsecond, twice).
CPU_EVERY = 64
#: Latencies kept per route for its percentiles, and for a point of the
#: chart (the last of its interval).
RECENT = 1000
#: The cache's counters, as the backends name them.
CACHE_COUNTERS = (
    'hits', 'misses', 'stale', 'waited', 'evictions', 'invalidations',
    'errors', 'rejected', 'too_big', 'discarded', 'unencodable',
    'near_hits', 'patches',
)  # fmt: skip
#: The router's counters: metric name, help, and its attribute.
DATABASE = (
    ('dbtune_db_writes', 'Writing SQL method calls', 'writes'),
    ('dbtune_db_write_transactions', 'Transactions that took a write slot',
     'write_transactions'),
    ('dbtune_db_failovers', 'Reads sent to the writer, their reader down',
     'failovers'),
    ('dbtune_write_slot_waits', 'Writes that waited for a slot',
     'write_waits'),
    ('dbtune_write_slot_wait_seconds', 'Time writes waited for a slot',
     'write_wait_seconds'),
    ('dbtune_db_behind', 'Reads sent to the writer, every reader too far '
     'behind (dbtune.max_replica_lag)', 'behind'),
)  # fmt: skip


class Route:
    """One route's children of the metrics, its last latencies, and the
    ``(queries, database seconds)`` of its requests not yet counted."""

    __slots__ = (
        'duration', 'errors', 'queries', 'db_seconds', 'recent', 'pending',
    )  # fmt: skip

    def __init__(self, metrics, name):
        self.duration = metrics['duration'].labels(route=name)
        self.errors = metrics['errors'].labels(route=name)
        self.queries = metrics['queries'].labels(route=name)
        self.db_seconds = metrics['db_seconds'].labels(route=name)
        self.recent = deque(maxlen=RECENT)
        self.pending = deque()


def make_metrics(registry):
    """The metrics of one process, registered in ``registry``."""
    from prometheus_client import Counter, Gauge, Histogram

    def counter(name, text, *labels):
        return Counter(name, text, labels, registry=registry)

    def gauge(name, text, *labels, mode='livesum'):
        return Gauge(
            name, text, labels, registry=registry, multiprocess_mode=mode
        )

    metrics = {
        'duration': Histogram(
            'dbtune_request_duration_seconds',
            'Time in the app, by route',
            ['route'],
            registry=registry,
            buckets=BUCKETS,
        ),
        'errors': counter(
            'dbtune_request_errors',
            'Requests answered 5xx or failed, by route',
            'route',
        ),  # fmt: skip
        'queries': counter(
            'dbtune_route_queries', 'Statements run, by route', 'route'
        ),
        'db_seconds': counter(
            'dbtune_route_db_seconds', 'Database time, by route', 'route'
        ),
        'measured': counter(
            'dbtune_measured_request_seconds',
            f'Wall, CPU and runnable-not-running (estimate) time of 1 '
            f'request in {CPU_EVERY}',
            'kind',
        ),
        'measured_requests': counter(
            'dbtune_measured_requests', f'Requests measured, 1 in {CPU_EVERY}'
        ),
        'in_flight': gauge('dbtune_requests_in_flight', 'Requests running'),
        'peak': gauge(
            'dbtune_requests_in_flight_peak',
            'The most requests at once',
            mode='max',
        ),  # fmt: skip
        'cpu': counter(
            'dbtune_process_cpu_seconds', 'CPU time of the process'
        ),
        'cache': counter(
            'dbtune_cache_events', 'Cache outcomes and events', 'event'
        ),
        'reads': counter('dbtune_db_reads', 'Reads, by role', 'role'),
        'dropped': counter(
            'dbtune_cache_dropped',
            'Cached values of a SQL method dropped by writes',
            'method',
        ),
        'patched': counter(
            'dbtune_cache_patched',
            'Cached values of a SQL method changed in place by writes',
            'method',
        ),
        'untold': counter(
            'dbtune_untold_writes',
            'Writes whose rows could not be told, by SQL method',
            'method',
        ),
        'changes': counter(
            'dbtune_changes',
            'What the listener of changes made anywhere counts',
            'event',
        ),
        'pool': gauge(
            'dbtune_pool_connections',
            'Pooled connections, by role and state',
            'role',
            'state',
        ),  # fmt: skip
    }
    for name, text, _ in DATABASE:
        metrics[name] = counter(name, text)
    return metrics


def samples(*metrics):
    """``{(sample name, labels): value}`` of ``metrics``, this process's
    (in multiprocess mode too: a metric reads its own process's values)."""
    with updating:
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for metric in metrics
            for family in metric.collect()
            for sample in family.samples
        }


def cache_counters(cache):
    """``{name: count}`` of what ``cache`` counts, of
    :data:`CACHE_COUNTERS` (hits and misses at least)."""
    return {
        name: getattr(cache, name)
        for name in CACHE_COUNTERS
        if hasattr(cache, name)
    } or {'hits': 0, 'misses': 0}


_FIGURES = ('dropped', 'patched', 'untold_writes')


def method_figures(dbtune):
    """SQL method: ``dropped``, its cached values lost to writes (with
    memcached, as this process's reads found them), ``patched``, those
    that writes changed in place (in process), and ``untold_writes``, its
    writes whose rows could not be told (``ORM <table>`` for flushes);
    for the methods with any."""
    figures = {}
    cache = dbtune.cache
    for figure in ('dropped', 'patched'):
        for key, count in list(getattr(cache, figure, {}).items()):
            name = key.split('\0', 1)[0]
            figures.setdefault(name, dict.fromkeys(_FIGURES, 0))
            figures[name][figure] += count
    untold = dbtune.router.untold if dbtune.router is not None else {}
    for name, count in list(untold.items()):
        figures.setdefault(name, dict.fromkeys(_FIGURES, 0))
        figures[name]['untold_writes'] = count
    return dict(sorted(figures.items()))


#: What the listener of ``dbtune.cache.listen`` counts: figure, attribute.
LISTENER = (
    ('changes_heard', 'notices'),
    ('changes_own', 'own'),
    ('listener_connects', 'connects'),
    ('listener_failures', 'failures'),
    ('listener_dropped_all', 'drops'),
    ('listener_late', 'late'),
)


def listener_figures(dbtune):
    """What the listener counts, ``{}`` without one."""
    listener = dbtune.listener
    if listener is None:
        return {}
    return {name: getattr(listener, attribute) for name, attribute in LISTENER}


def database_figures(router):
    """What ``router`` counts, by role and in all; ``{}`` for none."""
    if router is None:
        return {}
    roles = {
        'writer': {
            'url': router.key,
            'reads': router.writer_reads,
            'writes': router.writes,
            **_pool(router.writer.pool),
        }
    }
    if router.replicas:  # a pool of its own on the writer's database
        roles['writer_read_only'] = {
            'url': router.key,
            'reads': router.read_only_writer_reads,
            **_pool(router.read_only_writer.pool),
        }
    for i, reader in enumerate(router.readers):
        roles[f'reader{i}'] = {
            'url': reader.name,
            'reads': reader.reads,
            'in_flight': reader.in_flight,
            'down': reader.down_until > monotonic(),
            **_pool(reader.engine.pool),
        }
        if router.lag_watch is not None:
            lag = reader.lag
            # Not known, or infinite (not replaying): no number.
            known = lag is not None and lag != float('inf')
            roles[f'reader{i}']['lag'] = round(lag, 3) if known else None
    return {
        'roles': roles,
        'write_transactions': router.write_transactions,
        'failovers': router.failovers,
        'write_waits': router.write_waits,
        'write_wait_seconds': router.write_wait_seconds,
        'behind': router.behind,
    }


def _pool(pool):
    """How busy a SQLAlchemy pool is, when its class says (QueuePool)."""
    if not hasattr(pool, 'checkedout'):
        return {}
    return {
        'pool_size': pool.size(),
        'in_use': pool.checkedout(),
        'idle': pool.checkedin(),
        'overflow': max(0, pool.overflow()),
    }


def cache_size(cache):
    """The entries and bytes a cache in memory holds; ``{}`` for others."""
    if not hasattr(cache, 'bytes'):
        return {}
    return {'entries': len(cache), 'bytes': cache.bytes}
