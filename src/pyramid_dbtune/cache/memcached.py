"""The shared cache: memcached, for many processes and machines.

Every process reads the same entries, and a write committed anywhere
invalidates them everywhere, through per-table generation counters kept in
memcached. A memcached that is down, slow or full is a miss, never an
error.

What is stored is signed: each value carries an HMAC-SHA256 of its key and
its payload under ``dbtune.cache.secret``, checked before anything is
decoded (:mod:`.codec`: JSON with tagged values, never a pickle), so a
forged or garbled value is rejected and cannot run code.

memcached is spoken through pymemcache's public API: a ``Client`` per
server and thread (a ``Client`` is not thread-safe, and one per thread
takes no lock on the hit path), the server of a key chosen by pymemcache's
``RendezvousHash``, a server that fails set aside for
``dbtune.cache.dead_retry`` seconds.
"""

import hashlib
import logging
import secrets
import threading
import time
from concurrent.futures import Future

from pymemcache.client.rendezvous import RendezvousHash

from ..deploy import forks
from ..sql.analysis import ANY_TABLE
from . import MAX_EXPIRY
from .codec import SIGNATURE, Unencodable, decode, encode, opened, sign
from .memory import HIT, MISS, STALE, WAITED, key_size
from .servers import EPOCH, FAILED, Server, ServerCalls
from .verified import Kept

log = logging.getLogger(__name__)

#: The layout of keys and values; a new one never reads an old one.
FORMAT = 1
_LOCK_TIME = 5  # seconds a fill lock lives, if its holder dies
#: Bytes memcached's item limit (``-I``) counts besides the key and the
#: value: its item header, the CAS and the flags (about 60 in 1.6).
ITEM_HEADER = 100
#: How many tables' key lists are remembered (and eight times as many
#: entry names, routes and generation keys), then forgotten at once.
MEMO_SIZE = 512
#: The largest cache key whose memcached name is remembered.
_MEMO_KEY_BYTES = 4096
#: How long a miss waits, then again, for another process's fill: 0.5 s.
_WAITS = (0.001, 0.002, 0.004, 0.008, 0.016, *[0.025] * 18, 0.019)


def _digest(text):
    return hashlib.blake2b(text.encode('utf-8'), digest_size=8).hexdigest()


def kept_for(ttl):
    """Seconds memcached keeps an entry of ``ttl`` seconds: as long again
    past its time, served while one process refreshes it; at most 30 days."""
    return min(MAX_EXPIRY, max(1, int(ttl * 2 + 1)))


