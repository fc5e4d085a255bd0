"""Per-process figures, cheap enough to leave on: ``dbtune.stats = true``.

The timing tween (:mod:`.tweens`) counts each finished request into the
:class:`Figures` of its thread; everything else (the cache's and the router's
counters, the pools, the process's CPU time) is read when somebody asks,
from ``/_dbtune/stats`` (JSON) or ``/_dbtune/metrics`` (Prometheus text).

The parallelism figures answer "am I threading?":

``in_flight``
    requests running now, and the most seen at once (``peak_in_flight``).
``cpu_ratio``
    CPU time the process used over the wall time that passed. Above 1.0
    only when more than one core worked at once (the GIL lets one thread
    run Python at a time; C code that releases it, such as a database
    driver waiting for its answer, does not hold it).
``runnable_ratio``
    an estimate of the share of request time spent ready to run but not
    running: waiting for the GIL, or for a core. Measured on one request
    in :data:`CPU_EVERY` (reading a thread's CPU clock is a system call,
    under a microsecond, twice a request) as its wall time, less its
    thread's CPU time, less the time it was known to wait (database calls,
    write slot), never below 0. Anything else a request waits for
    (reading its body, files, calls to other services, sleeps) counts here
    too, and a database call's own CPU time is taken off twice, so read it
    as a hint, not a measure.
"""

import contextlib
import fcntl
import itertools
import json
import logging
import os
import threading
import time
import weakref
from collections import deque
from time import monotonic, perf_counter, process_time, thread_time

from ..deploy import forks
from .access import PREFIX, ROUTE_PREFIX

log = logging.getLogger(__name__)

#: Upper bounds of the latency histogram, in seconds (Prometheus ``le``).
BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, float('inf'),
)  # fmt: skip
#: One request in this many has its thread's CPU time measured (reading a
#: thread's CPU clock is a system call: under a microsecond, twice).
CPU_EVERY = 64
#: Seconds a point of the dashboard's chart covers, and how many are kept.
TICK = 2.0
HISTORY = 300
#: ``recent_cpu_ratio`` is the mean of this many of the chart's last points:
#: 30 seconds of them while requests come.
RECENT_CPU = round(30 / TICK)
#: Latencies kept per route (of every thread) for its percentiles, and for
#: a point of the chart (the last of its interval).
RECENT = 1000
#: Requests that match no route are counted under this name.
NO_ROUTE = '(no route)'
#: Routes counted apart, at most; the requests of any more are counted
#: together under :data:`OTHER_ROUTES`.
MAX_ROUTES = 500
OTHER_ROUTES = '(other routes)'
#: Seconds between two writes of a process's file (multi-process).
FLUSH_EVERY = 1.0
#: The cache's counters, as the backends name them.
CACHE_COUNTERS = (
    'hits', 'misses', 'stale', 'waited', 'evictions', 'invalidations',
    'errors', 'rejected', 'too_big', 'discarded', 'unencodable',
    'near_hits',
)  # fmt: skip


class Route:
    """What one route's requests took, in one thread.

    ``recent`` is the route's last :data:`RECENT` latencies, one deque that
    every thread's :class:`Route` of that route shares (appending to a
    deque is atomic), so that what is kept does not grow with the threads.
    """

    __slots__ = (
        'errors', 'seconds', 'queries', 'db_seconds', 'buckets', 'recent',
    )  # fmt: skip

    def __init__(self, recent=None):
        self.errors = self.queries = 0
        self.seconds = self.db_seconds = 0.0
        self.buckets = [0] * len(BUCKETS)
        self.recent = recent

    @property
    def requests(self):
        """The requests counted: those of the histogram's buckets (one
        figure fewer to keep on a request's path)."""
        return sum(self.buckets)

    def add(self, other):
        """Add ``other``'s counts to this one's."""
        self.errors += other.errors
        self.seconds += other.seconds
        self.queries += other.queries
        self.db_seconds += other.db_seconds
        self.buckets = [
            a + b for a, b in zip(self.buckets, other.buckets, strict=True)
        ]


class Figures:
    """One thread's figures: only that thread writes them, so they need no
    lock; :meth:`Stats.snapshot` adds up every thread's."""

    __slots__ = ('routes', 'measured', 'wall', 'cpu', 'runnable')

    def __init__(self):
        #: route name -> :class:`Route` (``None``: not counted)
        self.routes = {}
        self.measured = 0
        self.wall = self.cpu = self.runnable = 0.0


