"""What the ``egg:pyramid_dbtune#zope`` filter adds to a Zope request.

Side by side in one run, in process (no server), microseconds per
request, for an application standing for Zope's that answers at once:
the application called directly, then behind the filter with nothing on
(it is the application), with the probes on (``/_dbtune/`` apart, the
rest straight on), with ``dbtune.server_timing`` and with
``dbtune.stats`` (every request through the filter's Pyramid
application and the timing tween). Each figure is the best of several
rounds, the forms run in turn in each round.

    .venv/bin/python benchmarks/bench_zope_filter.py [--quick]
"""

import argparse
import time

from common import best_of_rounds
from pyramid_dbtune.registry import DBTune
from pyramid_dbtune.settings import parse
from pyramid_dbtune.zope.ops import front

TOKEN = 'a-benchmark-token-of-some-length'
FORMS = {
    'nothing on': {'dbtune.cache.default_time': '5'},
    'probes': {'dbtune.probes': 'true', 'dbtune.stats.token': TOKEN},
    'server_timing': {'dbtune.server_timing': 'true'},
    'stats': {'dbtune.stats': 'true', 'dbtune.stats.token': TOKEN},
}


def zope(environ, start_response):
    start_response('200 OK', [('Content-Type', 'text/plain')])
    return [b'published']


def environ():
    return {
        'REQUEST_METHOD': 'GET',
        'PATH_INFO': '/folder/page',
        'SCRIPT_NAME': '',
        'QUERY_STRING': '',
        'SERVER_NAME': 'localhost',
        'SERVER_PORT': '80',
        'SERVER_PROTOCOL': 'HTTP/1.1',
        'wsgi.url_scheme': 'http',
    }


def start_response(status, headers, exc_info=None):
    pass


def timer(app, calls):
    def measure():
        start = time.perf_counter()
        for _ in range(calls):
            for _ in app(environ(), start_response):
                pass
        return (time.perf_counter() - start) / calls

    return measure


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--quick', action='store_true')
    args = parser.parse_args()
    calls, rounds = (500, 2) if args.quick else (20000, 5)
    apps = {'Zope alone': zope}
    for name, settings in FORMS.items():
        apps[name] = front(zope, DBTune(parse(settings)))
    best = best_of_rounds(
        {name: timer(app, calls) for name, app in apps.items()}, rounds
    )
    alone = best['Zope alone']
    print(f'{"form":<16} {"us/request":>10} {"added us":>9}')
    for name, seconds in best.items():
        print(
            f'{name:<16} {seconds * 1e6:10.2f} {(seconds - alone) * 1e6:9.2f}'
        )


if __name__ == '__main__':
    main()
