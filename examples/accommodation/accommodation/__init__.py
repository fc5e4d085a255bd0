"""The accommodation demo: a student-accommodation search on pyramid_dbtune.

The search that melted under load in the old Zope reports, written with
cached SQL methods. The database is an embedded SQLite file, seeded on
first start.
"""

import logging
from pathlib import Path

from pyramid.config import Configurator

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
