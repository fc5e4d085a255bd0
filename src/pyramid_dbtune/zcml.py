"""ZCML directives, through pyramid_zcml (``pip install
pyramid_dbtune[zcml]``).

``<include package="pyramid_dbtune" />`` reads this package's
``configure.zcml``, which does what ``config.include('pyramid_dbtune')``
does and makes the ``dbtune:`` directives of ``meta.zcml`` known::

    <configure xmlns="http://pylonshq.com/pyramid"
               xmlns:dbtune="urn:pyramid_dbtune">
      <include package="pyramid_zcml" />
      <include package="pyramid_dbtune" />
      <dbtune:sqlmethod file="sql/search.zsql" cache_time="20" />
      <dbtune:sqlmethod name="areas" sql="SELECT name FROM area" />
      <dbtune:sqlmethods directory="sql" />
    </configure>

A bad attribute is ZCML's usual error, naming the file and the line.
"""

from pyramid.exceptions import ConfigurationError
from pyramid_zcml import with_context
from zope.configuration.fields import Path
from zope.interface import Interface
from zope.schema import Float, Int, Text, TextLine

from .convert import Invalid, as_bool
from .sql.method import SQLMethod
from .sql.zsql import load_file

#: The XML namespace of the ``dbtune:`` directives.
NAMESPACE = 'urn:pyramid_dbtune'


class ISetupDirective(Interface):
    """``<dbtune:setup />``: ``config.include('pyramid_dbtune')``."""


def setup(_context):
    # Once a registry, whether Python included it first or not: includeme
    # sees to that.
    with_context(_context).include('pyramid_dbtune')


class ISQLMethodDirective(Interface):
    """``<dbtune:sqlmethod>``: one SQL method, from a file or inline."""

    name = TextLine(
        title='The method name (default: the file name, less its ending)',
        required=False,
    )
    file = Path(title='A .sql or .zsql file', required=False)
    sql = Text(title='The statement, with :name parameters', required=False)
    cache_time = Float(title='Seconds to keep rows', required=False, min=0.0)
    max_rows = Int(title='Rows to keep at most', required=False, min=0)
    tables = TextLine(title='Tables read or written', required=False)
    # Text, read as every boolean of the package is (settings.as_bool).
    writes = TextLine(title='Whether the statement writes', required=False)
    invalidate = TextLine(
        title='Whether a write to its tables drops its rows', required=False
    )


def _pyramid_config(_context, directive):
    config = with_context(_context)
    if getattr(config.registry, 'dbtune', None) is None:
        raise ConfigurationError(
            f'<dbtune:{directive}> before pyramid_dbtune is set up: put '
            '<include package="pyramid_dbtune" /> first'
        )
    return config


def sqlmethod(_context, name=None, file=None, sql=None, **kw):
    config = _pyramid_config(_context, 'sqlmethod')
    if (file is None) == (sql is None):
        raise ConfigurationError(
            '<dbtune:sqlmethod> takes either file="..." or sql="...", '
            'one of them'
        )
    kw = {k: v for k, v in kw.items() if v is not None}
    if 'tables' in kw and not kw['tables'].replace(',', ' ').split():
        # No table would mean never invalidated.
        raise ConfigurationError(
            f'<dbtune:sqlmethod> tables={kw["tables"]!r} names no table'
        )
    for flag in ('writes', 'invalidate'):
        if flag in kw:
            try:
                kw[flag] = as_bool(kw[flag])
            except Invalid as exc:
                raise ConfigurationError(
                    f'<dbtune:sqlmethod> {flag}={kw[flag]!r} is not valid: '
                    f'expected {exc}'
                ) from None
    cache_time = kw.get('cache_time')
    if cache_time is not None and cache_time.is_integer():
        # ZCML's Float reads "20" as 20.0: keep it the 20 a file's header
        # or Python would give.
        kw['cache_time'] = int(cache_time)
    try:
        if file is not None:
            method = load_file(file, **({'name': name} if name else {}), **kw)
        else:
            if not name:
                raise ValueError('an inline SQL method needs a name')
            method = SQLMethod(name, sql, **kw)
    except (OSError, ValueError, TypeError) as exc:  # SQLFileError too
        raise ConfigurationError(str(exc)) from None
    config.add_sql_method(method)


class ISQLMethodsDirective(Interface):
    """``<dbtune:sqlmethods>``: every .sql and .zsql file of a directory."""

    directory = Path(title='A directory of .sql and .zsql files')


def sqlmethods(_context, directory):
    _pyramid_config(_context, 'sqlmethods').add_sql_methods(directory)
