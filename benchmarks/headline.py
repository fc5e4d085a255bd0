"""The headline figure: the accommodation site under load, before and after.

On PostgreSQL, in one run, side by side (``headline_apps.py``):

1. **baseline**: the site as Pyramid's starter template has one write it
   (ORM session joined to pyramid_tm, no caching, one engine, the health
   check a view), served as the starter serves it: waitress, 4 threads;
2. **tuned**: the accommodation demo on pyramid_dbtune (cached SQL methods
   in memcached, a read pool apart from the writer, the health check on the
   fast path), under ``gunicorn -c python:pyramid_dbtune.gunicorn``.

``wrk`` replays a busy hour's mix for a fixed time at each concurrency:
mostly searches over a skewed spread of filters, some detail pages, a few
updates, and health checks. Meanwhile a checker (in this process) updates
a few watched properties and searches for them: no search may return a
state older than the last update committed before it started, less the
search's cache time; and no request may fail. It prints a table of
requests/s, p50 and p99 latency and errors, the ratios, and saves a PNG
chart.

    .venv/bin/python benchmarks/headline.py [--quick] [--seconds 10]

``make bench`` runs it; it installs wrk (apt-get) and memcached when they
are missing, and needs the PostgreSQL server of ``DBTUNE_TEST_POSTGRESQL``.
"""

import argparse
import datetime
import http.client
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

import sqlalchemy as sa

from bench_memcached import start_memcached
from common import (
    ensure_wrk,
    free_port,
    gunicorn_command,
    load_properties,
    postgresql_scratch,
    start_server,
    stop_server,
)
from headline_apps import ADMIN_TOKEN

HERE = Path(__file__).parent
PROPERTIES = 20000
#: The search's cache time in the demo (search_properties.sql).
SEARCH_CACHE_TIME = 30
#: The checker's properties: updated only by it, never by wrk.
WATCHED = 5
CHECK_AREA = 'Headingley'
CHECK_SEARCH = {
    'area': CHECK_AREA,
    'max_rent': '1000',
    'min_rooms': '1',
    'available': '2099-12-31',
}

# The busy hour, per 1,000 requests: 600 search pages, 100 JSON searches,
# 190 detail pages, 10 updates, 100 health checks. Filters and properties
# are picked with a skew (u^2, u^3): some areas and houses are looked at
# far more than others, as on a real site.
MIX = r"""
local areas = {"Headingley", "Hyde%20Park", "Burley", "Woodhouse",
               "City%20Centre", "Meanwood", "Kirkstall", "Little%20London"}
local rents = {150, 130, 180, 110, 250, 90}
local rooms = {1, 2, 3, 4}
local dates = {"2026-09-01", "2026-08-01", "2026-10-01", "2026-07-01",
               "2026-11-01", "2026-12-01"}
local first_update = __FIRST_UPDATE__
local count = __COUNT__
local token = "__TOKEN__"

local function skewed(list, power)
  return list[math.floor(#list * math.random() ^ power) + 1]
end

local function search()
  return "area=" .. skewed(areas, 2) .. "&max_rent=" .. skewed(rents, 2)
    .. "&min_rooms=" .. skewed(rooms, 2) .. "&available=" .. skewed(dates, 2)
end

local seeded = false

request = function()
  if not seeded then
    math.randomseed(os.time() + tonumber(tostring({}):sub(8), 16))
    seeded = true
  end
  local r = math.random(1000)
  if r <= 600 then
    return wrk.format("GET", "/?" .. search())
  elseif r <= 700 then
    return wrk.format("GET", "/api/search?" .. search())
  elseif r <= 890 then
    local id = math.floor(count * math.random() ^ 3) + 1
    return wrk.format("GET", "/property/" .. id)
  elseif r <= 900 then
    local id = math.random(first_update, count)
    local body = "rent=" .. math.random(70, 190)
      .. "&available=2026-0" .. math.random(6, 9) .. "-1" .. math.random(0, 9)
    return wrk.format("POST", "/admin/property/" .. id,
      {["X-Admin-Token"] = token,
       ["Content-Type"] = "application/x-www-form-urlencoded"}, body)
  else
    return wrk.format("GET", "/healthz")
  end
end
"""


