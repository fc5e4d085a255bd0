"""Nothing opened before a fork is used after it (``gunicorn --preload``).

Objects that hold connections or locks register here; in a forked child
each is told to start afresh (``after_fork()``): pooled connections are the
parent's, and a lock another thread of the parent held at the fork stays
held in the child for ever. Then those that run a thread start it
(``start_after_fork()``, where they have one): a thread started earlier
could take a lock or a pooled connection another object has yet to renew.
It happens at every ``os.fork()``, whatever server forked; :func:`renew`
may be called again (the gunicorn hooks do) and renews once per process.
"""

import logging
import os
import weakref

log = logging.getLogger(__name__)

_objects = weakref.WeakSet()
#: The process whose connections and locks the registered objects hold.
_owner = os.getpid()
#: How many objects this process renewed after its fork.
renewed = 0
#: The objects whose renewal failed in this process, with the exception.
failures = []


def renew_after_fork(obj):
    """Call ``obj.after_fork()`` in every child forked from now on."""
    _objects.add(obj)


def renew():
    """In a forked child, renew every registered object, once.

    Returns how many objects were renewed by this call: 0 in the process
    that made them, and when the child renewed them already. An object
    whose ``after_fork()`` (or ``start_after_fork()``) raises is logged
    and listed in :data:`failures`, and the others are renewed all the
    same (this runs inside ``os.fork()``, where nothing may raise); after
    such a failure no thread is started (gunicorn's ``post_fork`` hook
    then stops the worker).
    """
    global _owner, renewed
    if os.getpid() == _owner:
        return 0
    objects = list(_objects)
    failures.clear()
    renewed_now = [obj for obj in objects if _call(obj, 'after_fork')]
    # Threads last, once nothing of the parent's is left to take; none
    # after a failure, when something of the parent's may be left.
    for obj in renewed_now if not failures else ():
        if hasattr(obj, 'start_after_fork'):
            _call(obj, 'start_after_fork')
    _owner = os.getpid()
    renewed = len(renewed_now)
    return renewed


def _call(obj, name):
    """Call ``obj.<name>()``; log and list in :data:`failures` what it
    raises. Whether it returned."""
    try:
        getattr(obj, name)()
    except Exception as exc:
        log.exception('pyramid_dbtune: could not renew %r (%s)', obj, name)
        failures.append((obj, exc))
        return False
    return True


os.register_at_fork(after_in_child=renew)
