"""Per-process figures on prometheus_client, cheap enough to leave on:
``dbtune.stats = true``.

The timing tween (:mod:`.tween`) hands each finished request to
:meth:`Stats.count`, which observes it in prometheus_client's own metric
types (a histogram of latencies by route, counters of errors and database
time) in a registry of the application's. The cache's and the router's
counters, the pools and the process's CPU time are carried into the same
metrics at most once a :data:`TICK` and whenever somebody asks. Several
processes (gunicorn) share them through prometheus_client's multiprocess
mode: with ``PROMETHEUS_MULTIPROC_DIR`` set, each process's values live in
prometheus_client's files there, a thread of each process carries its
counters there once a :data:`TICK` (so that an idle process's are as
true as a busy one's), ``/_dbtune/metrics`` adds up every process's, and
the gunicorn hook ``child_exit`` tells prometheus_client when a worker is
gone (``mark_process_dead``).

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
import math
import os
import threading
import time
from collections import deque
from time import perf_counter, process_time, thread_time

from pyramid_retry import is_error_retryable

from ..deploy import forks
from . import carrier
from .access import PREFIX, ROUTE_PREFIX
from .metrics import (
    BUCKETS,
    CPU_EVERY,
    DATABASE,
    RECENT,
    Route,
    cache_counters,
    cache_size,
    database_figures,
    listener_figures,
    make_metrics,
    method_figures,
    samples,
    updating,
)

__all__ = ['BUCKETS', 'CPU_EVERY', 'RECENT', 'Stats']

#: Seconds a point of the dashboard's chart covers, and how many are kept.
TICK = 2.0
HISTORY = 300
#: ``recent_cpu_ratio`` is the mean of this many of the chart's last points:
#: 30 seconds of them while requests come.
RECENT_CPU = round(30 / TICK)
#: Requests that match no route are counted under this name.
NO_ROUTE = '(no route)'
#: Routes counted apart, at most; the requests of any more are counted
#: together under :data:`OTHER_ROUTES`.
MAX_ROUTES = 500
OTHER_ROUTES = '(other routes)'


def percentile(ordered, fraction):
    """The least of ``ordered`` that ``fraction`` of them are at or below
    (nearest rank: the 9th of 10 for 0.9); 0 for no values."""
    if not ordered:
        return 0.0
    # Rounded first: 0.07 * 100 is 7.000000000000001, rank 7 all the same.
    rank = math.ceil(round(fraction * len(ordered), 9))
    return ordered[max(0, rank - 1)]


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

    ``registry`` is the prometheus_client ``CollectorRegistry`` of its
    metrics; ``active`` maps each thread running a request to its request
    (the profiler reads it too).
    """

    def __init__(self, dbtune, active, multiprocess_dir=None):
        self.dbtune = dbtune
        self.active = active
        self.multiprocess_dir = multiprocess_dir
        self._lock = threading.Lock()
        #: held while the figures are carried into the metrics, so that two
        #: threads do not both add what grew
        self._carrying = threading.Lock()
        self.reset()
        forks.renew_after_fork(self)
        if multiprocess_dir is not None:
            carrier.start(self, TICK)

    def after_fork(self):
        """In a forked child: new locks, metrics of its own, and no
        request running (the parent's threads are not here, its carrier
        thread neither: :meth:`start_after_fork` starts one)."""
        self._lock = threading.Lock()
        self._carrying = threading.Lock()
        self.active.clear()
        self.reset()

    def start_after_fork(self):
        """Once every object of the child is renewed: what the parent's
        cache, router and listener had counted before the fork is the
        parent's, not this process's, and is left out of its metrics
        (with several processes, prometheus_client adds them all up).
        With ``PROMETHEUS_MULTIPROC_DIR``, starts the child's carrier
        thread: it counts from now, whether it serves or not."""
        with self._carrying, updating:
            self._carry_all(self._carried.__setitem__)
        if self.multiprocess_dir is not None:
            carrier.start(self, TICK)

    def reset(self):
        """Start every figure again, in a registry of their own."""
        from prometheus_client import CollectorRegistry

        with self._lock:
            self.registry = CollectorRegistry(auto_describe=True)
            with updating:
                self.metrics = make_metrics(self.registry)
            #: route name -> :class:`Route` (``None``: not counted)
            self.routes = {}
            self.peak_in_flight = 0
            self.started = (time.time(), perf_counter(), process_time())
            self.history = deque(maxlen=HISTORY)
            #: the latencies of the chart's current point (the last ones)
            self.window = deque(maxlen=RECENT)
            #: what of the cache's and router's counters is in the metrics
            self._carried = {}
            # The first request ticks: the chart's first point starts there.
            self._last_tick = None
            self.next_tick = 0.0

    # On the request path

    def count(self, request, response, raised, seconds, end, cpu_start):
        """Count a request that took ``seconds`` and ended at ``end``
        (``perf_counter``), while it is still among :attr:`active`. An
        attempt that pyramid_retry runs again is not counted (the one that
        answers is), nor are the operator's own views. ``cpu_start`` is its
        thread's CPU clock at its start, read on 1 request in
        :data:`CPU_EVERY`, else None."""
        if len(self.active) > self.peak_in_flight:
            self._note_peak()
        state = request.__dict__
        if raised is None:
            raised = state.get('exception')  # an exception view's answer
        if raised is None or not is_error_retryable(request, raised):
            matched = state.get('matched_route')
            name = NO_ROUTE if matched is None else matched.name
            try:
                route = self.routes[name]
            except KeyError:
                route = self._new_route(name)
            if route is not None:
                with updating:
                    route.duration.observe(seconds)
                    if response is None or response.status[0] == '5':
                        route.errors.inc()
                route.recent.append(seconds)
                self.window.append(seconds)
                context = state.get('dbtune')
                if context is not None and (
                    context.queries or context.db_seconds  # a flush: no query
                ):
                    # Carried into the counters later (carry): a deque's
                    # append is atomic, and costs a tenth of two incs.
                    route.pending.append((context.queries, context.db_seconds))
                if cpu_start is not None:
                    self._measured(seconds, cpu_start, context)
        if end >= self.next_tick:
            self.tick(end)

    def _new_route(self, name):
        """The first request of route ``name``: its :class:`Route`, or
        None for the operator's own views (not the site's traffic)."""
        with self._lock:
            if name.startswith(ROUTE_PREFIX):
                self.routes[name] = None
                return None
            named = sum(r is not None for r in self.routes.values())
            if name not in self.routes and named >= MAX_ROUTES:
                # Not kept under its name: each of its requests comes here
                # again, and is counted with the other routes.
                name = OTHER_ROUTES
            route = self.routes.get(name)
            if route is None:
                with updating:
                    route = self.routes[name] = Route(self.metrics, name)
            return route

    def _measured(self, seconds, cpu_start, context):
        cpu = thread_time() - cpu_start
        waited = 0.0
        if context is not None:
            waited = context.db_seconds + context.unit.write_wait
        measured = self.metrics['measured']
        with updating:
            measured.labels(kind='wall').inc(seconds)
            measured.labels(kind='cpu').inc(cpu)
            runnable = max(0.0, seconds - cpu - waited)
            measured.labels(kind='runnable').inc(runnable)
            self.metrics['measured_requests'].inc()

    def _note_peak(self):
        """More requests run than the peak so far (the operator's views
        included): count them as :meth:`in_flight` does."""
        running = self.in_flight()
        with self._lock:  # another thread may set a higher one meanwhile
            if running > self.peak_in_flight:
                self.peak_in_flight = running
                with updating:
                    self.metrics['peak'].set(running)

    def tick(self, now):
        """Carry the counters into the metrics, and close the chart's
        current point (at most once a :data:`TICK`)."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            if now < self.next_tick:
                return
            last = self._last_tick
            if last is not None:
                window, self.window = self.window, deque(maxlen=RECENT)
            cpu, cache = process_time(), cache_counters(self.dbtune.cache)
            # The first point counts from the start, as its window does.
            served = 0 if last is None else self._served()
            self._last_tick = (now, cpu, cache, served)
            self.next_tick = now + TICK
        finally:
            self._lock.release()
        if self.multiprocess_dir is None:  # else the carrier thread's
            self.carry()
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
        """The requests counted so far, every route's."""
        return sum(
            value
            for (name, _), value in samples(self.metrics['duration']).items()
            if name.endswith('_count')
        )

    # Read when asked

    def carry(self):
        """Bring the metrics up to date with what the cache and the router
        count, the pools, the requests in flight and the process's CPU."""
        with self._carrying, updating:
            self._carry_all()

    def _carry_all(self, carry=None):
        """Carry every figure; ``carry(counter, value)`` instead of
        :meth:`_carry`, for the counters."""
        carry = carry or self._carry
        metrics = self.metrics
        for route in list(self.routes.values()):
            if route is not None and route.pending:
                queries = seconds = 0
                with contextlib.suppress(IndexError):  # emptied
                    while True:
                        count, took = route.pending.popleft()
                        queries += count
                        seconds += took
                route.queries.inc(queries)
                route.db_seconds.inc(seconds)
        carry(metrics['cpu'], process_time())
        for event, value in cache_counters(self.dbtune.cache).items():
            carry(metrics['cache'].labels(event=event), value)
        for name, figures in method_figures(self.dbtune).items():
            carry(metrics['dropped'].labels(method=name), figures['dropped'])
            carry(metrics['patched'].labels(method=name), figures['patched'])
            untold = figures['untold_writes']
            carry(metrics['untold'].labels(method=name), untold)
        for event, value in listener_figures(self.dbtune).items():
            carry(metrics['changes'].labels(event=event), value)
        metrics['in_flight'].set(self.in_flight())
        database = database_figures(self.dbtune.router)
        for role, figures in database.get('roles', {}).items():
            carry(metrics['reads'].labels(role=role), figures['reads'])
            for state in ('in_use', 'idle'):
                if state in figures:
                    metrics['pool'].labels(role=role, state=state).set(
                        figures[state]
                    )
        router = self.dbtune.router
        for name, _, attribute in DATABASE if router is not None else ():
            carry(metrics[name], getattr(router, attribute))

    def _carry(self, counter, value):
        """Increment ``counter`` by what ``value`` grew since last time."""
        grown = value - self._carried.get(counter, 0)
        if grown > 0:
            counter.inc(grown)
            self._carried[counter] = value

    def in_flight(self):
        """Requests running now, but the operator's views."""
        return sum(
            not operators(request) for request in list(self.active.values())
        )

    def _routes(self):
        """Each counted route's figures, from the metrics."""
        metrics = self.metrics
        values = samples(
            metrics['duration'],
            metrics['errors'],
            metrics['queries'],
            metrics['db_seconds'],
        )

        def of(sample, name):
            return values.get((sample, (('route', name),)), 0)

        figures = {}
        for name, route in sorted(self.routes.items()):
            requests = of('dbtune_request_duration_seconds_count', name)
            if route is None or not requests:
                continue  # 0: its first request is being counted
            # A copy is taken at once (C code, under the GIL) while threads
            # append.
            recent = sorted(route.recent.copy())
            seconds = of('dbtune_request_duration_seconds_sum', name)
            figures[name] = {
                'requests': int(requests),
                'errors': int(of('dbtune_request_errors_total', name)),
                'mean_ms': round(seconds / requests * 1000, 3),
                'p50_ms': round(percentile(recent, 0.5) * 1000, 3),
                'p90_ms': round(percentile(recent, 0.9) * 1000, 3),
                'p99_ms': round(percentile(recent, 0.99) * 1000, 3),
                'max_ms': round(recent[-1] * 1000, 3) if recent else 0.0,
                'queries': int(of('dbtune_route_queries_total', name)),
                'db_ms': round(
                    of('dbtune_route_db_seconds_total', name) * 1e3, 3
                ),
            }
        return figures

    def snapshot(self):
        """Everything, as plain data (the ``/_dbtune/stats`` answer)."""
        now = perf_counter()
        self.tick(now)
        self.carry()
        self._note_peak()  # with a request that has not ended yet
        started, since, cpu_start = self.started
        wall = now - since
        routes = self._routes()
        measured = samples(
            self.metrics['measured'], self.metrics['measured_requests']
        )

        def kind(name):
            key = ('dbtune_measured_request_seconds_total', (('kind', name),))
            return measured.get(key, 0.0)

        cpu_wall = kind('wall')
        recent = [p['cpu_ratio'] for p in list(self.history)[-RECENT_CPU:]]
        cache = cache_counters(self.dbtune.cache)
        looked = cache['hits'] + cache['misses']
        return {
            'pid': os.getpid(),
            'started': started,
            'uptime': round(wall, 3),
            'requests': sum(r['requests'] for r in routes.values()),
            'parallelism': {
                'in_flight': self.in_flight(),
                'peak_in_flight': self.peak_in_flight,
                'threads': threading.active_count(),
                'cpu_ratio': round((process_time() - cpu_start) / wall, 4),
                'recent_cpu_ratio': (
                    round(sum(recent) / len(recent), 4) if recent else None
                ),
                'measured_requests': int(
                    measured.get(('dbtune_measured_requests_total', ()), 0)
                ),
                'request_cpu_ratio': _ratio(kind('cpu'), cpu_wall),
                'runnable_ratio': _ratio(kind('runnable'), cpu_wall),
            },
            'routes': routes,
            'cache': {
                'backend': self.dbtune.settings.cache_backend,
                'hit_ratio': _ratio(cache['hits'], looked),
                **cache,
                **cache_size(self.dbtune.cache),
                **listener_figures(self.dbtune),
            },
            'methods': method_figures(self.dbtune),
            'database': database_figures(self.dbtune.router),
            'history': list(self.history),
        }

    def exposition(self):
        """The Prometheus text of the metrics: this process's, or with
        ``PROMETHEUS_MULTIPROC_DIR`` every process's, added up by
        prometheus_client; and its content type."""
        from prometheus_client import CollectorRegistry, generate_latest
        from prometheus_client.exposition import CONTENT_TYPE_LATEST

        self.carry()
        if self.multiprocess_dir is None:
            return generate_latest(self.registry), CONTENT_TYPE_LATEST
        from prometheus_client import multiprocess

        every = CollectorRegistry()
        multiprocess.MultiProcessCollector(every, path=self.multiprocess_dir)
        return generate_latest(every), CONTENT_TYPE_LATEST


def _ratio(part, whole):
    return round(part / whole, 4) if whole else None
