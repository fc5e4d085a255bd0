"""The ``dbtune.*`` settings: one table, parsed once, frozen.

Every setting is read from the deployment settings by :func:`parse`, which
returns a :class:`Settings` object and raises
:class:`pyramid.exceptions.ConfigurationError` for a bad value, naming the
setting, the value and what would be accepted.
"""

import difflib
import re
from dataclasses import dataclass, field, make_dataclass
from types import MappingProxyType

from pyramid.exceptions import ConfigurationError
from sqlalchemy.engine import make_url

from .cache import MAX_EXPIRY
from .convert import (
    Invalid,
    as_bool,
    as_bytes,
    as_fast_paths,
    as_name,
    as_namespace,
    as_seconds,
    as_secret,
    as_servers,
    as_token,
    as_url,
    as_urls,
    limit_seconds,
    one_of,
    per_second,
    pin_seconds,
    positive_int,
    positive_seconds,
)

PREFIX = 'dbtune.'


@dataclass(frozen=True)
class Setting:
    """One ``dbtune.`` setting: its name (less ``dbtune.``), the converter
    of its text, its default, and what it does, as the docs say it.
    ``shown`` is the default as the docs show it, where the value alone
    would not say it (``sqlalchemy.url`` for ``url``)."""

    name: str
    convert: object
    default: object
    doc: str
    shown: str | None = None

    @property
    def field(self):
        """Its attribute of :class:`Settings`: ``cache.max_bytes`` is
        ``cache_max_bytes``."""
        return self.name.replace('.', '_')

    @property
    def default_text(self):
        """The default, as the settings page shows it."""
        if self.shown is not None:
            return self.shown
        if self.default is None:
            return '—'
        if isinstance(self.default, bool):
            return f'``{str(self.default).lower()}``'
        return f'``{self.default}``'


