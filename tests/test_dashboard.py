"""The dashboard at /_dbtune/: served by a real server (waitress), loaded
in headless Chromium, its figures read back from the DOM.

Chromium's own command line (``--dump-dom``, ``--screenshot``) needs no
Python package and no driver: the page runs its script, fetches the
stats, and what it rendered is printed.
"""

import json
import os
import re
import shutil
import subprocess
import threading
import time
from html.parser import HTMLParser

import pytest
import waitress

from pyramid_dbtune.ops import access, dashboard, stats

from conftest import IN_CI, SEARCH, SET_RENT, call

TOKEN = 'a-token-of-16-chars-or-more'
AUTH = {access.HEADER: TOKEN}
ON = {
    'dbtune.stats': 'true',
    'dbtune.profile': 'true',
    'dbtune.stats.token': TOKEN,
}


def crunch(request):
    """Work the profile will show."""
    total = 0
    for i in range(200000):
        total += i % 7
    return {'total': total}


def empty_view(request):
    return {}


def chromium():
    binary = shutil.which('chromium')
    if binary is None:
        message = 'chromium is not installed (.ci/chromium.sh installs it)'
        if IN_CI:
            pytest.fail(f'{message} (CI=true: a missing tool fails the run)')
        pytest.skip(message)
    return binary


@pytest.fixture
def served(apps, sqlite_url, monkeypatch):
    """The app, with some traffic, served by waitress on loopback."""
    monkeypatch.setattr(stats, 'TICK', 0.05)  # points for the chart
    app = apps(sqlite_url, [SEARCH, SET_RENT], ON, views={'/crunch': crunch})
    app.app.registry.dbtune.stats.reset()
    for _ in range(3):
        call(app, ('search', {'area': 'Headingley'}))
        time.sleep(0.06)
    call(app, ('set_rent', {'id': 1, 'rent': 95}))
    call(app, ('search', {'area': 'Headingley'}))
    for i in range(20):
        app.get('/crunch')
        if i % 4 == 0:
            time.sleep(0.06)
    server = waitress.create_server(app.app, host='127.0.0.1', port=0)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    yield app, f'http://127.0.0.1:{server.effective_port}'
    server.close()
    thread.join(10)


def run_chromium(tmp_path, *args):
    command = [
        chromium(), '--headless', '--no-sandbox', '--disable-gpu',
        '--disable-dev-shm-usage', '--no-first-run', '--hide-scrollbars',
        f'--user-data-dir={tmp_path / "profile"}', *args,
    ]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


class Texts(HTMLParser):
    """The text of every element with an id, and the attributes."""

    def __init__(self):
        super().__init__()
        self.ids, self.attrs, self._open = {}, {}, []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if 'id' in attrs:
            self.attrs[attrs['id']] = attrs
            self.ids.setdefault(attrs['id'], '')
        self._open.append(attrs.get('id'))

    def handle_endtag(self, tag):
        if self._open:
            self._open.pop()

    def handle_data(self, data):
        for name in filter(None, self._open):
            self.ids[name] += data


def test_the_dashboard_in_a_browser(served, tmp_path):
    app, base = served
    url = f'{base}/_dbtune/?token={TOKEN}'
    screenshot = tmp_path / 'dashboard.png'
    run_chromium(tmp_path, '--window-size=1280,1600',
                 '--virtual-time-budget=3000', f'--screenshot={screenshot}',
                 url)  # fmt: skip
    assert screenshot.read_bytes().startswith(b'\x89PNG')
    assert screenshot.stat().st_size > 10000
    if os.environ.get('DBTUNE_SCREENSHOT'):  # for the docs' picture
        shutil.copy(screenshot, os.environ['DBTUNE_SCREENSHOT'])

    # The DOM after the page's script ran and refreshed once (2 s of
    # virtual time: the page fetched /_dbtune/stats and /_dbtune/profile).
    dom = run_chromium(tmp_path, '--virtual-time-budget=3000', '--dump-dom',
                       url)  # fmt: skip
    page = Texts()
    page.feed(dom)
    figures = app.get('/_dbtune/stats', headers=AUTH).json
    # 25, and the browser's favicon.ico requests (404), which may come
    # after the page's last refresh.
    assert 25 <= int(page.ids['requests']) <= figures['requests']
    assert page.ids['hit-ratio'] == str(figures['cache']['hit_ratio'])
    assert page.ids['hit-ratio'] == '0.5'  # 2 hits, 2 misses
    assert page.ids['in-flight'] == '0'
    assert page.ids['pid'] == str(os.getpid())
    assert re.fullmatch(r'\d+(\.\d+)?', page.ids['cpu-ratio'])
    assert page.ids['refresh-state'] == ''  # the refresh worked
    # The routes table: one row per route, with its count.
    rows = re.findall(r'<tr><td>([^<]+)</td><td>(\d+)</td>', dom)
    assert ('call', '5') in rows and ('/crunch', '20') in rows
    # The chart has its points, and its lines are drawn from them.
    points = int(page.attrs['chart']['data-points'])
    assert 3 <= points <= len(figures['history'])  # it ticks on
    drawn = page.attrs['latency-line']['points'].split()
    assert len(drawn) == points
    # Its axes: clock times under it, milliseconds and the ratio beside it.
    axes = page.ids['chart-axes']
    assert len(re.findall(r'\d\d:\d\d:\d\d', axes)) >= 2, axes
    assert f'{page.ids["chart-max"]} ms' in axes and '0 ms' in axes
    assert re.fullmatch(r'\d+\.\d', page.ids['chart-tick'])
    # The legend's spacing is for its entries, not the figure inside one.
    assert '.legend > span {' in dom and '.legend span {' not in dom
    # The profile names the view's function.
    assert 'crunch' in dom
    assert int(page.ids['profile-samples']) >= 1
    # The token is not copied into links.
    assert page.attrs['prof-link']['href'] == 'profile.prof'


