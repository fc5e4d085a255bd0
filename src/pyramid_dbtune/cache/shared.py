"""What the processes that share a memcached cache tell each other.

Their writes carry one origin (:func:`origin`), so that a listener passes
over the changes whose commit dropped what they changed, whichever of
them made it. And a process that starts listening asks whether another
listens already (:func:`ask`): what was committed before it listened was
then heard, and the cache is kept. Where none answers (the whole site
started anew, say), nobody heard what changed while none listened, and
the cache is dropped.

The question travels as the changes do, after them (a ``NOTIFY`` on
PostgreSQL, a row of ``dbtune_changes`` on MySQL): a listener that
answers has applied every change made before it. It answers only once it
listens itself, having asked in turn, so that two processes that start
together do not vouch for each other. The answer is a signed key in
memcached.
"""

import hashlib
import json
import re
import time
import uuid

from .triggers import CHANNEL, PROBE

#: Seconds a listener waits for an answer (on MySQL, four times
#: ``dbtune.cache.listen_every`` if more: others read that often).
WAIT_FOR_ANSWER = 1.0
#: Seconds an answer is kept in memcached.
ANSWER_FOR = 60


def origin(settings):
    """The origin of every process that shares a memcached cache (one
    digest of what it shares), or None for a cache of a process's own."""
    if settings.cache_backend != 'memcached':
        return None
    shared = (
        f'{settings.cache_namespace} {settings.cache_servers} '
        f'{settings.cache_secret}'
    )
    return f'memcached {hashlib.sha256(shared.encode()).hexdigest()[:16]}'


def ask(connection, cache, every, stopping):
    """Ask, on the listener's ``connection`` (listening already), whether
    another process listens; True once one answers in ``cache``, False if
    none has within :data:`WAIT_FOR_ANSWER` seconds, or ``stopping`` (an
    event) is set."""
    token = uuid.uuid4().hex
    wait = WAIT_FOR_ANSWER
    if connection.dialect.name == 'postgresql':  # a notice comes at once
        connection.exec_driver_sql(
            'SELECT pg_notify(%s, %s)', (CHANNEL, json.dumps({'p': token}))
        )
    else:
        connection.exec_driver_sql(
            f'INSERT INTO {CHANNEL} (tbl, cols) VALUES (%s, %s)',
            (PROBE, json.dumps(token)),
        )
        wait = max(wait, 4 * every)
    deadline = time.monotonic() + wait
    while not cache.noted(f'listens:{token}'):
        if time.monotonic() > deadline or stopping.wait(0.02):
            return False
    return True


def answer(cache, token):
    """Say in ``cache`` that this process listens, to the one that asked
    with ``token``: a token :func:`ask` makes, else nothing (anyone who
    may write to the changes' channel may write there)."""
    if isinstance(token, str) and _TOKEN.fullmatch(token):
        cache.note(f'listens:{token}', ANSWER_FOR)


_TOKEN = re.compile('[0-9a-f]{32}')
