"""Reading a statement's text: read or write, and which tables."""

import pytest

from pyramid_dbtune.sql import readings
from pyramid_dbtune.sql.analysis import (
    ANY_TABLE,
    analyse,
    in_parameters,
    is_setting,
    names,
)


@pytest.mark.parametrize(
    'sql, tables',
    [
        ('SELECT * FROM property WHERE id = :id', {'property'}),
        ('select p.id from Property p join area a on a.n = p.a',
         {'property', 'area'}),
        ('SELECT 1 FROM a, b AS bb, "Public"."C" WHERE 1=1', {'a', 'b', 'c'}),
        ('SELECT * FROM a LEFT JOIN b USING (x) NATURAL JOIN c',
         {'a', 'b', 'c'}),
        ('SELECT * FROM a x JOIN b y ON x.i = y.i', {'a', 'b'}),
        ('SELECT * FROM (SELECT name FROM area) a, property p',
         {'area', 'property'}),
        ('SELECT * FROM property AS "P", area AS "A"', {'property', 'area'}),
        ('SELECT * FROM ONLY property', {'property'}),
        ('SELECT * FROM t AS x (a, b) JOIN u ON true', {'t', 'u'}),
        ('TABLE property', {'property'}),
        ('SELECT now()', set()),
        ('VALUES (1)', set()),
        ('SHOW TABLES', set()),
        ("SELECT 'from nowhere' AS s FROM t -- from comments\n", {'t'}),
        ('/* from c */ SELECT x FROM `db`.`t`', {'t'}),
        ("SELECT 'C:\\' AS path, id FROM property", {'property'}),
        ("SELECT 'It\\'s' AS s, id FROM property", {'property'}),
        ('WITH r AS (SELECT * FROM a) SELECT * FROM r', {'a', 'r'}),
        ('(SELECT x FROM a) UNION (SELECT x FROM b)', {'a', 'b'}),
        ('EXPLAIN SELECT * FROM t', {'t'}),
        ("SELECT replace(a, 'x', 'y') FROM t", {'t'}),
        ('SELECT * FROM (SELECT max(a) FROM b) x', {'b'}),
        ('SELECT * FROM (SELECT a FROM b', {'b'}),
        ('SELECT substring(x from 2) FROM t', {'t'}),
        ('SELECT * FROM generate_series(1, 3) g, property p', {ANY_TABLE}),
        ('SELECT * FROM property p JOIN lookup(p.id) l ON true', {ANY_TABLE}),
        # Joins in parentheses, and tables after a join's condition.
        ('SELECT * FROM (a JOIN b ON a.x = b.x)', {'a', 'b'}),
        ('SELECT * FROM a, ((b JOIN c ON b.x = c.x))', {'a', 'b', 'c'}),
        ('SELECT * FROM b JOIN p ON b.x = p.y, a c', {'a', 'b', 'p'}),
        ('SELECT * FROM a JOIN b USING (id), c', {'a', 'b', 'c'}),
        ('SELECT * FROM b STRAIGHT_JOIN c', {'b', 'c'}),
        ('SELECT * FROM a TABLESAMPLE BERNOULLI (10), b', {'a', 'b'}),
        ('SELECT * FROM a USE INDEX (i, j), b', {'a', 'b'}),
        # Names that begin with a letter outside ASCII, as quoted.
        ('SELECT * FROM ñandú, Ärger a, "表" t', {'ñandú', 'ärger', '表'}),
        # MySQL's index hints for a part of the query, and ODBC's outer
        # join, which MySQL reads.
        ('SELECT * FROM a FORCE INDEX FOR ORDER BY (PRIMARY), b', {'a', 'b'}),
        ('SELECT * FROM a IGNORE KEY FOR GROUP BY (i), b', {'a', 'b'}),
        ('SELECT * FROM a USE INDEX FOR JOIN (i), b', {'a', 'b'}),
        ('SELECT * FROM {oj a LEFT OUTER JOIN b ON a.x = b.x}', {'a', 'b'}),
        ('SELECT * FROM c, { OJ a LEFT JOIN b ON 1 = 1 }', {'a', 'b', 'c'}),
        ('SELECT * FROM a, (SELECT x FROM b, c) s, d WHERE z IN '
         '(SELECT 1 FROM e, f) ORDER BY 1, 2', {*'abcdef'}),
        ('SELECT * FROM (VALUES (1, 2), (3, 4)) AS t (a, b), q', {'q'}),
        ('SELECT * FROM ((SELECT x FROM b)) s, q', {'b', 'q'}),
        ('SELECT * FROM (a x LEFT JOIN b ON 1 = 1)', {'a', 'b'}),
        ('SELECT * FROM (a AS x, b) JOIN c ON 1 = 1', {'a', 'b', 'c'}),
        # Parentheses that hold neither: their tables cannot be told.
        ('SELECT * FROM (1 + 2) x', {ANY_TABLE}),
        ('SELECT * FROM (only a JOIN b ON 1 = 1)', {ANY_TABLE}),
        ('SELECT 1 FROM :t', set()),  # not SQL: no table
        ('SELECT * FROM (a TABLESAMPLE SYSTEM (1) JOIN b ON 1 = 1)',
         {ANY_TABLE}),
        # A FROM of no table, in EXTRACT, SUBSTRING, TRIM.
        ('SELECT EXTRACT(EPOCH FROM (now() - p.at)), '
         "substring(p.a FROM 2), trim(both 'x' FROM p.b) FROM t p", {'t'}),
        ('SELECT a FROM t GROUP BY a, b LIMIT 10, 20', {'t'}),
        # What is double-quoted or backquoted hides a quote or a comment.
        ('SELECT "it\'s" AS x, y FROM a, b WHERE c = \'x\'', {'a', 'b'}),
        ('SELECT * FROM a WHERE n = "O\'Brien" UNION SELECT * FROM b '
         "WHERE c = 'x'", {'a', 'b'}),
        ('SELECT "/*" AS o, y FROM a, b WHERE "*/" = 1', {'a', 'b'}),
        # MySQL's INSERT() of strings, a column named merge: reads.
        ("SELECT INSERT(name, 1, 1, 'x') FROM a", {'a'}),
        ('SELECT merge FROM a', {'a'}),
        # As each database reads comments and strings: MySQL's # and its
        # /*! code */, -- only before a space, PostgreSQL's $$ quotes and
        # nested comments.
        ("SELECT p.id FROM area # Tom's list\nJOIN property p "
         "ON p.area = area.name WHERE p.area <> 'x'", {'area', 'property'}),
        ('SELECT id, rent--1 AS r FROM property', {'property'}),
        ('SELECT a.name FROM area a /*! JOIN property p ON p.area = a.name */',
         {'area', 'property'}),
        ('SELECT 1 FROM area /*!50100 , property */', {'area', 'property'}),
        ("SELECT $$it's$$ AS l, p.id FROM property p WHERE p.a = 'x'",
         {'property'}),
        ("SELECT $q$it's$q$ AS l, id FROM a, b WHERE c = 'x'", {'a', 'b'}),
        ('SELECT 1 /* /* */ FROM property -- */\n', {'property'}),
        ("SELECT 1 /* /* */ ' */ FROM property -- '\n", {'property'}),
        # SQLite's string where a table is expected: a table not told.
        ("SELECT id FROM 'property' WHERE area = :area", {ANY_TABLE}),
        ("SELECT id FROM main.'property'", {ANY_TABLE}),
        ("SELECT * FROM a JOIN 'b' ON 1 = 1", {ANY_TABLE}),
        ("SELECT * FROM a, 'b'", {ANY_TABLE}),
        # A FROM that names no table.
        ("SELECT * FROM t WHERE a IS DISTINCT FROM 'x'", {'t'}),
        ('SELECT * FROM t WHERE a IS NOT DISTINCT FROM b.c', {'t'}),
        # PostgreSQL's TABLE x, a query of its own.
        ('SELECT id FROM property WHERE id NOT IN (TABLE banned)',
         {'property', 'banned'}),
        ('WITH b AS (TABLE banned) SELECT * FROM property, b',
         {'b', 'banned', 'property'}),
        ('SELECT x FROM a UNION ALL TABLE b', {'a', 'b'}),
        ('(TABLE a) EXCEPT TABLE ONLY b', {'a', 'b'}),
        ('SELECT * FROM (TABLE a) s', {'a'}),
        # MariaDB's SET STATEMENT: the statement it runs.
        ('SET STATEMENT max_statement_time = 1 FOR SELECT * FROM area',
         {'area'}),
    ],
)  # fmt: skip
def test_reads_and_their_tables(sql, tables):
    assert analyse(sql) == (False, frozenset(tables))


