"""The WSGI applications that bench_fastpath.py compares, one per variant.

Each answers ``GET /ok.html`` with ``OK``. Servers load them with
``fastpath_apps:app_factory()`` and the variant named in
``DBTUNE_BENCH_VARIANT``.
"""

import os
import tempfile

import sqlalchemy as sa
import zope.sqlalchemy
from pyramid.config import Configurator
from pyramid.response import Response
from sqlalchemy.orm import Session

from pyramid_dbtune.fastpath import wrap

PATH = '/ok.html'
VARIANTS = ('bare', 'filter', 'include', 'view', 'full')


def bare(environ, start_response):
    """The floor: a WSGI callable that only answers."""
    start_response(
        '200 OK',
        [
            ('Content-Type', 'text/plain; charset=utf-8'),
            ('Content-Length', '2'),
        ],
    )
    return [b'OK']


def not_found(environ, start_response):
    start_response('404 Not Found', [('Content-Length', '0')])
    return []


def ok_view(request):
    return Response('OK', content_type='text/plain')


class Root:
    """A traversal root with one leaf, ``ok.html``."""

    __name__ = ''
    __parent__ = None

    def __init__(self, request):
        self.request = request

    def __getitem__(self, name):
        if name == 'ok.html':
            leaf = Leaf()
            leaf.__parent__ = self
            return leaf
        raise KeyError(name)


class Leaf:
    __name__ = 'ok.html'


def full_view(context, request):
    # What a cookiecutter app does on each request that uses the database:
    # a session joined to the request's transaction.
    request.dbsession  # noqa: B018 (create and register it)
    return Response('OK', content_type='text/plain')


def dbsession(request):
    session = Session(bind=request.registry['bench_engine'])
    zope.sqlalchemy.register(session, transaction_manager=request.tm)
    return session


def make(variant, database=None):
    """The application for ``variant``: one of :data:`VARIANTS`."""
    if variant == 'bare':
        return bare
    if variant == 'filter':
        return wrap(not_found, {PATH: 'OK'})
    if variant == 'include':
        config = Configurator(
            settings={'dbtune.fast_paths': f'{PATH}=OK', 'retry.attempts': 3}
        )
        config.include('pyramid_retry')
        config.include('pyramid_dbtune')
        return config.make_wsgi_app()
    if variant == 'view':
        config = Configurator()
        config.add_route('ok', PATH)
        config.add_view(ok_view, route_name='ok')
        return config.make_wsgi_app()
    if variant == 'full':
        if database is None:
            database = os.path.join(tempfile.mkdtemp(), 'bench.sqlite')
        config = Configurator(
            root_factory=Root, settings={'retry.attempts': 3}
        )
        config.include('pyramid_retry')
        config.include('pyramid_tm')
        config.registry['bench_engine'] = sa.create_engine(
            f'sqlite:///{database}'
        )
        config.add_request_method(dbsession, 'dbsession', reify=True)
        config.add_view(full_view, context=Leaf)
        return config.make_wsgi_app()
    raise ValueError(f'unknown variant {variant!r}; one of {VARIANTS}')


def app_factory():
    """For servers: the variant named in ``DBTUNE_BENCH_VARIANT``."""
    return make(os.environ['DBTUNE_BENCH_VARIANT'])
