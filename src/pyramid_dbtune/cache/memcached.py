"""The shared cache: memcached, for many processes and machines.

Every process reads the same entries, and a write committed anywhere
invalidates them everywhere, through per-table generation counters kept in
memcached. A memcached that is down, slow or full is a miss, never an
error.

What is stored is signed: each value carries an HMAC-SHA256 of its key and
its payload under ``dbtune.cache.secret``, checked before anything is
decoded. The payload is JSON with tagged values, never a pickle: a forged
or garbled value is rejected and cannot run code.
"""

import base64
import datetime
import decimal
import hashlib
import hmac
import json
import logging
import secrets
import socket
import struct
import sys
import threading
import time
import uuid
from collections import OrderedDict
from concurrent.futures import Future

from pymemcache.client.hash import HashClient

from ..deploy import forks
from ..sql.analysis import ANY_TABLE
from ..sql.rows import Rows
from . import MAX_EXPIRY
from .memory import HIT, MISS, STALE, WAITED

log = logging.getLogger(__name__)

#: The layout of keys and values; a new one never reads an old one.
FORMAT = 1
_SIGNATURE = 32  # bytes of HMAC-SHA256
_EPOCH = '\0all'  # the generation that invalidating everything bumps
_LOCK_TIME = 5  # seconds a fill lock lives, if its holder dies
_MEMO_SIZE = 512
#: How long a miss waits, then again, for another process's fill: 0.5 s.
_WAITS = (0.001, 0.002, 0.004, 0.008, 0.016, *[0.025] * 18, 0.019)
_FAILED = object()  # what a call that memcached failed returns


class Unencodable(TypeError):
    """A value the row codec has no tag for: its rows are not shared."""


def _tag(value):
    if isinstance(value, bytes):
        return {'$b': base64.b64encode(value).decode('ascii')}
    if isinstance(value, decimal.Decimal):
        return {'$d': str(value)}
    if isinstance(value, datetime.datetime):
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
    # so that their contents are never taken for tags.
    if isinstance(value, dict | list | tuple):
        try:
            return {'$j': json.dumps(value, separators=(',', ':'))}
        except TypeError:
            raise Unencodable(type(value).__name__) from None
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
        Rows(data['c'], data['r'], truncated=data['t']),
        dict(data['g']),
        data['e'],
    )


class ReplyError(Exception):
    """memcached's reply to ``get`` was not one this module can read.

    Not an :class:`OSError`: the server answered, so HashClient must not
    count it as down (``SERVER_ERROR out of memory`` is a miss, not an
    outage)."""


class Closed(ConnectionError):
    """The connection was closed before any of the reply came."""


#: A receive takes at most this much: the kernel hands over less at once.
_RECEIVE = 256 * 1024


