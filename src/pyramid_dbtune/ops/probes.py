"""Probe views for ``dbtune threadcheck``: wait, burn CPU, read the database.

With ``dbtune.probes = true`` (and a way in: ``dbtune.stats.token`` or
``dbtune.stats.permission``, see :mod:`pyramid_dbtune.ops.access`), three
views answer under ``/_dbtune/probe/``, each taking ``ms``, milliseconds
from 0 to :data:`MAX_MS`:

``io``
    Sleeps ``ms``: waiting, as for a slow database or a remote service,
    which the GIL does not serialise.
``cpu``
    Runs Python code until this thread has used ``ms`` of CPU time: a fixed
    amount of work, however many threads share the GIL or the cores.
``sql``
    Calls the SQL method ``dbtune_probe`` through ``request.sql``, as a
    view would: a read on a reader, never cached, that waits ``ms`` in
    the database on PostgreSQL (``pg_sleep``) and MySQL/MariaDB
    (``SLEEP``), and is a bare ``SELECT 1`` elsewhere. Only with a
    database (``dbtune.url``).

Each answers JSON saying which process and thread served it, when it
entered and left the view, how long it took inside it, and what the
server claims about its parallelism
(:func:`server_claims`).
"""

import math
import os
import sys
import threading
import time

from pyramid.httpexceptions import HTTPBadRequest

from ..convert import whole_number
from ..sql.method import SQLMethod
from . import access

#: The most milliseconds a probe may be asked to take.
MAX_MS = 10000
#: Milliseconds a probe takes when the request names none.
DEFAULT_MS = 50
#: The SQL method the ``sql`` probe calls.
METHOD = 'dbtune_probe'

#: The probe's statement by dialect, and whether it waits ``:seconds``.
_SQL = {
    'postgresql': ('SELECT 1 AS one FROM pg_sleep(:seconds)', True),
    'mysql': ('SELECT SLEEP(:seconds) AS slept', True),
    'mariadb': ('SELECT SLEEP(:seconds) AS slept', True),
    'oracle': ('SELECT 1 AS one FROM dual', False),
}
_PLAIN = ('SELECT 1 AS one', False)

#: What a server told this process about itself (see :func:`declare`).
declared = {}


def declare(**claims):
    """Record what the server says of this process: ``server``,
    ``workers``, ``threads``, ``worker_class``. The gunicorn hooks
    (:mod:`pyramid_dbtune.gunicorn`) call it in each worker."""
    declared.update(claims)


def cgroup_cpus(root='/sys/fs/cgroup', own='/proc/self/cgroup'):
    """The CPUs a container's CPU quota allows this process, rounded up;
    ``None`` without a quota.

    Reads cgroup v2's ``cpu.max`` or v1's ``cpu.cfs_quota_us`` and
    ``cpu.cfs_period_us`` under ``root``, in this process's cgroup (named
    in ``own``) and in each cgroup above it: the smallest quota counts.
    """
    paths = {}
    try:
        with open(own) as lines:
            for line in lines:
                _, controllers, path = line.rstrip('\n').split(':', 2)
                paths[controllers] = path.strip('/')
    except (OSError, ValueError):
        paths = {}
    limits = []
    # v2: one hierarchy; v1: the cpu controller's, alone or with cpuacct.
    for folder, path, files in [
        ('', paths.get('', ''), ('cpu.max',)),
        *(
            (name, paths.get(name, ''), ('cpu.cfs_quota_us',
                                         'cpu.cfs_period_us'))
            for name in ('cpu', 'cpu,cpuacct', 'cpuacct,cpu')
        ),
    ]:  # fmt: skip
        base = os.path.join(root, folder)
        parts = [p for p in path.split('/') if p]
        for depth in range(len(parts), -1, -1):
            quota = _quota(os.path.join(base, *parts[:depth]), files)
            if quota is not None:
                limits.append(quota)
    return min(limits, default=None)


def _quota(folder, files):
    """CPUs (rounded up) of the quota in ``folder``, or ``None``."""
    texts = []
    for name in files:
        try:
            with open(os.path.join(folder, name)) as file:
                texts.append(file.read())
        except OSError:
            return None
    words = ' '.join(texts).split()
    try:
        quota, period = int(words[0]), int(words[1])
    except (IndexError, ValueError):  # 'max', or not a quota
        return None
    if quota <= 0 or period <= 0:  # v1 says -1 for none
        return None
    return max(1, math.ceil(quota / period))


