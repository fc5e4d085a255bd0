"""An app laid out as Pyramid's cookiecutter starter (SQLAlchemy backend).

Only :func:`main`'s ``add_sql_methods`` line is new: the app's own SQL
methods. pyramid_dbtune itself comes in by the ini file's lines.
"""

from pyramid.config import Configurator


def main(global_config, **settings):
    """This function returns a Pyramid WSGI application."""
    with Configurator(settings=settings) as config:
        config.include('.routes')
        config.include('.models')
        config.add_sql_methods('starter:sql')
        config.scan()
    return config.make_wsgi_app()
