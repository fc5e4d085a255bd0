"""``dbtune threadcheck URL``: am I threading, and how well?

Drives the probe views of :mod:`pyramid_dbtune.ops.probes` on a running
server, one request at a time and ``2 N`` at once, in turns, so that other
load on the machine spoils both alike. For each probe it measures the
effective parallelism, up to ``N``, from the times the probes were in
their views (:class:`~pyramid_dbtune.deploy.probing.Measurement`), and
the throughput ratio; it notes the processes and threads that served,
judges each process and the whole against what the server claims, and
says in plain words what it found.

It asks over HTTP with the standard library's ``urllib``: no client
library, nothing beyond pyramid_dbtune's own install.
"""

import argparse
import json
import math
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from ..ops.access import HEADER
from .probing import (
    MIN_ROUNDS,
    Measurement,
    NoProbe,
    ProbeError,
    Progress,
    fetch,
    measure,
)

__all__ = [
    'Capacity',
    'Measurement',
    'NoProbe',
    'ProbeError',
    'check',
    'fetch',
    'format_report',
    'judge',
    'judge_processes',
    'MIN_ROUNDS',
]

#: The probes, in the order they run.
PROBES = ('io', 'cpu', 'sql')
#: Far below: when the parallelism above 1 is below this share of the
#: parallelism above 1 that the server claims (1 of 2 is far below).
FAR_BELOW = 0.5
#: The fewest milliseconds of work a request may be asked for: below it,
#: the fixed cost of a request (HTTP, Pyramid, the client's threads)
#: outweighs the work, and the readings are mostly noise.
MIN_MS = 10
#: Where one request at a time is claimed, a parallelism below this says
#: that requests queued before the application took them.
QUEUED = 0.7
#: CPU probes that get less of a core than this, alone or in the rounds
#: (see :attr:`Measurement.round_core_share`): the host is too busy for
#: a CPU reading. Above it, the reading is judged as it is: it counts the
#: processes that had a request in a view, which other programs do not lower.
BUSY = 0.4
NAMES = {'io': 'I/O', 'cpu': 'CPU', 'sql': 'SQL'}
#: Worker classes whose requests run on green threads, not OS threads.
GREEN = ('gevent', 'eventlet', 'gevent_wsgi', 'gevent_pywsgi')


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
        if probe == 'io':
            lagging = judge_processes(result.processes, capacity, concurrency)
            report['verdict'] += lagging
            far = far or bool(lagging)
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


def judge_processes(processes, capacity, concurrency):
    """A sentence for each process that ran far fewer of its waits at
    once than it had threads for, though the total may look right (one
    worker of several behind a lock)."""
    sentences = []
    for pid, (measured, sent) in processes.items():
        expected = min(capacity.threads, sent, concurrency)
        if expected > 1 and measured - 1 < FAR_BELOW * (expected - 1):
            sentences.append(
                f'I/O in process {pid}: {measured:.1f} of the {expected:g} '
                'it had threads and requests for — something in that process '
                'serialises requests that only wait (a lock)'
            )
    return sentences


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
            f'pid {pid} ({_count(len(t), "thread")}, '
            f'{row["processes"][pid]:.1f} at once)'
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
    return tuple(dict.fromkeys(names))  # each once, in order


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
