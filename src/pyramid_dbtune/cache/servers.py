"""memcached's servers as the shared cache talks to them: a pymemcache
``Client`` per server and thread, calls whose failures are misses, and the
invalidations a server missed, made good as soon as it answers."""

import logging
import threading
import time

from pymemcache.client.base import Client
from pymemcache.exceptions import MemcacheUnexpectedCloseError

from .codec import opened, sign

log = logging.getLogger('pyramid_dbtune.cache.memcached')

#: The generation that invalidating everything bumps.
EPOCH = '\0all'
FAILED = object()  # what a call that memcached failed returns
#: A server that missed an invalidation is asked to make it good this
#: often (seconds), for at most this long.
MEND_EVERY = 0.25
MEND_FOR = 600


#: Failures that say a server is unreachable, not that it refused a key:
#: such a server is set aside for a while (as HashClient does).
_UNREACHABLE = (OSError, MemcacheUnexpectedCloseError)
#: A kept connection found closed (memcached restarted, or something
#: between reset it): asked once more, on a new one; not by RetryingClient,
#: whose ``__getattr__`` and lambda cost ~1.5 us on every call.
_CLOSED = (ConnectionResetError, BrokenPipeError, MemcacheUnexpectedCloseError)


class Server:
    """One memcached server: its address, this thread's client of it, until
    when it is set aside after a failure, and whether its last call
    failed (said once, and again when it answers)."""

    def __init__(self, address, options):
        self.address = address
        self.options = options
        self.local = threading.local()
        self.down_until = 0.0
        self.failing = False

    def __repr__(self):
        return '{}:{}'.format(*self.address)

    def client(self):
        client = getattr(self.local, 'client', None)
        if client is None:
            client = self.local.client = Client(self.address, **self.options)
        return client


class ServerCalls:
    """What :class:`~pyramid_dbtune.cache.memcached.MemcachedCache` does
    with its servers, apart from what it asks them. It holds the state:
    ``by_address``, ``_missed`` (addresses, each with how many
    invalidations it missed), ``_mender`` (a thread or None), ``_lock``,
    ``_counting``, ``errors``, ``_recheck``, ``_timeouts`` and
    ``_secret``; and names keys (``_name``, ``_generation_key(EPOCH)``)."""

    def _call(self, server, default, method, *args, **kw):
        """``method(*args, **kw)`` of ``server``'s client, a failure as
        ``default``: logged once while they last, and an unreachable
        server set aside for ``dbtune.cache.dead_retry`` seconds."""
        try:
            call = getattr(server.client(), method)
            try:
                result = call(*args, **kw)
            except _CLOSED:  # the client closed it: this call opens anew
                result = call(*args, **kw)
        except Exception as exc:
            with self._counting:
                self.errors += 1
            if isinstance(exc, _UNREACHABLE):
                server.down_until = time.monotonic() + self._timeouts[2]
                self._recheck = 0.0  # the live servers have changed
            if not server.failing:
                server.failing = True
                log.warning(
                    'memcached %r failed, serving from the database: %s: %s',
                    server,
                    exc.__class__.__name__,
                    exc,
                )
            return default
        if server.failing:
            server.failing = False
            log.warning('memcached %r answers again', server)
        return result

    def ping(self):
        """Raise if no memcached server answers."""
        failures = []
        for server in self.by_address.values():
            try:
                server.client().get(self._name('ping'))
                return
            except Exception as exc:
                failures.append(f'{server!r}: {exc!r}')
        raise ConnectionError('; '.join(failures))

    def note(self, name, expire):
        """Keep the mark ``name`` for ``expire`` seconds, signed: what the
        processes that share the cache tell each other
        (:mod:`~pyramid_dbtune.cache.shared`)."""
        key = self._name('n', name)
        mark = sign(self._secret, key, b'1')
        self._on(self._server(key), None, 'set', key, mark, expire=expire)

    def noted(self, name):
        """Whether the mark ``name`` is kept (:meth:`note`); False where
        its server fails, or its signature does not hold."""
        key = self._name('n', name)
        mark = self._on(self._server(key), None, 'get', key)
        return mark is not None and opened(self._secret, key, mark) == b'1'

    def _on(self, server, default, method, *args, **kw):
        """Run ``method`` (a name) of ``server``'s client, failures as
        ``default``. A server that missed an invalidation has its epoch
        bumped first."""
        if server is None:
            return default
        missed = self._missed and server.address in self._missed
        if missed and not self._make_good(server):
            return default
        return self._call(server, default, method, *args, **kw)

    def _make_good(self, server):
        """Bump the epoch of ``server``, which missed an invalidation, so
        that none of its entries is served again; False if it cannot be
        told."""
        epoch = self._generation_key(EPOCH)
        address = server.address
        seen = self._missed.get(address)
        # None: memcached lost the epoch (a restart), and with it every
        # entry that depends on it.
        if self._call(server, FAILED, 'incr', epoch, 1) is FAILED:
            return False
        with self._lock:
            # One missed meanwhile (another thread's write) is made good
            # by the next bump, not by this one, which may come before it.
            if self._missed.get(address) == seen:
                self._missed.pop(address, None)
        return True

    def _missed_invalidation(self, address):
        """Note that ``address`` missed an invalidation, and make it good
        from a thread of this process's as soon as the server answers:
        until then other processes may serve its old entries, and this one
        may serve no request for a while (:data:`MEND_EVERY`,
        :data:`MEND_FOR`)."""
        with self._lock:
            self._missed[address] = self._missed.get(address, 0) + 1
            if self._mender is None or not self._mender.is_alive():
                self._mender = threading.Thread(
                    target=self._mend,
                    name='dbtune-memcached-mend',
                    daemon=True,
                )
                self._mender.start()

    def _mend(self):
        told = set(self._missed)
        log.warning(
            'memcached %s missed an invalidation: its epoch is bumped as '
            'soon as it answers',
            self._named(told),
        )
        for _ in range(int(MEND_FOR / MEND_EVERY)):
            time.sleep(MEND_EVERY)
            for address in list(self._missed):
                told.add(address)
                self._make_good(self.by_address[address])
            if self._ended(lambda: not self._missed):
                log.warning(
                    'memcached %s: missed invalidation made good',
                    self._named(told),
                )
                return
        self._ended(lambda: True)
        log.error(
            'memcached %s: missed invalidation not made good in %d s; it is '
            "at this process's next use of the server",
            self._named(self._missed),
            MEND_FOR,
        )

    def _ended(self, done):
        """Whether the mender ends, as ``done()`` says under the lock
        that a missed invalidation is noted under: one noted after it
        starts a mender of its own."""
        with self._lock:
            if done():
                self._mender = None
                return True
            return False

    def _named(self, addresses):
        """``host:port`` of each of ``addresses``, in order."""
        return ', '.join(sorted(repr(self.by_address[a]) for a in addresses))
