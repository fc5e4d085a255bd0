"""The ``dbtune.*`` settings: one table, parsed once, frozen.

Every setting is read from the deployment settings by :func:`parse`, which
returns a :class:`Settings` object and raises
:class:`pyramid.exceptions.ConfigurationError` for a bad value, naming the
setting, the value and what would be accepted.
"""

import contextlib
import difflib
import math
import re
import threading
from dataclasses import dataclass, field, make_dataclass
from types import MappingProxyType

from pyramid.exceptions import ConfigurationError
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from .fastpath import FastPathError, parse_paths

PREFIX = 'dbtune.'


class Invalid(ValueError):
    """A converter's complaint; its text says what would be accepted."""


def as_url(value):
    """A database URL whose dialect and driver are installed."""
    text = str(value).strip()
    try:
        url = make_url(text)
        dialect = url.get_dialect()
    except (ArgumentError, NoSuchModuleError, ValueError):  # ValueError: port
        raise Invalid(
            'a database URL such as postgresql+psycopg://user@host/db '
            'or sqlite:///path/to/file.sqlite'
        ) from None
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        raise Invalid(
            f'a URL whose driver is installed ({exc}): install the extra '
            'for your database (pyramid_dbtune[postgresql], [mysql] or '
            '[oracle]) and name its driver, as in postgresql+psycopg://, '
            'mysql+pymysql:// or oracle+oracledb://'
        ) from None
    return text


def _items(value, separators, accepted):
    """The items of a text (split at whitespace and ``separators``) or of
    a list given from Python."""
    if isinstance(value, str):
        for separator in separators:
            value = value.replace(separator, ' ')
        return value.split()
    try:
        return list(value)
    except TypeError:
        raise Invalid(accepted) from None


_URL_COMMA = re.compile(r',(?=\s*[A-Za-z][\w+.-]*://)')


def as_urls(value):
    """One or more database URLs, separated by white space or commas (as
    every list setting is)."""
    accepted = 'one or more database URLs, separated by white space or commas'
    if isinstance(value, str):
        # A comma inside a URL (a query's option) is the URL's: only one
        # before the next URL's scheme separates.
        value = _URL_COMMA.sub(' ', value)
    urls = _items(value, '', accepted)
    if not urls:
        raise Invalid(accepted)
    return tuple(as_url(url) for url in urls)


def whole_number(text, low=0, high=None):
    """``text`` as a whole number from ``low`` to ``high`` (no bound:
    None), else None. ASCII digits only: ``str.isdigit`` takes ``'²'`` too,
    which ``int`` refuses; and at most 18 of them, so that no text a client
    sends costs ``int`` more than a moment."""
    if not (text.isascii() and text.isdigit() and len(text) <= 18):
        return None
    number = int(text)
    if number < low or (high is not None and number > high):
        return None
    return number


def as_servers(value):
    """``host:port`` items, whitespace- or comma-separated."""
    accepted = 'host:port items such as 127.0.0.1:11211'
    servers = []
    for item in _items(value, ',', accepted):
        host, sep, port = str(item).rpartition(':')
        port = whole_number(port, 1, 65535)
        if not (sep and host and port):
            raise Invalid(accepted)
        servers.append((host.strip('[]'), port))
    if not servers:
        raise Invalid(accepted)
    return tuple(servers)


def as_secret(value):
    text = str(value)
    if len(text) < 16:
        raise Invalid(
            'a secret of 16 characters or more (a long random string)'
        )
    return text


def as_token(value):
    """A secret that can travel in an HTTP header: printable ASCII."""
    text = as_secret(value)
    if not (text.isascii() and text.isprintable()) or text != text.strip():
        raise Invalid(
            'a token of printable ASCII characters, without spaces at its '
            'ends (it travels in an HTTP header)'
        )
    return text


def as_namespace(value):
    text = str(value).strip()
    if (
        not text
        or len(text) > 40
        or not all(c.isalnum() or c in '_-.' for c in text)
    ):
        raise Invalid('up to 40 letters, digits, "_", "-" or "."')
    return text


