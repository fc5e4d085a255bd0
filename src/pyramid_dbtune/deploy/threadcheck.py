"""``dbtune threadcheck URL``: am I threading, and how well?

Drives the probe views of :mod:`pyramid_dbtune.ops.probes` on a running
server, one request at a time and ``N`` at once, in turns, so that other
load on the machine spoils both alike. For each probe it measures the
effective parallelism, the seconds of work the probes did in a round of
``N`` requests at once ÷ the seconds the round took beyond what ``N``
requests that do no work take, and the throughput ratio; it notes the
processes and threads that served, compares them with what the server
claims, and says in plain words what it found.

It asks over HTTP with the standard library's ``urllib``: no client
library, nothing beyond pyramid_dbtune's own install.
"""

import argparse
import http.client
import json
import math
import os
import statistics
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..ops.access import HEADER

#: The probes, in the order they run.
PROBES = ('io', 'cpu', 'sql')
#: Far below: when the parallelism above 1 is below this share of the
#: parallelism above 1 that the server claims (1 of 2 is far below).
FAR_BELOW = 0.5
#: Rounds of N requests at once, at the least, whatever the duration.
MIN_ROUNDS = 3
#: The fewest milliseconds of work a request may be asked for: below it,
#: the fixed cost of a request (HTTP, Pyramid, the client's threads)
#: outweighs the work, and the readings are mostly noise.
MIN_MS = 10
#: Where one request at a time is claimed, a parallelism below this says
#: that requests queued before the application took them.
QUEUED = 0.7
#: CPU probes that get less of a core than this, alone or in the rounds
#: (see :attr:`Measurement.round_core_share`): the host is too busy for
#: a CPU reading. Above it, the reading is divided by the share.
BUSY = 0.4
NAMES = {'io': 'I/O', 'cpu': 'CPU', 'sql': 'SQL'}
#: Worker classes whose requests run on green threads, not OS threads.
GREEN = ('gevent', 'eventlet', 'gevent_wsgi', 'gevent_pywsgi')


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


@dataclass
class Capacity:
    """What the server's configuration claims, from the probes' answers."""

    processes: int
    threads: int
    cores: int
    claims: dict

    @classmethod
    def of(cls, claims, served, concurrency):
        """``claims`` as the probes said them; ``served``: process id to
        thread ids seen. Where the server declares no counts, its WSGI
        flags say whether it claims more than one process or thread: as
        many as were seen then, or, where only one was seen, more (two
        processes; ``concurrency`` threads)."""
        seen = max((len(t) for t in served.values()), default=1)
        processes = claims['workers'] or (
            max(len(served), 2) if claims['multiprocess'] else 1
        )
        threads = claims['threads'] or (
            (seen if seen > 1 else concurrency) if claims['multithread'] else 1
        )
        # What served is there, whatever the server says (several servers
        # behind a balancer, say).
        processes = max(processes, len(served))
        threads = max(threads, seen)
        return cls(processes, threads, claims['cores'], claims)

    def expected(self, probe, concurrency, db_wait=True):
        """The parallelism the configuration allows for ``probe``."""
        if probe == 'cpu' or (probe == 'sql' and not db_wait):
            return min(concurrency, self.processes, self.cores)
        return min(concurrency, self.processes * self.threads)

    def describe(self):
        claims = self.claims
        words = [claims['software'] or 'a WSGI server']
        if claims['worker_class']:
            words.append(claims['worker_class'])
        declared = claims['workers'] is not None
        words.append(
            f'{_count(self.processes, "process", "processes")} × '
            f'{_count(self.threads, "thread")} '
            + ('declared' if declared else 'judged from the WSGI flags')
        )
        flags = [
            f'wsgi.{flag} = {str(bool(claims[flag])).lower()}'
            for flag in ('multithread', 'multiprocess')
        ]
        return (
            ', '.join(words)
            + f' ({", ".join(flags)}); '
            + f'the host has {_count(self.cores, "core")}'
        )


def _count(number, noun, plural=None):
    return f'{number} {noun if number == 1 else plural or noun + "s"}'


