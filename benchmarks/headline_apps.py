"""The forms of the accommodation site that ``headline.py`` compares.

``baseline_app`` is the site as Pyramid's starter template (the
cookiecutter's SQLAlchemy backend) would have a user write it: an ORM
model, a session per request joined to ``pyramid_tm`` by zope.sqlalchemy,
pyramid_retry, no caching, one engine, and the health check a normal view
that asks the database. Its pages are the demo's, rendered by the same
code, so that only the data layer differs.

``dogpile_app`` is the baseline with its queries cached as users cache
them today: a dogpile.cache region in memcached, for the searches' cache
time (30 s), no invalidation.

``tuned_app`` is the demo itself (``examples/accommodation``) with
pyramid_dbtune set up as its docs advise: cached SQL methods in each
process, kept fresh by every write, through the app or not
(``dbtune.cache.listen``): a change is applied to the rows held where it
can be, else drops them; a read pool apart from the writer, and the
health check on the fast path.

``ceiling_app`` serves the same pages on the same stack with every query
answered from a Python dict (the properties loaded at start, each
search's answer kept once made): no database, no cache, the most any
cache could give.

Servers load them as ``headline_apps:baseline_app`` (waitress ``--call``)
or ``headline_apps:<form>_app()`` (gunicorn); the database URL, the
memcached address and the searches' cache time come from the environment
(``DBTUNE_HEADLINE_URL``, ``DBTUNE_HEADLINE_MEMCACHED``,
``DBTUNE_HEADLINE_SEARCH_CACHE_TIME``; ``DBTUNE_HEADLINE_LAGGING`` lets
the tuned searches lag an update by their cache time, as Zope's did).
"""

import hashlib
import os
from types import SimpleNamespace

import sqlalchemy as sa
import zope.sqlalchemy
from pyramid.config import Configurator
from pyramid.httpexceptions import HTTPForbidden, HTTPNotFound
from pyramid.response import Response
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from accommodation import main as accommodation_main
from accommodation.views import render_page, search_params, update_params

#: Sent as X-Admin-Token with every update, in both forms.
ADMIN_TOKEN = 'headline-admin-token'


def url():
    return os.environ['DBTUNE_HEADLINE_URL']


def search_cache_time():
    return os.environ.get('DBTUNE_HEADLINE_SEARCH_CACHE_TIME', '30')


# The baseline: models, a session per request, views.


class Base(DeclarativeBase):
    pass


class Property(Base):
    __tablename__ = 'property'

    id: Mapped[int] = mapped_column(primary_key=True)
    title: Mapped[str]
    area: Mapped[str]
    rent: Mapped[int]
    rooms: Mapped[int]
    available: Mapped[str]
    description: Mapped[str]

    def as_dict(self, *, description=True):
        names = ['id', 'title', 'area', 'rent', 'rooms', 'available']
        if description:
            names.append('description')
        return {name: getattr(self, name) for name in names}


def _filters(params):
    return (
        Property.area == params['area'],
        Property.rent <= params['max_rent'],
        Property.rooms >= params['min_rooms'],
        Property.available <= params['available'],
    )


def _search(request):
    return _search_with(request, search_params(request))


def baseline_search_page(request):
    params, rows, matches = _search(request)
    areas = request.dbsession.execute(
        sa.select(Property.area, sa.func.count(), sa.func.min(Property.rent))
        .group_by(Property.area)
        .order_by(Property.area)
    ).all()
    return render_page(params, rows, matches, areas, '')


def baseline_api_search(request):
    params, rows, matches = _search(request)
    return {
        'search': params,
        'matches': matches,
        'rows': [r.as_dict(description=False) for r in rows],
    }


def baseline_detail(request):
    found = request.dbsession.get(Property, int(request.matchdict['id']))
    if found is None:
        raise HTTPNotFound()
    return found.as_dict()


def baseline_update(request):
    if request.headers.get('X-Admin-Token') != ADMIN_TOKEN:
        raise HTTPForbidden()
    rent, available = update_params(request)
    found = request.dbsession.get(Property, int(request.matchdict['id']))
    if found is None:
        raise HTTPNotFound()
    found.rent, found.available = rent, available
    return found.as_dict()


def baseline_health(request):
    request.dbsession.execute(sa.text('SELECT 1'))
    return Response('OK', content_type='text/plain')


def baseline_app(global_config=None, **settings):
    return _site(settings, BASELINE)


BASELINE = {
    'search': baseline_search_page,
    'api_search': baseline_api_search,
    'property': baseline_detail,
    'admin_property': baseline_update,
    'health': baseline_health,
}