def percentile(ordered, fraction):
    """The value below which ``fraction`` of ``ordered`` lies (nearest
    rank); 0 for no values."""
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def route_name(request):
    """The name of the route ``request`` matched, or :data:`NO_ROUTE`."""
    route = getattr(request, 'matched_route', None)
    return NO_ROUTE if route is None else route.name


def operators(request):
    """True for a request to one of the operator's ``/_dbtune/`` views
    (known from its path, before any route is matched)."""
    return request.environ.get('PATH_INFO', '').startswith(PREFIX)


class Stats:
    """The figures of one process; ``registry.dbtune.stats``.

    ``active`` maps each thread running a request to its request; the
    profiler reads it too. Each thread counts its requests in
    :class:`Figures` of its own, without a lock.
    """

    def __init__(self, runtime, active, multiprocess_dir=None):
        self.runtime = runtime
        self.active = active
        self.multiprocess_dir = multiprocess_dir
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._flusher = None
        self._write_failed = False
        self.reset()
        forks.renew_after_fork(self)

    def after_fork(self):
        """In a forked child: a new lock, figures of its own, and no
        request running (the parent's threads are not here)."""
        self._lock = threading.Lock()
        self.pid = os.getpid()
        self.active.clear()
        self.reset()

    def reset(self):
        """Start every figure again from 0."""
        with self._lock:
            #: thread id -> :class:`Figures`
            self.threads = {}
            #: the figures of threads that ended, added up
            self._ended = Figures()
            #: route name -> its latencies (:attr:`Route.recent`)
            self._recent = {}
            self.peak_in_flight = 0
            self.started = (time.time(), perf_counter(), process_time())
            self.history = deque(maxlen=HISTORY)
            #: the latencies of the chart's current point (the last ones)
            self.window = deque(maxlen=RECENT)
            # The first request ticks: it writes this process's file, and
            # the chart's first point starts there.
            self._last_tick = None
            self.next_tick = 0.0

    # On the request path: the timing tween counts each request into the
    # Route of its thread and route name; these are its slower turns.

    def new_thread(self, ident):
        """The :class:`Figures` of thread ``ident``, at its first request."""
        mine = self.threads[ident] = Figures()
        return mine

    def new_route(self, mine, name):
        """The first request of route ``name`` in this thread: its
        :class:`Route`, or None for the operator's own views."""
        if name.startswith(ROUTE_PREFIX):
            # The operator's own views are not the site's traffic.
            mine.routes[name] = None
            return None
        with self._lock:
            recent = self._recent.get(name)
            if recent is None:
                if len(self._recent) >= MAX_ROUTES:
                    # Not kept under its name: each of its requests comes
                    # here again, and is counted with the other routes.
                    name = OTHER_ROUTES
                    recent = self._recent.get(name)
                if recent is None:
                    recent = self._recent[name] = deque(maxlen=RECENT)
        route = mine.routes.get(name)
        if route is None:
            route = mine.routes[name] = Route(recent)
        return route

    def measured(self, mine, seconds, cpu_start, context):
        """Count a request of this thread (``mine``) that took ``seconds``
        and had its thread's CPU clock read at its start (``cpu_start``):
        one in :data:`CPU_EVERY`."""
        cpu = thread_time() - cpu_start
        waited = 0.0
        if context is not None:
            waited = context.db_seconds + context.unit.write_wait
        mine.measured += 1
        mine.wall += seconds
        mine.cpu += cpu
        mine.runnable += max(0.0, seconds - cpu - waited)

    def note_peak(self):
        """A request started with more in flight than the peak so far
        (operator's views included): count them as :meth:`in_flight`
        does."""
        running = self.in_flight()
        if running > self.peak_in_flight:
            self.peak_in_flight = running

    def tick(self, now):
        """Close the chart's current point (at most once a :data:`TICK`)."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            if now < self.next_tick:
                return
            last = self._last_tick
            if last is not None:
                window, self.window = self.window, deque(maxlen=RECENT)
            cpu, cache = process_time(), self._cache()
            # The first point counts from the start, as its window does.
            served = 0 if last is None else self._served()
            self._last_tick = (now, cpu, cache, served)
            self.next_tick = now + TICK
        finally:
            self._lock.release()
        if self.multiprocess_dir is not None and self._flusher != os.getpid():
            self._start_flusher()
        if last is None:
            return
        then, then_cpu, then_cache, then_served = last
        ordered = sorted(window)  # the last RECENT of the point's
        hits = cache['hits'] - then_cache['hits']
        looked = hits + cache['misses'] - then_cache['misses']
        self.history.append(
            {
                'time': round(time.time(), 3),
                'requests': served - then_served,
                'p50_ms': round(percentile(ordered, 0.5) * 1000, 3),
                'p95_ms': round(percentile(ordered, 0.95) * 1000, 3),
                'hit_ratio': round(hits / looked, 4) if looked else None,
                'cpu_ratio': round((cpu - then_cpu) / (now - then), 4),
            }
        )

    def _served(self):
        """The requests counted so far, with :attr:`_lock` held: a sum of
        each living thread's routes, and of the ended threads', once a
        :data:`TICK`."""
        return sum(
            sum(route.buckets)
            for figures in self._fold_ended()
            for route in list(figures.routes.values())
            if route is not None
        )

    # Read when asked

    def _cache(self):
        cache = self.runtime.cache
        return {
            name: getattr(cache, name)
            for name in CACHE_COUNTERS
            if hasattr(cache, name)
        } or {'hits': 0, 'misses': 0}

    def _database(self):
        router = self.runtime.router
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
        for i, reader in enumerate(router.readers):
            roles[f'reader{i}'] = {
                'url': reader.name,
                'reads': reader.reads,
                'in_flight': reader.in_flight,
                'down': reader.down_until > monotonic(),
                **_pool(reader.engine.pool),
            }
        return {
            'roles': roles,
            'write_transactions': router.write_transactions,
            'failovers': router.failovers,
            'write_waits': router.write_waits,
            'write_wait_seconds': router.write_wait_seconds,
        }

    def in_flight(self):
        """Requests running now, but the operator's views."""
        return sum(
            not operators(request) for request in list(self.active.values())
        )

    def _figures(self):
        """Every thread's :class:`Figures`, those of threads that ended
        added into one (:meth:`_fold_ended`)."""
        with self._lock:
            return self._fold_ended()

    def _fold_ended(self):
        """With :attr:`_lock` held: add the :class:`Figures` of threads
        that ended into one (a server that makes a thread per connection
        would otherwise leave one behind per connection); every thread's
        figures."""
        living = {thread.ident for thread in threading.enumerate()}
        for ident in list(self.threads):
            if ident not in living:
                _fold(self._ended, self.threads.pop(ident))
        return [self._ended, *self.threads.values()]

    def _routes(self, figures):
        """The :class:`Figures` ``figures`` of each route, added up
        (without their latencies: see :attr:`Route.recent`)."""
        total = {}
        for each in figures:
            _add_routes(total, each.routes)
        return total

    def _cpu(self, figures):
        """The measured requests of ``figures``: how many, wall, CPU,
        runnable."""
        return (
            sum(f.measured for f in figures),
            sum(f.wall for f in figures),
            sum(f.cpu for f in figures),
            sum(f.runnable for f in figures),
        )

    def snapshot(self):
        """Everything, as plain data (the ``/_dbtune/stats`` answer)."""
        now = perf_counter()
        self.tick(now)
        started, since, cpu_start = self.started
        wall = now - since
        figures = self._figures()
        routes = self._routes(figures)
        measured, cpu_wall, cpu_seconds, runnable = self._cpu(figures)
        recent = [p['cpu_ratio'] for p in list(self.history)[-RECENT_CPU:]]
        cache = self._cache()
        looked = cache['hits'] + cache['misses']
        return {
            'pid': self.pid,
            'started': started,
            'uptime': round(wall, 3),
            'requests': sum(r.requests for r in routes.values()),
            'parallelism': {
                'in_flight': self.in_flight(),
                'peak_in_flight': self.peak_in_flight,
                'threads': threading.active_count(),
                'cpu_ratio': round((process_time() - cpu_start) / wall, 4),
                'recent_cpu_ratio': (
                    round(sum(recent) / len(recent), 4) if recent else None
                ),
                'measured_requests': measured,
                'request_cpu_ratio': _ratio(cpu_seconds, cpu_wall),
                'runnable_ratio': _ratio(runnable, cpu_wall),
            },
            'routes': {
                name: _route_figures(route)
                for name, route in sorted(routes.items())
                # 0: its first request is being counted
                if route.requests
            },
            'cache': {
                'backend': self.runtime.settings.cache_backend,
                'hit_ratio': _ratio(cache['hits'], looked),
                **cache,
                **_cache_size(self.runtime.cache),
            },
            'database': self._database(),
            'history': list(self.history),
        }

    # Prometheus

    def metrics(self):
        """The figures as metric families: ``{name: (type, help, samples)}``
        where a sample is ``(labels, value)``, and a histogram's value is
        ``(bucket counts, sum)``. Plain data, so that processes can share
        it in files and it can be summed."""
        cache = self._cache()
        figures = self._figures()
        routes = [
            (name, r.requests, r.errors, r.buckets, r.seconds)
            for name, r in self._routes(figures).items()
        ]
        cpu = self._cpu(figures)[1:]
        families = {
            'dbtune_requests': ('counter', 'Requests, by route', [
                ({'route': n}, count) for n, count, *_ in routes
            ]),
            'dbtune_request_errors': (
                'counter', 'Requests answered 5xx or failed, by route',
                [({'route': n}, errors) for n, _, errors, *_ in routes],
            ),
            'dbtune_request_duration_seconds': (
                'histogram', 'Time in the app, by route', [
                    ({'route': n}, (buckets, seconds))
                    for n, _, _, buckets, seconds in routes
                ],
            ),
            'dbtune_requests_in_flight': (
                'gauge', 'Requests running now', [({}, self.in_flight())]
            ),
            'dbtune_process_cpu_seconds': (
                'counter', 'CPU time of the process',
                [({}, process_time())],
            ),
            'dbtune_measured_request_seconds': (
                'counter', 'Wall, CPU and runnable-not-running (estimate) '
                f'time of 1 request in {CPU_EVERY}',
                [({'kind': kind}, value) for kind, value in
                 zip(('wall', 'cpu', 'runnable'), cpu, strict=True)],
            ),
            'dbtune_cache_events': (
                'counter', 'Cache outcomes and events',
                [({'event': k}, v) for k, v in cache.items()],
            ),
        }  # fmt: skip
        database = self._database()
        if database:
            roles = database['roles']
            families.update(
                {
                    'dbtune_db_reads': ('counter', 'Reads, by role', [
                        ({'role': role}, r['reads'])
                        for role, r in roles.items()
                    ]),
                    'dbtune_db_writes': ('counter', 'Writing SQL method '
                                         'calls', [({}, roles['writer']
                                                    ['writes'])]),
                    'dbtune_db_write_transactions': (
                        'counter', 'Transactions that took a write slot',
                        [({}, database['write_transactions'])],
                    ),
                    'dbtune_db_failovers': (
                        'counter', 'Reads sent to the writer, their reader '
                        'down', [({}, database['failovers'])],
                    ),
                    'dbtune_write_slot_waits': (
                        'counter', 'Writes that waited for a slot',
                        [({}, database['write_waits'])],
                    ),
                    'dbtune_write_slot_wait_seconds': (
                        'counter', 'Time writes waited for a slot',
                        [({}, database['write_wait_seconds'])],
                    ),
                    'dbtune_pool_connections': (
                        'gauge', 'Pooled connections, by role and state', [
                            ({'role': role, 'state': state}, r[state])
                            for role, r in roles.items()
                            for state in ('in_use', 'idle')
                            if state in r
                        ],
                    ),
                }
            )  # fmt: skip
        return families

    # Several processes (gunicorn): one file each, summed when scraped

    def _start_flusher(self):
        """With ``PROMETHEUS_MULTIPROC_DIR``: a thread of this process
        writes its file now, and then every :data:`FLUSH_EVERY` seconds
        while the process (and this object) lives. Never on a request's
        thread: a disk that fails must not fail a request."""
        with self._lock:
            if self._flusher == os.getpid():
                return
            self._flusher = os.getpid()
        threading.Thread(
            target=_flush_every_second,
            args=(weakref.ref(self),),
            name='dbtune-stats-flush',
            daemon=True,
        ).start()

    def flush(self):
        """Write this process's file; True if it was written. A failure is
        logged once, as a warning, until a write works again."""
        directory = self.multiprocess_dir
        try:
            write_metrics(directory, os.getpid(), self.metrics())
        except OSError as exc:
            if not self._write_failed:
                self._write_failed = True
                log.warning(
                    'stats: cannot write this process\'s figures to %s (%s); '
                    'trying again every %g s',
                    directory, exc, FLUSH_EVERY,
                )  # fmt: skip
            return False
        if self._write_failed:
            self._write_failed = False
            log.warning('stats: writing to %s again', directory)
        return True