def judge(probe, measured, capacity, concurrency, db_wait=True, share=1.0):
    """A sentence on one probe's parallelism, and whether it is far
    below what the configuration claims. ``share``: of a core, that the
    probe got, alone or in the rounds, whichever is less (see
    :attr:`Measurement.core_share`)."""
    expected = capacity.expected(probe, concurrency, db_wait)
    head = f'{NAMES[probe]}: {measured:.1f} of {concurrency}'
    if probe == 'cpu' and share < BUSY:
        return (
            f'{head} — the host is busy: CPU requests got {share:.0%} of '
            'a core while they ran, so this reading says little about the '
            'server; run again when the host is quiet',
            False,
        )
    if probe == 'sql' and not db_wait:
        return (
            f"{head} — this database's probe does not wait in the "
            "database: the reading is of Python's work on the read path, "
            'and is not judged',
            False,
        )
    processes, threads = capacity.processes, capacity.threads
    cores = capacity.cores
    if expected == 1 and measured < QUEUED:
        return (
            f'{head} — below the 1 that one request at a time gives: '
            'requests queued before the application took them (the '
            "server's listen backlog overflowing, a proxy in front, or a "
            'busy client machine)',
            False,
        )
    if expected > 1 and measured - 1 < FAR_BELOW * (expected - 1):
        why = {
            'io': 'something serialises requests that only wait (a lock, '
            'or a one-at-a-time proxy or server in front)',
            'cpu': 'the processes share fewer cores than they seem to '
            '(CPU affinity, a container limit), something serialises '
            'them (a lock shared by the processes), or the host is busy',
            'sql': 'reads queue for the database: look at '
            "dbtune.read_pool_size and the database's connection limit",
        }[probe]
        return (
            f'{head} — far below the {expected} this server claims '
            f'({processes} × {threads}): {why}',
            True,
        )
    if measured > max(2 * expected, expected + 1.5):
        return (
            f'{head} — well above the {expected} this server claims '
            f'({processes} × {threads}): more processes or threads serve '
            'than it declares (several servers behind a load balancer, '
            'or a worker class other than the configured one)',
            False,
        )
    if probe == 'cpu' and cores == 1 and concurrency > 1:
        return (
            f'{head} — this host has 1 core: CPU work runs one request at '
            'a time whatever the server does',
            False,
        )
    if probe == 'cpu' and processes == 1 and threads > 1:
        if capacity.claims['worker_class'] in GREEN:
            why = 'green threads take turns in one thread of one process'
        else:
            why = 'CPU work is serialised by the GIL inside one process'
        return (
            f'{head} — {why}; run {cores} processes (this host has '
            f'{_count(cores, "core")})',
            False,
        )
    if expected == 1 and concurrency > 1:
        return (
            f'{head} — one request at a time: one process with one thread, '
            'so a request that waits holds up every other; add threads '
            '(gunicorn --threads) or processes',
            False,
        )
    return f'{head} in parallel.', False


def check(
    base,
    *,
    concurrency=8,
    duration=2.0,
    ms=50,
    token=None,
    probes=PROBES,
    progress=None,
):
    """Run threadcheck against the application at ``base``; a report as
    a dict (what ``--json`` prints)."""
    base = _base_url(base)
    if token and not (token.isascii() and token.isprintable()):
        # Not echoed: it is a secret.
        raise ProbeError(
            'the token (--token or DBTUNE_TOKEN) must be printable ASCII, '
            f'to go in the {HEADER} header'
        )
    progress = progress or Progress()
    measured, firsts = {}, {}
    for probe in probes:
        try:
            measured[probe], firsts[probe] = measure(
                base,
                probe,
                concurrency=concurrency,
                duration=duration,
                ms=ms,
                token=token,
                progress=progress,
            )
        except NoProbe:
            if probe == 'sql' and _has_probes(base, token):
                if len(probes) > 1:
                    continue  # the application has no database
                raise NoProbe(
                    f'no sql probe at {base}: the application has no '
                    'database (dbtune.url); its io and cpu probes answer'
                ) from None
            raise NoProbe(
                f'no probe at {base}/_dbtune/probe/{probe}: set '
                'dbtune.probes = true in the application, and give its '
                'dbtune.stats.token with --token (or DBTUNE_TOKEN)'
            ) from None
    served = {}
    for result in measured.values():
        for pid, threads in result.served.items():
            served.setdefault(pid, set()).update(threads)
    claims = next(iter(firsts.values()))['claims']
    capacity = Capacity.of(claims, served, concurrency)
    report = {
        'url': base,
        'concurrency': concurrency,
        'duration': duration,
        'ms': ms,
        'claims': claims,
        'capacity': {
            'processes': capacity.processes,
            'threads': capacity.threads,
            'cores': capacity.cores,
        },
        'server': capacity.describe(),
        'probes': {},
        'verdict': [],
        'far_below': [],
    }
    for probe, result in measured.items():
        db_wait = firsts[probe].get('db_wait', True)
        sentence, far = judge(
            probe,
            result.parallelism,
            capacity,
            concurrency,
            db_wait,
            min(result.core_share, result.round_core_share),
        )
        report['probes'][probe] = {
            **result.as_dict(),
            'expected': capacity.expected(probe, concurrency, db_wait),
        }
        report['verdict'].append(sentence)
        if far:
            report['far_below'].append(probe)
    if report['far_below']:
        report['verdict'].append(
            'Verdict: parallelism is far below what the server claims ('
            + ', '.join(NAMES[p] for p in report['far_below'])
            + ').'
        )
    else:
        report['verdict'].append(
            'Verdict: the server runs requests as its configuration claims.'
        )
    return report


