"""Database servers of a test's own (or a benchmark's), each in a
temporary directory on a free loopback port, never the machine's own:
PostgreSQL, with a streaming standby, and MariaDB, with a replica by
GTID. ``conftest`` makes fixtures of them; ``benchmarks/bench_rwsplit.py``
starts a standby with them."""

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa


class ServerMissing(Exception):
    """A server could not be made or started: ``(what, why)``."""


def _postgresql_bin(name):
    """A PostgreSQL server program: on the PATH, or where Debian's
    postgresql packages put it (the newest version)."""
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(
        Path('/usr/lib/postgresql').glob(f'*/bin/{name}'),
        key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0,
    )
    if not versions:
        raise ServerMissing(f'PostgreSQL ({name})', 'not installed')
    return str(versions[-1])


def free_port():
    """A loopback port below Linux's ephemeral range that is free now."""
    for _ in range(50):
        port = random.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(('127.0.0.1', port))
            except OSError:
                continue
            return port
    raise OSError('no free loopback port')


class _OwnServer:
    """A database server of the test's own: its temporary directory (owned
    by ``nobody`` when the tests run as root, as the servers insist), its
    process, stopped by ``signal``."""

    signal = signal.SIGTERM

    def __init__(self, prefix):
        self.user = 'nobody' if os.geteuid() == 0 else None
        self.dir = Path(tempfile.mkdtemp(prefix=prefix))
        if self.user:
            shutil.chown(self.dir, self.user)
        self.data = self.dir / 'data'
        self.process = None

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(self.signal)
            self.process.wait(30)
        self.process = None

    def remove(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class PostgreSQL(_OwnServer):
    """A PostgreSQL server of the test's own, in a temporary directory, on
    a free loopback port: made by ``initdb`` (as ``nobody`` when the tests
    run as root, which PostgreSQL refuses), stopped and started again by
    the test, and removed at the end.

    With ``standby_of``, a streaming standby of that server instead, made
    by ``pg_basebackup -R``, replaying its WAL ``delay`` seconds late
    (:meth:`delay`); ``options`` are ``-c`` settings of the server."""

    #: A fast shutdown: connections are cut, as at a restart.
    signal = signal.SIGINT

    def __init__(self, standby_of=None, options=(), delay=0):
        super().__init__('dbtune-pg-')
        self.options = list(options)
        if standby_of is None:
            command = [
                _postgresql_bin('initdb'), '-D', str(self.data), '-A',
                'trust', '-U', 'postgres', '--no-sync', '-E', 'UTF8',
            ]  # fmt: skip
        else:
            command = [
                _postgresql_bin('pg_basebackup'), '-h', '127.0.0.1',
                '-p', str(standby_of.port), '-U', 'postgres',
                '-D', str(self.data), '-R', '-X', 'stream', '--no-sync',
            ]  # fmt: skip
        subprocess.run(
            command, user=self.user, check=True, capture_output=True
        )
        self.port = free_port()
        self.url = (
            f'postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres'
        )
        self.process = None
        self.start()
        if delay:
            self.delay(delay)

    def delay(self, seconds):
        """A standby: replay the primary's WAL ``seconds`` late from now on
        (``recovery_min_apply_delay``, set and reloaded, so that it can be
        lifted while a test's tables are made)."""
        wanted = str(round(seconds * 1000))  # as pg_settings shows it, ms
        engine = sa.create_engine(
            self.url, poolclass=sa.pool.NullPool, isolation_level='AUTOCOMMIT'
        )
        try:
            with engine.connect() as connection:
                connection.exec_driver_sql(
                    f"ALTER SYSTEM SET recovery_min_apply_delay = '{wanted}ms'"
                )
                connection.exec_driver_sql('SELECT pg_reload_conf()')
            # A new session sees it once the postmaster has reloaded, and
            # told the startup process, which reloads as it wakes.
            deadline = time.monotonic() + 30
            while True:
                with engine.connect() as connection:
                    shown = connection.exec_driver_sql(
                        'SELECT setting FROM pg_settings '
                        "WHERE name = 'recovery_min_apply_delay'"
                    ).scalar()
                if shown == wanted:
                    return
                assert time.monotonic() < deadline, (shown, wanted)
                time.sleep(0.01)
        finally:
            engine.dispose()

    def start(self):
        self.process = subprocess.Popen(
            [_postgresql_bin('postgres'), '-D', str(self.data),
             '-p', str(self.port), '-k', str(self.dir),
             '-c', 'listen_addresses=127.0.0.1', '-c', 'fsync=off',
             *(f'-c{option}' for option in self.options)],
            user=self.user,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        engine = sa.create_engine(self.url, poolclass=sa.pool.NullPool)
        deadline = time.monotonic() + 30
        try:
            while True:
                try:
                    with engine.connect():
                        return
                except sa.exc.OperationalError as exc:
                    if self.process.poll() is not None or (
                        time.monotonic() > deadline
                    ):
                        raise ServerMissing(
                            f'PostgreSQL on {self.port}', exc
                        ) from exc
                    time.sleep(0.05)
        finally:
            engine.dispose()


class MariaDB(_OwnServer):
    """A MariaDB server of the test's own, in a temporary directory, on a
    free loopback port (``mariadb-install-db``, then ``mariadbd`` as
    ``nobody`` when the tests run as root), with a binary log and GTIDs.

    With ``replica_of``, a replica of that server by GTID, its events
    applied ``delay`` seconds late (``MASTER_DELAY``)."""

    def __init__(self, server_id=1, replica_of=None, delay=0):
        super().__init__('dbtune-mariadb-')
        self.server_id = server_id
        install = shutil.which('mariadb-install-db') or shutil.which(
            'mysql_install_db'
        )
        if install is None:
            raise ServerMissing(
                'MariaDB (mariadb-install-db)', 'not installed'
            )
        subprocess.run(
            [install, '--no-defaults', f'--datadir={self.data}',
             '--auth-root-authentication-method=normal', '--skip-test-db'],
            user=self.user, check=True, capture_output=True,
        )  # fmt: skip
        self.port = free_port()
        self.url = f'mysql+pymysql://root@127.0.0.1:{self.port}/test'
        self.process = None
        self.start()
        if replica_of is None:
            self.execute('CREATE DATABASE test')
        else:
            self.execute(
                f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', "
                f"MASTER_PORT={replica_of.port}, MASTER_USER='root', "
                f'MASTER_USE_GTID=slave_pos, MASTER_DELAY={delay}',
                'START SLAVE',
            )

    def start(self):
        server = shutil.which('mariadbd') or '/usr/sbin/mariadbd'
        self.process = subprocess.Popen(
            [server, '--no-defaults', f'--datadir={self.data}',
             f'--port={self.port}', '--bind-address=127.0.0.1',
             f'--socket={self.dir / "socket"}',
             f'--pid-file={self.dir / "pid"}',
             f'--log-bin={self.data / "bin"}',
             f'--server-id={self.server_id}',
             f'--log-error={self.dir / "error.log"}',
             '--innodb-flush-log-at-trx-commit=0', '--skip-name-resolve'],
            user=self.user,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            try:
                self.execute('SELECT 1')
                return
            except sa.exc.OperationalError as exc:
                if self.process.poll() is not None or (
                    time.monotonic() > deadline
                ):
                    raise ServerMissing(
                        f'MariaDB on {self.port}', exc
                    ) from exc
                time.sleep(0.05)

    def delay(self, seconds):
        """A replica: apply the primary's events ``seconds`` late from
        now on."""
        self.execute(
            'STOP SLAVE',
            f'CHANGE MASTER TO MASTER_DELAY={seconds}',
            'START SLAVE',
        )

    def execute(self, *statements):
        url = f'mysql+pymysql://root@127.0.0.1:{self.port}/'
        engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        try:
            with engine.connect() as connection:
                for statement in statements:
                    connection.exec_driver_sql(statement)
                connection.commit()
        finally:
            engine.dispose()
