"""The sampling profiler: it adds up many requests of many threads, per
route, and never serialises them."""

import marshal
import pstats
import threading
import time

import pytest
from pyramid.config import Configurator
from webtest import TestApp

from pyramid_dbtune.ops import access, profiler, stats

TOKEN = 'a-token-of-16-chars-or-more'
AUTH = {access.HEADER: TOKEN}
ON = {'dbtune.profile': 'true', 'dbtune.stats.token': TOKEN}


def busy_for(seconds):
    """The view's own slow function: Python work, on the CPU."""
    deadline = time.thread_time() + seconds
    total = 0
    while time.thread_time() < deadline:
        total += 1
    return total


def slow_view(request):
    return {'turns': busy_for(0.004)}


def other_function(seconds):
    deadline = time.thread_time() + seconds
    while time.thread_time() < deadline:
        pass


def other_view(request):
    other_function(0.004)
    return {}


@pytest.fixture
def app(apps, sqlite_url):
    return apps(sqlite_url, [], ON,
                views={'/slow': slow_view, '/other': other_view})  # fmt: skip


def drive(app, path, count, threads=4):
    def run():
        for _ in range(count // threads):
            app.get(path)

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


def test_after_200_requests_the_slow_function_is_on_top(app, tmp_path):
    drive(app, '/slow', 200)  # four threads, at the default 100 a second
    # One thread: four would also be sampled waiting on the logging
    # module's lock (``transaction`` names a logger per transaction), as
    # often as in other_function on a busy machine.
    drive(app, '/other', 40, threads=1)

    def profiled():
        return app.get('/_dbtune/profile', headers=AUTH,
                       params={'limit': '1000'}).json  # fmt: skip

    # On a busy machine the sampler gets fewer turns: more requests, until
    # it has enough samples to say (a minute at the most). A few samples
    # of /other could fall elsewhere than other_function (pyramid_tm's
    # end of the request, on a machine that is busy): twenty, at least.
    deadline = time.monotonic() + 60
    profile = profiled()
    while (
        profile['routes'].get('/slow', {}).get('samples', 0) < 20
        or profile['routes'].get('/other', {}).get('samples', 0) < 20
    ) and time.monotonic() < deadline:
        drive(app, '/slow', 50)
        drive(app, '/other', 10, threads=1)
        profile = profiled()
    assert profile['rate'] == 100
    slow = profile['routes']['/slow']
    assert slow['own'][0]['function'] == 'busy_for'
    assert slow['own'][0]['file'] == __file__
    assert slow['samples'] >= 20 and slow['own'][0]['own_s'] > 0
    cumulative = {f['function']: f['cumulative_s'] for f in slow['cumulative']}
    assert cumulative['slow_view'] >= cumulative['busy_for'] > 0
    other = profile['routes']['/other']
    assert other['own'][0]['function'] == 'other_function'
    assert 'busy_for' not in [f['function'] for f in other['own']]
    # One route only, and fewer rows.
    one = app.get('/_dbtune/profile', headers=AUTH,
                  params={'route': '/other', 'limit': '1'}).json  # fmt: skip
    assert list(one['routes']) == ['/other']
    assert len(one['routes']['/other']['own']) == 1

    # The .prof file loads with pstats, the slow function on top.
    response = app.get('/_dbtune/profile.prof', headers=AUTH,
                       params={'route': '/slow'})  # fmt: skip
    assert (
        'dbtune-profile-/slow.prof' in response.headers['Content-Disposition']
    )
    path = tmp_path / 'slow.prof'
    path.write_bytes(response.body)
    loaded = pstats.Stats(str(path))
    loaded.sort_stats('tottime')
    top = loaded.fcn_list[0]
    assert top[2] == 'busy_for' and top[0] == __file__
    callers = loaded.stats[top][4]
    assert [key[2] for key in callers] == ['slow_view']
    # All routes together.
    everything = marshal.loads(
        app.get('/_dbtune/profile.prof', headers=AUTH).body
    )
    assert {key[2] for key in everything} >= {'busy_for', 'other_function'}

    # Collapsed stacks: outermost first, a count in ms at the end.
    text = app.get('/_dbtune/profile.folded', headers=AUTH,
                   params={'route': '/slow'}).text  # fmt: skip
    lines = text.splitlines()
    assert lines and all(line.rsplit(' ', 1)[1].isdigit() for line in lines)
    heaviest = max(lines, key=lambda line: int(line.rsplit(' ', 1)[1]))
    assert heaviest.rsplit(' ', 1)[0].split(';')[-1].startswith('busy_for (')
    assert 'timing_tween' in heaviest

    # Reset forgets every sample.
    app.get('/_dbtune/profile/reset', headers=AUTH, status=404)  # POST only
    assert app.post('/_dbtune/profile/reset', headers=AUTH).json
    assert app.get('/_dbtune/profile', headers=AUTH).json['routes'] == {}


def test_the_profiler_never_serialises_requests(apps, sqlite_url):
    together = threading.Barrier(2, timeout=10)

    def meet(request):
        together.wait()  # both requests inside the view at once
        busy_for(0.05)
        return {}

    app = apps(sqlite_url, [], {**ON, 'dbtune.profile.sample': '1000'},
               views={'/meet': meet})  # fmt: skip
    drive(app, '/meet', 2, threads=2)
    assert not together.broken
    routes = app.app.registry.dbtune.profiler.routes()
    assert routes['/meet'][0] >= 2


def test_errors_of_the_views(app):
    app.get('/_dbtune/profile', headers=AUTH, params={'route': 'nope'},
            status=404)  # fmt: skip
    for limit in ('0', 'x', '1001', '²'):
        app.get('/_dbtune/profile', headers=AUTH, params={'limit': limit},
                status=400)  # fmt: skip


def test_the_sampling_thread_stops_when_idle_and_starts_again(
    app, monkeypatch
):
    monkeypatch.setattr(profiler, 'IDLE', 0.05)
    sampler = app.app.registry.dbtune.profiler
    app.get('/slow')
    deadline = time.monotonic() + 10
    while sampler.running and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not sampler.running
    app.get('/slow')
    assert sampler.running
    sampler.start()  # running already: no second thread
    assert [t.name for t in threading.enumerate()].count(
        'dbtune-profiler'
    ) == 1


def test_stacks_beyond_the_bound_are_one(app, monkeypatch):
    monkeypatch.setattr(profiler, 'MAX_STACKS', 1)
    sampler = app.app.registry.dbtune.profiler
    request = app.app.request_factory({'PATH_INFO': '/slow'})
    request.matched_route = app.app.routes_mapper.get_route('/slow')
    sampler.active[threading.get_ident()] = request
    try:
        sampler.sample(0.01)

        def deeper():
            sampler.sample(0.01)

        deeper()
    finally:
        del sampler.active[threading.get_ident()]
    top = sampler.top()
    names = [f['function'] for f in top['own']]
    assert profiler.OTHER[2] in names and 'deeper' not in names
    # A thread that ended between the map and the frames is passed over.
    before = sampler.samples
    sampler.active[-1] = request
    try:
        sampler.sample(0.01)
    finally:
        del sampler.active[-1]
    assert sampler.samples == before


def test_the_operators_own_views_are_not_sampled(app):
    sampler = app.app.registry.dbtune.profiler
    request = app.app.request_factory({'PATH_INFO': '/_dbtune/profile'})
    request.matched_route = app.app.routes_mapper.get_route(access.ROUTE)
    sampler.active[threading.get_ident()] = request
    try:
        sampler.sample(0.01)
        assert sampler.samples == 0
        request.matched_route = app.app.routes_mapper.get_route('/slow')
        sampler.sample(0.01)  # the same thread, in the site's route
        assert sampler.samples == 1
    finally:
        del sampler.active[threading.get_ident()]
    assert list(sampler.routes()) == ['/slow']


def slow_tween_factory(handler, registry):
    """A tween under the timing tween, before the route is matched: an
    app's authentication, say."""

    def slow_tween(request):
        other_function(0.03)
        return handler(request)

    return slow_tween


def test_time_before_the_route_is_matched_is_the_routes(apps, sqlite_url):
    with Configurator(settings={'dbtune.url': sqlite_url, **ON}) as config:
        config.include('pyramid_dbtune')
        config.add_tween(
            f'{__name__}.slow_tween_factory',
            under='pyramid_dbtune.ops.tween.timing_tween_factory',
        )
        config.add_route('slow', '/slow')
        config.add_view(slow_view, route_name='slow', renderer='json')
        app = TestApp(config.make_wsgi_app())
    sampler = app.app.registry.dbtune.profiler
    try:
        wait_until(lambda: drive(app, '/slow', 8, threads=1) or any(
            stack[-1] is other_function.__code__
            for stack in sampler.stacks.get('slow', ())
        ))  # fmt: skip
        assert list(sampler.routes()) == ['slow']
        # A request that matches no route: its samples, kept until it has
        # ended, are filed once the sampler sees no request running.
        app.get('/nowhere', status=404)
        wait_until(lambda: stats.NO_ROUTE in sampler.stacks)
        leaves = {stack[-1] for stack in sampler.stacks[stats.NO_ROUTE]}
        assert other_function.__code__ in leaves
    finally:
        app.app.registry.dbtune.close()


def test_a_running_request_of_no_route_is_filed_as_it_runs(sqlite_url):
    # With no route (traversal, as a Zope-style site has), a request's
    # samples waited for its end, one kept per sample: a long request
    # showed nothing while it ran, and held more the longer it ran. They
    # are filed once the router has found its context.
    release = threading.Event()

    def long_view(request):
        release.wait(30)
        return {}

    settings = {'dbtune.url': sqlite_url, **ON}
    with Configurator(settings=settings, root_factory=lambda _: {}) as config:
        config.include('pyramid_dbtune')
        config.add_view(long_view, renderer='json')
        app = TestApp(config.make_wsgi_app())
    sampler = app.app.registry.dbtune.profiler
    running = threading.Thread(target=app.get, args=('/',))
    running.start()
    try:
        wait_until(lambda: stats.NO_ROUTE in sampler.stacks)
        assert running.is_alive()
    finally:
        release.set()
        running.join()
        app.app.registry.dbtune.close()


def wait_until(condition):
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


class StartsLate(dict):
    """The map of threads to requests, empty at the first look only: a
    request starts just as the sampler, idle, decides to stop."""

    looked = False

    def __len__(self):
        if not self.looked:
            self.looked = True
            return 0
        return super().__len__()


def test_a_request_that_starts_as_the_sampler_stops_restarts_it(
    app, monkeypatch
):
    monkeypatch.setattr(profiler, 'IDLE', 0)
    sampler = app.app.registry.dbtune.profiler
    request = app.app.request_factory({'PATH_INFO': '/slow'})
    request.matched_route = app.app.routes_mapper.get_route('/slow')
    active = StartsLate({threading.get_ident(): request})
    monkeypatch.setattr(sampler, 'active', active)
    sampler.start()
    # The first thread stopped, but started another, which samples.
    wait_until(lambda: sampler.samples > 0)
    assert active.looked and sampler.running
    active.clear()


def test_a_sampler_that_fails_is_not_left_running(app, monkeypatch, caplog):
    sampler = app.app.registry.dbtune.profiler

    def broken(weight):
        raise RuntimeError('broken')

    monkeypatch.setattr(sampler, 'sample', broken)
    monkeypatch.setattr(threading, 'excepthook', lambda args: None)
    me = threading.get_ident()
    sampler.active[me] = app.app.request_factory({'PATH_INFO': '/slow'})
    try:
        sampler.start()
        wait_until(lambda: not sampler.running)
    finally:
        del sampler.active[me]

    class NoThreads(threading.Thread):
        def start(self):
            raise RuntimeError("can't start new thread")

    monkeypatch.setattr(profiler.threading, 'Thread', NoThreads)
    assert app.get('/slow').json  # the request goes on
    assert not sampler.running
    assert 'cannot start its thread' in caplog.text


def test_after_a_fork_no_request_is_running(app):
    dbtune = app.app.registry.dbtune
    dbtune.active[12345] = object()
    dbtune.profiler.after_fork()
    assert dbtune.active == {}