def _site(settings, pages):
    """The starter-shaped site with ``pages``, a view per route name."""
    settings = {
        'sqlalchemy.url': url(),
        'retry.attempts': '3',
        'tm.manager_hook': 'pyramid_tm.explicit_manager',
        **settings,
    }
    with Configurator(settings=settings) as config:
        config.include('pyramid_tm')
        config.include('pyramid_retry')
        engine = sa.engine_from_config(settings, 'sqlalchemy.')
        factory = sessionmaker(bind=engine)

        def dbsession(request):
            session = factory(info={'request': request})
            zope.sqlalchemy.register(session, transaction_manager=request.tm)
            return session

        config.add_request_method(dbsession, 'dbsession', reify=True)
        routes = [
            ('search', '/', {}),
            ('api_search', '/api/search', {'renderer': 'json'}),
            ('property', '/property/{id:\\d+}', {'renderer': 'json'}),
            ('admin_property', '/admin/property/{id:\\d+}',
             {'renderer': 'json', 'request_method': 'POST'}),
            ('health', '/healthz', {}),
        ]  # fmt: skip
        for name, pattern, options in routes:
            config.add_route(name, pattern)
            config.add_view(pages[name], route_name=name, **options)
        return config.make_wsgi_app()


# Dogpile: the baseline's queries in a dogpile.cache memcached region.

_region = None


def region():
    global _region
    if _region is None:
        from dogpile.cache import make_region

        _region = make_region(
            key_mangler=lambda key: hashlib.sha1(key.encode()).hexdigest()
        ).configure(
            'dogpile.cache.pymemcache',
            expiration_time=int(search_cache_time()),
            arguments={'url': [os.environ['DBTUNE_HEADLINE_MEMCACHED']]},
        )
    return _region


def cached(request, key, create):
    """``create()``'s value, from the region when it holds it; a miss
    marks the request's ``X-Cache`` ``miss``."""

    def creator():
        request.environ['headline.miss'] = True
        return create()

    return region().get_or_create(key, creator)


def outcome(request, response):
    miss = request.environ.get('headline.miss')
    response.headers['X-Cache'] = 'miss' if miss else 'hit'
    return response


def _dogpile_search(request):
    params = search_params(request)
    key = 'search:' + ':'.join(str(params[k]) for k in sorted(params))

    def create():
        _, rows, matches = _search_with(request, params)
        return {
            'rows': [r.as_dict(description=False) for r in rows],
            'matches': matches,
        }

    return params, cached(request, key, create)


def _search_with(request, params):
    session = request.dbsession
    rows = session.scalars(
        sa.select(Property)
        .where(*_filters(params))
        .order_by(Property.rent, Property.id)
        .limit(50)
    ).all()
    matches = session.scalar(
        sa.select(sa.func.count())
        .select_from(Property)
        .where(*_filters(params))
    )
    return params, rows, matches


def dogpile_search_page(request):
    params, found = _dogpile_search(request)

    def areas():
        return [
            {'area': a, 'properties': n, 'cheapest': c}
            for a, n, c in request.dbsession.execute(
                sa.select(
                    Property.area, sa.func.count(), sa.func.min(Property.rent)
                )
                .group_by(Property.area)
                .order_by(Property.area)
            )
        ]

    response = render_page(
        params,
        [SimpleNamespace(**r) for r in found['rows']],
        found['matches'],
        [SimpleNamespace(**a) for a in cached(request, 'areas', areas)],
        '',
    )
    return outcome(request, response)


def dogpile_api_search(request):
    params, found = _dogpile_search(request)
    outcome(request, request.response)
    return {'search': params, **found}


def dogpile_detail(request):
    id = int(request.matchdict['id'])

    def create():
        found = request.dbsession.get(Property, id)
        return None if found is None else found.as_dict()

    found = cached(request, f'property:{id}', create)
    if found is None:
        raise HTTPNotFound()
    return found


def dogpile_app(global_config=None, **settings):
    pages = {
        **BASELINE,
        'search': dogpile_search_page,
        'api_search': dogpile_api_search,
        'property': dogpile_detail,
    }
    return _site(settings, pages)


# The ceiling: every query answered from a Python dict.