@pytest.mark.parametrize(
    'sql, tables',
    [
        ('INSERT INTO property VALUES (1)', {'property'}),
        ('UPDATE ñandú SET área = 1', {'ñandú'}),
        ('INSERT INTO t (a, b) SELECT x, y FROM u', {'t'}),
        ('insert ignore into t (a) values (1)', {'t'}),
        ('REPLACE INTO t VALUES (1)', {'t'}),
        # SQLite's conflict actions stand between the verb and the table.
        ('INSERT OR REPLACE INTO property VALUES (1)', {'property'}),
        ('UPDATE OR IGNORE property SET area = 1', {'property'}),
        ('update or replace main.property p set rent = 1', {'property'}),
        ('UPDATE OR ROLLBACK a SET x = 1 FROM b', {'a', 'b'}),
        ('UPDATE public.property SET rent = 1', {'property'}),
        ('update only t set a = 1', {'t'}),
        ('UPDATE property p, area a SET p.x = a.y', {'property', 'area'}),
        ('UPDATE p SET x = 1 FROM property p', {'p', 'property'}),
        ('DELETE FROM t WHERE id IN (SELECT id FROM other)', {'t'}),
        ('DELETE FROM t USING u WHERE t.id = u.id', {'t', 'u'}),
        ('DELETE FROM ONLY property', {'property'}),
        ('TRUNCATE TABLE t', {'t'}),
        ('truncate t', {'t'}),
        ('TRUNCATE property, area', {'property', 'area'}),
        ('TRUNCATE ONLY property', {'property'}),
        ('MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN '
         'UPDATE SET a = 1 WHEN NOT MATCHED THEN INSERT VALUES (1)', {'t'}),
        ('INSERT INTO t VALUES (1) ON CONFLICT (id) DO UPDATE SET a = 2',
         {'t'}),
        ('INSERT INTO t VALUES (1) ON DUPLICATE KEY UPDATE a = 2', {'t'}),
        ('WITH gone AS (DELETE FROM t RETURNING *) '
         'INSERT INTO log SELECT * FROM gone', {'t', 'log'}),
        ('EXPLAIN ANALYZE DELETE FROM t', {'t'}),
        ('WITH c AS (SELECT 1) UPDATE a JOIN b ON a.x = b.x SET b.x = 1',
         {'a', 'b'}),
        ('UPDATE a STRAIGHT_JOIN b ON a.x = b.x SET b.y = 1', {'a', 'b'}),
        ('UPDATE a JOIN b ON (a.x = lower(b.x)) SET b.y = 1', {'a', 'b'}),
        ('UPDATE a SET x = 1, y = 2 FROM b, c WHERE a.i = b.i',
         {'a', 'b', 'c'}),
        ('SELECT * FROM t FOR UPDATE', set()),
        ('SELECT * FROM t FOR NO KEY UPDATE NOWAIT', set()),
        ('SELECT * FROM t FOR SHARE', set()),
        ('SELECT * FROM t LOCK IN SHARE MODE', set()),
        ('SELECT * FROM t /*!40000 FOR UPDATE */', set()),
        ("UPDATE area a # it's\nJOIN property p ON p.area = a.name "
         "SET p.rent = 1 WHERE a.name <> 'x'", {'area', 'property'}),
        # Settings, notifications, table locks: in the writing transaction
        # (where a SQL method's applies to what follows), of no table.
        ("SET LOCAL statement_timeout = '5s'", set()),
        ('set search_path to tenant, public', set()),
        ('SET SESSION max_statement_time = 5', set()),
        ('SET @x = (SELECT rent FROM property WHERE id = 1);', set()),
        ('SET GLOBAL max_connections = 10', set()),
        ('SET TRANSACTION ISOLATION LEVEL SERIALIZABLE', set()),
        ("NOTIFY changed, 'property'", set()),
        ('LISTEN changed', set()),
        ('UNLISTEN *', set()),
        ('LOCK TABLE property IN SHARE MODE', set()),
        ('LOCK TABLES property WRITE, area READ', set()),
        ('UNLOCK TABLES', set()),
        ('SET STATEMENT max_statement_time = 1 FOR '
         'UPDATE property SET rent = (1) WHERE id = 1', {'property'}),
    ],
)  # fmt: skip
def test_writes_and_their_tables(sql, tables):
    assert analyse(sql) == (True, frozenset(tables))


