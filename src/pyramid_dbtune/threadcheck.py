"""``dbtune threadcheck URL``: am I threading, and how well?

Drives the probe views of :mod:`pyramid_dbtune.probes` on a running
server, one request at a time and ``N`` at once, in turns, so that other
load on the machine spoils both alike. For each probe it measures the
effective parallelism, ``N`` × the single request's time ÷ the time ``N``
requests at once take, and the throughput ratio; it notes the processes
and threads that served, compares them with what the server claims, and
says in plain words what it found.

Standard library only, so that it runs on any machine that can reach the
server.
"""

import argparse
import json
import os
import statistics
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .access import HEADER

#: The probes, in the order they run.
PROBES = ('io', 'cpu', 'sql')
#: A parallelism below this share of what the server claims is far below.
FAR_BELOW = 0.5
#: Rounds of N requests at once, at the least, whatever the duration.
MIN_ROUNDS = 2
#: A CPU probe alone that gets less of a core than this: the host is busy.
BUSY = 0.7
NAMES = {'io': 'I/O', 'cpu': 'CPU', 'sql': 'SQL'}
#: Straight to the server: a proxy in between would be measured too.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ProbeError(Exception):
    """A probe could not be reached, or did not answer as a probe does."""


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
    #: Seconds of each request sent alone.
    single: list = field(default_factory=list)
    #: The probes' answers to the requests sent alone.
    alone: list = field(default_factory=list)
    #: Seconds of each round of ``concurrency`` requests at once.
    rounds: list = field(default_factory=list)
    #: The probes' answers in the rounds.
    answers: list = field(default_factory=list)

    @property
    def parallelism(self):
        """N × a single request's time ÷ a round's time (medians)."""
        return (
            self.concurrency
            * statistics.median(self.single)
            / statistics.median(self.rounds)
        )

    @property
    def throughput_ratio(self):
        """Requests per second N at once ÷ requests per second alone."""
        at_once = self.concurrency * len(self.rounds) / sum(self.rounds)
        return at_once / (len(self.single) / sum(self.single))

    @property
    def core_share(self):
        """How much of a core a request alone got: its CPU time ÷ its
        time in the view (medians). Below 1, other work had the cores."""
        return statistics.median(
            a['cpu_seconds'] / max(a['seconds'], 1e-9) for a in self.alone
        )

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
            'throughput_ratio': round(self.throughput_ratio, 2),
            'single_ms': round(statistics.median(self.single) * 1000, 1),
            'round_ms': round(statistics.median(self.rounds) * 1000, 1),
            'requests': len(self.single) + self.concurrency * len(self.rounds),
            'served': {str(p): t for p, t in self.served.items()},
            'core_share_alone': round(self.core_share, 2),
        }


def measure(base, probe, *, concurrency, duration, ms, token, progress):
    """Drive ``probe`` for about ``duration`` seconds: a request alone,
    then ``concurrency`` at once, in turns."""
    url = f'{base}/_dbtune/probe/{probe}?ms={ms}'
    # Long enough for every request of a round to queue behind the others.
    timeout = 10 + 4 * concurrency * ms / 1000
    result = Measurement(probe, concurrency)
    first, _ = fetch(url, token, timeout)  # also warms the server up
    with ThreadPoolExecutor(concurrency) as pool:
        start = time.monotonic()
        while (
            len(result.rounds) < MIN_ROUNDS
            or time.monotonic() - start < duration
        ):
            answer, seconds = fetch(url, token, timeout)
            result.single.append(seconds)
            result.alone.append(answer)
            began = time.perf_counter()
            answers = list(
                pool.map(
                    lambda _: fetch(url, token, timeout), range(concurrency)
                )
            )
            result.rounds.append(time.perf_counter() - began)
            result.answers += [answer for answer, _ in answers]
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
            self.stream.write(f'\r{probe:>4} [{bar}] {fraction:4.0%}')
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
    probe got alone (see :attr:`Measurement.core_share`)."""
    expected = capacity.expected(probe, concurrency, db_wait)
    far = measured < FAR_BELOW * expected
    head = f'{NAMES[probe]}: {measured:.1f} of {concurrency}'
    if probe == 'cpu' and share < BUSY:
        return (
            f'{head} — the host is busy: a CPU request alone got '
            f'{share:.0%} of a core, so this reading says little about '
            'the server; run again when the host is quiet',
            False,
        )
    processes, threads = capacity.processes, capacity.threads
    cores = capacity.cores
    if far:
        why = {
            'io': 'something serialises requests that only wait (a lock, '
            'or a one-at-a-time proxy or server in front)',
            'cpu': 'the processes share fewer cores than they seem to '
            '(CPU affinity, a container limit) or the host is busy',
            'sql': 'reads queue for the database: look at '
            "dbtune.read_pool_size and the database's connection limit",
        }[probe]
        return (
            f'{head} — far below the {expected} this server claims '
            f'({processes} × {threads}): {why}',
            True,
        )
    cpu_like = probe == 'cpu' or (probe == 'sql' and not db_wait)
    if probe == 'sql' and not db_wait:
        head += (
            " (this database's probe does not wait in the database: it "
            "measures Python's work on the read path)"
        )
    if cpu_like and cores == 1 and concurrency > 1:
        return (
            f'{head} — this host has 1 core: CPU work runs one request at '
            'a time whatever the server does',
            False,
        )
    if cpu_like and processes == 1 and threads > 1:
        return (
            f'{head} — CPU work is serialised by the GIL inside one '
            f'process; run {cores} processes (this host has '
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
    base = base.rstrip('/')
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
            if probe == 'sql' and measured:
                continue  # the application has no database
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
            result.core_share,
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
        if value is None or value < low or (high and value > high):
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


def add_parser(commands):
    """Add ``threadcheck`` to the ``dbtune`` command's subcommands."""
    from .probes import MAX_MS

    parser = commands.add_parser(
        'threadcheck',
        help='measure how many requests a server really runs at once',
        description=__doc__.split('\n\n')[1].replace('\n', ' '),
    )
    parser.add_argument('url', help='the application, e.g. http://host:8000')
    parser.add_argument(
        '--concurrency', '-n', type=_positive(int, 2), default=8,
        help='requests at once (default 8)',
    )  # fmt: skip
    parser.add_argument(
        '--duration', '-d', type=_positive(float, 0.1), default=2.0,
        help='about how many seconds each probe runs (default 2)',
    )  # fmt: skip
    parser.add_argument(
        '--ms', type=_positive(int, 1, MAX_MS), default=50,
        help='milliseconds each probe request works (default 50)',
    )  # fmt: skip
    parser.add_argument(
        '--token', default=os.environ.get('DBTUNE_TOKEN'),
        help="the application's dbtune.stats.token (default: $DBTUNE_TOKEN)",
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
