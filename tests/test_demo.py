"""The accommodation demo, as `make demo` serves it (on a smaller seed)."""

import sqlite3

import pytest
from webtest import TestApp

from accommodation import main
from accommodation.seed import properties


@pytest.fixture
def demo(tmp_path):
    app = main(
        {},
        **{
            'accommodation.database': str(tmp_path / 'demo.sqlite'),
            'accommodation.properties': '3000',
            'accommodation.admin_token': 'secret',
        },
    )
    yield TestApp(app)
    app.registry.dbtune.router.dispose()


def test_first_start_seeds_the_database(demo, tmp_path):
    connection = sqlite3.connect(tmp_path / 'demo.sqlite')
    (count,) = connection.execute('SELECT count(*) FROM property').fetchone()
    connection.close()
    assert count == 3000


def test_seed_is_the_same_every_time():
    assert list(properties(50)) == list(properties(50))


def test_search_returns_rows_and_the_second_is_cached(demo):
    first = demo.get('/api/search', {'area': 'Hyde Park', 'max_rent': 140})
    assert first.json['cache'] == 'miss' and first.headers['X-Cache'] == 'miss'
    rows = first.json['rows']
    assert 0 < len(rows) <= 50 and first.json['matches'] >= len(rows)
    assert all(r['area'] == 'Hyde Park' and r['rent'] <= 140 for r in rows)
    assert [r['rent'] for r in rows] == sorted(r['rent'] for r in rows)

    second = demo.get('/api/search', {'area': 'Hyde Park', 'max_rent': 140})
    assert second.json == {**first.json, 'cache': 'hit'}


def test_search_page(demo):
    page = demo.get('/', {'area': 'Burley'})
    assert page.content_type == 'text/html'
    assert '<option selected>Burley</option>' in page.text
    assert 'queries' in page.text and page.headers['X-Cache'] == 'miss'
    again = demo.get('/', {'area': 'Burley'})
    assert 'Served from the cache.' in again.text


def test_bad_search_is_a_400(demo):
    demo.get('/api/search', {'max_rent': 'cheap'}, status=400)
    demo.get('/api/search', {'available': 'soon'}, status=400)
    # Too big for the database's integers: a 400, not an OverflowError.
    demo.get('/api/search', {'min_rooms': '9' * 20}, status=400)
    demo.get('/', {'max_rent': '9' * 20}, status=400)


def test_property_page(demo):
    assert demo.get('/property/7').json['id'] == 7
    demo.get('/property/99999', status=404)
    # Too long for the database's integers: no such property, no error.
    demo.get('/property/99999999999999999999', status=404)
    demo.post('/admin/property/99999999999999999999', status=404)


def test_admin_update_is_seen_at_once(demo):
    search = {'area': 'Headingley', 'max_rent': 200}
    first = demo.get('/api/search', search).json['rows'][0]
    token = {'X-Admin-Token': 'secret'}
    update = {'rent': 1, 'available': '2026-06-01'}
    answer = demo.post(f'/admin/property/{first["id"]}', update, headers=token)
    assert answer.json['rent'] == 1
    after = demo.get('/api/search', search).json
    assert after['cache'] == 'miss'
    assert after['rows'][0] == {**first, **update}


def test_admin_update_needs_the_token_and_good_values(demo):
    update = {'rent': 1, 'available': '2026-06-01'}
    demo.post('/admin/property/1', update, status=403)
    token = {'X-Admin-Token': 'secret'}
    demo.post('/admin/property/1', {'rent': 'x'}, headers=token, status=400)
    too_big = {**update, 'rent': '9' * 20}
    demo.post('/admin/property/1', too_big, headers=token, status=400)
    demo.post('/admin/property/99999', update, headers=token, status=404)


def test_make_demo_shows_the_operations_side(tmp_path, caplog):
    """development.ini turns on Server-Timing, stats and the profiler, and
    the demo logs the dashboard's link with a token made at start."""
    from pathlib import Path

    from pyramid.paster import get_appsettings

    ini = Path(__file__).parents[1] / 'examples/accommodation/development.ini'
    settings = dict(get_appsettings(str(ini)))
    settings['accommodation.database'] = str(tmp_path / 'demo.sqlite')
    settings['accommodation.properties'] = '300'
    caplog.set_level('INFO', logger='accommodation')
    app = main({}, **settings)
    try:
        links = [
            r.getMessage() for r in caplog.records if '/_dbtune/' in r.msg
        ]
        assert len(links) == 1, caplog.text
        token = links[0].split('token=')[1].split()[0]
        demo = TestApp(app)
        assert 'total;dur=' in demo.get('/').headers['Server-Timing']
        assert '<title>' in demo.get(f'/_dbtune/?token={token}').text
        assert demo.get('/_dbtune/stats', params={'token': token}).json
        demo.get('/_dbtune/', status=404)  # not without the token
    finally:
        app.registry.dbtune.router.dispose()
