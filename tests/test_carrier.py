"""pyramid_dbtune.ops.carrier: a failing carry neither stops the carrier
thread nor the carry of another app's figures at exit."""

import contextlib
import gc
import logging
import threading
import time

from pyramid_dbtune.ops import carrier


class Figures:
    """What the carrier is given: something with a ``carry()``; this one
    fails while ``failing`` is set."""

    def __init__(self, failing=False):
        self.failing = failing
        self.tried = self.carried = 0

    def carry(self):
        self.tried += 1
        if self.failing:
            raise RuntimeError('the figures are out of reach')
        self.carried += 1


class Said(logging.Handler):
    """Counts the carrier's errors, keeping no record: a record's
    traceback would keep the figures, and their thread, alive."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.count = 0

    def emit(self, record):
        if 'could not be carried' in record.getMessage():
            self.count += 1


@contextlib.contextmanager
def said():
    """The carrier's errors, counted by a :class:`Said` of its own:
    pytest's handlers, which it adds to the logger for the test, would keep
    the records."""
    logger = logging.getLogger('pyramid_dbtune.ops.carrier')
    handler, kept = Said(), logger.handlers[:]
    logger.handlers[:] = [handler]
    logger.propagate = False
    try:
        yield handler
    finally:
        logger.propagate = True
        logger.handlers[:] = kept


def until(predicate, seconds=10):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_failing_carry_at_exit_leaves_the_others_carried():
    # Every one fails: each is tried all the same, whatever the order.
    apps = [Figures(failing=True) for _ in range(3)]
    with said() as errors:
        for figures in apps:
            carrier.start(figures, 3600)  # its thread carries, then sleeps
        until(lambda: errors.count == 3)  # each thread's carry, said
        assert all(figures.tried == 1 for figures in apps)
        carrier.carry_at_exit()
    assert [figures.tried for figures in apps] == [2, 2, 2]
    assert errors.count == 6


def test_the_carrier_thread_outlives_a_failing_carry():
    figures = Figures(failing=True)
    before = set(threading.enumerate())
    with said() as errors:
        carrier.start(figures, 0.01)
        (thread,) = set(threading.enumerate()) - before
        until(lambda f=figures: f.tried >= 5)
        assert errors.count == 1  # once a run of failures
        figures.failing = False
        until(lambda f=figures: f.carried >= 2)
        figures.failing = True
        until(lambda: errors.count == 2)  # a new run is said again
        assert thread.is_alive()
        del figures
        gc.collect()
        thread.join(10)
    assert not thread.is_alive()  # it ends with what it carried
