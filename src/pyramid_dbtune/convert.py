"""How a setting's text is read: a converter for each kind of value, and
the package's one reader of booleans and of digits."""

import contextlib
import math
import re
import threading
from types import MappingProxyType

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from .fastpath import FastPathError, parse_paths


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
    if dialect.is_async:  # its engine is no Engine: every read would fail
        raise Invalid(
            f"a URL with a driver that is not asyncio's, as "
            f'{url.drivername} is: postgresql+psycopg://, not '
            'postgresql+psycopg_async://'
        )
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
    """``host:port`` items, whitespace- or comma-separated; an IPv6
    address in brackets (``[::1]:11211``)."""
    accepted = 'host:port items such as 127.0.0.1:11211 or [::1]:11211'
    servers = []
    for item in _items(value, ',', accepted):
        host, sep, port = str(item).rpartition(':')
        port = whole_number(port, 1, 65535)
        if host[:1] == '[' and host[-1:] == ']':
            host = host[1:-1]
        elif ':' in host:
            host = ''  # an IPv6 address needs its brackets
        if not (sep and host and port) or '[' in host or ']' in host:
            raise Invalid(accepted)
        servers.append((host, port))
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
        or not text.isascii()  # memcached's keys are ASCII
        or not all(c.isalnum() or c in '_-.' for c in text)
    ):
        raise Invalid('up to 40 ASCII letters, digits, "_", "-" or "."')
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
    number = None
    if not isinstance(value, bool):
        number = whole_number(str(value).strip().removeprefix('+'), low)
    if number is None or number > high:
        raise Invalid(accepted)
    return number


def as_count(value):
    """A whole number, 0 or more (a SQL file's ``max_rows``)."""
    return _whole_number(value, 0, math.inf, 'a whole number, 0 or more')


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
    """A non-negative, finite number of seconds (``20``, ``1.5``), in
    ASCII digits (``float`` takes ``'٣'`` and ``'1_0'`` too)."""
    text = str(value).strip()
    try:
        number = float(text) if text.isascii() and '_' not in text else -1.0
    except ValueError:
        number = -1.0
    if isinstance(value, bool) or not math.isfinite(number) or number < 0:
        raise Invalid('a number of seconds, 0 or more (such as 20 or 1.5)')
    return int(number) if number.is_integer() else number


#: The longest ``pin_after_write``: its cookie's expiry must be a date.
MAX_PIN = 365 * 24 * 3600


#: The longest time limit: PostgreSQL's statement_timeout is a 32-bit
#: count of milliseconds, and a larger one fails every connection.
MAX_LIMIT = (2**31 - 1) // 1000


def limit_seconds(value):
    """A time limit in seconds, from 0 (none) to :data:`MAX_LIMIT`."""
    seconds = None
    with contextlib.suppress(Invalid):
        seconds = as_seconds(value)
    if seconds is None or seconds > MAX_LIMIT:
        raise Invalid(
            f'a number of seconds, 0 (no limit) to {MAX_LIMIT} (24 days)'
        )
    return seconds


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


_SIZE = re.compile(r'^\s*([0-9]+)\s*([kmg]i?b?|b)?\s*$', re.IGNORECASE)
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