#: Every ``dbtune.`` setting: the one table the parsed :class:`Settings`,
#: start-up errors and the docs' settings page come from.
TABLE = (
    Setting('url', as_url, None, shown='``sqlalchemy.url``', doc=(
        "The database's SQLAlchemy URL, such as "
        '``postgresql+psycopg://app@db/app``. Needed once any SQL method is '
        'registered. SQLite databases should be files: an in-memory SQLite '
        'database is one per thread.')),
    Setting('read_urls', as_urls, None, shown="the writer's URL", doc=(
        'One or more read URLs (replicas), separated by white space or '
        'commas. Reads go to the one with the fewest reads in flight; one '
        'that refuses connections is left out for a while (see '
        ":doc:`routing`). Unset, reads go to the writer's database through a "
        'pool of their own.')),
    Setting('read_pool_size', positive_int, 8, doc=(
        "Connections kept in each read engine's pool.")),
    Setting('write_concurrency', positive_int, 1, doc=(
        'Transactions of this process that may write at once; ``1`` '
        'serialises them.')),
    Setting('write_timeout', positive_seconds, 10, doc=(
        'Seconds a request waits for a write slot before it is answered ``503 '
        'Service Unavailable``, having written nothing.')),
    Setting('connect_timeout', limit_seconds, 5, doc=(
        'Seconds a connection to the writer or a reader may take to open '
        '(PostgreSQL counts whole seconds, 2 at the least; ``0``: no bound). '
        'A reader that does not answer in time is down, and its reads go to '
        'the writer; a ``connect_timeout`` in a URL wins.')),
    Setting('statement_timeout', limit_seconds, 30, doc=(
        'Seconds a statement may run (``0``: no bound): PostgreSQL stops it '
        '(its ``statement_timeout``), PyMySQL gives up waiting for its answer '
        "(``read_timeout``, which also bounds the wait for a server's "
        "greeting), and InnoDB's wait for a row lock ends a second before "
        '(``innodb_lock_wait_timeout``, its error retryable). A bound the '
        'URL names wins. Other drivers are given neither bound: each '
        'process names them in its log at start-up.')),
    Setting('pin_after_write', pin_seconds, 0, doc=(
        'With ``dbtune.read_urls``: seconds a client that wrote reads from '
        'the writer (a ``dbtune_pin`` cookie), and that reads of the tables '
        'written are filled from the writer, to ride out replica lag. At most '
        'a year.')),
    Setting('causal_reads', as_bool, True, doc=(
        'With ``dbtune.read_urls`` on PostgreSQL or MariaDB: when a '
        "request's write commits, the writer's log position (its WAL "
        "position; its GTIDs) goes into the client's ``dbtune_pin`` cookie, "
        "signed, and that client's later reads go to a replica that has "
        'replayed it, else to the writer; reads of the tables written fill '
        'the cache from such a replica only. ``false``: reads may go to a '
        'replica that has not (``pin_after_write`` pins a client to the '
        'writer by time instead, as on other databases).')),
    Setting('pin_secret', as_secret, None, shown="drawn from the URL", doc=(
        'The key causal pins are signed with (16 characters or more, the '
        'same in every process), so that no client can make one. Unset, '
        "it is drawn from the writer's URL, password included: set it where "
        'the URL holds no password.')),
    Setting('max_replica_lag', as_seconds, 0, doc=(
        'With ``dbtune.read_urls``: seconds a replica may be behind the '
        'writer for reads to go to it (``0``: no bound). Each process looks '
        'at every replica\'s lag every 0.25 s, never on a read; a replica '
        'further behind is passed over until it catches up, and while all '
        'are, reads go to the writer. PostgreSQL and MySQL/MariaDB.')),
    Setting('dbsession', as_bool, True, doc=(
        'Whether ``request.dbsession`` is routed: the package\'s own, or the '
        "application's where it adds one (it is adopted). ``false`` leaves "
        '``request.dbsession`` to the application, as does a package with '
        'no database (no ``dbtune.url``).')),
    Setting('retry.backoff', as_seconds, 0.01, doc=(
        'The longest wait before pyramid_retry runs a request again, at '
        'first: each retry of a request waits a random time up to this, '
        'doubled at each attempt (``0``: no wait), so that requests that '
        'failed together (a serialization failure, a deadlock) do not collide '
        'again, and none loses every attempt.')),
    Setting('retry.max_backoff', positive_seconds, 1, doc=(
        'The longest wait before a retry, however many attempts came '
        'before.')),
    Setting('cache.backend', one_of('memory', 'memcached', 'none'), 'memory',
            doc=(
        '``memory`` keeps results in this process; ``memcached`` in '
        'memcached, shared by every process that names the same servers and '
        'secret (see :doc:`memcached`); ``none`` caches nothing.')),
    Setting('cache.servers', as_servers, None, doc=(
        'With ``memcached``: ``host:port`` items (``[::1]:11211`` for IPv6), '
        'separated by white space or commas. Required.')),
    Setting('cache.secret', as_secret, None, doc=(
        'With ``memcached``: the key that signs every entry, 16 characters or '
        'more, the same in every process that shares the cache. Required.')),
    Setting('cache.namespace', as_namespace, 'dbtune', doc=(
        'A prefix for every key, so that applications can share servers: '
        '1 to 40 ASCII letters, digits, ``_``, ``-`` or ``.``.')),
    Setting('cache.timeout', positive_seconds, 0.25, doc=(
        'Seconds memcached has to answer; past them the read is a miss, '
        'answered from the database.')),
    Setting('cache.connect_timeout', positive_seconds, 0.25, doc=(
        'Seconds memcached has to accept a connection; past them the read is '
        'a miss, answered from the database.')),
    Setting('cache.dead_retry', positive_seconds, 5, doc=(
        'Seconds a server that failed is left alone before it is tried '
        'again.')),
    Setting('cache.item_limit', as_bytes, 1024 * 1024, shown='``1MiB``', doc=(
        "Results whose entry is larger, its key and memcached's item "
        "header counted, are not stored (memcached's own item limit, "
        '``-I``, is 1 MiB by default).')),
    Setting('cache.max_entries', positive_int, 10000, doc=(
        'At most this many results are kept; the least recently used go '
        'first. With memcached, at most this many verified entries are kept '
        'decoded in each process.')),
    Setting('cache.max_bytes', as_bytes, 64 * 1024 * 1024, shown='``64MiB``',
            doc=(
        'At most about this much memory is held by cached results: a number '
        'of bytes, or with a unit (``500KB``, ``64MiB``, ``1GB``; ``KB`` is '
        '1000 bytes and ``KiB`` 1024). A single result larger than this is '
        'never stored. With memcached, it bounds the verified entries each '
        'process keeps decoded.')),
    Setting('cache.default_time', as_seconds, 0, doc=(
        'Seconds to cache the results of SQL methods that name no '
        '``cache_time`` of their own (``0``: not cached).')),
    Setting('cache.listen', as_bool, False, doc=(
        'Whether each process hears of the changes committed to the '
        'database by anyone (``psql``, a cron job, another application), and '
        'drops the cached results they could have changed: PostgreSQL, MySQL '
        'and MariaDB, once ``dbtune triggers`` has installed the triggers '
        '(see :doc:`sqlmethods`).')),
    Setting('cache.listen_every', positive_seconds, 0.25, doc=(
        'With ``cache.listen`` on MySQL and MariaDB: seconds between two '
        'reads of the changes (PostgreSQL sends them as they commit). On '
        'PostgreSQL, how often the listener looks up from waiting.')),
    Setting('fast_paths', as_fast_paths, None, doc=(
        'Paths answered before Pyramid builds a request: whitespace-separated '
        '``/path=answer`` items, where the answer is a text or ``python:`` '
        'and a dotted name of a function (see :doc:`fastpath`). Unset: '
        'nothing is installed.')),
    Setting('server_timing', as_bool, False, doc=(
        'Add a ``Server-Timing`` header to every response: total time, '
        'database read and write time, write-slot wait, cache hits and misses '
        '(see :doc:`stats`).')),
    Setting('stats', as_bool, False, doc=(
        'Count requests, latency per route, cache, database and parallelism '
        'figures, served at ``/_dbtune/stats`` (JSON) and '
        '``/_dbtune/metrics`` (Prometheus), and the dashboard at '
        '``/_dbtune/``. Needs ``dbtune.stats.token`` or '
        '``dbtune.stats.permission``, and ``pyramid_dbtune[stats]``.')),
    Setting('profile', as_bool, False, doc=(
        'The sampling profiler and its views under ``/_dbtune/profile``. '
        'Needs ``dbtune.stats.token`` or ``dbtune.stats.permission``.')),
    Setting('profile.sample', per_second, 100, doc=(
        'Samples the profiler takes a second, from 1 to 1000: each reads the '
        'stack of every thread running a request.')),
    Setting('stats.token', as_token, None, doc=(
        'A secret of 16 printable ASCII characters or more (it travels in a '
        "header) that lets a request into the operator's ``/_dbtune/`` views, "
        'given in the ``X-Dbtune-Token`` header or the ``token`` query '
        'parameter. Those views are off by default; a request without the '
        'token (or the permission below) gets a 404, as if they were not '
        'there.')),
    Setting('stats.permission', as_name, None, doc=(
        "A permission of the application's security policy that also lets a "
        'request into the ``/_dbtune/`` views. Without a security policy, '
        'Pyramid grants every permission, so this setting then stops start-up '
        'with an error.')),
    Setting('probes', as_bool, False, doc=(
        '``true`` adds the probe views under ``/_dbtune/probe/`` that '
        '``dbtune threadcheck`` drives (see :doc:`threadcheck`). Needs '
        '``dbtune.stats.token`` or ``dbtune.stats.permission``: without a way '
        'in, start-up stops with an error. Off, nothing is added.')),
)  # fmt: skip