def _base_url(url):
    """``url`` without its trailing slashes, or a :class:`ProbeError`
    when it is not the http(s) URL of a server, without a query."""
    base = url.rstrip('/')
    try:
        parts = urllib.parse.urlsplit(base)
        parts.port  # noqa: B018 (raises ValueError when it is no port)
    except ValueError:
        parts = None
    # urlsplit drops tabs and newlines: look at the text itself too.
    if not (
        parts
        and parts.scheme in ('http', 'https')
        and parts.hostname
        and not (parts.query or parts.fragment)
        and base.isprintable()
        and ' ' not in base
    ):
        raise ProbeError(
            f'{url!r} is not a URL: give one such as http://host:8000'
        )
    return base


def _has_probes(base, token):
    try:
        fetch(f'{base}/_dbtune/probe/io?ms=0', token, 10)
    except ProbeError:
        return False
    return True


def format_report(report):
    """The report as text for a person."""
    lines = [
        f'threadcheck {report["url"]}: {report["concurrency"]} at once, '
        f'{report["ms"]} ms a request, about {report["duration"]} s a probe',
        f'server: {report["server"]}',
        '',
        f'{"probe":6} {"alone ms":>9} {"N at once ms":>13} '
        f'{"parallelism":>12} {"throughput x":>13}  served by',
    ]
    for probe, row in report['probes'].items():
        served = ', '.join(
            f'pid {pid} ({_count(len(t), "thread")})'
            for pid, t in row['served'].items()
        )
        lines.append(
            f'{probe:6} {row["single_ms"]:9.1f} {row["round_ms"]:13.1f} '
            f'{row["parallelism"]:12.2f} {row["throughput_ratio"]:13.2f}  '
            f'{served}'
        )
    lines.append('')
    lines += report['verdict']
    return '\n'.join(lines)


def _positive(kind, low, high=None):
    def convert(text):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if (
            value is None
            or not math.isfinite(value)
            or value < low
            or (high and value > high)
        ):
            upto = f' to {high}' if high else ' or more'
            raise argparse.ArgumentTypeError(
                f'{text!r} is not valid: expected a number from {low}{upto}'
            )
        return value

    return convert


def _probe_list(text):
    names = [n.strip() for n in text.split(',') if n.strip()]
    unknown = [n for n in names if n not in PROBES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f'{text!r} is not valid: expected probes among '
            f'{", ".join(PROBES)}, separated by commas'
        )
    return tuple(names)


#: Requests at once, at the most: a thread of this command each.
MAX_CONCURRENCY = 256


def add_parser(commands):
    """Add ``threadcheck`` to the ``dbtune`` command's subcommands."""
    from ..ops.probes import MAX_MS

    parser = commands.add_parser(
        'threadcheck',
        help='measure how many requests a server really runs at once',
        description=__doc__.split('\n\n')[1].replace('\n', ' '),
    )
    parser.add_argument('url', help='the application, e.g. http://host:8000')
    parser.add_argument(
        '--concurrency', '-n', type=_positive(int, 2, MAX_CONCURRENCY),
        default=8,
        help=f'requests at once, 2 to {MAX_CONCURRENCY} (default 8)',
    )  # fmt: skip
    parser.add_argument(
        '--duration', '-d', type=_positive(float, 0.1), default=2.0,
        help='about how many seconds each probe runs (default 2)',
    )  # fmt: skip
    parser.add_argument(
        '--ms', type=_positive(int, MIN_MS, MAX_MS), default=50,
        help=f'milliseconds each probe request works (default 50, at '
        f'least {MIN_MS})',
    )  # fmt: skip
    parser.add_argument(
        '--token', default=os.environ.get('DBTUNE_TOKEN'),
        help="the application's dbtune.stats.token; prefer setting "
        '$DBTUNE_TOKEN, which other users cannot see in the process list',
    )  # fmt: skip
    parser.add_argument(
        '--probes', type=_probe_list, default=PROBES,
        help='which probes, comma-separated (default io,cpu,sql)',
    )  # fmt: skip
    parser.add_argument(
        '--json', action='store_true', help='print the report as JSON'
    )
    parser.set_defaults(run=run)


def run(args, stdout=None, stderr=None):
    """The command: 0 when parallelism is as claimed, 1 when it is far
    below, 2 when the probes cannot be driven."""
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    try:
        report = check(
            args.url,
            concurrency=args.concurrency,
            duration=args.duration,
            ms=args.ms,
            token=args.token,
            probes=args.probes,
            progress=Progress(stderr),
        )
    except ProbeError as exc:
        stderr.write(f'threadcheck: {exc}\n')
        return 2
    if args.json:
        stdout.write(json.dumps(report, indent=2) + '\n')
    else:
        stdout.write(format_report(report) + '\n')
    return 1 if report['far_below'] else 0