class Reader:
    """One thread's connection to one server, for ``get`` alone.

    The hit path's one round trip: ``get`` of an entry and its tables'
    generations. pymemcache's own ``get_many`` checks every key and parses
    for every command, and its pool takes a lock twice: together, half as
    much again as the round trip. The keys here are this module's own
    (hashed, short, ASCII), so the reply is all that needs reading.
    Everything else (``set``, ``add``, ``incr``, ``delete``) goes through
    pymemcache. Any failure closes the connection; the next call opens a
    new one.
    """

    def __init__(self, server, connect_timeout, timeout):
        self.server = server
        self.connect_timeout = connect_timeout
        self.timeout = timeout
        self.sock = None

    def _connect(self):
        sock = socket.create_connection(self.server, self.connect_timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if _KERNEL_TIMEOUTS:
            # The kernel's timeout: a socket in Python's timeout mode polls
            # before every send and receive, two system calls more a hit.
            seconds, fraction = divmod(self.timeout, 1)
            micro = int(fraction * 1e6)
            if not seconds:
                micro = max(micro, 1)  # {0, 0} would mean no timeout at all
            limit = struct.pack('ll', int(seconds), micro)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, limit)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, limit)
            sock.settimeout(None)
        else:  # pragma: no cover (not Linux or macOS)
            sock.settimeout(self.timeout)
        self.sock = sock
        return sock

    def close(self):
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def fetch(self, keys):
        """``{key: value}`` of those ``keys`` the server holds.

        A connection kept from before that is found closed before any of
        the reply came (memcached restarted, or something between reset
        it) is replaced once: a ``get`` can be asked again. A timeout, or a
        reply cut short, is not asked again."""
        command = ('get ' + ' '.join(keys) + '\r\n').encode('ascii')
        kept = self.sock is not None
        try:
            return self._ask(command)
        except (Closed, ConnectionResetError, BrokenPipeError):
            if not kept:
                raise
        return self._ask(command)

    def _ask(self, command):
        try:
            sock = self.sock or self._connect()
            try:
                sock.sendall(command)
            except BlockingIOError:  # the kernel's timeout ran out
                raise TimeoutError(
                    'memcached took no command in time'
                ) from None
            return self._reply(sock)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _reply(sock):
        # Mostly the whole reply comes in one piece: it is parsed where it
        # lies, and only the values are copied out.
        data = _receive(sock, first=True)
        pos = 0
        found = {}
        while True:
            end = data.find(b'\r\n', pos)
            if end < 0:
                data = _more(sock, data, len(data) + 1)
                continue
            if end == pos + 3 and data.startswith(b'END', pos):
                if end + 2 != len(data):
                    raise ReplyError('more after END')
                return found
            head = data[pos:end].split()
            if len(head) != 4 or head[0] != b'VALUE' or not head[3].isdigit():
                raise ReplyError(data[pos:end][:40].decode('ascii', 'replace'))
            start = end + 2
            stop = start + int(head[3])
            if len(data) < stop + 2:
                data = _more(sock, data, stop + 2)
            if data[stop : stop + 2] != b'\r\n':
                raise ReplyError('a value longer than it said')
            found[head[1].decode('ascii')] = data[start:stop]
            pos = stop + 2


#: Kernel timeouts where ``SO_RCVTIMEO`` takes a ``struct timeval`` of two
#: longs; elsewhere Python's timeout mode.
_KERNEL_TIMEOUTS = sys.platform.startswith(('linux', 'darwin'))


def _receive(sock, size=0, first=False):
    try:
        chunk = sock.recv(min(max(size, 65536), _RECEIVE))
    except BlockingIOError:  # the kernel's timeout ran out
        raise TimeoutError('memcached did not answer in time') from None
    if not chunk:
        if first:
            raise Closed('memcached closed the connection')
        raise ReplyError('memcached closed the connection mid-reply')
    return chunk


def _more(sock, data, size):
    """``data`` and what follows it, to ``size`` bytes at least."""
    pieces = [data]
    have = len(data)
    while have < size:
        pieces.append(_receive(sock, size - have))
        have += len(pieces[-1])
    return b''.join(pieces)


