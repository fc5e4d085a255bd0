"""What a two-byte OK costs, from a bare WSGI callable to the full stack.

Side by side in one run, microseconds per request in process for:

* ``bare``: a WSGI callable that only answers (the floor);
* ``filter``: ``pyramid_dbtune.fastpath.wrap`` (the paste filter);
* ``include``: ``dbtune.fast_paths`` in a Pyramid app with pyramid_retry
  and pyramid_tm included;
* ``view``: a Pyramid URL-dispatch view;
* ``full``: pyramid_tm + pyramid_retry + traversal + a zope.sqlalchemy
  session joined to the request's transaction.

With ``--http``, requests per second through real servers (waitress and
gunicorn) driven by ``wrk``, installed with apt-get when missing. Each
figure is the best of several rounds, run in turn, so that other load on
the machine spoils all of them alike.

    .venv/bin/python benchmarks/bench_fastpath.py [--http] [--quick]

Targets: the filter adds under 1 us in process and is within 5% of the bare
callable over HTTP; the include-only form costs under 5 us in process.
"""

import argparse
import io
import sys
import time
from functools import partial

from common import (
    best_of_rounds,
    ensure_wrk,
    free_port,
    gunicorn_command,
    print_rates,
    requests_per_second,
    start_server,
    stop_server,
    together,
)
from fastpath_apps import PATH, VARIANTS, make

NAMES = {
    'bare': 'bare WSGI callable',
    'filter': 'fastpath filter (wrap)',
    'include': 'dbtune.fast_paths (include)',
    'view': 'Pyramid URL-dispatch view',
    'full': 'full stack (tm+retry+traversal+session)',
}


def environ_for(path):
    return {
        'REQUEST_METHOD': 'GET',
        'PATH_INFO': path,
        'SCRIPT_NAME': '',
        'QUERY_STRING': '',
        'SERVER_NAME': '127.0.0.1',
        'SERVER_PORT': '80',
        'SERVER_PROTOCOL': 'HTTP/1.1',
        'HTTP_HOST': '127.0.0.1',
        'wsgi.url_scheme': 'http',
        'wsgi.input': io.BytesIO(),
        'wsgi.errors': sys.stderr,
        'wsgi.version': (1, 0),
        'wsgi.multithread': True,
        'wsgi.multiprocess': False,
        'wsgi.run_once': False,
    }


def start_response(status, headers, exc_info=None):
    if not status.startswith('200'):
        raise AssertionError(status)


def per_request(app, calls, path=PATH, start_response=start_response):
    """Seconds per request, environ copy included (the same for all)."""
    template = environ_for(path)
    start = time.perf_counter()
    for _ in range(calls):
        body = app(dict(template), start_response)
        b''.join(body)
        if hasattr(body, 'close'):
            body.close()
    return (time.perf_counter() - start) / calls


def in_process(calls, rounds):
    apps = {name: make(name) for name in VARIANTS}
    for app in apps.values():
        assert b''.join(app(environ_for(PATH), start_response)) == b'OK'
    return best_of_rounds(
        {name: partial(per_request, app, calls) for name, app in apps.items()},
        rounds,
    )


def serve(server, variant, port):
    if server == 'waitress':
        command = [
            sys.executable,
            '-m',
            'waitress',
            f'--listen=127.0.0.1:{port}',
            '--threads=4',
            '--call',
            'fastpath_apps:app_factory',
        ]
    else:
        command = gunicorn_command(
            port,
            '--workers', '1',
            '--worker-class', 'gthread',
            '--threads', '4',
            app='fastpath_apps:app_factory()',
        )  # fmt: skip
    return start_server(command, port, {'DBTUNE_BENCH_VARIANT': variant})


def over_http(seconds, rounds, variants=VARIANTS):
    wrk = ensure_wrk()
    results = {}
    for server in ('waitress', 'gunicorn'):
        best = dict.fromkeys(variants, 0.0)
        running = {}
        try:
            ports = [free_port() for _ in variants]
            processes = together(
                [
                    partial(serve, server, variant, port)
                    for variant, port in zip(variants, ports, strict=True)
                ],
                stop_server,
            )
            running = dict(
                zip(variants, zip(processes, ports, strict=True), strict=True)
            )
            for _ in range(rounds):
                for variant, (_, port) in running.items():
                    best[variant] = max(
                        best[variant],
                        requests_per_second(
                            wrk, f'http://127.0.0.1:{port}{PATH}', seconds
                        ),
                    )
        finally:
            for process, _ in running.values():
                stop_server(process)
        results[server] = best
    return results


def report_in_process(best):
    bare = best['bare']
    print(f'In process, best of rounds ({PATH} -> OK):')
    print(f'{"what":42} {"us/req":>8} {"x bare":>7} {"+us":>7}')
    for name in VARIANTS:
        seconds = best[name]
        print(
            f'{NAMES[name]:42} {seconds * 1e6:8.2f} {seconds / bare:7.2f} '
            f'{(seconds - bare) * 1e6:7.2f}'
        )
    added = (best['filter'] - bare) * 1e6
    include = best['include'] * 1e6
    print(
        f'\nfilter adds {added:.2f} us (target < 1: '
        f'{"met" if added < 1 else "NOT met"}); include-only costs '
        f'{include:.2f} us (target < 5: {"met" if include < 5 else "NOT met"})'
    )
    print(
        f'full stack / include-only = {best["full"] / best["include"]:.1f}; '
        f'full stack / bare = {best["full"] / bare:.1f}'
    )


def report_http(results):
    print_rates(
        '\nOver HTTP (wrk -t2 -c16), requests per second, best of rounds:',
        {name: NAMES[name] for name in next(iter(results.values()))},
        results,
        'bare',
        42,
    )
    for server, r in results.items():
        gap = 1 - r['filter'] / r['bare']
        print(
            f'{server}: filter within {gap * 100:.1f}% of bare (target 5%: '
            f'{"met" if gap <= 0.05 else "NOT met"})'
        )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        '--http',
        action='store_true',
        help='also through waitress and gunicorn, with wrk',
    )
    parser.add_argument(
        '--quick', action='store_true', help='few calls: checks it runs'
    )
    args = parser.parse_args(argv)
    calls, rounds = (200, 2) if args.quick else (20000, 7)
    report_in_process(in_process(calls, rounds))
    if args.http:
        if args.quick:  # the two the target compares, once
            report_http(over_http(1, 1, ('bare', 'filter')))
        else:
            report_http(over_http(3, 3))
    return 0


if __name__ == '__main__':
    sys.exit(main())
