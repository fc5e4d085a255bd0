"""The timing tween: microseconds per request, ``Server-Timing``, and the
figures of :mod:`.stats` and :mod:`.profiler`.

Registered only when ``dbtune.server_timing``, ``dbtune.stats`` or
``dbtune.profile`` is on, outermost (under ``INGRESS``), so that the time it
measures takes in pyramid_tm's commit. Every line of it runs on every
request: it is kept under 3 microseconds with all of them on
(``benchmarks/bench_overhead.py``). Hence ``%`` formatting, the header's
counts kept as text, and the header appended to the list rather than set
through ``response.headers``; what a request counts for is
:meth:`.stats.Stats.count`'s to say.
"""

import itertools
import logging
from threading import get_ident
from time import perf_counter, thread_time

from ..cache import HIT, MISS, STALE, WAITED
from .stats import CPU_EVERY

log = logging.getLogger(__name__)

# % formats floats faster than f-strings do.
_TOTAL = 'total;dur=%.3f'
_READS = 'total;dur=%.3f, db-read;dur=%.3f%s'
_COUNTS_TEXT = ', db-queries;desc=%d, cache-hit;desc=%d, cache-miss;desc=%d'
#: ``Server-Timing``'s counts as text, by ``(queries, hits, misses, stale,
#: waited)``: most requests repeat a handful of them, and formatting is most
#: of what the header costs. At most :data:`MAX_COUNTS` are kept (then
#: they are forgotten, and those of the requests since kept).
_COUNTS = {}
MAX_COUNTS = 1024


def _counts(key):
    queries, hits, misses, stale, waited = key
    text = _COUNTS_TEXT % (queries, hits, misses)
    if stale:
        text += f', cache-stale;desc={stale}'
    if waited:
        text += f', cache-waited;desc={waited}'
    if len(_COUNTS) >= MAX_COUNTS:
        _COUNTS.clear()  # those of now come back
    _COUNTS[key] = text
    return text


def server_timing(request, seconds):
    """The ``Server-Timing`` value for a request that took ``seconds``:
    ``total``, and when it used the database, ``db-read`` (ms),
    ``db-queries``, ``cache-hit`` and ``cache-miss`` (counts); then
    ``cache-stale`` and ``cache-waited`` (counts), ``db-write`` and
    ``write-slot`` (ms) when not 0. Each figure costs the request its
    formatting: the ones that are mostly 0 are left out when they are."""
    return _server_timing(request.__dict__.get('dbtune'), seconds)


def _server_timing(context, seconds):
    if context is None:
        return _TOTAL % (seconds * 1000)
    cache = context.cache
    key = (
        context.queries,
        cache[HIT],
        cache[MISS],
        cache[STALE],
        cache[WAITED],
    )
    write = context.write_seconds
    text = _READS % (
        seconds * 1000,
        (context.db_seconds - write) * 1000,
        _COUNTS.get(key) or _counts(key),
    )
    if write:
        text += ', db-write;dur=%.3f' % (write * 1000)  # noqa: UP031
    wait = context.unit.write_wait
    if wait:
        text += ', write-slot;dur=%.3f' % (wait * 1000)  # noqa: UP031
    return text


def timing_tween_factory(handler, registry):
    """Time every request; see the module's text for what it feeds."""
    dbtune = registry.dbtune
    header = dbtune.settings.server_timing
    stats = dbtune.stats
    profiler = dbtune.profiler
    if stats is None and profiler is None:

        def timing_tween(request):
            start = perf_counter()
            response = handler(request)
            seconds = perf_counter() - start
            response.headerlist.append(
                (
                    'Server-Timing',
                    _server_timing(request.__dict__.get('dbtune'), seconds),
                )
            )
            return response

        return timing_tween

    active = dbtune.active
    turn = itertools.count()
    failed = []  # said once

    def timing_tween(request):
        ident = get_ident()
        outer = active.get(ident)  # a subrequest's parent
        active[ident] = request
        if profiler is not None and not profiler.running:
            profiler.start()
        cpu = None
        if stats is not None and not next(turn) % CPU_EVERY:
            cpu = thread_time()
        start = perf_counter()
        response = raised = None
        try:
            response = handler(request)
        except BaseException as exc:
            raised = exc
            raise
        finally:
            end = perf_counter()
            seconds = end - start
            if stats is not None:
                try:
                    stats.count(request, response, raised, seconds, end, cpu)
                except Exception:
                    # A request never fails for its figures.
                    if not failed:
                        failed.append(True)
                        log.exception(
                            'pyramid_dbtune: a request could not be counted'
                        )
            if outer is None:
                del active[ident]
            else:
                active[ident] = outer
        if header:
            response.headerlist.append(
                (
                    'Server-Timing',
                    _server_timing(request.__dict__.get('dbtune'), seconds),
                )
            )
        return response

    return timing_tween