def test_the_page_without_the_token_is_not_found(served):
    app, _ = served
    for path in ('', 'stats', 'metrics', 'profile', 'profile.prof',
                 'profile.folded'):  # fmt: skip
        app.get('/_dbtune/' + path, status=404)
        app.get('/_dbtune/' + path, status=404, params={'token': 'x' * 20})
        app.get('/_dbtune/' + path, headers=AUTH)
    app.post('/_dbtune/profile/reset', status=404)
    app.post('/_dbtune/profile/reset', headers=AUTH)


@pytest.mark.parametrize('feature', ['stats', 'profile'])
def test_a_page_of_one_feature(apps, sqlite_url, feature):
    app = apps(sqlite_url, [], {f'dbtune.{feature}': 'true',
                                'dbtune.stats.token': TOKEN})  # fmt: skip
    page = app.get('/_dbtune/', headers=AUTH)
    assert page.content_type == 'text/html'
    data = re.search(r'let data = (.*);\n', page.text).group(1)
    other = 'profile' if feature == 'stats' else 'stats'
    assert f'"{other}": null' in data and f'"{feature}": {{' in data
    app.get(f'/_dbtune/{other}', headers=AUTH, status=404)


def test_the_data_cannot_close_the_script(apps, sqlite_url):
    app = apps(sqlite_url, [], ON, views={'/</script><b>x': empty_view})
    app.get('/</script><b>x')
    page = app.get('/_dbtune/', headers=AUTH).text
    assert '</script><b>' not in page
    assert '\\u003c/script>\\u003cb>x' in page


def test_no_markup_in_the_data(apps, sqlite_url):
    app = apps(sqlite_url, [], ON, views={'/<!--<script>': empty_view})
    app.get('/<!--<script>')
    page = app.get('/_dbtune/', headers=AUTH).text
    data = re.search(r'let data = (.*);\n', page).group(1)
    assert '<' not in data and '\\u003c!--\\u003cscript>' in data
    assert json.loads(data)['stats']['routes']['/<!--<script>']


def test_the_page_carries_a_csrf_token_for_the_permission():
    from test_access import Policy, make_strict

    settings = {'stats.permission': 'view-stats', 'profile': 'true'}
    ops = {'X-User': 'ops'}
    page = make_strict(Policy(), **settings).get('/_dbtune/', headers=ops)
    csrf = json.loads(re.search(r'let data = (.*);\n', page.text)[1])['csrf']
    assert isinstance(csrf, str) and len(csrf) >= 20
    # No session factory, no CSRF token.
    app = make_strict(Policy(), session=False, **settings)
    page = app.get('/_dbtune/', headers=ops)
    assert (
        json.loads(re.search(r'let data = (.*);\n', page.text)[1])['csrf']
        is None
    )


def test_a_download_is_named_whatever_the_route_is_named():
    assert dashboard.disposition('dbtune-profile-/slow.prof') == (
        'attachment; filename="dbtune-profile-/slow.prof"'
    )
    # Not Latin-1, or a quote: RFC 6266's UTF-8 form, which any header
    # carries.
    assert dashboard.disposition('dbtune-profile-检索.prof') == (
        "attachment; filename*=UTF-8''dbtune-profile-%E6%A3%80%E7%B4%A2.prof"
    )
    assert dashboard.disposition('a"b\\c') == (
        "attachment; filename*=UTF-8''a%22b%5Cc"
    )


def test_the_page_says_how_often_cpu_is_measured():
    page = dashboard.PAGE.read_text(encoding='utf-8')
    assert f'from 1 request in {stats.CPU_EVERY}"' in page
