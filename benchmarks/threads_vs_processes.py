"""Threads versus processes under gunicorn: the old table, on this host.

Two pages, the probe views of pyramid_dbtune: a CPU-bound one (``cpu``,
10 ms of Python work) and an I/O-bound one (``io``, 10 ms of waiting).
Each is served by gunicorn (``-c python:pyramid_dbtune.gunicorn``) as

* 1×1: one sync worker, one request at a time;
* 1×8: one worker of 8 threads;
* 2×1: two sync workers;
* 2×4: two workers of 4 threads each;

and driven by ``wrk`` (installed with apt-get when missing), 16
connections. It prints requests per second and each one's ratio to 1×1,
and saves a bar chart (matplotlib) as a PNG. All four servers run for the
whole run, and every round measures each of them in turn, so that other
load on the machine spoils all of them alike; each figure is the best of
the rounds.

    .venv/bin/python benchmarks/threads_vs_processes.py [--quick] [--png P]

What it shows: threads multiply the pages that wait and do nothing for
the pages that compute (the GIL runs one thread of a process at a time);
processes multiply both, up to the cores.
"""

import argparse
import sys
import tempfile
from functools import partial
from pathlib import Path

from common import (
    ensure_wrk,
    free_port,
    gunicorn_command,
    print_rates,
    requests_per_second,
    start_server,
    stop_server,
    together,
)
from probe_app import TOKEN

CONFIGS = {
    '1×1': ['--workers', '1', '--threads', '1', '-k', 'sync'],
    '1×8': ['--workers', '1', '--threads', '8'],
    '2×1': ['--workers', '2', '--threads', '1', '-k', 'sync'],
    '2×4': ['--workers', '2', '--threads', '4'],
}
PAGES = {'CPU-bound': 'cpu', 'I/O-bound': 'io'}
MS = 10
CONNECTIONS = 16
PNG = Path(__file__).parents[1] / 'docs' / 'threads_vs_processes.png'


def measure(seconds, rounds):
    """Requests per second: {page: {config: best of rounds}}."""
    wrk = ensure_wrk()
    best = {page: dict.fromkeys(CONFIGS, 0.0) for page in PAGES}
    running = {}
    try:
        ports = [free_port() for _ in CONFIGS]
        processes = together(
            [
                partial(start_server, gunicorn_command(port, *flags), port)
                for flags, port in zip(CONFIGS.values(), ports, strict=True)
            ],
            stop_server,
        )
        running = dict(
            zip(CONFIGS, zip(processes, ports, strict=True), strict=True)
        )
        for _ in range(rounds):
            for page, probe in PAGES.items():
                for name, (_, port) in running.items():
                    url = f'http://127.0.0.1:{port}/_dbtune/probe/{probe}'
                    rate = requests_per_second(
                        wrk,
                        f'{url}?ms={MS}',
                        seconds,
                        connections=CONNECTIONS,
                        headers=[f'X-Dbtune-Token: {TOKEN}'],
                    )
                    best[page][name] = max(best[page][name], rate)
    finally:
        for process, _ in running.values():
            stop_server(process)
    return best


def report(best, seconds, rounds):
    print_rates(
        f'gunicorn workers × threads; requests per second (wrk, '
        f'{CONNECTIONS} connections, {seconds} s, best of {rounds}); '
        f'pages: {MS} ms of CPU, {MS} ms of waiting',
        {name: name for name in CONFIGS},
        best,
        '1×1',
        8,
    )
    cpu, io = best['CPU-bound'], best['I/O-bound']
    print(
        f'\nCPU-bound: 2×1 / 1×8 = {cpu["2×1"] / cpu["1×8"]:.2f} '
        f'(processes over threads); 1×8 / 1×1 = '
        f'{cpu["1×8"] / cpu["1×1"]:.2f} (threads, one GIL)'
    )
    print(
        f'I/O-bound: 1×8 / 1×1 = {io["1×8"] / io["1×1"]:.2f} (threads '
        f'wait together); 2×1 / 1×1 = {io["2×1"] / io["1×1"]:.2f}'
    )


def chart(best, path):
    import matplotlib

    matplotlib.use('Agg')
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(1, 2, figsize=(9, 3.6))
    for ax, (page, rates) in zip(axes, best.items(), strict=True):
        bars = ax.bar(list(rates), list(rates.values()),
                      color=['#888', '#4a7', '#47a', '#a74'])  # fmt: skip
        ax.bar_label(bars, fmt='%.0f', fontsize=8)
        ax.set_title(f'{page} page ({MS} ms)')
        ax.set_xlabel('gunicorn workers × threads')
        ax.set_ylabel('requests per second')
        ax.margins(y=0.15)
    figure.suptitle('Threads versus processes (wrk, 16 connections)')
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
    print(f'\nchart: {path}')


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        '--quick', action='store_true', help='short runs: checks it runs'
    )
    parser.add_argument(
        '--png', type=Path, help=f'where the chart goes (default {PNG.name} '
        'in docs/; with --quick, a temporary file)',
    )  # fmt: skip
    args = parser.parse_args(argv)
    seconds, rounds = (1, 1) if args.quick else (3, 3)
    best = measure(seconds, rounds)
    report(best, seconds, rounds)
    png = args.png
    if png is None:
        png = Path(tempfile.mkdtemp()) / PNG.name if args.quick else PNG
    chart(best, png)
    return 0


if __name__ == '__main__':
    sys.exit(main())
