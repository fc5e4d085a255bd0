"""An aggregating profiler, safe to leave on: ``dbtune.profile = true``.

A sampling profiler: a thread of its own wakes ``dbtune.profile.sample``
times a second, reads the stack of every thread that is running a request
(``sys._current_frames()``; the timing tween keeps the map of threads to
requests) and counts it under the request's route. It adds up every
request of every thread, and a request is never slowed while it runs: no
``sys.setprofile``, ``sys.settrace`` or ``sys.monitoring`` hook is set, so
it works on any Python 3 and beside any other profiler or debugger (from
Python 3.12 only one cProfile can run in a process, and it sees every
thread). A sample is weighed by the wall time since the previous one, so
own and cumulative times are estimates in seconds of wall time, in which
time spent waiting (for a database, a lock) shows as the Python function
that waits. A function that runs for much less than the interval between
samples is seen in proportion to how often it runs, not every time.
"""

import logging
import marshal
import sys
import threading
from collections import Counter
from time import perf_counter, sleep

from ..deploy import forks
from .access import ROUTE_PREFIX
from .stats import route_name

log = logging.getLogger(__name__)

#: Seconds without any request before the sampling thread stops; the next
#: request starts it again.
IDLE = 10.0
#: Distinct stacks kept per route; more are counted as one "(other)".
MAX_STACKS = 20000
#: How the profile names a stack it no longer tells apart.
OTHER = ('~', 0, '(other stacks)')


def _label(code):
    return (
        code.co_filename,
        code.co_firstlineno,
        getattr(code, 'co_qualname', code.co_name),
    )


def _filed(request, stacks):
    """``(route, stack, seconds)`` of ``stacks``, sampled in ``request``
    before it had a route."""
    name = route_name(request)
    return [(name, stack, seconds) for stack, seconds in stacks]


