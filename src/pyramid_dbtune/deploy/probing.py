"""Asking a running server's probe views over HTTP, side by side: what
each answer says, and what a round of them measured."""

import http.client
import json
import math
import statistics
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..ops.access import HEADER

#: Rounds of N requests at once, at the least, whatever the duration.
MIN_ROUNDS = 3


class ProbeError(Exception):
    """A probe could not be reached, or did not answer as a probe does."""


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is an error: following it would send the token to
    wherever it points, another host included."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        raise ProbeError(
            f'{req.full_url} redirected to {newurl}; give that URL'
        )


#: Straight to the server: a proxy in between would be measured too.
_OPENER = urllib.request.build_opener(
    urllib.request.ProxyHandler({}), _NoRedirects
)


class NoProbe(ProbeError):
    """The server answered 404: no such probe, or no way in."""


def fetch(url, token, timeout):
    """GET one probe; its JSON answer and the seconds it took."""
    headers = {HEADER: token} if token else {}
    request = urllib.request.Request(url, headers=headers)
    start = time.perf_counter()
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise NoProbe(f'{url} answered 404') from None
        raise ProbeError(f'{url} answered {exc.code} {exc.reason}') from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, 'reason', exc)
        raise ProbeError(f'{url} could not be reached: {reason}') from None
    except http.client.HTTPException as exc:
        raise ProbeError(
            f'{url} did not answer in HTTP: {exc.__class__.__name__}: {exc}'
        ) from None
    seconds = time.perf_counter() - start
    try:
        answer = json.loads(body)
    except ValueError:
        answer = None
    if not (isinstance(answer, dict) and answer.keys() >= _ANSWER):
        raise ProbeError(
            f'{url} did not answer as a pyramid_dbtune probe: {body[:80]!r}'
        )
    return answer, seconds


_ANSWER = {'pid', 'thread', 'claims'}


@dataclass
class Measurement:
    """One probe's timings: single requests, and rounds of requests at
    once."""

    probe: str
    concurrency: int
    #: The answers' field that is a request's work: ``seconds`` for
    #: waits (the wait asked), ``cpu_seconds`` for CPU work (whose time
    #: in the view includes waiting for the GIL).
    work_of: str = 'seconds'
    #: Seconds of each request sent alone.
    single: list = field(default_factory=list)
    #: The probes' answers to the requests sent alone.
    alone: list = field(default_factory=list)
    #: Seconds of each round of requests at once.
    rounds: list = field(default_factory=list)
    #: The probes' answers in the rounds.
    answers: list = field(default_factory=list)
    #: Requests a round sends at once (``concurrency`` where 0).
    sent: int = 0

    def _rounds(self):
        """The answers of each round."""
        n = self.sent or self.concurrency
        return [
            self.answers[i : i + n] for i in range(0, len(self.answers), n)
        ]

    @property
    def work(self):
        """Seconds of work the probes did in a round (median)."""
        return statistics.median(
            sum(_work(a, self.work_of) for a in answers)
            for answers in self._rounds()
        )

    def _reading(self, answers, raw=False):
        """How many of ``answers``' requests worked at once, from the
        times the probes give (the server's clocks: the client's would
        count HTTP, and requests that fell unevenly between processes).

        Waits: the most requests in their views at one time, times the
        share of their time in the views that was the wait asked (below 1
        where they also waited for one another inside: a pool, a lock).
        CPU work: how many processes had a request in a view, on average
        over the time any had one (a process's threads take turns for the
        GIL); ``raw``, the CPU seconds they got in that time instead,
        which other programs on the cores lower too. At most
        ``concurrency``.
        """
        if self.work_of == 'cpu_seconds':
            mine = _by_process(answers).values()
            if raw:
                busy = max(_union(answers), 1e-9)
                value = sum(a['cpu_seconds'] for a in answers) / busy
            else:
                # Until the first process ran out of requests: the
                # requests fall unevenly between the processes.
                until = min(max(a['ended'] for a in m) for m in mine)
                busy = max(_union(answers, until), 1e-9)
                value = sum(_union(m, until) for m in mine) / busy
        else:
            work = sum(_work(a, self.work_of) for a in answers)
            busy = sum(a['seconds'] for a in answers)
            value = _most_at_once(answers) * min(1.0, work / max(busy, 1e-9))
        return min(self.concurrency, value)

    @property
    def raw_parallelism(self):
        """:attr:`parallelism`, but for CPU work the CPU seconds the
        requests got per second (median)."""
        return statistics.median(
            self._reading(answers, raw=True) for answers in self._rounds()
        )

    @property
    def parallelism(self):
        """How many requests' work ran at once in a round (the median of
        the rounds' readings)."""
        return statistics.median(map(self._reading, self._rounds()))

    @property
    def processes(self):
        """Process id: how many of its requests worked at once, as
        :attr:`raw_parallelism` reads them, and how many it was sent, in
        the rounds it served (medians)."""
        readings = {}
        for answers in self._rounds():
            for pid, mine in _by_process(answers).items():
                readings.setdefault(pid, []).append(
                    (self._reading(mine), len(mine))
                )
        return {
            pid: tuple(
                map(statistics.median, zip(*readings[pid], strict=True))
            )
            for pid in sorted(readings)
        }

    def _round_shares(self):
        """Each round's share of a core that its processes got while
        they had a request in a view: their CPU time ÷ the time they had
        one (the GIL does not lower it: a process whose threads take
        turns still uses its core)."""
        shares = []
        for answers in self._rounds():
            cpu = sum(a['cpu_seconds'] for a in answers)
            busy = sum(map(_union, _by_process(answers).values()))
            shares.append(min(1.0, max(cpu / max(busy, 1e-9), 0.01)))
        return shares

    @property
    def round_core_share(self):
        """The share of a core the processes got while they had work in
        the rounds (median): below 1, other programs had the cores."""
        return statistics.median(self._round_shares())

    @property
    def throughput_ratio(self):
        """Requests per second at once ÷ requests per second alone."""
        n = self.sent or self.concurrency
        at_once = n * len(self.rounds) / sum(self.rounds)
        return at_once / (len(self.single) / sum(self.single))

    @property
    def core_share(self):
        """How much of a core a request alone got: its CPU time ÷ its
        time in the view (medians). Below 1, other work had the cores."""
        return statistics.median(_share(a) for a in self.alone)

    @property
    def served(self):
        """Process id: the thread ids that served it, in the rounds."""
        served = {}
        for answer in self.answers:
            served.setdefault(answer['pid'], set()).add(answer['thread'])
        return {pid: sorted(served[pid]) for pid in sorted(served)}

    def as_dict(self):
        return {
            'parallelism': round(self.parallelism, 2),
            'raw_parallelism': round(self.raw_parallelism, 2),
            'throughput_ratio': round(self.throughput_ratio, 2),
            'single_ms': round(statistics.median(self.single) * 1000, 1),
            'round_ms': round(statistics.median(self.rounds) * 1000, 1),
            'work_ms': round(self.work * 1000, 1),
            'requests': len(self.single) + len(self.answers),
            'served': {str(p): t for p, t in self.served.items()},
            'processes': {
                str(p): round(v, 2) for p, (v, _) in self.processes.items()
            },
            'core_share_alone': round(self.core_share, 2),
            'core_share_in_rounds': round(self.round_core_share, 2),
        }


