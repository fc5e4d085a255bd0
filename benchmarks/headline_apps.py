"""The two forms of the accommodation site that ``headline.py`` compares.

``baseline_app`` is the site as Pyramid's starter template (the
cookiecutter's SQLAlchemy backend) would have a user write it: an ORM
model, a session per request joined to ``pyramid_tm`` by zope.sqlalchemy,
pyramid_retry, no caching, one engine, and the health check a normal view
that asks the database. Its pages are the demo's, rendered by the same
code, so that only the data layer differs.

``tuned_app`` is the demo itself (``examples/accommodation``) with
pyramid_dbtune set up as its docs advise: cached SQL methods in
memcached, searches that may lag an update by their cache time, a read
pool apart from the writer, and the health check on the fast path.

Servers load them as ``headline_apps:baseline_app`` (waitress ``--call``),
``headline_apps:baseline_app()`` and ``headline_apps:tuned_app()``
(gunicorn); the database URL, the memcached address and the searches'
cache time come from the environment (``DBTUNE_HEADLINE_URL``,
``DBTUNE_HEADLINE_MEMCACHED``, ``DBTUNE_HEADLINE_SEARCH_CACHE_TIME``).
"""

import os

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
SECRET = 'the headline benchmark secret, not for production'


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
    params = search_params(request)
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
            ('search', '/', baseline_search_page, {}),
            ('api_search', '/api/search', baseline_api_search,
             {'renderer': 'json'}),
            ('property', '/property/{id:\\d+}', baseline_detail,
             {'renderer': 'json'}),
            ('admin_property', '/admin/property/{id:\\d+}', baseline_update,
             {'renderer': 'json', 'request_method': 'POST'}),
            ('health', '/healthz', baseline_health, {}),
        ]  # fmt: skip
        for name, pattern, view, options in routes:
            config.add_route(name, pattern)
            config.add_view(view, route_name=name, **options)
        return config.make_wsgi_app()


# The tuned form: the demo, with pyramid_dbtune's settings.


def tuned_app(global_config=None, **settings):
    return accommodation_main(
        global_config or {},
        **{
            'dbtune.url': url(),
            'dbtune.cache.backend': 'memcached',
            'dbtune.cache.servers': os.environ['DBTUNE_HEADLINE_MEMCACHED'],
            'dbtune.cache.secret': SECRET,
            'dbtune.fast_paths': (
                '/healthz=python:pyramid_dbtune.fastpath:deep_check'
            ),
            # Searches, counts and the area list may lag an update by up
            # to their cache time (30 s, 30 s, 300 s): property pages may
            # not (see "Fresh or fast" in docs/sqlmethods.rst). With
            # headline.py --fresh, none may: invalidation by row.
            **(
                {}
                if os.environ.get('DBTUNE_HEADLINE_FRESH')
                else {
                    f'dbtune.invalidate.{name}': 'false'
                    for name in (
                        'search_properties',
                        'count_properties',
                        'list_areas',
                    )
                }
            ),
            # headline.py --quick cuts the searches' cache time, so that its
            # checker can catch a stale search within a short run.
            'dbtune.cache_time.search_properties': search_cache_time(),
            'dbtune.cache_time.count_properties': search_cache_time(),
            'accommodation.admin_token': ADMIN_TOKEN,
            **settings,
        },
    )