@pytest.mark.parametrize(
    'sql',
    ['CREATE TABLE t (a int)', 'DROP TABLE t', 'CALL refresh()',
     'ALTER TABLE t ADD b int', 'GRANT SELECT ON t TO u', '',
     'DELETE t FROM t JOIN u', 'SELECT * INTO backup FROM t',
     'INSERT INTO', 'INSERT INTO :x', 'UPDATE', 'DELETE FROM',
     'UPDATE f(1) SET a = 1', 'TRUNCATE', 'UPDATE :t SET a = 1',
     'DELETE FROM :t',
     # SQLite's string where a table is expected.
     "UPDATE 'property' SET rent = 1", "DELETE FROM 'property'",
     "UPDATE main.'property' SET rent = 1",
     "INSERT INTO main.'property' VALUES (1)",
     # MySQL's joins to update, and the tables that refer to a table.
     'UPDATE (a JOIN b ON a.x = b.x) SET b.x = 1', 'TRUNCATE a CASCADE',
     'UPDATE a, (b JOIN c ON 1 = 1) SET c.x = 2',
     'UPDATE a JOIN (b JOIN c ON b.i = c.i) ON a.i = b.i SET c.x = 2',
     # A setting and a write, in one text.
     "SET search_path TO x; DELETE FROM property", 'LOCK t; DROP TABLE t',
     'SET STATEMENT max_statement_time = 1 FOR',
     'SET STATEMENT max_statement_time = (1)'],
)  # fmt: skip
def test_writes_whose_tables_cannot_be_told(sql):
    assert analyse(sql) == (True, None)