def usable_cores(cgroup_root='/sys/fs/cgroup'):
    """The cores this process may run on: those of its CPU affinity, at
    most its container's CPU quota (see :func:`cgroup_cpus`)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover (not on Linux)
        cores = os.cpu_count() or 1
    quota = cgroup_cpus(cgroup_root)
    return cores if quota is None else min(cores, quota)


def server_claims(environ):
    """What the server claims about parallelism, as far as it can be told.

    ``multithread`` and ``multiprocess`` are the WSGI flags; ``workers``
    and ``threads`` are counts where the server declares them (gunicorn
    with the hooks of :mod:`pyramid_dbtune.gunicorn`, mod_wsgi), else
    ``None``; ``cores`` are the cores this process may use.
    """
    claims = {
        'software': environ.get('SERVER_SOFTWARE'),
        'multithread': bool(environ.get('wsgi.multithread')),
        'multiprocess': bool(environ.get('wsgi.multiprocess')),
        'server': None,
        'workers': None,
        'threads': None,
        'worker_class': None,
        'cores': usable_cores(),
    }
    claims.update(declared)
    # mod_wsgi's module exists only inside Apache, and says both counts.
    mod_wsgi = sys.modules.get('mod_wsgi')
    if hasattr(mod_wsgi, 'threads_per_process'):
        claims.update(
            server='mod_wsgi',
            workers=mod_wsgi.maximum_processes,
            threads=mod_wsgi.threads_per_process,
        )
    return claims


def _milliseconds(request):
    try:
        text = request.GET.get('ms', str(DEFAULT_MS))
    except UnicodeDecodeError:  # any parameter: WebOb decodes them all
        raise HTTPBadRequest('the query string is not UTF-8') from None
    ms = whole_number(text, 0, MAX_MS)
    if ms is None:
        raise HTTPBadRequest(
            f'ms must be a whole number of milliseconds from 0 to {MAX_MS}, '
            f'not {text[:20]!r}' + ('…' if len(text) > 20 else '')
        )
    return ms


def burn(seconds):
    """Run Python code until this thread has used ``seconds`` of CPU."""
    end = time.thread_time() + seconds
    total = 0
    while time.thread_time() < end:
        total += sum(range(1000))
    return total


def _probe(name, work):
    def view(request):
        ms = _milliseconds(request)
        began = time.time()
        started = time.perf_counter()
        cpu = time.thread_time()
        extra = work(request, ms) or {}
        return {
            'probe': name,
            'ms': ms,
            'seconds': time.perf_counter() - started,
            # The wall clock, to tell which requests were in views at once.
            'began': began,
            'ended': time.time(),
            'cpu_seconds': time.thread_time() - cpu,
            'pid': os.getpid(),
            'thread': threading.get_native_id(),
            'claims': server_claims(request.environ),
            **extra,
        }

    view.__doc__ = f'The {name} probe: its work, and who served it.'
    return view


def _io(request, ms):
    time.sleep(ms / 1000)


def _cpu(request, ms):
    burn(ms / 1000)


def _sql(request, ms):
    waits = _SQL.get(request.registry.dbtune.router.dialect, _PLAIN)[1]
    params = {'seconds': ms / 1000} if waits else {}
    rows = request.sql[METHOD](**params)
    return {'rows': len(rows), 'db_wait': waits}


def probe_method(dialect):
    """The ``dbtune_probe`` SQL method for a database dialect."""
    sql = _SQL.get(dialect, _PLAIN)[0]
    return SQLMethod(METHOD, sql, cache_time=0, max_rows=1, tables=())


def install(config):
    """Add the probe views (``dbtune.probes = true``)."""
    dbtune = config.registry.dbtune
    access.check(dbtune.settings, 'probes')
    probes = {'io': _io, 'cpu': _cpu}
    if dbtune.router is not None:
        config.add_sql_method(probe_method(dbtune.router.dialect))
        probes['sql'] = _sql
    for name, work in probes.items():
        access.add_view(
            config,
            f'probe/{name}',
            _probe(name, work),
            renderer='json',
            request_method='GET',
        )
