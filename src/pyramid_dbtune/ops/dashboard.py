"""The operator's views: ``/_dbtune/`` (a dashboard), ``stats``,
``metrics`` and the profile's, each behind :mod:`.access`.

Installed by :func:`install` only for the features that are on.
"""

import contextlib
import json
import os
from importlib.resources import files
from urllib.parse import quote

from pyramid.csrf import get_csrf_token
from pyramid.exceptions import ConfigurationError
from pyramid.response import Response
from pyramid.tweens import INGRESS

from ..convert import whole_number
from . import access
from .profiler import Profiler
from .stats import Stats

#: The dashboard's page: one file, its script and styles inline, so that
#: it works with no network beyond this server.
PAGE = files(__package__).joinpath('templates/dashboard.html')
#: Where the page takes the figures of its first paint.
DATA_MARK = '/*DBTUNE_DATA*/null'


def install(config, dbtune):
    """Set up the timing tween and the views of the features that are on
    (``dbtune.server_timing``, ``dbtune.stats``, ``dbtune.profile``)."""
    settings = dbtune.settings
    for feature in ('stats', 'profile'):
        if getattr(settings, feature):
            access.check(settings, feature)
    dbtune.active = {}
    if settings.stats:
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            raise ConfigurationError(
                'dbtune.stats = true needs prometheus_client: install '
                'pyramid_dbtune[stats]'
            ) from None
        dbtune.stats = Stats(dbtune, dbtune.active, multiprocess_dir())
        add_stats_views(config, dbtune.stats)
    if settings.profile:
        dbtune.profiler = Profiler(dbtune.active, settings.profile_sample)
        add_profile_views(config, dbtune.profiler)
    if settings.stats or settings.profile:
        access.add_view(config, '', dashboard_view)
    config.add_tween(
        'pyramid_dbtune.ops.tween.timing_tween_factory', under=INGRESS
    )


def multiprocess_dir():
    """``PROMETHEUS_MULTIPROC_DIR``, or None; a ConfigurationError when
    prometheus_client, which chose its mode when it was first imported,
    chose the other: the metrics would be kept where ``/_dbtune/metrics``
    does not read them."""
    from prometheus_client import values

    directory = os.environ.get('PROMETHEUS_MULTIPROC_DIR') or None
    # No public flag tells the mode; ValueClass is the value type every
    # metric is made of (the point prometheus_client's own tests swap).
    in_memory = values.ValueClass is values.MutexValue
    if directory is not None and in_memory:
        raise ConfigurationError(
            'PROMETHEUS_MULTIPROC_DIR is set, but prometheus_client was '
            'imported before it was, and keeps its metrics in memory: '
            '/_dbtune/metrics would not show this process. Set the '
            'variable in the environment before the process starts (as '
            "gunicorn's and prometheus_client's docs say), not from Python."
        )
    if directory is None and not in_memory:
        raise ConfigurationError(
            'prometheus_client is in multiprocess mode, but '
            'PROMETHEUS_MULTIPROC_DIR is not set now (it was unset after '
            'prometheus_client was imported, or is empty, or only the '
            'deprecated prometheus_multiproc_dir is set): set '
            'PROMETHEUS_MULTIPROC_DIR to a directory in the environment '
            'before the process starts.'
        )
    return directory


def dashboard_view(request):
    """The dashboard: the stats, a chart of latency and cache hit ratio,
    and the profile's top functions."""
    dbtune = request.registry.dbtune
    data = {
        'stats': None if dbtune.stats is None else dbtune.stats.snapshot(),
        'profile': (
            None if dbtune.profiler is None else profile_data(request)
        ),
        # What the page's POST (reset) sends when the permission let the
        # user in (and the app has sessions, hence CSRF tokens).
        'csrf': None,
    }
    if access.way_in(request) == 'permission':
        with contextlib.suppress(AttributeError):  # no session factory
            data['csrf'] = get_csrf_token(request)
    # In a <script> element, "</" could end it early and "<!--" change
    # how it is read: no "<" at all, as JSON's own escape.
    text = json.dumps(data).replace('<', '\\u003c')
    page = PAGE.read_text(encoding='utf-8').replace(DATA_MARK, text)
    return Response(page, content_type='text/html', charset='utf-8')