def _flush_every_second(ref):
    while True:
        stats = ref()
        if stats is None:
            return  # its app is gone
        stats.flush()
        del stats
        time.sleep(FLUSH_EVERY)


def _fold(into, figures):
    """Add the :class:`Figures` of a thread that ended into ``into``."""
    _add_routes(into.routes, figures.routes)
    into.measured += figures.measured
    into.wall += figures.wall
    into.cpu += figures.cpu
    into.runnable += figures.runnable


def _add_routes(into, routes):
    """Add each :class:`Route` of ``routes`` (name -> :class:`Route`, or
    None: not counted) into the one of its name in ``into``."""
    for name, route in list(routes.items()):
        if route is None:
            continue
        mine = into.get(name)
        if mine is None:
            mine = into[name] = Route(route.recent)
        mine.add(route)


def _route_figures(route):
    # A copy is taken at once (C code, under the GIL) while threads append.
    recent = sorted(route.recent.copy())
    return {
        'requests': route.requests,
        'errors': route.errors,
        'mean_ms': round(route.seconds / route.requests * 1000, 3),
        'p50_ms': round(percentile(recent, 0.5) * 1000, 3),
        'p90_ms': round(percentile(recent, 0.9) * 1000, 3),
        'p99_ms': round(percentile(recent, 0.99) * 1000, 3),
        'max_ms': round(recent[-1] * 1000, 3) if recent else 0.0,
        'queries': route.queries,
        'db_ms': round(route.db_seconds * 1000, 3),
    }