_TRUE = ('true', 'yes', 'on', '1')
_FALSE = ('false', 'no', 'off', '0')


def as_bool(value):
    """``true``/``false`` (also yes/no, on/off, 1/0), nothing else."""
    text = str(value).strip().lower()
    if text not in _TRUE + _FALSE:
        raise Invalid('true or false (or yes/no, on/off, 1/0)')
    return text in _TRUE


def as_name(value):
    """A non-empty word, such as a permission's name."""
    text = str(value).strip()
    if not text or any(c.isspace() for c in text):
        raise Invalid('a name without spaces, such as view-stats')
    return text


def _whole_number(value, low, high, accepted):
    try:
        number = int(str(value).strip())
    except ValueError:
        number = None
    if isinstance(value, bool) or number is None or not low <= number <= high:
        raise Invalid(accepted)
    return number


def per_second(value):
    """A whole number of times a second, from 1 to 1000."""
    return _whole_number(
        value, 1, 1000, 'a whole number of samples a second, from 1 to 1000'
    )


def one_of(*choices):
    def convert(value):
        text = str(value).strip().lower()
        if text not in choices:
            raise Invalid('one of ' + ', '.join(choices))
        return text

    return convert


def positive_int(value):
    """A whole number above 0."""
    return _whole_number(value, 1, math.inf, 'a whole number above 0')


def as_seconds(value):
    """A non-negative, finite number of seconds (``20``, ``1.5``)."""
    try:
        number = float(str(value).strip())
    except ValueError:
        number = -1.0
    if isinstance(value, bool) or not math.isfinite(number) or number < 0:
        raise Invalid('a number of seconds, 0 or more (such as 20 or 1.5)')
    return int(number) if number.is_integer() else number


#: The longest ``pin_after_write``: its cookie's expiry must be a date.
MAX_PIN = 365 * 24 * 3600


def pin_seconds(value):
    """A number of seconds from 0 to :data:`MAX_PIN` (a year)."""
    seconds = None
    with contextlib.suppress(Invalid):
        seconds = as_seconds(value)
    if seconds is None or seconds > MAX_PIN:
        raise Invalid(
            f'a number of seconds, 0 or more and at most {MAX_PIN} (a year)'
        )
    return seconds


_SIZE = re.compile(r'^\s*(\d+)\s*([kmg]i?b?|b)?\s*$', re.IGNORECASE)
_UNITS = {'k': 1000, 'm': 1000**2, 'g': 1000**3}


def positive_seconds(value):
    """A number of seconds above 0, and no more than a lock can wait."""
    seconds = None
    with contextlib.suppress(Invalid):
        seconds = as_seconds(value)
    if not seconds or seconds > threading.TIMEOUT_MAX:
        raise Invalid('a number of seconds above 0 (such as 10 or 0.5)')
    return seconds


def as_bytes(value):
    """A size in bytes: ``67108864``, ``64MiB``, ``500KB``, ``1GB``."""
    match = None if isinstance(value, bool) else _SIZE.match(str(value))
    if match is None or int(match.group(1)) < 1:
        raise Invalid('a size above 0 such as 67108864, 64MiB or 500KB')
    number, unit = int(match.group(1)), (match.group(2) or 'b').lower()
    if unit != 'b':
        base = 1024 if 'i' in unit else 1000
        number *= base ** (list(_UNITS).index(unit[0]) + 1)
    return number


