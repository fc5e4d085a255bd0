"""The entries a process has verified in memcached, kept decoded: its
next hits of one ask memcached for the entry's generations alone."""

import threading
from collections import OrderedDict

from .memory import estimate_size


class Verified:
    """An entry found signed and of the current generations: ``entry`` is
    ``(rows, generations, expires)``, ``signature`` the one it carried."""

    __slots__ = ('signature', 'entry', 'size', 'answer')

    def __init__(self, signature, entry, size, answer):
        self.signature = signature
        self.entry = entry
        self.size = size
        #: What memcached answers for its generations' keys while no write
        #: has bumped them: a hit is told by comparing with it alone.
        self.answer = answer


#: What :meth:`Kept.get` gives for a name it does not hold: rows long
#: expired.
NOT_KEPT = Verified(None, (None, None, 0.0), 0, {})


class Kept:
    """The verified entries of one process, by memcached key: at most
    ``max_entries`` of at most about ``max_bytes`` (the oldest kept go
    first), and none once an unknown write has emptied it."""

    def __init__(self, max_entries, max_bytes):
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._entries = OrderedDict()
        self._held = 0  # bytes
        #: How many times it was emptied: a read that began before does
        #: not put back what it found.
        self.emptied = 0

    def __len__(self):
        return len(self._entries)

    def get(self, name):
        """The :class:`Verified` entry kept for ``name``, or
        :data:`NOT_KEPT`."""
        return self._entries.get(name, NOT_KEPT)

    def keep(self, name, signature, entry, answer, emptied):
        """Keep ``entry`` for ``name``, unless it was emptied since its
        read began (``emptied``, :attr:`emptied` then) or the rows alone
        are over ``max_bytes``."""
        size = estimate_size(tuple(answer.items()), entry[0])
        if size > self.max_bytes:
            return
        verified = Verified(signature, entry, size, answer)
        with self._lock:
            if self.emptied != emptied:
                return
            self._held += size - self._entries.pop(name, NOT_KEPT).size
            self._entries[name] = verified
            while (
                len(self._entries) > self.max_entries
                or self._held > self.max_bytes
            ):
                self._held -= self._entries.popitem(last=False)[1].size

    def forget(self, name):
        """Forget the entry kept for ``name``, if one still is."""
        with self._lock:
            self._held -= self._entries.pop(name, NOT_KEPT).size

    def clear(self):
        """Forget every entry, and those of reads under way."""
        with self._lock:
            self._entries.clear()
            self._held = 0
            self.emptied += 1
