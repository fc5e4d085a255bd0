"""Telling driver errors apart by their codes, with the drivers' own
exception classes."""

import sqlite3

import psycopg
import pymysql
import pytest

from pyramid_dbtune.routing.errors import is_read_only_refusal, is_retryable


@pytest.mark.parametrize(
    'error, retryable',
    [
        (psycopg.errors.SerializationFailure(), True),
        (psycopg.errors.DeadlockDetected(), True),
        (psycopg.errors.UniqueViolation(), False),
        (pymysql.err.OperationalError(1213, 'Deadlock found'), True),
        (pymysql.err.OperationalError(1205, 'Lock wait timeout'), True),
        # As PyMySQL 1.1 and later give them, with the server's SQLSTATE.
        (pymysql.err.OperationalError(1205, 'Lock', sqlstate='HY000'), True),
        (pymysql.err.IntegrityError(1062, 'Dup', sqlstate='23000'), False),
        (pymysql.err.IntegrityError(1062, 'Duplicate entry'), False),
        (sqlite3.OperationalError('database is locked'), False),
        (Exception(), False),
    ],
)
def test_retryable(error, retryable):
    assert is_retryable(error) is retryable


@pytest.mark.parametrize(
    'error, refusal',
    [
        (psycopg.errors.ReadOnlySqlTransaction(), True),
        (psycopg.errors.UndefinedTable(), False),
        (pymysql.err.OperationalError(1792, 'READ ONLY transaction'), True),
        (pymysql.err.OperationalError(1146, "Table doesn't exist"), False),
        (
            sqlite3.OperationalError('attempt to write a readonly database'),
            True,
        ),
        (sqlite3.OperationalError('no such table: t'), False),
    ],
)
def test_read_only_refusal(error, refusal):
    assert is_read_only_refusal(error) is refusal
