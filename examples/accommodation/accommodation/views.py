"""The demo's pages: a search form, a JSON search, a detail page, an update."""

import datetime
import html

from pyramid.httpexceptions import HTTPBadRequest, HTTPForbidden, HTTPNotFound
from pyramid.response import Response
from pyramid.view import view_config

DEFAULTS = {
    'area': 'Headingley',
    'max_rent': '150',
    'min_rooms': '1',
    'available': '2026-09-01',
}


def whole_number(text):
    """``text`` as an integer the database can hold (64 bits); else
    ValueError."""
    number = int(text)
    if not -(2**63) <= number < 2**63:
        raise ValueError(f'{text} is out of range')
    return number


def search_params(request):
    """The search filters from the query string, checked; 400 if bad."""
    get = {**DEFAULTS, **request.GET}
    try:
        params = {
            'area': get['area'],
            'max_rent': whole_number(get['max_rent']),
            'min_rooms': whole_number(get['min_rooms']),
            'available': datetime.date.fromisoformat(
                get['available']
            ).isoformat(),
        }
    except ValueError as exc:
        raise HTTPBadRequest(f'bad search: {exc}') from None
    return params


def search(request):
    params = search_params(request)
    rows = request.sql.search_properties(**params)
    matches = request.sql.count_properties(**params)[0].matches
    return params, rows, matches


def cache_outcome(request):
    """``hit`` when every SQL method call of the request was cached."""
    counts = request.dbtune.cache
    return 'hit' if counts['hit'] and not counts['miss'] else 'miss'


@view_config(route_name='api_search', renderer='json')
def api_search(request):
    params, rows, matches = search(request)
    request.response.headers['X-Cache'] = cache_outcome(request)
    return {
        'search': params,
        'matches': matches,
        'rows': rows.dictionaries(),
        'cache': cache_outcome(request),
    }


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>Student accommodation</title>
<style>
body {{ font-family: sans-serif; margin: 2em auto; max-width: 60em; }}
table {{ border-collapse: collapse; width: 100%; }}
td, th {{ border-bottom: 1px solid #ddd; padding: .3em; text-align: left; }}
form label {{ margin-right: 1em; }}
.note {{ color: #666; }}
</style></head>
<body>
<h1>Student accommodation</h1>
<form method="get" action="/">
<label>Area <select name="area">{areas}</select></label>
<label>Max rent £<input name="max_rent" size="4" value="{max_rent}"></label>
<label>Rooms at least <input name="min_rooms" size="2"
  value="{min_rooms}"></label>
<label>Available by <input name="available" type="date"
  value="{available}"></label>
<button>Search</button>
</form>
<p>{matches} properties match; the cheapest {shown} are shown.</p>
<table><tr><th>Property</th><th>Area</th><th>Rent</th><th>Rooms</th>
<th>Available</th></tr>
{rows}
</table>
<p class="note">{outcome}</p>
</body></html>
"""


def render_page(params, rows, matches, areas, note):
    """The search page: the form, then the rows (anything with ``id``,
    ``title``, ``area``, ``rent``, ``rooms``, ``available``)."""
    esc = html.escape
    options = ''.join(
        '<option{}>{}</option>'.format(
            ' selected' if a.area == params['area'] else '', esc(a.area)
        )
        for a in areas
    )
    body = ''.join(
        f'<tr><td><a href="/property/{r.id}">{esc(r.title)}</a></td>'
        f'<td>{esc(r.area)}</td><td>£{r.rent}</td><td>{r.rooms}</td>'
        f'<td>{esc(r.available)}</td></tr>\n'
        for r in rows
    )
    page = PAGE.format(
        areas=options,
        max_rent=params['max_rent'],
        min_rooms=params['min_rooms'],
        available=params['available'],
        matches=matches,
        shown=len(rows),
        rows=body,
        outcome=note,
    )
    return Response(page, content_type='text/html', charset='utf-8')


@view_config(route_name='search')
def search_page(request):
    params, rows, matches = search(request)
    outcome = cache_outcome(request)
    context = request.dbtune
    note = (
        'Served from the cache.'
        if outcome == 'hit'
        else f'{context.queries} queries, '
        f'{context.db_seconds * 1000:.1f} ms in the database.'
    )
    response = render_page(
        params, rows, matches, request.sql.list_areas(), note
    )
    response.headers['X-Cache'] = outcome
    return response


@view_config(route_name='property', renderer='json')
def property_detail(request):
    rows = request.sql.get_property(id=int(request.matchdict['id']))
    if not rows:
        raise HTTPNotFound()
    return rows[0]._asdict()


def update_params(request):
    """The new rent and availability date from the form; 400 if bad."""
    try:
        rent = whole_number(request.POST['rent'])
        available = datetime.date.fromisoformat(
            request.POST['available']
        ).isoformat()
    except (KeyError, ValueError) as exc:
        raise HTTPBadRequest(f'bad update: {exc}') from None
    return rent, available


@view_config(
    route_name='admin_property', request_method='POST', renderer='json'
)
def admin_update(request):
    """Set a property's rent and availability date (needs the token)."""
    token = request.registry.settings.get('accommodation.admin_token')
    if not token or request.headers.get('X-Admin-Token') != token:
        raise HTTPForbidden()
    id = int(request.matchdict['id'])
    rent, available = update_params(request)
    result = request.sql.update_property(id=id, rent=rent, available=available)
    if not result.rowcount:
        raise HTTPNotFound()
    return request.sql.get_property(id=id)[0]._asdict()