# Stats


def add_stats_views(config, stats):
    access.add_view(
        config, 'stats', lambda request: stats.snapshot(), renderer='json'
    )
    access.add_view(config, 'metrics', lambda request: metrics(stats))


def metrics(stats):
    """The Prometheus text of this process (with ``PROMETHEUS_MULTIPROC_DIR``:
    of every process), and, in one process, prometheus_client's own
    figures of it (CPU, memory, Python) and the app's own metrics."""
    from prometheus_client import REGISTRY, generate_latest

    body, content_type = stats.exposition()
    if stats.multiprocess_dir is None:
        body += generate_latest(REGISTRY)
    response = Response(body)
    response.headers['Content-Type'] = content_type
    return response


# The profile


def add_profile_views(config, profiler):
    add = access.add_view
    add(config, 'profile', profile_data, renderer='json')
    add(config, 'profile.prof', profile_prof)
    add(config, 'profile.folded', profile_folded)
    add(config, 'profile/reset', profile_reset, renderer='json',
        request_method='POST')  # fmt: skip


def _route(request):
    """The ``route`` query parameter (``None``: all routes); a route
    with no samples is a 404 with the names of those that have some."""
    from pyramid.httpexceptions import HTTPNotFound

    profiler = request.registry.dbtune.profiler
    route = access.query(request, 'route') or None
    if route is not None:
        sampled = profiler.routes()
        if route not in sampled:
            known = ', '.join(sampled) or 'none yet'
            raise HTTPNotFound(
                f'no samples of route {route!r} (sampled: {known})'
            )
    return profiler, route


def _limit(request):
    from pyramid.httpexceptions import HTTPBadRequest

    text = access.query(request, 'limit') or '20'
    limit = whole_number(text, 1, 1000)
    if limit is None:
        raise HTTPBadRequest('limit: a whole number from 1 to 1000')
    return limit


def profile_data(request):
    """Per route (``?route=`` one of them), the top functions by own and
    by cumulative time (``?limit=``, 20)."""
    profiler, route = _route(request)
    limit = _limit(request)
    routes = profiler.routes()
    names = [route] if route is not None else list(routes)
    return {
        'rate': round(1 / profiler.interval),
        'samples': profiler.samples,
        'routes': {
            name: {
                'samples': routes[name][0],
                'seconds': round(routes[name][1], 6),
                **profiler.top(name, limit),
            }
            for name in names
        },
    }


def _download(request, body, suffix, content_type):
    _, route = _route(request)
    name = 'dbtune-profile' + ('' if route is None else f'-{route}')
    data = body(route)
    if isinstance(data, str):
        data = data.encode('utf-8')
    response = Response(data, content_type=content_type)
    response.content_disposition = disposition(name + suffix)
    return response


def disposition(filename):
    """The ``Content-Disposition`` of a download named ``filename``: as
    it is when a header can carry it plainly, else as RFC 6266's UTF-8
    ``filename*`` (a route's name may be anything)."""
    plain = filename.isascii() and filename.isprintable()
    if plain and not {'"', '\\'} & set(filename):
        return f'attachment; filename="{filename}"'
    return "attachment; filename*=UTF-8''" + quote(filename, safe='')


def profile_prof(request):
    """The profile as a ``.prof`` file (``pstats``, snakeviz)."""
    profiler = request.registry.dbtune.profiler
    return _download(
        request, profiler.pstats_data, '.prof', 'application/octet-stream'
    )


def profile_folded(request):
    """The profile as collapsed stacks, for flame graphs."""
    profiler = request.registry.dbtune.profiler
    response = _download(request, profiler.collapsed, '.folded', 'text/plain')
    response.charset = 'utf-8'
    return response


def profile_reset(request):
    """Forget the samples (POST)."""
    request.registry.dbtune.profiler.reset()
    return {'reset': True}