class MemcachedCache:
    """A cache of query results in memcached, shared by processes.

    Counters, as :class:`~pyramid_dbtune.cache.MemoryCache` has them, plus
    ``errors`` (memcached failures, each a miss), ``rejected`` (values whose
    signature or encoding failed), ``unencodable`` (rows holding values the
    codec cannot share), ``too_big`` (over ``dbtune.cache.item_limit``)
    and ``near_hits`` (hits of reads that no write invalidates, served from
    this process's copy of rows it had verified, without a round trip).
    """

    def __init__(self, settings):
        self.servers = settings.cache_servers
        self.namespace = settings.cache_namespace
        self.item_limit = settings.cache_item_limit
        self._secret = settings.cache_secret.encode('utf-8')
        self._timeouts = (
            settings.cache_connect_timeout,
            settings.cache_timeout,
            settings.cache_dead_retry,
        )
        self.hits = self.misses = self.stale = self.waited = 0
        self.errors = self.rejected = self.unencodable = 0
        self.too_big = self.discarded = self.invalidations = 0
        self.near_hits = 0
        #: Verified entries kept decoded in this process (and served from
        #: it, for reads that no write invalidates): at most this many.
        self.memo_size = settings.cache_max_entries
        self._failing = False
        self.after_fork()
        forks.renew_after_fork(self)

    def after_fork(self):
        """A new client, lock and memo: nothing of the parent's is used."""
        connect_timeout, timeout, dead_retry = self._timeouts
        self.client = HashClient(
            list(self.servers),
            connect_timeout=connect_timeout,
            timeout=timeout,
            no_delay=True,
            use_pooling=True,
            retry_attempts=1,
            retry_timeout=dead_retry,
            dead_timeout=dead_retry,
            ignore_exc=False,
            default_noreply=False,
        )
        self._lock = threading.Lock()
        self._inflight = {}
        self._memo = OrderedDict()
        self._missed = set()
        self._names = {}
        self._generation_keys = {}
        self._table_keys = {}
        self._routes = {}
        self._ring = None
        self._local = threading.local()

    # Keys

    def _name(self, *parts):
        return ':'.join((self.namespace, str(FORMAT), *parts))

    def entry_key(self, key):
        """memcached's key for a cache key: hashed to fit its 250 bytes,
        the same in every process."""
        name = self._names.get(key)
        if name is None:
            name = self._names[key] = self._hash_key(key)
            if len(self._names) > _MEMO_SIZE * 8:
                self._names.clear()
        return name

    def _hash_key(self, key):
        prefix, values, types = key
        values = [
            sorted(map(repr, v)) if isinstance(v, frozenset) else v
            for v in values
        ]
        text = repr((prefix, values, [t.__qualname__ for t in types]))
        digest = hashlib.blake2b(text.encode('utf-8'), digest_size=20)
        return self._name('e', digest.hexdigest())

    def _generation_key(self, table):
        # Table names are short; hashed anyway so any name fits.
        name = self._generation_keys.get(table)
        if name is None:
            digest = hashlib.blake2b(table.encode('utf-8'), digest_size=12)
            name = self._generation_keys[table] = self._name(
                'g', digest.hexdigest()
            )
        return name

    # Signing

    def _sign(self, name, payload):
        mac = hmac.new(self._secret, name.encode('utf-8') + b'\0', 'sha256')
        mac.update(payload)
        return mac.digest() + payload

    def _open(self, name, value):
        """The payload of ``value`` if its signature holds, else None."""
        if len(value) <= _SIGNATURE:
            return None
        mac = hmac.new(self._secret, name.encode('utf-8') + b'\0', 'sha256')
        mac.update(memoryview(value)[_SIGNATURE:])
        if not hmac.compare_digest(mac.digest(), value[:_SIGNATURE]):
            return None
        return value[_SIGNATURE:]

    # memcached, with failures as misses

    def _call(self, default, method, *args, **kw):
        try:
            result = method(*args, **kw)
        except Exception as exc:
            self.errors += 1
            if not self._failing:
                self._failing = True
                log.warning(
                    'memcached %s failed, serving from the database: %s: %s',
                    ', '.join(f'{h}:{p}' for h, p in self.servers),
                    exc.__class__.__name__,
                    exc,
                )
            return default
        if self._failing:
            self._failing = False
            log.warning('memcached answers again')
        return result

    def ping(self):
        """Raise if no memcached server answers."""
        self.client.get(self._name('ping'))

    # An entry's generations live on the entry's own server, so that a hit
    # is one round trip however many servers there are, and losing a server
    # loses only the entries it held. HashClient says which server a key is
    # on, and keeps track of the dead, only through these two methods of
    # its own; they have not changed in pymemcache's 3.x and 4.x releases.

    def _server(self, name):
        """The client of the server that holds key ``name``, or None.

        Remembered while the set of live servers stays the same: the
        rendezvous hash is pure Python, and costs more than the rest of a
        hit."""
        client = self.client
        ring = (len(client.clients), len(client._dead_clients))
        if ring != self._ring:
            self._routes.clear()
            self._ring = ring
        server = self._routes.get(name)
        if server is None:
            try:
                server = client._get_client(name)
            except Exception:  # all servers down
                return None
            if len(self._routes) > _MEMO_SIZE * 8:
                self._routes.clear()
            self._routes[name] = server
        return server

    def _reader(self, server):
        """This thread's :class:`Reader` of ``server``.

        Made anew when HashClient brings a dead server back (as a new
        client): the old connection went with the old process."""
        readers = self._local.__dict__.setdefault('readers', {})
        made_for, reader = readers.get(server.server, (None, None))
        if made_for is not server:
            if reader is not None:
                reader.close()
            connect_timeout, timeout, _ = self._timeouts
            reader = Reader(server.server, connect_timeout, timeout)
            readers[server.server] = (server, reader)
        return reader

    def _on(self, server, default, method, *args, **kw):
        """Run ``method`` (a name) of ``server``'s client, failures as
        ``default``; ``fetch`` is this thread's :class:`Reader`'s. A
        server that missed an invalidation has its epoch bumped first."""
        if server is None:
            return default
        run = self.client._safely_run_func
        if server.server in self._missed:
            epoch = self._generation_key(_EPOCH)
            if (
                self._call(None, run, server, server.incr, None, epoch, 1)
                is None
            ):
                return default
            self._missed.discard(server.server)
        if method == 'fetch':
            function = self._reader(server).fetch
        else:
            function = getattr(server, method)
        return self._call(default, run, server, function, default, *args, **kw)

    # Reading

    def _tables(self, tables):
        """``tables`` in order, and the keys of their generations and the
        epoch: the same for every call of a method, so remembered."""
        if not isinstance(tables, frozenset):
            tables = frozenset(tables)
        known = self._table_keys.get(tables)
        if known is None:
            ordered = sorted(tables)
            keys = [self._generation_key(t) for t in (*ordered, _EPOCH)]
            known = self._table_keys[tables] = (ordered, keys)
            if len(self._table_keys) > _MEMO_SIZE:
                self._table_keys.clear()
        return known

    def _generations(self, server, tables, got):
        """The current generation of each table (and the epoch) on
        ``server``, from a ``get_many`` answer, seeding those it has not
        got; None if it cannot tell."""
        generations = {}
        for table in (*tables, _EPOCH):
            raw = got.get(self._generation_key(table))
            if raw is None:
                raw = self._seed(server, table)
                if raw is None:
                    return None
            generations[table] = int(raw)
        return generations

    def _seed(self, server, table):
        """Start a table's generation on ``server`` at a random number,
        and return the one it holds. Random: a counter that memcached
        evicted, and so lost, cannot come back to a value an old entry
        holds."""
        key = self._generation_key(table)
        start = str(secrets.randbits(48)).encode('ascii')
        if self._on(server, False, 'add', key, start, expire=0):
            return start
        return self._on(server, None, 'get', key)

    def _entry(self, name, value):
        """``(rows, generations, expires)`` of a verified value, or None.

        The memo knows a value by its signature: a value that carries the
        same one is the same value, or one whose rest was changed by
        somebody without the secret, and then it is these verified rows
        that are served, not that rest."""
        memo = self._memo.get(name)
        if memo is not None and memo[0] == value[:_SIGNATURE]:
            return memo[1]
        payload = self._open(name, value)
        if payload is None:
            self.rejected += 1
            return None
        try:
            entry = decode(payload)
        except (ValueError, KeyError, TypeError):
            self.rejected += 1  # signed, but not ours to read: a bug
            return None
        with self._lock:
            self._memo[name] = (bytes(value[:_SIGNATURE]), entry)
            if len(self._memo) > self.memo_size:
                self._memo.popitem(last=False)
        return entry

    def get_or_fill(self, key, ttl, tables, fill, *args):
        name = self.entry_key(key)
        if not tables:
            # A read that no write invalidates (``invalidate=False``): the
            # rows this process verified are good until their time runs
            # out, wherever they are asked for, without a round trip.
            near = self._memo.get(name)
            if near is not None and time.time() < near[1][2]:
                self.hits += 1
                self.near_hits += 1
                return near[1][0], HIT
        tables, keys = self._tables(tables)
        wanted = [name, *keys]
        server = self._server(name)
        got = self._on(server, None, 'fetch', wanted)
        if got is None:  # memcached failed: a miss, and nothing stored
            got, generations = {}, None
        else:
            generations = self._generations(server, tables, got)
        value = got.get(name)
        entry = self._entry(name, value) if value is not None else None
        stale = None
        if entry is not None and entry[1] == generations:
            rows, _, expires = entry
            if time.time() < expires:
                self.hits += 1
                return rows, HIT
            stale = rows
        return self._fill(name, ttl, generations, stale, fill, args)

    # Filling

    def _fill(self, name, ttl, generations, stale, fill, args):
        with self._lock:
            future = self._inflight.get(name)
            leader = future is None
            if leader:
                future = self._inflight[name] = Future()
        if not leader:
            if stale is not None:
                self.stale += 1
                return stale, STALE
            self.waited += 1
            return future.result(), WAITED
        try:
            lock = self._name('l', name.rsplit(':', 1)[1])
            mine = self._call(
                True, self.client.add, lock, b'1', expire=_LOCK_TIME
            )
            if not mine and stale is not None:
                # Another process refreshes it: the old rows meanwhile.
                self.stale += 1
                future.set_result(stale)
                return stale, STALE
            if not mine and generations is not None:
                # Another process fills it: wait a little for its rows.
                rows = self._wait_for(name, generations)
                if rows is not None:
                    self.waited += 1
                    future.set_result(rows)
                    return rows, WAITED
            self.misses += 1
            rows = fill(*args)
            if generations is not None:
                self._store(name, rows, ttl, generations)
            if mine:
                self._call(None, self.client.delete, lock)
        except BaseException as exc:
            future.set_exception(exc)
            raise
        else:
            future.set_result(rows)
        finally:
            with self._lock:
                del self._inflight[name]
        return rows, MISS

    def _wait_for(self, name, generations, waits=_WAITS):
        """Rows another process stores under ``name`` for ``generations``
        within about half a second, or None. Asked again soon at first (a
        fill mostly takes milliseconds), then less often."""
        for pause in waits:
            time.sleep(pause)
            server = self._server(name)
            value = self._on(server, {}, 'fetch', [name]).get(name)
            entry = self._entry(name, value) if value is not None else None
            if entry is not None and entry[1] == generations:
                return entry[0]
        return None

    def _store(self, name, rows, ttl, generations):
        expires = time.time() + ttl
        try:
            payload = encode(rows, generations, expires)
        except Unencodable:
            self.unencodable += 1
            return
        value = self._sign(name, payload)
        if len(value) > self.item_limit:
            self.too_big += 1
            return
        # Kept past its time by as long again, to be served while one
        # process refreshes it; never past memcached's 30 days.
        expire = min(MAX_EXPIRY, max(1, int(ttl * 2 + 1)))
        self._call(None, self.client.set, name, value, expire=expire)

    # Invalidating

    def invalidate(self, tables):
        """Bump the generations of ``tables`` (``None``: all) on every
        server: every process's next read of a result over them misses."""
        names = [_EPOCH] if tables is None else [*tables, ANY_TABLE]
        if tables is None:
            # Even the rows no write invalidates go with an unknown write
            # here (other processes keep theirs until their time runs out).
            with self._lock:
                self._memo.clear()
        live = {c.server: c for c in list(self.client.clients.values())}
        for address in self.servers:
            server = live.get(address)
            for table in names:
                key = self._generation_key(table)
                bumped = self._on(server, _FAILED, 'incr', key, 1)
                if bumped is _FAILED:
                    # Unreachable (or taken out as dead): its entries may
                    # now be stale, so its epoch is bumped before it is
                    # read again.
                    self._missed.add(address)
                    break
                if bumped is None:  # never set: nothing depends on it
                    self._seed(server, table)
        self.invalidations += 1