def seed_database(url):
    """The demo's properties at ``url``; the checker's watched ids."""
    load_properties(url, PROPERTIES)
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        connection.exec_driver_sql('ANALYZE property')
        watched = connection.execute(
            sa.text(
                'SELECT id FROM property WHERE area = :area '
                'ORDER BY id LIMIT :count'
            ),
            {'area': CHECK_AREA, 'count': WATCHED},
        ).scalars()
        watched = list(watched)
    engine.dispose()
    return watched


def serve(form, port, env):
    if form == 'baseline':
        command = [
            sys.executable, '-m', 'waitress',
            f'--listen=127.0.0.1:{port}',
            '--threads=4',
            '--call', 'headline_apps:baseline_app',
        ]  # fmt: skip
    else:
        command = gunicorn_command(port, app='headline_apps:tuned_app()')
    process = start_server(command, port, env, timeout=60)
    # Up, and its database and cache answer.
    connection = http.client.HTTPConnection('127.0.0.1', port, 30)
    connection.request('GET', '/healthz')
    answer = connection.getresponse()
    connection.close()
    if answer.status != 200:
        stop_server(process)
        raise RuntimeError(f'{form}: /healthz answered {answer.status}')
    return process


class Checker(threading.Thread):
    """Updates the watched properties and searches for them, all the run.

    Each watched property's ``available`` date only ever moves on, one day
    per update, and its rent is 1 (so it is among the 50 cheapest shown):
    a search that shows date ``d`` for it shows the state of the update
    that set ``d``, and any later update's date means that one was seen.
    """

    def __init__(self, port, watched, pause=0.05):
        super().__init__(daemon=True)
        self.port = port
        self.watched = watched
        self.pause = pause
        self.stopping = threading.Event()
        # (committed by, id, day): the update's answer had come back.
        self.updates = []
        # (started, {id: day}) per search.
        self.searches = []
        self.failures = []
        self.day = 0

    def _ask(self, connection, method, path, body=None, headers=None):
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        data = response.read()
        if response.status != 200:
            self.failures.append(f'{method} {path}: {response.status}')
            return None
        return data

    def update(self, connection, id):
        self.day += 1
        body = urllib.parse.urlencode(
            {'rent': 1, 'available': day_text(self.day)}
        )
        answer = self._ask(
            connection,
            'POST',
            f'/admin/property/{id}',
            body,
            {
                'X-Admin-Token': ADMIN_TOKEN,
                'Content-Type': 'application/x-www-form-urlencoded',
            },
        )
        if answer is not None:
            self.updates.append((time.time(), id, self.day))

    def search(self, connection):
        started = time.time()
        query = urllib.parse.urlencode(CHECK_SEARCH)
        answer = self._ask(connection, 'GET', f'/api/search?{query}')
        if answer is not None:
            seen = {
                row['id']: day_of(row['available'])
                for row in json.loads(answer)['rows']
                if row['id'] in self.watched
            }
            self.searches.append((started, seen))

    def run(self):
        connection = http.client.HTTPConnection('127.0.0.1', self.port, 30)
        try:
            for id in self.watched:  # a known state to start from
                self.update(connection, id)
            turn = 0
            while not self.stopping.is_set():
                self.update(connection, self.watched[turn % WATCHED])
                turn += 1
                next_update = time.monotonic() + self.pause * 4
                while time.monotonic() < next_update:
                    self.search(connection)
                    time.sleep(self.pause)
        except Exception as exc:  # noqa: BLE001 (reported, not raised)
            self.failures.append(f'checker: {exc!r}')
        finally:
            connection.close()

    def stale(self, cache_time):
        """Searches that showed a state older than allowed."""
        bad = []
        for started, seen in self.searches:
            for id, day in seen.items():
                # The newest update of id committed before the search
                # started, less the cache time: that or newer must show.
                newest = max(
                    (
                        d
                        for t, i, d in self.updates
                        if i == id and t < started - cache_time
                    ),
                    default=0,
                )
                if day < newest:
                    bad.append((started, id, day, newest))
        missing = [s for s, seen in self.searches if len(seen) < WATCHED]
        return bad, missing


