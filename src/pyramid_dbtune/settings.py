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
from dataclasses import dataclass, field, fields
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


def as_urls(value):
    """One or more database URLs, whitespace-separated."""
    accepted = 'one or more database URLs, whitespace-separated'
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
class Settings:
    """The parsed ``dbtune.*`` settings (see :doc:`settings`)."""

    url: str | None = None
    #: The read URLs; ``None``: read from ``url`` with a pool of its own.
    read_urls: tuple | None = None
    read_pool_size: int = 8
    write_concurrency: int = 1
    write_timeout: float = 10
    pin_after_write: float = 0
    cache_backend: str = 'memory'
    cache_servers: tuple | None = None
    cache_secret: str | None = field(default=None, repr=False)
    cache_namespace: str = 'dbtune'
    cache_timeout: float = 0.25
    cache_connect_timeout: float = 0.25
    cache_dead_retry: float = 5
    cache_item_limit: int = 1024 * 1024
    cache_max_entries: int = 10000
    cache_max_bytes: int = 64 * 1024 * 1024
    cache_default_time: float = 0
    #: ``dbtune.fast_paths``: path to body (bytes) or callable.
    fast_paths: MappingProxyType | None = None
    #: Add a ``Server-Timing`` header to every response (:doc:`stats`).
    server_timing: bool = False
    #: Count requests, cache and database use; ``/_dbtune/stats``.
    stats: bool = False
    #: The sampling profiler, and how many samples it takes a second.
    profile: bool = False
    profile_sample: int = 100
    #: Lets a request into the ``/_dbtune/`` views (:mod:`.access`).
    stats_token: str | None = field(default=None, repr=False)
    stats_permission: str | None = None
    #: ``dbtune.probes``: the probe views of :mod:`.probes` are on.
    probes: bool = False
    #: ``dbtune.cache_time.<name>`` overrides, by SQL method name.
    cache_times: MappingProxyType = field(
        default_factory=lambda: MappingProxyType({})
    )
    #: ``dbtune.invalidate.<name>`` overrides, by SQL method name.
    invalidates: MappingProxyType = field(
        default_factory=lambda: MappingProxyType({})
    )


_DEFAULTS = {f.name: f.default for f in fields(Settings)}


@dataclass(frozen=True)
class Setting:
    name: str
    convert: object

    @property
    def default(self):
        """The default: that of the :class:`Settings` field of this name."""
        return _DEFAULTS[self.name.replace('.', '_')]


#: Every ``dbtune.`` setting: (name, converter); defaults in :class:`Settings`.
TABLE = (
    Setting('url', as_url),
    Setting('read_urls', as_urls),
    Setting('read_pool_size', positive_int),
    Setting('write_concurrency', positive_int),
    Setting('write_timeout', positive_seconds),
    Setting('pin_after_write', pin_seconds),
    Setting('cache.backend', one_of('memory', 'memcached', 'none')),
    Setting('cache.servers', as_servers),
    Setting('cache.secret', as_secret),
    Setting('cache.namespace', as_namespace),
    Setting('cache.timeout', positive_seconds),
    Setting('cache.connect_timeout', positive_seconds),
    Setting('cache.dead_retry', positive_seconds),
    Setting('cache.item_limit', as_bytes),
    Setting('cache.max_entries', positive_int),
    Setting('cache.max_bytes', as_bytes),
    Setting('cache.default_time', as_seconds),
    Setting('fast_paths', as_fast_paths),
    Setting('server_timing', as_bool),
    Setting('stats', as_bool),
    Setting('profile', as_bool),
    Setting('profile.sample', per_second),
    Setting('stats.token', as_token),
    Setting('stats.permission', as_name),
    Setting('probes', as_bool),
)

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
