"""How a process's figures reach prometheus_client's files, with
``PROMETHEUS_MULTIPROC_DIR`` (several processes, such as gunicorn's
workers): a thread carries them once a tick from the moment the process
begins to count (the application's set-up, or the fork of a worker from a
preloaded master), whether it serves or idles, and the process carries
them once more when it exits, so that a worker that is recycled
(``max_requests``, a reload) loses none of what it counted last.
"""

import atexit
import logging
import threading
import time
import weakref

__all__ = ['carry_at_exit', 'start']

log = logging.getLogger(__name__)

#: Every :class:`~.stats.Stats` whose figures are carried in this process
#: (a forked child's, renewed, among them).
_carried = weakref.WeakSet()


def start(stats, every):
    """A thread of this process carries the figures of ``stats`` into
    prometheus_client's files every ``every`` seconds while the process
    (and ``stats``) lives, so that a scrape that another process answers
    finds this one's at most that old; and :func:`carry_at_exit` carries
    them when the process exits. Never a request's thread."""
    _carried.add(stats)
    threading.Thread(
        target=_carry_every,
        args=(weakref.ref(stats), every),
        name='dbtune-stats-carry',
        daemon=True,
    ).start()


def _carry_every(ref, every):
    failing = False  # said once a run of failures
    while True:
        stats = ref()
        if stats is None:
            return  # its app is gone
        failing = not _carry(stats, quiet=failing)
        del stats
        time.sleep(every)


def _carry(stats, quiet=False):
    """Carry the figures of ``stats``: True, or False when that failed
    (logged unless ``quiet``). A failure never stops the next carry, nor
    another app's."""
    try:
        stats.carry()
    except Exception:
        if not quiet:
            log.exception('pyramid_dbtune: the figures could not be carried')
        return False
    return True


def carry_at_exit():
    """Carry the figures of every :class:`~.stats.Stats` of this process
    that :func:`start` was given (registered with :mod:`atexit`: it runs
    when the process exits, as a gunicorn worker does)."""
    for stats in list(_carried):
        _carry(stats)


atexit.register(carry_at_exit)