#: The checker's dates count days from here.
EPOCH = datetime.date(2030, 1, 1)


def day_text(day):
    return (EPOCH + datetime.timedelta(days=day)).isoformat()


def day_of(text):
    return (datetime.date.fromisoformat(text) - EPOCH).days


def run_wrk(wrk, script, port, concurrency, seconds):
    threads = min(concurrency, 2)
    done = subprocess.run(
        [
            wrk,
            f'-t{threads}',
            f'-c{concurrency}',
            f'-d{seconds}s',
            '--timeout',
            '10s',
            '--latency',
            '-s',
            script,
            f'http://127.0.0.1:{port}/',
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=seconds + 60,
    )
    out = done.stdout
    result = {
        'rps': float(re.search(r'Requests/sec:\s+([\d.]+)', out)[1]),
        'p50': latency(out, '50'),
        'p99': latency(out, '99'),
        'requests': int(re.search(r'(\d+) requests in', out)[1]),
    }
    errors = re.search(r'Non-2xx or 3xx responses: (\d+)', out)
    sockets = re.search(
        r'Socket errors: connect (\d+), read (\d+), write (\d+), '
        r'timeout (\d+)',
        out,
    )
    result['errors'] = int(errors[1]) if errors else 0
    if sockets:
        result['errors'] += sum(int(n) for n in sockets.groups())
    return result


def latency(out, percent):
    match = re.search(rf'^\s+{percent}%\s+([\d.]+)(us|ms|s)\s*$', out, re.M)
    value, unit = float(match[1]), match[2]
    return value * {'us': 0.001, 'ms': 1, 's': 1000}[unit]


def measure(form, url, memcached, watched, concurrencies, seconds, wrk):
    port = free_port()
    env = {'DBTUNE_HEADLINE_URL': url, 'DBTUNE_HEADLINE_MEMCACHED': memcached}
    process = serve(form, port, env)
    results = {}
    try:
        with tempfile.NamedTemporaryFile('w', suffix='.lua') as script:
            script.write(
                MIX.replace('__FIRST_UPDATE__', str(max(watched) + 1))
                .replace('__COUNT__', str(PROPERTIES))
                .replace('__TOKEN__', ADMIN_TOKEN)
            )
            script.flush()
            # Warm up: the first requests of each process open connections.
            run_wrk(wrk, script.name, port, max(concurrencies), 1)
            checker = Checker(port, watched)
            checker.start()
            for concurrency in concurrencies:
                print(
                    f'  {form}: concurrency {concurrency} for {seconds} s',
                    file=sys.stderr,
                )
                results[concurrency] = run_wrk(
                    wrk, script.name, port, concurrency, seconds
                )
            checker.stopping.set()
            checker.join(60)
    finally:
        stop_server(process)
    stale, missing = checker.stale(SEARCH_CACHE_TIME)
    return results, {
        'searches': len(checker.searches),
        'updates': len(checker.updates),
        'stale': len(stale),
        'stale_examples': stale[:3],
        'incomplete': len(missing),
        'failures': checker.failures[:5],
        'failed': len(checker.failures),
    }


def report(results, checks, concurrencies, chart):
    print(
        f'\nThe accommodation site on PostgreSQL, {PROPERTIES} properties; '
        f'{platform.machine()}, {os.cpu_count()} cores, Python '
        f'{platform.python_version()}'
    )
    print(
        f'{"form":9} {"conc":>4} {"req/s":>9} {"p50 ms":>8} {"p99 ms":>8} '
        f'{"errors":>6}'
    )
    for form in ('baseline', 'tuned'):
        for c in concurrencies:
            r = results[form][c]
            print(
                f'{form:9} {c:4} {r["rps"]:9.0f} {r["p50"]:8.2f} '
                f'{r["p99"]:8.2f} {r["errors"]:6}'
            )
    print('\ntuned / baseline:')
    for c in concurrencies:
        base, tuned = results['baseline'][c], results['tuned'][c]
        print(
            f'  concurrency {c:2}: {tuned["rps"] / base["rps"]:5.1f}x '
            f'requests/s, p99 {tuned["p99"]:.1f} ms vs {base["p99"]:.1f} ms'
        )
    for form in ('baseline', 'tuned'):
        check = checks[form]
        print(
            f'{form} checker: {check["searches"]} searches, '
            f'{check["updates"]} updates, {check["stale"]} stale beyond '
            f'{SEARCH_CACHE_TIME} s, {check["incomplete"]} incomplete, '
            f'{check["failed"]} failed {check["failures"] or ""}'
        )
    top = max(concurrencies)
    base, tuned = results['baseline'][top], results['tuned'][top]
    ratio = tuned['rps'] / base['rps']
    clean = (
        tuned['errors'] == 0
        and checks['tuned']['stale'] == 0
        and checks['tuned']['failed'] == 0
    )
    met = ratio >= 5 and tuned['p99'] < base['p99'] and clean
    print(
        f'\nAt concurrency {top}: tuned serves {ratio:.1f}x the baseline, '
        f'p99 {tuned["p99"]:.1f} ms vs {base["p99"]:.1f} ms, '
        f'{tuned["errors"]} errors, {checks["tuned"]["stale"]} stale reads '
        f'(target >= 5x, lower p99, no errors, no stale reads: '
        f'{"met" if met else "NOT met"})'
    )
    if chart:
        save_chart(results, concurrencies, chart)
        print(f'chart: {chart}')
    return clean


def save_chart(results, concurrencies, path):
    import matplotlib

    matplotlib.use('Agg')
    from matplotlib import pyplot

    figure, panes = pyplot.subplots(1, 2, figsize=(10, 4))
    width = 0.38
    places = range(len(concurrencies))
    for axes, (figure_name, title) in zip(
        panes, (('rps', 'requests/s'), ('p99', 'p99 latency, ms')), strict=True
    ):
        for offset, form, colour in (
            (-width / 2, 'baseline', '#999999'),
            (width / 2, 'tuned', '#2a7ab0'),
        ):
            axes.bar(
                [p + offset for p in places],
                [results[form][c][figure_name] for c in concurrencies],
                width,
                label=form,
                color=colour,
            )
        axes.set_xticks(list(places), [str(c) for c in concurrencies])
        axes.set_xlabel('concurrent clients (wrk)')
        axes.set_title(title)
        axes.legend()
    figure.suptitle('The accommodation site, before and after pyramid_dbtune')
    figure.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    pyplot.close(figure)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--quick', action='store_true')
    parser.add_argument('--seconds', type=int, default=10)
    parser.add_argument(
        '--chart',
        default=str(HERE.parent / 'docs/_static/headline.png'),
        help='where to save the PNG chart ("" for none)',
    )
    args = parser.parse_args(argv)
    seconds = 1 if args.quick else args.seconds
    concurrencies = (1, 8, 32)
    wrk = ensure_wrk()
    if shutil.which('memcached') is None:
        subprocess.run(
            ['bash', str(HERE.parent / '.ci/memcached.sh')], check=True
        )
    url, drop = postgresql_scratch()
    memcached, port = start_memcached()
    try:
        watched = seed_database(url)
        results, checks = {}, {}
        for form in ('baseline', 'tuned'):
            results[form], checks[form] = measure(
                form,
                url,
                f'127.0.0.1:{port}',
                watched,
                concurrencies,
                seconds,
                wrk,
            )
    finally:
        memcached.kill()
        memcached.wait()
        drop()
    clean = report(results, checks, concurrencies, args.chart)
    return 0 if clean else 1


if __name__ == '__main__':
    sys.exit(main())