def _ratio(part, whole):
    return round(part / whole, 4) if whole else None


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


def _cache_size(cache):
    if not hasattr(cache, 'bytes'):
        return {}
    return {'entries': len(cache), 'bytes': cache.bytes}


FILE_PREFIX = 'dbtune_'
#: What the files of processes that ended were folded into.
ENDED = 'dbtune_ended.json'
#: Held (``flock``) while the files are read and folded.
LOCK = 'dbtune.lock'
#: The files' format: a file of another is left out.
VERSION = 1


def write_metrics(directory, pid, families):
    """Write one process's metric families to ``directory``, atomically
    (a temporary file, renamed; removed if the write fails)."""
    _write(
        os.path.join(directory, f'{FILE_PREFIX}{pid}.json'),
        {'version': VERSION, 'families': families},
    )


def _write(path, data):
    temporary = f'{path}.{os.getpid()}.{threading.get_ident()}.tmp'
    try:
        with open(temporary, 'w') as file:
            json.dump(data, file)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover (another user's process)
        return True
    return True


def _number(value):
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(value)
    return value


def _histogram(value):
    buckets, seconds = value
    if len(buckets) != len(BUCKETS):
        raise ValueError(buckets)
    return ([_number(count) for count in buckets], _number(seconds))


_VALUES = {'counter': _number, 'gauge': _number, 'histogram': _histogram}


def _load(path):
    """The metric families a file holds, checked through; None for a file
    that cannot be read, or that this version did not write."""
    try:
        with open(path) as file:
            data = json.load(file)
        if data['version'] != VERSION:
            return None
        if not all(isinstance(name, str) for name in data.get('folded', [])):
            return None
        families = {}
        for name, (kind, text, samples) in data['families'].items():
            value = _VALUES[kind]
            if not isinstance(text, str):
                raise TypeError(text)
            checked = []
            for labels, number in samples:
                if not all(
                    isinstance(k, str) and isinstance(v, str)
                    for k, v in labels.items()
                ):
                    raise TypeError(labels)
                checked.append((labels, value(number)))
            families[name] = (kind, text, checked)
        return {**data, 'families': families}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def _files(directory):
    """``{file name: pid}`` of the processes' files in ``directory``;
    the temporary files of processes that ended are removed."""
    found = {}
    for entry in os.listdir(directory):
        if not entry.startswith(FILE_PREFIX) or entry == ENDED:
            continue
        pid, _, rest = entry[len(FILE_PREFIX) :].partition('.')
        if not _number_text(pid):
            continue  # not one of ours
        if rest == 'json':
            found[entry] = int(pid)
            continue
        # json.<writer's pid>.<thread>.tmp: see _write
        writer = rest.split('.')
        if (
            len(writer) == 4
            and writer[0] == 'json'
            and writer[3] == 'tmp'
            and _number_text(writer[1])
            and not _alive(int(writer[1]))
        ):
            with contextlib.suppress(OSError):
                os.remove(os.path.join(directory, entry))
    return found


def _number_text(text):
    """True for a whole number written in ASCII digits (``isdigit`` takes
    ``'²'`` too, which ``int`` does not)."""
    return text.isascii() and text.isdigit()


def _sum(total, families, gauges=True):
    """Add ``families`` into ``total`` (``{name: (kind, text, {labels:
    value})}``); nothing of them if one is of another kind there."""
    for name, (kind, _, _) in families.items():
        if name in total and total[name][0] != kind:
            return False
    for name, (kind, text, samples) in families.items():
        if kind == 'gauge' and not gauges:
            continue
        sums = total.setdefault(name, (kind, text, {}))[2]
        for labels, value in samples:
            key = tuple(sorted(labels.items()))
            sums[key] = _add(sums.get(key), value)
    return True


def _families(total):
    return {
        name: (kind, text, [(dict(key), v) for key, v in sums.items()])
        for name, (kind, text, sums) in total.items()
    }


def read_metrics(directory):
    """The metric families of every process that wrote to ``directory``,
    summed: counters and histograms of processes that ended still count
    (a counter never goes down), gauges only of the living.

    The files of processes that ended are folded into one
    (:data:`ENDED`) and removed, so that a server that replaces its
    workers is not left with a file per worker it ever had. A file that
    is not valid is left out whole, with a warning. Every process that
    reads does so holding an exclusive ``flock`` of :data:`LOCK`.
    """
    with open(os.path.join(directory, LOCK), 'a') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        files = _files(directory)
        ended = _load(os.path.join(directory, ENDED)) or {'families': {}}
        ended_total = {}
        _sum(ended_total, ended['families'])
        dead, living = [], []
        for entry, pid in sorted(files.items()):
            if _alive(pid):
                living.append(entry)
                continue
            dead.append(entry)
            if entry in ended.get('folded', ()):
                continue  # folded already, but its removal failed
            families = _load(os.path.join(directory, entry))
            if families is None or not _sum(
                ended_total, families['families'], gauges=False
            ):
                _left_out(entry)
        if dead:
            _write(
                os.path.join(directory, ENDED),
                {
                    'version': VERSION,
                    'families': _families(ended_total),
                    'folded': dead,
                },
            )
            for entry in dead:
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(directory, entry))
        total = {}
        _sum(total, _families(ended_total))
        for entry in living:
            families = _load(os.path.join(directory, entry))
            if families is None or not _sum(total, families['families']):
                _left_out(entry)
    return _families(total)


