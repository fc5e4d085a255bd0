"""Fork safety (``pyramid_dbtune.deploy.forks``): in a child forked for
real, every registered object is renewed once, a failing one does not
stop the others, and threads start once all are renewed; the engines and
the cache a child renews are its own."""

import os

from pyramid.scripting import prepare

from pyramid_dbtune.deploy import forks

from conftest import in_a_child


class Renewable:
    def __init__(self):
        self.renewed = 0

    def after_fork(self):
        self.renewed += 1


class Failing:
    def after_fork(self):
        raise RuntimeError('cannot renew')


class Threaded(Renewable):
    """As the listener: a thread of its own in a forked child, which uses
    what the other objects renew."""

    def __init__(self, others):
        super().__init__()
        self.others = others
        self.saw = None

    def start_after_fork(self):
        self.saw = [obj.renewed for obj in self.others]


def test_a_failing_renewal_does_not_stop_the_others(caplog):
    objects = [Failing(), Renewable(), Failing(), Renewable()]
    threaded = Threaded(objects[1::2])
    for obj in [*objects, threaded]:
        forks.renew_after_fork(obj)
    assert forks.renew() == 0  # the process that made them

    def the_others_renewed():
        failed = {id(obj) for obj, _ in forks.failures}
        logged = [r for r in caplog.records if 'could not renew' in r.msg]
        return (
            [obj.renewed for obj in objects[1::2]] == [1, 1]
            and {id(obj) for obj in objects[::2]} <= failed
            and not {id(obj) for obj in objects[1::2]} & failed
            and len(logged) >= 2
            # Something of the parent's may be left: no thread starts.
            and threaded.renewed == 1
            and threaded.saw is None
            and forks.renew() == 0  # once per process, all the same
        )

    assert in_a_child(the_others_renewed)
    assert [obj.renewed for obj in objects[1::2]] == [0, 0]


def test_forks_renew_once_per_process():
    obj = Renewable()
    forks.renew_after_fork(obj)
    assert forks.renew() == 0  # the process that made it
    # os.fork renewed it in the child; a hook calling renew again does not.
    assert in_a_child(
        lambda: obj.renewed == 1 and forks.renew() == 0 and forks.renewed >= 1
    )
    assert obj.renewed == 0


def test_threads_start_once_every_object_is_renewed():
    others = [Renewable() for _ in range(20)]
    threaded = [Threaded(others) for _ in range(5)]
    for obj in [*threaded, *others]:
        forks.renew_after_fork(obj)
    assert in_a_child(
        lambda: (
            all(obj.renewed == 1 for obj in threaded)
            and all(obj.saw == [1] * 20 for obj in threaded)
        )
    )
    assert [obj.saw for obj in threaded] == [None] * 5


def test_engines_are_fresh_in_a_forked_child(postgresql_url, apps):
    methods = [{'name': 'one', 'sql': 'SELECT :n AS n'}]
    app = apps(postgresql_url, methods)
    router = app.app.registry.dbtune.router
    request = prepare(registry=app.app.registry)['request']
    assert request.sql.one(n=1)[0].n == 1  # a pooled reader connection
    before = router.readers[0].engine.pool.checkedin()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (runs in the child)
        code = 1
        try:
            child = prepare(registry=app.app.registry)['request']
            fresh = router.readers[0].engine.pool.checkedin() == 0
            code = 0 if fresh and child.sql.one(n=2)[0].n == 2 else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # The parent's pooled connection was not closed by the child.
    assert router.readers[0].engine.pool.checkedin() == before
    assert request.sql.one(n=3)[0].n == 3


def test_after_fork_drops_connections_and_makes_new_locks(sqlite_url, apps):
    methods = [{'name': 'one', 'sql': 'SELECT :n AS n'}]
    app = apps(sqlite_url, methods)
    dbtune = app.app.registry.dbtune
    request = prepare(registry=app.app.registry)['request']
    request.sql.one(n=1)
    router, cache = dbtune.router, dbtune.cache
    slots, lock = router.write_slots, cache._lock
    router.after_fork()
    cache.after_fork()
    assert router.readers[0].engine.pool.checkedin() == 0
    assert router.write_slots is not slots and cache._lock is not lock
    assert request.sql.one(n=2)[0].n == 2