class Ceiling:
    """The properties, loaded once; each search's answer, kept once made."""

    def __init__(self):
        engine = sa.create_engine(url())
        with engine.connect() as connection:
            rows = connection.execute(sa.select(Property.__table__))
            self.by_id = {r.id: dict(r._mapping) for r in rows}
        engine.dispose()
        self.by_area = {}
        for row in self.by_id.values():
            self.by_area.setdefault(row['area'], []).append(row)
        self.areas = [
            SimpleNamespace(
                area=area,
                properties=len(rows),
                cheapest=min(r['rent'] for r in rows),
            )
            for area, rows in sorted(self.by_area.items())
        ]
        self.searches = {}

    def search(self, params):
        key = tuple(sorted(params.items()))
        try:
            return self.searches[key]
        except KeyError:
            pass
        matching = sorted(
            (
                r
                for r in self.by_area.get(params['area'], ())
                if r['rent'] <= params['max_rent']
                and r['rooms'] >= params['min_rooms']
                and r['available'] <= params['available']
            ),
            key=lambda r: (r['rent'], r['id']),
        )
        names = ('id', 'title', 'area', 'rent', 'rooms', 'available')
        rows = [{n: r[n] for n in names} for r in matching[:50]]
        found = self.searches[key] = (rows, len(matching))
        return found


def ceiling_app(global_config=None, **settings):
    ceiling = Ceiling()

    def search_page(request):
        params = search_params(request)
        rows, matches = ceiling.search(params)
        response = render_page(
            params,
            [SimpleNamespace(**r) for r in rows],
            matches,
            ceiling.areas,
            '',
        )
        response.headers['X-Cache'] = 'hit'
        return response

    def api_search(request):
        params = search_params(request)
        rows, matches = ceiling.search(params)
        request.response.headers['X-Cache'] = 'hit'
        return {'search': params, 'matches': matches, 'rows': rows}

    def detail(request):
        found = ceiling.by_id.get(int(request.matchdict['id']))
        if found is None:
            raise HTTPNotFound()
        return found

    def update(request):
        if request.headers.get('X-Admin-Token') != ADMIN_TOKEN:
            raise HTTPForbidden()
        found = ceiling.by_id.get(int(request.matchdict['id']))
        if found is None:
            raise HTTPNotFound()
        found['rent'], found['available'] = update_params(request)
        return found

    def health(request):
        return Response('OK', content_type='text/plain')

    # The starter's stack (pyramid_tm, pyramid_retry), as the others
    # have: only the data comes from elsewhere.
    pages = {
        'search': search_page,
        'api_search': api_search,
        'property': detail,
        'admin_property': update,
        'health': health,
    }
    return _site(settings, pages)


# The tuned form: the demo, with pyramid_dbtune's settings.

#: The demo's cached reads.
FRESH_METHODS = (
    'search_properties', 'count_properties', 'list_areas', 'get_property',
)  # fmt: skip


def tuned_app(global_config=None, **settings):
    return accommodation_main(
        global_config or {},
        **{
            'dbtune.url': url(),
            'dbtune.cache.listen': 'true',
            # Each process keeps the rows it read, and applies to them
            # every change committed, through the app or not: the rows are
            # never dropped by a change that can be patched in.
            'dbtune.cache.backend': 'memory',
            'dbtune.fast_paths': (
                '/healthz=python:pyramid_dbtune.fastpath:deep_check'
            ),
            # Every read is invalidated by row, whoever writes. With
            # headline.py --lagging, searches, counts and the area list may
            # lag an update by up to their cache time (30 s, 30 s, 300 s),
            # as Zope's did (see "Fresh or fast" in docs/sqlmethods.rst).
            **(
                {}
                if not os.environ.get('DBTUNE_HEADLINE_LAGGING')
                else {
                    f'dbtune.invalidate.{name}': 'false'
                    for name in (
                        'search_properties',
                        'count_properties',
                        'list_areas',
                    )
                }
            ),
            # Fresh, the rows are kept for an hour: every change reaches
            # them, so the time bounds only how long they are kept, not
            # how old they may be; and each process holds every property
            # it read. Lagging, the searches' cache time is the demo's
            # (headline.py --quick cuts it, so that its checker can catch
            # a stale search within a short run).
            **(
                {f'dbtune.cache_time.{name}': '3600' for name in FRESH_METHODS}
                if not os.environ.get('DBTUNE_HEADLINE_LAGGING')
                else {
                    'dbtune.cache_time.search_properties': search_cache_time(),
                    'dbtune.cache_time.count_properties': search_cache_time(),
                }
            ),
            'dbtune.cache.max_entries': '50000',
            'dbtune.cache.max_bytes': str(256 * 1024 * 1024),
            'accommodation.admin_token': ADMIN_TOKEN,
            **settings,
        },
    )
