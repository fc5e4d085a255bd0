"""Asking a running server's probe views over HTTP, side by side: what
each answer says, and what a round of them measured."""

import http.client
import json
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
    """One probe's timings: single requests, and rounds of N at once."""

    probe: str
    concurrency: int
    #: The answers' field that is a request's work: ``seconds`` in the
    #: view for waits, ``cpu_seconds`` for CPU work (whose time in the
    #: view includes waiting for the GIL).
    work_of: str = 'seconds'
    #: Seconds of each request sent alone.
    single: list = field(default_factory=list)
    #: The probes' answers to the requests sent alone.
    alone: list = field(default_factory=list)
    #: Seconds of each round of ``concurrency`` requests at once.
    rounds: list = field(default_factory=list)
    #: The probes' answers in the rounds.
    answers: list = field(default_factory=list)
    #: Seconds of each round of ``concurrency`` requests that do no work
    #: (``ms=0``): the fixed cost of a round.
    baseline: list = field(default_factory=list)

    def _works(self):
        """Seconds of work the probes did in each round."""
        n = self.concurrency
        return [
            sum(_work(a, self.work_of) for a in self.answers[i : i + n])
            for i in range(0, len(self.answers), n)
        ]

    @property
    def work(self):
        """Seconds of work the probes did in a round (median)."""
        return statistics.median(self._works())

    @property
    def raw_parallelism(self):
        """How many requests' work ran at once: for each round, the
        seconds of work its probes did ÷ the seconds it took beyond the
        round of requests that do no work sent right after it (at least
        the work of one request in ``concurrency``), and at most the
        requests that were in their views at one time; the median of the
        rounds."""
        return statistics.median(v for v, _ in self._parallelisms())

    def _parallelisms(self):
        """Each round's reading, and the most requests in views at once."""
        baseline = self.baseline or [0.0] * len(self.rounds)
        n = self.concurrency
        readings = []
        for i, (work, took, fixed) in enumerate(
            zip(self._works(), self.rounds, baseline, strict=True)
        ):
            most = _most_at_once(self.answers[i * n : i * n + n])
            readings.append(
                (min(work / max(took - fixed, work / n, 1e-9), most), most)
            )
        return readings

    @property
    def parallelism(self):
        """:attr:`raw_parallelism`; for CPU work, each round's reading ÷
        the share of a core its processes got while they had work (see
        :attr:`round_core_share`), so that other programs that take part
        of the cores do not read as the server's doing."""
        if self.work_of != 'cpu_seconds':
            return self.raw_parallelism
        return statistics.median(
            min(most, value / share)
            for (value, most), share in zip(
                self._parallelisms(), self._round_shares(), strict=True
            )
        )

    def _round_shares(self):
        """Each round's share of a core that its processes got while
        they had a request in a view: their CPU time ÷ the time they had
        one (the GIL does not lower it: a process whose threads take
        turns still uses its core)."""
        n = self.concurrency
        shares = []
        for i, alone in enumerate(self.alone):
            answers = self.answers[i * n : i * n + n]
            if not all('began' in a for a in answers):
                shares.append(_share(alone))  # an older pyramid_dbtune
                continue
            cpu = busy = 0.0
            for pid in {a['pid'] for a in answers}:
                mine = [a for a in answers if a['pid'] == pid]
                cpu += sum(a['cpu_seconds'] for a in mine)
                busy += _union(mine)
            shares.append(min(1.0, max(cpu / max(busy, 1e-9), 0.01)))
        return shares

    @property
    def round_core_share(self):
        """The share of a core the processes got while they had work in
        the rounds (median): below 1, other programs had the cores."""
        return statistics.median(self._round_shares())

    @property
    def throughput_ratio(self):
        """Requests per second N at once ÷ requests per second alone."""
        at_once = self.concurrency * len(self.rounds) / sum(self.rounds)
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
            'baseline_round_ms': round(
                statistics.median(self.baseline or [0.0]) * 1000, 1
            ),
            'work_ms': round(self.work * 1000, 1),
            'requests': len(self.single)
            + self.concurrency * (len(self.rounds) + len(self.baseline)),
            'served': {str(p): t for p, t in self.served.items()},
            'core_share_alone': round(self.core_share, 2),
            'core_share_in_rounds': round(self.round_core_share, 2),
        }


def _work(answer, field):
    """A request's work: the wait asked of the ``io`` probe (its time in
    the view also counts its wait for the GIL after the sleep), else the
    answer's ``field``."""
    if answer['probe'] == 'io' and field == 'seconds':
        return answer['ms'] / 1000
    return answer[field]


def _most_at_once(answers):
    """The most requests that were inside their views at one time, from
    the wall-clock times the probes give: work cannot have run more at
    once than that, however the times add up. Requests that sat in a
    queue before the server took them (a listen backlog) make a round
    longer for work and no work alike."""
    if not all('began' in a for a in answers):
        return len(answers)  # a probe of an older pyramid_dbtune
    events = sorted(
        [(a['began'], 1) for a in answers]
        + [(a['ended'], -1) for a in answers]
    )
    most = inside = 0
    for _, step in events:
        inside += step
        most = max(most, inside)
    return most


def _union(answers):
    """Seconds in which at least one of ``answers`` was in its view."""
    total, end = 0.0, float('-inf')
    for began, ended in sorted((a['began'], a['ended']) for a in answers):
        if ended > end:
            total += ended - max(began, end)
            end = ended
    return total


def _share(answer):
    """The share of a core a probe got: its CPU time ÷ its time in the
    view, from 1% to 1."""
    return min(1.0, max(answer['cpu_seconds'] / max(answer['seconds'], 1e-9),
                        0.01))  # fmt: skip


def measure(base, probe, *, concurrency, duration, ms, token, progress):
    """Drive ``probe`` for about ``duration`` seconds: a request alone,
    ``concurrency`` at once, and ``concurrency`` that do no work (the
    ``io`` probe with ``ms=0``), in turns."""
    url = f'{base}/_dbtune/probe/{probe}?ms={ms}'
    empty = f'{base}/_dbtune/probe/io?ms=0'
    # Long enough for every request of a round to queue behind the others.
    timeout = 10 + 4 * concurrency * ms / 1000
    first, _ = fetch(url, token, timeout)
    db_wait = first.get('db_wait', True)
    result = Measurement(
        probe,
        concurrency,
        'cpu_seconds' if probe == 'cpu' or not db_wait else 'seconds',
    )

    def round_of(target):
        began = time.perf_counter()
        answers = list(
            pool.map(lambda _: fetch(target, token, timeout), [0] * n)
        )
        return time.perf_counter() - began, [a for a, _ in answers]

    n = concurrency
    with ThreadPoolExecutor(concurrency) as pool:
        # A first round of each, not counted: it starts the threads, the
        # connections and the workers, on both sides.
        round_of(url)
        round_of(empty)
        start = time.monotonic()
        while (
            len(result.rounds) < MIN_ROUNDS
            or time.monotonic() - start < duration
        ):
            answer, seconds = fetch(url, token, timeout)
            result.single.append(seconds)
            result.alone.append(answer)
            took, answers = round_of(url)
            result.rounds.append(took)
            result.answers += answers
            result.baseline.append(round_of(empty)[0])
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