#: What ``dbtune.cache_time.<name>`` and ``dbtune.invalidate.<name>``
#: (one per SQL method) do, for the settings page.
PER_METHOD_DOCS = (
    (
        'cache_time.<method>',
        'Seconds to cache the results of the SQL method ``<method>``, '
        'whatever its code or file says; ``0`` turns its caching off. It '
        'must name a registered method.',
    ),
    (
        'invalidate.<method>',
        '``true`` or ``false``, whatever the code or file says: whether a '
        'committed write to the tables of the read ``<method>`` drops its '
        'cached rows. ``false`` keeps them for their cache time, so they '
        'may be that old (see *Fresh or fast* in :doc:`sqlmethods`). It '
        'must name a registered read.',
    ),
)

#: Settings whose value is a secret: kept out of :class:`Settings`' repr,
#: and out of the errors of a bad one.
_HIDDEN = frozenset(
    s.name for s in TABLE if s.convert in (as_secret, as_token)
)

Settings = make_dataclass(
    'Settings',
    [
        (s.field, object, field(default=s.default, repr=s.name not in _HIDDEN))
        for s in TABLE
    ]
    + [
        (
            name,
            MappingProxyType,
            field(default_factory=lambda: MappingProxyType({})),
        )
        for name in ('cache_times', 'invalidates')
    ],
    frozen=True,
)
Settings.__module__ = __name__
Settings.__doc__ = """The parsed ``dbtune.*`` settings, one attribute a setting
(``dbtune.cache.max_bytes`` is ``cache_max_bytes``; see :doc:`settings`),
and ``cache_times`` and ``invalidates``: the ``dbtune.cache_time.<name>``
and ``dbtune.invalidate.<name>`` overrides, by SQL method name."""


