"""The timing tween: microseconds per request, ``Server-Timing``, and the
figures of :mod:`.stats` and :mod:`.profiler`.

Registered only when ``dbtune.server_timing``, ``dbtune.stats`` or
``dbtune.profile`` is on, outermost (under ``INGRESS``), so that the time it
measures takes in pyramid_tm's commit. Every line of it runs on every
request: it is kept to a couple of microseconds
(``benchmarks/bench_overhead.py``), hence ``%`` formatting and a header
appended to the list rather than set through ``response.headers``.
"""

import itertools
from threading import get_ident
from time import perf_counter, thread_time

from pyramid_retry import is_error_retryable

from .cache import HIT, MISS, STALE, WAITED
from .stats import CPU_EVERY

# % formats floats faster than f-strings do (see the module's text).
_READS = (
    'total;dur=%.3f, db-read;dur=%.3f, db-queries;desc=%d, '
    'cache-hit;desc=%d, cache-miss;desc=%d'
)


def server_timing(request, seconds):
    """The ``Server-Timing`` value for a request that took ``seconds``:
    ``total``, and when it used the database, ``db-read`` (ms),
    ``db-queries``, ``cache-hit`` and ``cache-miss`` (counts); ``db-write``
    and ``write-slot`` (ms), ``cache-stale`` and ``cache-waited`` when not
    0. Each figure costs the request its formatting: the ones that are
    mostly 0 are left out when they are."""
    context = request.__dict__.get('dbtune')
    if context is None:
        return 'total;dur=%.3f' % (seconds * 1000)
    cache = context.cache
    write = context.write_seconds
    text = _READS % (
        seconds * 1000,
        (context.db_seconds - write) * 1000,
        context.queries,
        cache[HIT],
        cache[MISS],
    )
    if write:
        text += ', db-write;dur=%.3f' % (write * 1000)  # noqa: UP031
    wait = context.unit.write_wait
    if wait:
        text += ', write-slot;dur=%.3f' % (wait * 1000)  # noqa: UP031
    if cache[STALE]:
        text += f', cache-stale;desc={cache[STALE]}'
    if cache[WAITED]:
        text += f', cache-waited;desc={cache[WAITED]}'
    return text


def timing_tween_factory(handler, registry):
    """Time every request; see the module's text for what it feeds."""
    runtime = registry.dbtune
    header = runtime.settings.server_timing
    stats = runtime.stats
    profiler = runtime.profiler
    if stats is None and profiler is None:

        def timing_tween(request):
            start = perf_counter()
            response = handler(request)
            response.headerlist.append(
                (
                    'Server-Timing',
                    server_timing(request, perf_counter() - start),
                )
            )
            return response

        return timing_tween

    active = runtime.active
    record = None if stats is None else stats.record
    turn = itertools.count()

    def timing_tween(request):
        ident = get_ident()
        outer = active.get(ident)  # a subrequest's parent
        active[ident] = request
        if profiler is not None and not profiler.running:
            profiler.start()
        cpu = None
        if record is not None:
            if len(active) > stats.peak_in_flight:
                stats.note_peak()
            if not next(turn) % CPU_EVERY:
                cpu = thread_time()
        start = perf_counter()
        try:
            response = handler(request)
        except BaseException as exc:
            # An attempt that pyramid_retry runs again is not counted.
            if record is not None and not is_error_retryable(request, exc):
                record(ident, request, perf_counter() - start, True, cpu)
            raise
        finally:
            if outer is None:
                del active[ident]
            else:
                active[ident] = outer
        end = perf_counter()
        if record is not None:
            # An exception view's answer that pyramid_retry will run again
            # is not counted; the attempt that answers is.
            exc = request.__dict__.get('exception')
            if exc is None or not is_error_retryable(request, exc):
                error = response.status[0] == '5'
                record(ident, request, end - start, error, cpu)
                if end >= stats.next_tick:
                    stats.tick(end)
        if header:
            response.headerlist.append(
                ('Server-Timing', server_timing(request, end - start))
            )
        return response

    return timing_tween
