"""Run by ``zconsole run etc/zope.conf zope_setup.py`` in a test's Zope
instance: a pyramid_dbtune connection, ZSQL Methods on it, and DTML
Methods that call them, added through Zope's own API."""

import os

import transaction
from Products.SQLAlchemyDA.da import manage_addSAWrapper
from Products.ZSQLMethods.SQL import manage_addZSQLMethod

from pyramid_dbtune.zope import manage_addDBTuneConnection

OTHER_URL = os.environ['DBTUNE_ZOPE_OTHER_URL']
manage_addDBTuneConnection(app, 'dbtune', 'The database')  # noqa: F821
site = app  # noqa: F821
manage_addZSQLMethod(
    site, 'get_rent', '', 'dbtune', 'id',
    'SELECT rent FROM property WHERE id = <dtml-sqlvar id type="int">',
)  # fmt: skip
site.get_rent.manage_advanced(
    max_rows=1000, max_cache=100, cache_time=60, class_name='', class_file=''
)
manage_addZSQLMethod(
    site, 'set_rent', '', 'dbtune', 'id rent',
    'UPDATE property SET rent = <dtml-sqlvar rent type="int"> '
    'WHERE id = <dtml-sqlvar id type="int">',
)  # fmt: skip
site.manage_addDTMLMethod(
    'show_rent', file='<dtml-in "get_rent(id=1)"><dtml-var rent></dtml-in>'
)
site.manage_addDTMLMethod(
    'update', file='<dtml-call "set_rent(id=1, rent=rent)">done'
)
site.manage_addDTMLMethod(
    'update_and_fail',
    file='<dtml-call "set_rent(id=1, rent=rent)">'
    '<dtml-raise type="ValueError">abort, please</dtml-raise>',
)
# Read uncached; two statements in one method; a write with a cache
# time; a write whose tables cannot be told; a commit that fails.
manage_addZSQLMethod(
    site, 'get_rent_now', '', 'dbtune', 'id',
    'SELECT rent FROM property WHERE id = <dtml-sqlvar id type="int">',
)  # fmt: skip
manage_addZSQLMethod(
    site, 'two_reads', '', 'dbtune', '',
    'SELECT 1 AS one<dtml-var sql_delimiter>'
    'SELECT id, rent FROM property WHERE id = 2',
)  # fmt: skip
manage_addZSQLMethod(
    site, 'cached_write', '', 'dbtune', 'rent',
    'UPDATE property SET rent = <dtml-sqlvar rent type="int"> WHERE id = 2',
)  # fmt: skip
manage_addZSQLMethod(
    site, 'untold_write', '', 'dbtune', '',
    'CREATE TEMPORARY TABLE scratch AS SELECT 1 AS x',
)  # fmt: skip
manage_addZSQLMethod(
    site, 'insert_twice', '', 'dbtune', '',
    'INSERT INTO once VALUES (1)<dtml-var sql_delimiter>'
    'INSERT INTO once VALUES (1)',
)  # fmt: skip
for name in ('two_reads', 'cached_write'):
    site[name].manage_advanced(
        max_rows=1000, max_cache=100, cache_time=60, class_name='',
        class_file='',
    )  # fmt: skip
site.manage_addDTMLMethod(
    'update_then_read',
    file='<dtml-call "set_rent(id=1, rent=rent)">'
    '<dtml-in "get_rent(id=1)"><dtml-var rent></dtml-in> '
    '<dtml-in "get_rent_now(id=1)"><dtml-var rent></dtml-in>',
)
site.manage_addDTMLMethod(
    'show_rent_now',
    file='<dtml-in "get_rent_now(id=1)"><dtml-var rent></dtml-in>',
)
site.manage_addDTMLMethod(
    'show_two', file='<dtml-in two_reads><dtml-var rent></dtml-in>'
)
site.manage_addDTMLMethod(
    'write_cached', file='<dtml-call "cached_write(rent=rent)">done'
)
site.manage_addDTMLMethod('write_untold', file='<dtml-call untold_write>done')
site.manage_addDTMLMethod('fail_at_commit', file='<dtml-call insert_twice>')
# A string put into the SQL, quoted by the connection.
manage_addZSQLMethod(
    site, 'in_area', '', 'dbtune', 'area',
    'SELECT count(*) AS n FROM property '
    'WHERE area = <dtml-sqlvar area type="string">',
)  # fmt: skip
site.manage_addDTMLMethod(
    'count_in_area',
    file='<dtml-in "in_area(area=area)"><dtml-var n></dtml-in>',
)

# Another adapter (Products.SQLAlchemyDA): its methods keep their own
# cache, as they always did.
manage_addSAWrapper(site, 'other', OTHER_URL, '')
manage_addZSQLMethod(
    site, 'other_rent', '', 'other', '',
    'SELECT rent FROM property WHERE id = 1',
)  # fmt: skip
site.other_rent.manage_advanced(
    max_rows=1000, max_cache=100, cache_time=60, class_name='', class_file=''
)
site.manage_addDTMLMethod(
    'show_other', file='<dtml-in other_rent><dtml-var rent></dtml-in>'
)
transaction.commit()