#: Settings that mean something to the memcached backend alone.
_MEMCACHED_ONLY = (
    'cache.servers', 'cache.secret', 'cache.namespace', 'cache.timeout',
    'cache.connect_timeout', 'cache.dead_retry', 'cache.item_limit',
)  # fmt: skip

#: Settings that take a suffix: ``dbtune.cache_time.<method name>``.
CACHE_TIME_PREFIX = 'cache_time.'
#: ... and ``dbtune.invalidate.<method name>``.
INVALIDATE_PREFIX = 'invalidate.'


#: Settings whose value is a secret: an error says its length, never it.
SECRETS = frozenset(PREFIX + name for name in _HIDDEN)
#: A URL's password, as an error hides it (as SQLAlchemy shows a URL).
_PASSWORD = re.compile(r'(://[^:/@\s]*:)[^@\s]*@')


def _fail(name, value, accepted):
    if name in SECRETS:
        shown = f'(a secret of {len(str(value))} characters)'
    else:
        shown = _PASSWORD.sub(r'\1***@', repr(value))
    return ConfigurationError(
        f'{name} = {shown} is not valid: expected {accepted}'
    )


def read(settings):
    """The items of ``settings`` that :func:`parse` reads."""
    return {
        k: v
        for k, v in settings.items()
        if k.startswith(PREFIX) or k == 'sqlalchemy.url'
    }


def check_unchanged(settings, included):
    """Raise if ``settings`` now say otherwise than ``included``, what
    :func:`read` gave when pyramid_dbtune was included: engines, cache and
    views were made of those, and a later ``config.add_settings`` would be
    ignored without a word. A value that means what it meant (``5`` for
    ``'5'``, ``True`` for ``'yes'``) is no change."""
    now = read(settings)
    differ = [k for k in now.keys() | included.keys()
              if now.get(k) != included.get(k)]  # fmt: skip
    if not differ:
        return
    was = parse(included)
    if parse(now) == was:
        return

    def changes(name):  # ``name`` alone as it is now
        given = {k: v for k, v in included.items() if k != name}
        if name in now:
            given[name] = now[name]
        return parse(given) != was

    # Named by what each changes alone; keys that change it only together
    # (dbtune.url emptied, sqlalchemy.url changed) all.
    changed = sorted(filter(changes, differ)) or sorted(differ)
    raise ConfigurationError(
        f'{", ".join(changed)} changed after pyramid_dbtune was '
        "included, and the change would be ignored: set pyramid_dbtune's "
        "settings before config.include('pyramid_dbtune') (or in the "
        'ini file)'
    )