@pytest.mark.parametrize(
    'sql, setting',
    [
        ("SET LOCAL statement_timeout = '5s'", True),
        ('SET search_path TO "Tenant", public', True),
        ('SET SESSION max_statement_time = 5', True),
        ('SET @x := (SELECT rent FROM property), @@sql_mode = DEFAULT', True),
        ("SET NAMES 'utf8mb4'", True),
        ("SET TIME ZONE 'UTC'", True),
        ('SET ROLE reader', True),
        ("SET x = 'global'", True),
        # The server's, the grants', another statement's or thread's.
        ('SET GLOBAL max_connections = 10', False),
        ('SET @@global.max_connections = 10', False),
        ('SET PERSIST max_connections = 10', False),
        ("SET PASSWORD = 'secret'", False),
        ('SET DEFAULT ROLE ALL TO u', False),
        ('SET STATEMENT max_statement_time = 1 FOR SELECT 1', False),
        ('SET RESOURCE GROUP batch FOR 14', False),
        # The transaction's: whether it may write, its isolation.
        ('SET TRANSACTION READ WRITE', False),
        ('SET SESSION TRANSACTION READ WRITE', False),
        ('SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE', False),
        ('SET transaction_read_only = off', False),
        ('SET LOCAL "transaction_read_only" TO off', False),
        ('SET default_transaction_read_only = off', False),
        ('SET @@session.tx_read_only = 0', False),
        ('SET CONSTRAINTS ALL DEFERRED', False),
        # Not one setting.
        ('SET search_path TO x; DELETE FROM property', False),
        ('SHOW search_path', False),
        ("NOTIFY changed, 'x'", False),
        ("SELECT set_config('search_path', 'x', true)", False),
    ],
)  # fmt: skip
def test_settings_a_read_only_transaction_may_make(sql, setting):
    assert is_setting(sql) is setting


