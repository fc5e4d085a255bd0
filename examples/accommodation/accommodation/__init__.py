"""The accommodation demo: a student-accommodation search on pyramid_dbtune.

The search that melted under load in the old Zope reports, written with
cached SQL methods. The database is an embedded SQLite file, seeded on
first start.
"""

import logging
import secrets
from pathlib import Path

from pyramid.config import Configurator
from pyramid.settings import asbool

from .seed import seed

log = logging.getLogger(__name__)


def main(global_config, **settings):
    """The WSGI application (``egg:accommodation``)."""
    database = settings.get('dbtune.url')
    if not database:
        path = Path(settings.get('accommodation.database', 'demo.sqlite'))
        count = int(settings.get('accommodation.properties', 20000))
        if not path.exists():
            log.info('seeding %s with %d properties', path, count)
            seed(path, count)
        settings['dbtune.url'] = f'sqlite:///{path}'
    operations = ('dbtune.stats', 'dbtune.profile')
    if any(asbool(settings.get(name)) for name in operations) and not (
        settings.get('dbtune.stats.token')
    ):
        # A demo has no secret of its own to keep: one made now, shown once.
        token = settings['dbtune.stats.token'] = secrets.token_urlsafe(16)
        log.info(
            'the dashboard: /_dbtune/?token=%s (on make demo: '
            'http://127.0.0.1:6543/_dbtune/?token=%s)',
            token,
            token,
        )
    with Configurator(settings=settings) as config:
        config.include('pyramid_dbtune')
        config.add_sql_methods('accommodation:sql/')
        config.add_route('search', '/')
        config.add_route('api_search', '/api/search')
        # Ids fit a 64-bit integer column: a longer one is no property.
        config.add_route('property', '/property/{id:\\d{1,18}}')
        config.add_route('admin_property', '/admin/property/{id:\\d{1,18}}')
        config.scan('.views')
    return config.make_wsgi_app()