class Profiler:
    """The samples of one process; ``registry.dbtune.profiler``.

    ``active`` maps each thread running a request to its request; ``rate``
    is samples a second.
    """

    def __init__(self, active, rate):
        self.active = active
        self.interval = 1.0 / rate
        self._lock = threading.Lock()
        self.running = False
        self.reset()
        forks.renew_after_fork(self)

    def after_fork(self):
        """In a forked child: no sampling thread (threads do not survive a
        fork), no request running, a new lock, and the child's own samples
        only."""
        self._lock = threading.Lock()
        self.running = False
        self.active.clear()
        self.reset()

    def reset(self):
        """Forget every sample."""
        with self._lock:
            #: route -> {stack (outermost code first): [samples, seconds]}
            self.stacks = {}
            self.samples = 0
            #: ``id(request)``: ``(request, [(stack, seconds)])`` of the
            #: requests sampled before their route was matched
            self._waiting = {}

    # The sampling thread

    def start(self):
        """Start sampling, if not started (the tween calls this). A
        sampling thread that cannot be started is logged, not raised: the
        request goes on, and the next one tries again."""
        with self._lock:
            if self.running:
                return
            self.running = True
        try:
            threading.Thread(
                target=self._run, name='dbtune-profiler', daemon=True
            ).start()
        except Exception:
            self.running = False
            log.warning('profiler: cannot start its thread', exc_info=True)

    def _run(self):
        try:
            self._sample_until_idle()
        finally:
            with self._lock:
                self.running = False
        # A request that started as this thread stopped saw it running, and
        # did not start another.
        if self.active:
            self.start()

    def _sample_until_idle(self):
        last = idle_since = perf_counter()
        while True:
            sleep(self.interval)
            now = perf_counter()
            # A sample stands for the time since the previous one, up to
            # a few intervals (a process that was stopped is not busy).
            weight, last = min(now - last, 4 * self.interval), now
            if not self.active:
                if self._waiting:
                    self.sample(0.0)  # their requests ended: filed
                if now - idle_since > IDLE:
                    return
                continue
            idle_since = now
            self.sample(weight)

    def sample(self, weight):
        """Count the stack of every thread in a request, ``weight``
        seconds each.

        The timing tween is outermost: the other tweens run before the
        router matches a route. A request's stacks from then wait, and are
        counted under its route once it has one, or once the router has
        found its context or it has ended (under
        :data:`~pyramid_dbtune.ops.stats.NO_ROUTE` if it matched none), at
        a later sample."""
        frames = sys._current_frames()
        taken, unrouted = [], []
        for ident, request in list(self.active.items()):
            frame = frames.get(ident)
            if frame is None:
                continue  # the request ended since
            stack = []
            while frame is not None:
                stack.append(frame.f_code)
                frame = frame.f_back
            stack.reverse()
            state = request.__dict__  # the router has matched or found
            if 'matched_route' in state or 'context' in state:
                taken.append((route_name(request), tuple(stack), weight))
            else:
                unrouted.append((request, tuple(stack)))
        del frames
        with self._lock:
            waiting, self._waiting = self._waiting, {}
            for request, stack in unrouted:
                # Its id is its own while it waits: it is held here.
                known = waiting.pop(id(request), None) or (request, [])
                known[1].append((stack, weight))
                self._waiting[id(request)] = known
            for known in waiting.values():  # routed since, or ended
                taken.extend(_filed(*known))
            for name, stack, seconds in taken:
                if name.startswith(ROUTE_PREFIX):
                    continue  # the operator's own views
                counts = self.stacks.get(name)
                if counts is None:
                    counts = self.stacks[name] = {}
                entry = counts.get(stack)
                if entry is None:
                    if len(counts) >= MAX_STACKS:
                        stack = (OTHER,)
                    entry = counts.setdefault(stack, [0, 0.0])
                entry[0] += 1
                entry[1] += seconds
                self.samples += 1

    # What the views show

    def _stacks(self, route=None):
        """``[(stack of labels, samples, seconds)]`` of one route, or of
        all."""
        with self._lock:
            chosen = [
                [(stack, n, seconds) for stack, (n, seconds) in counts.items()]
                for name, counts in self.stacks.items()
                if route is None or name == route
            ]
        return [
            (
                tuple(
                    code if isinstance(code, tuple) else _label(code)
                    for code in stack
                ),
                n,
                seconds,
            )
            for items in chosen
            for stack, n, seconds in items
        ]

    def functions(self, route=None):
        """Per function: ``{label: [samples, own, cumulative, callers]}``;
        ``callers`` maps a caller's label to ``[samples, own, cumulative]``
        of the calls from it. Labels are ``(file, line, name)``."""
        table = {}
        for stack, n, seconds in self._stacks(route):
            seen = set()
            leaf = len(stack) - 1
            for depth, label in enumerate(stack):
                entry = table.get(label)
                if entry is None:
                    entry = table[label] = [0, 0.0, 0.0, {}]
                own = seconds if depth == leaf else 0.0
                entry[1] += own
                caller = stack[depth - 1] if depth else None
                if caller is not None:
                    edge = entry[3].setdefault(caller, [0, 0.0, 0.0])
                    edge[0] += n
                    edge[1] += own
                    # A recursive call counts once toward cumulative time.
                    if (caller, label) not in seen:
                        edge[2] += seconds
                        seen.add((caller, label))
                if label not in seen:
                    seen.add(label)
                    entry[0] += n
                    entry[2] += seconds
        return table

    def routes(self):
        """``{route: (samples, seconds)}``."""
        with self._lock:
            return {
                name: (
                    sum(n for n, _ in counts.values()),
                    sum(seconds for _, seconds in counts.values()),
                )
                for name, counts in sorted(self.stacks.items())
            }

    def top(self, route=None, limit=20):
        """The ``limit`` functions with the most own time, and those with
        the most cumulative time, as plain data."""
        table = self.functions(route)

        def row(label):
            samples, own, cumulative, _ = table[label]
            return {
                'function': label[2],
                'file': label[0],
                'line': label[1],
                'samples': samples,
                'own_s': round(own, 6),
                'cumulative_s': round(cumulative, 6),
            }

        by_own = sorted(table, key=lambda k: (-table[k][1], k))
        by_cumulative = sorted(table, key=lambda k: (-table[k][2], k))
        return {
            'own': [row(k) for k in by_own[:limit] if table[k][1]],
            'cumulative': [row(k) for k in by_cumulative[:limit]],
        }

    def pstats_data(self, route=None):
        """The profile in the form :mod:`pstats` loads (a marshalled
        dict, as ``cProfile`` writes): a sample stands for a call."""
        data = {}
        for label, (samples, own, cumulative, callers) in self.functions(
            route
        ).items():
            data[label] = (
                samples,
                samples,
                own,
                cumulative,
                {
                    caller: (n, n, tt, ct)
                    for caller, (n, tt, ct) in callers.items()
                },
            )
        return marshal.dumps(data)

    def collapsed(self, route=None):
        """The stacks as text for flame graphs (``flamegraph.pl``,
        speedscope): ``outer;inner;leaf count`` lines, where a count is in
        milliseconds of wall time."""
        lines = Counter()
        for stack, _, seconds in self._stacks(route):
            text = ';'.join(f'{name} ({_short(file)}:{line})'
                            for file, line, name in stack)  # fmt: skip
            lines[text] += seconds
        return ''.join(
            f'{text} {max(1, round(seconds * 1000))}\n'
            for text, seconds in sorted(lines.items())
        )


def _short(filename):
    """A file's name past its last ``site-packages/`` or ``src/``."""
    for marker in ('site-packages/', 'src/'):
        if marker in filename:
            return filename.rsplit(marker, 1)[1]
    return filename