def _work(answer, field):
    """A request's work: for waits, the wait asked (its time in the view
    also counts waits for the GIL, a pool or a lock), else the answer's
    ``field``."""
    if field == 'seconds':
        return answer['ms'] / 1000
    return answer[field]


def _most_at_once(answers):
    """The most requests that were inside their views at one time, from
    the wall-clock times the probes give: work cannot have run more at
    once than that, however the times add up."""
    events = sorted(
        [(a['began'], 1) for a in answers]
        + [(a['ended'], -1) for a in answers]
    )
    most = inside = 0
    for _, step in events:
        inside += step
        most = max(most, inside)
    return most


def _by_process(answers):
    """``answers`` by the id of the process that gave them."""
    mine = {}
    for answer in answers:
        mine.setdefault(answer['pid'], []).append(answer)
    return mine


def _union(answers, until=math.inf):
    """Seconds in which at least one of ``answers`` was in its view,
    before ``until``."""
    total, end = 0.0, -math.inf
    for began, ended in sorted(
        (a['began'], min(a['ended'], until)) for a in answers
    ):
        start = max(began, end)
        if ended > start:
            total += ended - start
            end = ended
    return total


def _share(answer):
    """The share of a core a probe got: its CPU time ÷ its time in the
    view, from 1% to 1."""
    return min(1.0, max(answer['cpu_seconds'] / max(answer['seconds'], 1e-9),
                        0.01))  # fmt: skip


def measure(base, probe, *, concurrency, duration, ms, token, progress):
    """Drive ``probe`` for about ``duration`` seconds: a request alone,
    then a round of twice ``concurrency`` at once, in turns. Twice, so
    that each process of a server of several has as many as it has
    threads, however the requests fall between them."""
    url = f'{base}/_dbtune/probe/{probe}?ms={ms}'
    sent = 2 * concurrency
    # Long enough for every request of a round to queue behind the others.
    timeout = 10 + 4 * sent * ms / 1000
    first, _ = fetch(url, token, timeout)
    db_wait = first.get('db_wait', True)
    result = Measurement(
        probe,
        concurrency,
        'cpu_seconds' if probe == 'cpu' or not db_wait else 'seconds',
        sent=sent,
    )

    def round_of():
        began = time.perf_counter()
        answers = list(
            pool.map(lambda _: fetch(url, token, timeout), [0] * sent)
        )
        return time.perf_counter() - began, [a for a, _ in answers]

    with ThreadPoolExecutor(sent) as pool:
        # A first round, not counted: it starts the threads, the
        # connections and the workers, on both sides.
        round_of()
        start = time.monotonic()
        while (
            len(result.rounds) < MIN_ROUNDS
            or time.monotonic() - start < duration
        ):
            answer, seconds = fetch(url, token, timeout)
            result.single.append(seconds)
            result.alone.append(answer)
            took, answers = round_of()
            result.rounds.append(took)
            result.answers += answers
            progress.update(probe, (time.monotonic() - start) / duration)
    progress.done(probe)
    return result, first


class Progress:
    """A progress bar on a terminal; a line a probe elsewhere; nothing
    when ``stream`` is ``None``."""

    WIDTH = 30

    def __init__(self, stream=None):
        self.stream = stream
        self.tty = stream is not None and stream.isatty()

    def update(self, probe, fraction):
        if self.tty:
            done = int(self.WIDTH * min(fraction, 1.0))
            bar = '#' * done + '.' * (self.WIDTH - done)
            self.stream.write(
                f'\r{probe:>4} [{bar}] {min(fraction, 1.0):4.0%}'
            )
            self.stream.flush()

    def done(self, probe):
        if self.stream is None:
            return
        if self.tty:
            self.stream.write('\r' + ' ' * (self.WIDTH + 12) + '\r')
        self.stream.write(f'threadcheck: {probe} probe done\n')
        self.stream.flush()
