"""What a shared cache entry holds, as bytes: rows, their tables'
generations and their expiry, as compact JSON with tagged values.

Never a pickle: a value that does not decode is rejected, and cannot run
code. What is stored is signed (:func:`sign`), and its signature checked
(:func:`opened`) before it is decoded.
"""

import base64
import datetime
import decimal
import hmac
import json
import uuid
import zoneinfo

from ..routing.lag import Position
from ..sql.rows import Rows

#: Bytes of the signature a stored value begins with (HMAC-SHA256).
SIGNATURE = 32


def sign(secret, name, payload):
    """``payload``, to be stored under key ``name``, signed with ``secret``
    (bytes): the HMAC-SHA256 of the key and the payload, then the
    payload."""
    mac = hmac.new(secret, name.encode('utf-8') + b'\0', 'sha256')
    mac.update(payload)
    return mac.digest() + payload


def opened(secret, name, value):
    """The payload of ``value``, found under key ``name``, if its signature
    under ``secret`` holds; else None."""
    if len(value) <= SIGNATURE:
        return None
    mac = hmac.new(secret, name.encode('utf-8') + b'\0', 'sha256')
    mac.update(memoryview(value)[SIGNATURE:])
    if not hmac.compare_digest(mac.digest(), value[:SIGNATURE]):
        return None
    return value[SIGNATURE:]


class Unencodable(TypeError):
    """A value the row codec has no tag for: its rows are not shared."""


def _tag(value):
    if isinstance(value, bytes):
        return {'$b': base64.b64encode(value).decode('ascii')}
    if isinstance(value, decimal.Decimal):
        return {'$d': str(value)}
    if isinstance(value, datetime.datetime):
        if isinstance(value.tzinfo, zoneinfo.ZoneInfo):
            # Its zone, not only its offset: a day added is a day of the
            # zone's (the offset changes with summer time).
            return {'$Z': [value.isoformat(), value.tzinfo.key]}
        return {'$T': value.isoformat()}
    if isinstance(value, datetime.date):
        return {'$D': value.isoformat()}
    if isinstance(value, datetime.time):
        return {'$t': value.isoformat()}
    if isinstance(value, datetime.timedelta):
        return {'$i': [value.days, value.seconds, value.microseconds]}
    if isinstance(value, uuid.UUID):
        return {'$u': str(value)}
    raise Unencodable(type(value).__name__)


def _cell(value):
    # JSON and arrays (dicts and lists) travel as JSON text of their own,
    # so that their contents are never taken for tags; a tuple (a record
    # of PostgreSQL's) comes back a tuple.
    if isinstance(value, dict | list | tuple):
        try:
            text = json.dumps(value, separators=(',', ':'))
        except TypeError:
            raise Unencodable(type(value).__name__) from None
        return {'$p' if isinstance(value, tuple) else '$j': text}
    return value


_UNTAG = {
    '$b': base64.b64decode,
    '$d': decimal.Decimal,
    '$T': datetime.datetime.fromisoformat,
    '$D': datetime.date.fromisoformat,
    '$t': datetime.time.fromisoformat,
    '$i': lambda v: datetime.timedelta(*v),
    '$u': uuid.UUID,
    '$j': json.loads,
    '$p': lambda v: tuple(json.loads(v)),
    '$Z': lambda v: datetime.datetime.fromisoformat(v[0]).astimezone(
        zoneinfo.ZoneInfo(v[1])
    ),
}


def _untag(obj):
    # The only one-key objects the codec writes are tags; the payload
    # itself has more keys, and JSON cells travel as text.
    if len(obj) == 1:
        ((tag, value),) = obj.items()
        return _UNTAG[tag](value)
    return obj


def encode(rows, generations, expires):
    """The payload of an entry: JSON, compact, no pickle."""
    return json.dumps(
        {
            'c': rows.columns,
            'r': [[_cell(v) for v in row] for row in rows.tuples()],
            't': rows.truncated,
            'p': None if rows.position is None else str(rows.position),
            'g': sorted(generations.items()),
            'e': expires,
        },
        default=_tag,
        separators=(',', ':'),
        allow_nan=True,
    ).encode('utf-8')


def decode(payload):
    """``(rows, generations, expires)`` from a verified payload."""
    data = json.loads(payload, object_hook=_untag)
    return (
        Rows(
            data['c'],
            data['r'],
            truncated=data['t'],
            position=_position(data.get('p')),
        ),
        dict(data['g']),
        data['e'],
    )


def _position(text):
    """The position rows were read at, as :func:`encode` wrote it."""
    return None if text is None else Position.parse(text)
