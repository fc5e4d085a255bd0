"""Back-off between pyramid_retry's attempts, so no request is starved.

pyramid_retry runs a request again at once when it fails with a
retryable error (a serialization failure, a deadlock). Under contention
the requests that failed together come back together and collide again,
and one of them can lose every attempt while the others average four: a
500 though nothing was wrong. Waiting a random time before each retry,
up to a bound that doubles with each attempt ("full jitter"), spreads
them out. pyramid_retry has no such delay; its ``IBeforeRetry`` event,
sent before each retry, is where one belongs.
"""

import random
import time

from pyramid_retry import IBeforeRetry


def backoff_bound(attempt, first, most):
    """The longest wait before retry ``attempt + 1`` (``attempt`` counts
    from 0): ``first`` seconds, doubled each attempt, at most ``most``."""
    return min(most, first * 2**attempt)


class Backoff:
    """The ``IBeforeRetry`` subscriber: sleep a random time in
    ``[0, backoff_bound(attempt, first, most))``."""

    def __init__(self, first, most):
        self.first = first
        self.most = most

    def __call__(self, event):
        attempt = event.environ.get('retry.attempt', 0)
        time.sleep(
            random.uniform(0, backoff_bound(attempt, self.first, self.most))
        )


def install(config, first, most):
    """Wait before each of pyramid_retry's retries (nothing when ``first``
    is 0: no subscriber at all)."""
    if first > 0:
        config.add_subscriber(Backoff(first, most), IBeforeRetry)