class MemcachedCache(ServerCalls):
    """A cache of query results in memcached, shared by processes.

    Counters, as :class:`~pyramid_dbtune.cache.MemoryCache` has them, plus
    ``errors`` (memcached failures, each a miss), ``rejected`` (values whose
    signature or encoding failed, and generations that were not counters),
    ``unencodable`` (rows holding values the codec cannot share),
    ``too_big`` (over ``dbtune.cache.item_limit``) and ``near_hits`` (hits
    of reads that no write invalidates, served from this process's copy of
    rows it had verified, without a round trip).
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
        self.errors = self.rejected = self.unencodable = self.near_hits = 0
        self.too_big = self.discarded = self.invalidations = 0
        self._kept_bounds = (
            settings.cache_max_entries,
            settings.cache_max_bytes,
        )
        #: ``key[0]``: its values a read found dropped by a write
        self.dropped = {}
        self._undecodable = False
        self.after_fork()
        forks.renew_after_fork(self)

    def after_fork(self):
        """New clients, lock and memo: nothing of the parent's is used."""
        connect_timeout, timeout, _ = self._timeouts
        options = {
            'connect_timeout': connect_timeout,
            'timeout': timeout,
            'no_delay': True,
            'default_noreply': False,
        }
        self.by_address = {a: Server(a, options) for a in self.servers}
        self._lock = threading.Lock()
        #: Held to count: threads share the counters, and ``+=`` alone
        #: can lose one.
        self._counting = threading.Lock()
        self._mender = None
        self._inflight = {}
        #: The entries this process found signed and of the current
        #: generations, kept decoded (:mod:`.verified`)
        self.kept = Kept(*self._kept_bounds)
        self._missed = {}
        self._names = {}
        self._generation_keys = {}
        self._table_keys = {}
        self._reroute()

    # Keys

    def _name(self, *parts):
        return ':'.join((self.namespace, str(FORMAT), *parts))

    def entry_key(self, key):
        """memcached's key for a cache key: hashed to fit its 250 bytes,
        the same in every process."""
        name = self._names.get(key)
        if name is None:
            name = self._hash_key(key)
            # Remembered for small keys only: a call with big arguments
            # would keep them alive here, outside dbtune.cache.max_bytes.
            if key_size(key) <= _MEMO_KEY_BYTES:
                if len(self._names) >= MEMO_SIZE * 8:
                    self._names.clear()
                self._names[key] = name
        return name

    def hit_keys(self, key, tables):
        """The memcached keys a read of ``key`` over ``tables`` (as
        :meth:`get_or_fill` is given them) asks for in its one round trip:
        the entry's, then each table's generation's, then the epoch's. A
        hit of rows this process has verified asks for all but the
        first."""
        return [self.entry_key(key), *self._tables(tables)[1]]

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
        # Tables and rows' tags are short; hashed anyway so any one fits.
        name = self._generation_keys.get(table)
        if name is None:
            if len(self._generation_keys) >= MEMO_SIZE * 8:
                self._generation_keys.clear()  # a tag a row: bounded
            digest = hashlib.blake2b(table.encode('utf-8'), digest_size=12)
            name = self._generation_keys[table] = self._name(
                'g', digest.hexdigest()
            )
        return name

    # memcached, with failures as misses

    # An entry's generations live on the entry's own server, so that a hit
    # is one round trip however many servers there are, and losing a server
    # loses only the entries it held.

    def _server(self, name):
        """The server that holds key ``name`` among those not set aside,
        or None. Remembered while the set of those stays the same: the
        rendezvous hash is pure Python, and costs more than the rest of a
        hit."""
        if time.monotonic() >= self._recheck:
            self._reroute()
        server = self._routes.get(name)
        if server is None:
            ring, live = self._ring
            if not live:
                return None
            server = live[ring.get_node(name)]
            if len(self._routes) > MEMO_SIZE * 8:
                self._routes.clear()
            self._routes[name] = server
        return server

    def _reroute(self):
        """Route among the servers not set aside; look again after a
        failure, or when the first one set aside is due back."""
        now = time.monotonic()
        servers = self.by_address.values()
        live = {repr(s): s for s in servers if s.down_until <= now}
        self._routes = {}
        # The ring and its servers in one attribute: a thread that reads
        # them while another reroutes gets the old pair or the new one.
        self._ring = (RendezvousHash(list(live)), live)
        aside = [s.down_until for s in servers if s.down_until > now]
        self._recheck = min(aside, default=float('inf'))

    # Reading

    def _tables(self, tables):
        """``(table, key)`` of ``tables`` in order and the epoch, and the
        keys alone: the same for every call of a method, so remembered."""
        if not isinstance(tables, frozenset):
            tables = frozenset(tables)
        known = self._table_keys.get(tables)
        if known is None:
            ordered = (*sorted(tables), EPOCH)
            pairs = tuple((t, self._generation_key(t)) for t in ordered)
            known = self._table_keys[tables] = (pairs, [k for _, k in pairs])
            if len(self._table_keys) > MEMO_SIZE:
                self._table_keys.clear()
        return known

    def _generations(self, server, tables, got):
        """The current generation on ``server`` of each of ``tables`` (as
        :meth:`_tables` gives them) from a ``get_many`` answer, seeding
        those it has not got; None if it cannot tell."""
        generations, garbled = {}, False
        for table, key in tables:
            raw = got.get(key)
            if raw is None:
                raw = self._seed(server, table)
                if raw is None:
                    return None
            try:
                generations[table] = int(raw)
                if raw != b'%d' % generations[table]:
                    # Not as this package writes it (padded by memcached
                    # after a foreign write made it shorter, say): a kept
                    # entry's answer would never match it.
                    raise ValueError(raw)
            except ValueError:
                # Not a counter (written by something else): nothing over
                # the table can be told fresh until it starts again, at
                # the next read.
                garbled = True
                with self._counting:
                    self.rejected += 1
                self._on(server, None, 'delete', key)
        return None if garbled else generations

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
        known = self.kept.get(name)
        if known.signature == value[:SIGNATURE]:
            return known.entry
        payload = opened(self._secret, name, value)
        if payload is None:
            with self._counting:
                self.rejected += 1
            return None
        try:
            entry = decode(payload)
        except Exception as exc:
            # Signed, so written with the secret, but not ours to read:
            # another version of the package, say. Whatever fails (a bad
            # decimal, a date out of range, JSON nested too deep) is a
            # miss, said once.
            with self._counting:
                self.rejected += 1
            if not self._undecodable:
                self._undecodable = True
                log.warning(
                    'memcached: an entry signed with dbtune.cache.secret did '
                    'not decode (%s: %s), read as a miss; was it written by '
                    'another version of pyramid_dbtune?',
                    exc.__class__.__name__,
                    str(exc)[:200],
                )
            return None
        return entry

    def _remember(self, name, value, entry, emptied):
        """Keep ``entry``, decoded from ``value`` and found of the current
        generations, unless an unknown write emptied the kept entries
        since the read began: the next read asks only for its
        generations, and a read that no write invalidates is served it."""
        if self.kept.get(name).entry is entry:
            return  # a hit of what it holds: no lock taken
        answer = {
            self._generation_key(table): str(generation).encode('ascii')
            for table, generation in entry[1].items()
        }
        self.kept.keep(name, bytes(value[:SIGNATURE]), entry, answer, emptied)

    def get_or_fill(self, key, ttl, tables, fill, *args):
        name = self.entry_key(key)
        known = self.kept.get(name)
        if time.time() < known.entry[2]:
            if not tables:
                # A read that no write invalidates (``invalidate=False``):
                # the rows this process verified are good until their time
                # runs out, wherever they are asked for, without a round
                # trip.
                with self._counting:
                    self.hits += 1
                    self.near_hits += 1
                return known.entry[0], HIT
            # Rows this process verified: a hit while no write has bumped
            # their generations since, which the generations alone tell
            # (those of ``tables``: the same for every call of a key); the
            # entry, the bulk of a hit's bytes, is not asked for again.
            answer = known.answer
            server = self._server(name)
            got = self._on(server, None, 'get_many', list(answer))
            if got == answer:
                with self._counting:
                    self.hits += 1
                return known.entry[0], HIT
            if got is None:  # memcached failed: a miss, and nothing stored
                return self._fill(name, ttl, None, None, fill, args)
        tables, keys = self._tables(tables)
        server = self._server(name)
        emptied = self.kept.emptied
        got = self._on(server, None, 'get_many', [name, *keys])
        if got is None:  # memcached failed: a miss, and nothing stored
            got, generations = {}, None
        else:
            generations = self._generations(server, tables, got)
        value = got.get(name)
        entry = self._entry(name, value) if value is not None else None
        stale = None
        if entry is not None and entry[1] == generations:
            self._remember(name, value, entry, emptied)
            rows, _, expires = entry
            if time.time() < expires:
                with self._counting:
                    self.hits += 1
                return rows, HIT
            # While memcached keeps it: not for ever, if put back in it.
            if time.time() < expires - ttl + kept_for(ttl):
                stale = rows
        else:
            # What this process kept, if anything, is not what memcached
            # holds now: the next read asks for the entry with its
            # generations at once.
            self.kept.forget(name)
            if entry is not None and generations is not None:
                # Found dropped by a write (counted where it is found).
                with self._counting:
                    self.dropped[key[0]] = self.dropped.get(key[0], 0) + 1
        return self._fill(name, ttl, generations, stale, fill, args)

    # Filling

    def _fill(self, name, ttl, generations, stale, fill, args):
        # A fill is for the generations its read found: a read that found
        # newer ones (a write committed since) does not wait for it, here
        # or in another process, and is not given its rows. Where memcached
        # could not tell them, for this process's writes so far.
        of = '' if generations is None else _digest(repr(generations))
        flight = (name, of or self.invalidations)
        with self._lock:
            future = self._inflight.get(flight)
            leader = future is None
            if leader:
                future = self._inflight[flight] = Future()
        if not leader:
            if stale is not None:
                with self._counting:
                    self.stale += 1
                return stale, STALE
            with self._counting:
                self.waited += 1
            return future.result(), WAITED
        try:
            lock = self._name('l', name.rsplit(':', 1)[1], of)
            server = self._server(name)
            mine = self._on(server, True, 'add', lock, b'1', expire=_LOCK_TIME)
            if not mine and stale is not None:
                # Another process refreshes it: the old rows meanwhile.
                with self._counting:
                    self.stale += 1
                future.set_result(stale)
                return stale, STALE
            if not mine and generations is not None:
                # Another process fills it: wait a little for its rows.
                rows = self._wait_for(name, lock, generations)
                if rows is not None:
                    with self._counting:
                        self.waited += 1
                    future.set_result(rows)
                    return rows, WAITED
            with self._counting:
                self.misses += 1
            try:
                rows = fill(*args)
                if generations is not None:
                    self._store(name, rows, ttl, generations)
            finally:
                if mine:
                    # Stored, or nothing will be (a fill that failed, rows
                    # that cannot be stored): those waiting fill at once.
                    self._on(server, None, 'delete', lock)
        except BaseException as exc:
            future.set_exception(exc)
            raise
        else:
            future.set_result(rows)
        finally:
            with self._lock:
                del self._inflight[flight]
        return rows, MISS

    def _wait_for(self, name, lock, generations, waits=_WAITS):
        """Rows another process stores under ``name`` for ``generations``
        within about half a second, or None: at once when its ``lock`` is
        gone with none stored (its fill failed, or its rows cannot be
        stored). Asked again soon at first (a fill mostly takes
        milliseconds), then less often."""
        for pause in waits:
            time.sleep(pause)
            server = self._server(name)
            emptied = self.kept.emptied
            got = self._on(server, {}, 'get_many', [name, lock])
            value = got.get(name)
            entry = self._entry(name, value) if value is not None else None
            if entry and entry[1] == generations and time.time() < entry[2]:
                self._remember(name, value, entry, emptied)
                return entry[0]
            if lock not in got:
                return None
        return None

    def _store(self, name, rows, ttl, generations):
        expires = time.time() + ttl
        try:
            payload = encode(rows, generations, expires)
        except Unencodable:
            with self._counting:
                self.unencodable += 1
            return
        value = sign(self._secret, name, payload)
        if len(value) + len(name) + ITEM_HEADER > self.item_limit:
            with self._counting:
                self.too_big += 1
            return
        server = self._server(name)
        self._on(server, None, 'set', name, value, expire=kept_for(ttl))

    # Invalidating

    def invalidate(self, tables, changes=(), later=frozenset()):
        """Bump the generations of ``tables`` (``None``: all) on every
        server: every process's next read of a result over them misses.
        ``changes`` are not applied here, and ``later`` is for the
        in-process cache alone: a process does not know which changes an
        entry it did not fill holds."""
        names = [EPOCH] if tables is None else [*tables, ANY_TABLE]
        now = time.monotonic()
        for address, server in self.by_address.items():
            if server.down_until > now:
                server = None  # set aside: as if it failed
            for table in names:
                key = self._generation_key(table)
                bumped = self._on(server, FAILED, 'incr', key, 1)
                if bumped is FAILED:
                    # Unreachable (or taken out as dead): its entries may
                    # now be stale, so its epoch is bumped before it is
                    # read again.
                    self._missed_invalidation(address)
                    break
                # None: never set (or evicted), so no entry holds it; the
                # next read starts it at a number of its own.
        if tables is None:
            # Even the rows no write invalidates go with an unknown write
            # here (other processes keep theirs until their time runs
            # out). After the bumps: a read that found the old epoch
            # keeps nothing past this.
            self.kept.clear()
        with self._counting:
            self.invalidations += 1