def as_fast_paths(value):
    try:
        return MappingProxyType(parse_paths(value))
    except FastPathError as exc:
        raise Invalid(
            f'whitespace-separated /path=answer items such as '
            f'"/ok.html=OK /healthz=OK" ({exc})'
        ) from None


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
    Setting(
        'url',
        as_url,
        None,
        "The database's SQLAlchemy URL, such as "
        '``postgresql+psycopg://app@db/app``. Needed once any SQL method is '
        'registered. SQLite databases should be files: an in-memory SQLite '
        'database is one per thread.',
        shown='``sqlalchemy.url``',
    ),
    Setting(
        'read_urls',
        as_urls,
        None,
        'One or more read URLs (replicas), separated by white space or '
        'commas. Reads go'
        ' to the one with the fewest reads in flight; one that refuses '
        'connections is left out for a while (see :doc:`routing`). Unset, '
        "reads go to the writer's database through a pool of their own.",
        shown="the writer's URL",
    ),
    Setting(
        'read_pool_size',
        positive_int,
        8,
        "Connections kept in each read engine's pool.",
    ),
    Setting(
        'write_concurrency',
        positive_int,
        1,
        'Transactions of this process that may write at once; ``1`` '
        'serialises them.',
    ),
    Setting(
        'write_timeout',
        positive_seconds,
        10,
        'Seconds a request waits for a write slot before it is answered ``503'
        ' Service Unavailable``, having written nothing.',
    ),
    Setting(
        'connect_timeout',
        as_seconds,
        5,
        'Seconds a connection to the writer or a reader may take to open '
        '(PostgreSQL counts whole seconds, 2 at the least; ``0``: no '
        'bound). A reader that does not answer in time is down, and its '
        'reads go to the writer; a ``connect_timeout`` in a URL wins.',
    ),
    Setting(
        'statement_timeout',
        as_seconds,
        30,
        'Seconds a statement may run (``0``: no bound): PostgreSQL stops it '
        '(its ``statement_timeout``), PyMySQL gives up waiting for its '
        'answer (``read_timeout``, which also bounds the wait for a '
        "server's greeting). A ``statement_timeout`` the URL names wins.",
    ),
    Setting(
        'pin_after_write',
        pin_seconds,
        0,
        'With ``dbtune.read_urls``: seconds a client that wrote reads from '
        'the writer (a ``dbtune_pin`` cookie), and that reads of the tables '
        'written are filled from the writer, to ride out replica lag. At most'
        ' a year.',
    ),
    Setting(
        'retry.backoff',
        as_seconds,
        0.01,
        'The longest wait before pyramid_retry runs a request again, at '
        'first: each retry of a request waits a random time up to this, '
        'doubled at each attempt (``0``: no wait), so that requests that '
        'failed together (a serialization failure, a deadlock) do not '
        'collide again, and none loses every attempt.',
    ),
    Setting(
        'retry.max_backoff',
        positive_seconds,
        1,
        'The longest wait before a retry, however many attempts came before.',
    ),
    Setting(
        'cache.backend',
        one_of('memory', 'memcached', 'none'),
        'memory',
        '``memory`` keeps results in this process; ``memcached`` in '
        'memcached, shared by every process that names the same servers and '
        'secret (see :doc:`memcached`); ``none`` caches nothing.',
    ),
    Setting(
        'cache.servers',
        as_servers,
        None,
        'With ``memcached``: ``host:port`` items (``[::1]:11211`` for IPv6), '
        'separated by white space or commas. Required.',
    ),
    Setting(
        'cache.secret',
        as_secret,
        None,
        'With ``memcached``: the key that signs every entry, 16 characters or'
        ' more, the same in every process that shares the cache. Required.',
    ),
    Setting(
        'cache.namespace',
        as_namespace,
        'dbtune',
        'A prefix for every key, so that applications can share servers.',
    ),
    Setting(
        'cache.timeout',
        positive_seconds,
        0.25,
        'Seconds memcached has to answer; past them the read is a miss, '
        'answered from the database.',
    ),
    Setting(
        'cache.connect_timeout',
        positive_seconds,
        0.25,
        'Seconds memcached has to accept a connection; past them the read is '
        'a miss, answered from the database.',
    ),
    Setting(
        'cache.dead_retry',
        positive_seconds,
        5,
        'Seconds a server that failed is left alone before it is tried again.',
    ),
    Setting(
        'cache.item_limit',
        as_bytes,
        1024 * 1024,
        "Results whose entry is larger are not stored (memcached's own item "
        'limit, ``-I``, is 1 MiB by default).',
        shown='``1MiB``',
    ),
    Setting(
        'cache.max_entries',
        positive_int,
        10000,
        'At most this many results are kept; the least recently used go '
        'first. With memcached, at most this many verified entries are kept '
        'decoded in each process.',
    ),
    Setting(
        'cache.max_bytes',
        as_bytes,
        64 * 1024 * 1024,
        'At most about this much memory is held by cached results: a number '
        'of bytes, or with a unit (``500KB``, ``64MiB``, ``1GB``; ``KB`` is '
        '1000 bytes and ``KiB`` 1024). A single result larger than this is '
        'never stored.',
        shown='``64MiB``',
    ),
    Setting(
        'cache.default_time',
        as_seconds,
        0,
        'Seconds to cache the results of SQL methods that name no '
        '``cache_time`` of their own (``0``: not cached).',
    ),
    Setting(
        'fast_paths',
        as_fast_paths,
        None,
        'Paths answered before Pyramid builds a request: whitespace-separated'
        ' ``/path=answer`` items, where the answer is a text or ``python:`` '
        'and a dotted name of a function (see :doc:`fastpath`). Unset: '
        'nothing is installed.',
    ),
    Setting(
        'server_timing',
        as_bool,
        False,
        'Add a ``Server-Timing`` header to every response: total time, '
        'database read and write time, write-slot wait, cache hits and misses'
        ' (see :doc:`stats`).',
    ),
    Setting(
        'stats',
        as_bool,
        False,
        'Count requests, latency per route, cache, database and parallelism '
        'figures, served at ``/_dbtune/stats`` (JSON) and '
        '``/_dbtune/metrics`` (Prometheus), and the dashboard at '
        '``/_dbtune/``. Needs ``dbtune.stats.token`` or '
        '``dbtune.stats.permission``, and ``pyramid_dbtune[stats]``.',
    ),
    Setting(
        'profile',
        as_bool,
        False,
        'The sampling profiler and its views under ``/_dbtune/profile``. '
        'Needs ``dbtune.stats.token`` or ``dbtune.stats.permission``.',
    ),
    Setting(
        'profile.sample',
        per_second,
        100,
        'Samples the profiler takes a second, from 1 to 1000: each reads the '
        'stack of every thread running a request.',
    ),
    Setting(
        'stats.token',
        as_token,
        None,
        'A secret of 16 printable ASCII characters or more (it travels in a '
        "header) that lets a request into the operator's ``/_dbtune/`` views,"
        ' given in the ``X-Dbtune-Token`` header or the ``token`` query '
        'parameter. Those views are off by default; a request without the '
        'token (or the permission below) gets a 404, as if they were not '
        'there.',
    ),
    Setting(
        'stats.permission',
        as_name,
        None,
        "A permission of the application's security policy that also lets a "
        'request into the ``/_dbtune/`` views. Without a security policy, '
        'Pyramid grants every permission, so this setting then stops start-up'
        ' with an error.',
    ),
    Setting(
        'probes',
        as_bool,
        False,
        '``true`` adds the probe views under ``/_dbtune/probe/`` that '
        '``dbtune threadcheck`` drives (see :doc:`threadcheck`). Needs '
        '``dbtune.stats.token`` or ``dbtune.stats.permission``: without a way'
        ' in, start-up stops with an error. Off, nothing is added.',
    ),
)

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

#: Settings whose value is a secret: kept out of :class:`Settings`' repr.
_HIDDEN = frozenset(['cache.secret', 'stats.token'])

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
SECRETS = frozenset(['dbtune.cache.secret', 'dbtune.stats.token'])
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
    return Settings(
        **{name.replace('.', '_'): value for name, value in values.items()},
        cache_times=MappingProxyType(per_method[CACHE_TIME_PREFIX]),
        invalidates=MappingProxyType(per_method[INVALIDATE_PREFIX]),
    )