def parse(settings):
    """Parse the ``dbtune.*`` keys of ``settings`` into :class:`Settings`.

    ``dbtune.url`` falls back to ``sqlalchemy.url``. An unknown ``dbtune.``
    key is an error too, so that a misspelt setting cannot silently leave a
    feature at its default.
    """
    values = {}
    known = {PREFIX + s.name: s for s in TABLE}
    for key, setting in known.items():
        value = settings.get(key)
        if key == PREFIX + 'url' and value in (None, ''):
            key, value = 'sqlalchemy.url', settings.get('sqlalchemy.url')
        if value in (None, ''):
            values[setting.name] = setting.default
            continue
        try:
            values[setting.name] = setting.convert(value)
        except Invalid as exc:
            raise _fail(key, value, exc) from None

    per_method = {CACHE_TIME_PREFIX: {}, INVALIDATE_PREFIX: {}}
    converters = {CACHE_TIME_PREFIX: as_seconds, INVALIDATE_PREFIX: as_bool}
    for key, value in settings.items():
        if not key.startswith(PREFIX) or key in known:
            continue
        name = key[len(PREFIX) :]
        prefix = next((p for p in per_method if name.startswith(p)), None)
        if prefix is not None:
            try:
                per_method[prefix][name[len(prefix) :]] = converters[prefix](
                    value
                )
            except Invalid as exc:
                raise _fail(key, value, exc) from None
            continue
        accepted = sorted(known) + [
            PREFIX + p + '<method>' for p in per_method
        ]
        close = difflib.get_close_matches(key, accepted, n=1)
        hint = f' (did you mean {close[0]}?)' if close else ''
        raise ConfigurationError(
            f'{key} is not a pyramid_dbtune setting{hint}; '
            f'the settings are: {", ".join(accepted)}'
        )

    if values['cache.backend'] != 'memcached':
        for name in _MEMCACHED_ONLY:
            if settings.get(PREFIX + name) not in (None, ''):
                raise ConfigurationError(
                    f'{PREFIX}{name} is set, but {PREFIX}cache.backend is '
                    f'{values["cache.backend"]}: it applies to memcached only'
                )
    else:
        # memcached keeps an item 30 days at the most.
        times = {PREFIX + 'cache.default_time': values['cache.default_time']}
        times.update(
            (PREFIX + CACHE_TIME_PREFIX + name, seconds)
            for name, seconds in per_method[CACHE_TIME_PREFIX].items()
        )
        for key, seconds in times.items():
            if seconds > MAX_EXPIRY:
                raise _fail(
                    key,
                    settings[key],
                    f'at most {MAX_EXPIRY} seconds (30 days) with '
                    f'{PREFIX}cache.backend = memcached: what it keeps',
                )
        for name in ('cache.servers', 'cache.secret'):
            if values[name] is None:
                raise ConfigurationError(
                    f'{PREFIX}cache.backend = memcached needs {PREFIX}{name}'
                    + (
                        ': a shared cache must be signed, with a secret of '
                        '16 characters or more that only your processes know'
                        if name == 'cache.secret'
                        else ' (host:port items such as 127.0.0.1:11211)'
                    )
                )
    if values['cache.listen']:
        _check_listen(values['url'])
    if values['max_replica_lag'] and values['read_urls'] is None:
        raise ConfigurationError(
            f'{PREFIX}max_replica_lag is set, but {PREFIX}read_urls is not: '
            'it bounds the lag of replicas'
        )
    return Settings(
        **{s.field: values[s.name] for s in TABLE},
        cache_times=MappingProxyType(per_method[CACHE_TIME_PREFIX]),
        invalidates=MappingProxyType(per_method[INVALIDATE_PREFIX]),
    )


def _check_listen(url):
    """Raise unless the database of ``url`` can tell of its changes."""
    name = PREFIX + 'cache.listen'
    if url is None:
        raise ConfigurationError(
            f'{name} needs a database: set {PREFIX}url (or sqlalchemy.url)'
        )
    url = make_url(url)
    backend = url.get_backend_name()
    if backend not in ('postgresql', 'mysql', 'mariadb'):
        raise ConfigurationError(
            f'{name}: {backend} cannot tell of the changes made outside the '
            'application (PostgreSQL, MySQL and MariaDB can)'
        )
    if backend == 'postgresql' and url.get_driver_name() != 'psycopg':
        raise ConfigurationError(
            f'{name} needs psycopg (version 3) on PostgreSQL: a '
            'postgresql+psycopg:// URL'
        )