def test_in_parameters():
    sql = 'SELECT * FROM t WHERE id IN :ids AND x = ANY(:arr) AND y in:z'
    assert in_parameters(sql) == {'ids'}
    assert in_parameters("SELECT ':x' WHERE a IN (:b)") == set()


@pytest.mark.parametrize(
    'sql, hidden',
    [
        ('SELECT :a, :b', {}),
        ('SELECT t_:a, :b::date, (:b)', {'a': None}),
        ("SELECT ':a', :b", {'a': 'PostgreSQL or SQLite'}),
        ('SELECT 1 /* :a */, :b', {'a': 'PostgreSQL or SQLite'}),
        ('SELECT 1 /* /* */ :a */, :b', {'a': 'PostgreSQL or SQLite'}),
        ('SELECT 1 /* /* :a', {'a': 'PostgreSQL or SQLite'}),
        ('SELECT 1 # :a', {'a': 'MySQL'}),
        ('SELECT 1 --:a', {'a': 'PostgreSQL or SQLite'}),
        ("SELECT 1 --'\n, :a --'", {'a': 'MySQL'}),
        ('SELECT ":a", :b', {'a': 'PostgreSQL or SQLite'}),
        ('SELECT `:a` + 1, :b', {'a': 'MySQL'}),
        ("SELECT 'it\\', :a, ''", {'a': 'MySQL'}),
        ("SELECT 'x\\' :a '", {'a': 'MySQL'}),
        ("SELECT E'x\\' :a '", {'a': 'PostgreSQL or SQLite'}),
        ("SELECT \"x\\\" :a \"", {'a': 'MySQL'}),
        ("SELECT \"x\\\" :a \" \"", {'a': 'MySQL'}),
        ('SELECT $$ :a $$, $q$ :b $q$, :b', {'a': 'PostgreSQL or SQLite',
                                            'b': 'PostgreSQL or SQLite'}),
        ("SELECT $$ ' $$, :a, $$ ' $$", {'a': 'MySQL'}),
        ('SELECT /*! :a */ :b', {'a': 'PostgreSQL or SQLite'}),
        ("SELECT \\'-- \\'#\\''x :a",
         {'a': 'MySQL with NO_BACKSLASH_ESCAPES'}),
        ('SELECT /*!50100 :a */ :b /* :c', {'a': 'PostgreSQL or SQLite',
                                           'c': 'PostgreSQL or SQLite'}),
    ],
)  # fmt: skip
def test_hidden_parameters(sql, hidden):
    names = {n for n in 'abc' if f':{n}' in sql}
    assert readings.hidden_parameters(sql + ' :other', names) == hidden


def test_a_star_before_a_comment_is_code_to_mysql():
    # */ ends MySQL's /*! code */ only: 2*/* :a */3 is 2 * 3.
    sql = 'SELECT 2*/* :a */3, /*! 1 */ :b'
    assert readings.hidden_parameters(sql, {'a', 'b'}, ['MySQL']) == {
        'a': 'MySQL'
    }


@pytest.mark.parametrize(
    'sql, found',
    [
        ('SELECT * FROM property, "area" JOIN `x` USING (i)', set()),
        ('SELECT * FROM b.item', {('item', 'b.item', 'schema')}),
        ('SELECT * FROM "Public"."C"', {('c', '"Public"."C"', 'schema')}),
        ('SELECT * FROM "Item" i', {('item', '"Item"', 'quoted')}),
        ('SELECT * FROM (`Item` JOIN a ON true)',
         {('item', '`Item`', 'quoted')}),
        ('SELECT * FROM Item WHERE id IN (SELECT i FROM AREA)',
         {('item', 'Item', 'capitals'), ('area', 'AREA', 'capitals')}),
        ("UPDATE Item SET n = 'x'", {('item', 'Item', 'capitals')}),
    ],
)  # fmt: skip
def test_names_written_otherwise_than_plainly(sql, found):
    # Triggers on the plain name may miss the table such a name reads.
    assert names([sql]) == found
