"""Nothing opened before a fork is used after it (``gunicorn --preload``).

Objects that hold connections or locks register here; in a forked child
each is told to start afresh (``after_fork()``): pooled connections are the
parent's, and a lock another thread of the parent held at the fork stays
held in the child for ever.
"""

import os
import weakref

_objects = weakref.WeakSet()


def renew_after_fork(obj):
    """Call ``obj.after_fork()`` in every child forked from now on."""
    _objects.add(obj)


def _after_fork():  # pragma: no cover (runs in a forked child)
    for obj in list(_objects):
        obj.after_fork()


os.register_at_fork(after_in_child=_after_fork)