def _left_out(entry):
    log.warning(
        'stats: %s left out: not a file of this version of pyramid_dbtune',
        entry,
    )


def _add(total, value):
    if total is None:
        return value
    if isinstance(value, list | tuple):  # a histogram: (buckets, sum)
        buckets = [a + b for a, b in zip(total[0], value[0], strict=True)]
        return (buckets, total[1] + value[1])
    return total + value


class Collector:
    """A prometheus_client collector of :meth:`Stats.metrics` (this
    process's, or every process's that shares ``multiprocess_dir``)."""

    def __init__(self, stats):
        self.stats = stats

    def collect(self):
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        stats = self.stats
        if stats.multiprocess_dir is None:
            families = stats.metrics()
        else:
            stats.flush()
            try:
                families = read_metrics(stats.multiprocess_dir)
            except OSError as exc:
                log.warning(
                    'stats: cannot read %s (%s): this process\'s figures only',
                    stats.multiprocess_dir, exc,
                )  # fmt: skip
                families = stats.metrics()
        kinds = {
            'counter': CounterMetricFamily,
            'gauge': GaugeMetricFamily,
            'histogram': HistogramMetricFamily,
        }
        for name, (kind, text, samples) in sorted(families.items()):
            labels = sorted({k for sample, _ in samples for k in sample})
            family = kinds[kind](name, text, labels=labels)
            for sample, value in samples:
                values = [sample.get(k, '') for k in labels]
                if kind == 'histogram':
                    family.add_metric(values, _cumulative(value[0]), value[1])
                else:
                    family.add_metric(values, value)
            yield family


def _cumulative(counts):
    running = list(itertools.accumulate(counts))
    return [
        ('+Inf' if bound == float('inf') else repr(bound), count)
        for bound, count in zip(BUCKETS, running, strict=True)
    ]
