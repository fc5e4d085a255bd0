"""A client's pin to what it wrote, a cookie: until a time (the writer's,
for ``dbtune.pin_after_write``), or a log position (causal reads); both
signed."""

from pyramid import threadlocal

from ..convert import whole_number
from .lag import signed

#: The name of the cookie that pins a client to the writer after a write.
PIN_COOKIE = 'dbtune_pin'

#: Seconds a causal pin is kept by the client: replicas replay long before.
PIN_FOR = 3600


def parent_of(request):
    """The request under ``request`` that goes on in its transaction, if
    any: a subrequest's parent, the nearest request below it on Pyramid's
    stack of current requests (Pyramid pushes each request it invokes
    there) whose transaction manager is its own. Pyramid has no public
    way to look below the top of that stack (``get_current_request``),
    hence its ``manager.stack``."""
    tm = request.tm
    for pushed in reversed(threadlocal.manager.stack):
        below = pushed.get('request')
        if below is not request and getattr(below, 'tm', None) is tm:
            return below
    return None


def time_pin(value, key):
    """The time until which a time pin's cookie ``value`` pins its
    client, or None: for no pin, or one not signed with ``key`` (else a
    client could send every read of its own to the writer)."""
    return signed(value, key, whole_number)
