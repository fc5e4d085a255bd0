"""The dbtune.* settings: their defaults, their types, every bad value
named at start-up, and a setting added after the include refused."""

import pytest
from pyramid.config import Configurator
from pyramid.exceptions import ConfigurationError, ConfigurationExecutionError

from pyramid_dbtune.settings import TABLE, Invalid, Settings, as_bool, parse


def test_defaults():
    settings = parse({})
    assert settings.url is None
    assert settings.cache_backend == 'memory'
    assert settings.cache_max_entries == 10000
    assert settings.cache_max_bytes == 64 * 1024 * 1024
    assert settings.cache_default_time == 0
    assert dict(settings.cache_times) == {}
    assert settings == Settings()


def test_every_setting_has_a_field_of_its_name():
    fields = {s.name.replace('.', '_') for s in TABLE}
    assert fields == set(Settings.__dataclass_fields__) - {
        'cache_times',
        'invalidates',
    }


def test_values_are_parsed_once_into_their_types():
    settings = parse(
        {
            'dbtune.url': ' sqlite:///x.sqlite ',
            'dbtune.cache.backend': 'None',
            'dbtune.cache.max_entries': '50',
            'dbtune.cache.max_bytes': '2MiB',
            'dbtune.cache.default_time': '1.5',
            'dbtune.cache_time.search': '20',
        }
    )
    assert settings.url == 'sqlite:///x.sqlite'
    assert settings.cache_backend == 'none'
    assert settings.cache_max_entries == 50
    assert settings.cache_max_bytes == 2 * 1024 * 1024
    assert settings.cache_default_time == 1.5
    assert settings.cache_times['search'] == 20
    with pytest.raises(TypeError):
        settings.cache_times['other'] = 1
    with pytest.raises(AttributeError):
        settings.url = 'x'


@pytest.mark.parametrize(
    'text, size',
    [('100', 100), ('1KB', 1000), ('1kib', 1024), ('3 MB', 3_000_000),
     ('1GiB', 1024**3), (4096, 4096), ('7b', 7)],
)  # fmt: skip
def test_sizes(text, size):
    assert parse({'dbtune.cache.max_bytes': text}).cache_max_bytes == size


def test_url_falls_back_to_sqlalchemy_url():
    settings = parse({'sqlalchemy.url': 'postgresql+psycopg://u@h/db'})
    assert settings.url == 'postgresql+psycopg://u@h/db'
    settings = parse(
        {
            'sqlalchemy.url': 'postgresql+psycopg://u@h/db',
            'dbtune.url': 'sqlite://',
        }
    )
    assert settings.url == 'sqlite://'


@pytest.mark.parametrize(
    'key, value, accepted',
    [
        ('dbtune.url', 'not a url', 'a database URL'),
        ('sqlalchemy.url', '::', 'a database URL'),
        ('dbtune.cache.backend', 'redis', 'one of memory, memcached, none'),
        ('dbtune.cache.max_entries', '0', 'a whole number above 0'),
        ('dbtune.cache.max_entries', 'many', 'a whole number above 0'),
        ('dbtune.cache.max_entries', True, 'a whole number above 0'),
        # Digits are ASCII digits: int() and float() take others too.
        ('dbtune.cache.max_entries', '\u0665', 'a whole number above 0'),
        ('dbtune.cache.max_entries', '1_000', 'a whole number above 0'),
        ('dbtune.cache.default_time', '\u0663', 'a number of seconds'),
        ('dbtune.cache.default_time', '1_0', 'a number of seconds'),
        ('dbtune.cache.max_bytes', '\uff16\uff14MiB', 'a size above 0'),
        ('dbtune.cache.max_bytes', '64 furlongs', 'a size above 0'),
        ('dbtune.cache.max_bytes', '0', 'a size above 0'),
        ('dbtune.cache.default_time', '-1', 'a number of seconds'),
        ('dbtune.cache.default_time', 'inf', 'a number of seconds'),
        ('dbtune.cache.default_time', 'soon', 'a number of seconds'),
        ('dbtune.cache_time.search', 'nan', 'a number of seconds'),
    ],
)
def test_bad_values_name_setting_value_and_what_is_accepted(
    key, value, accepted
):
    with pytest.raises(ConfigurationError) as info:
        parse({key: value})
    message = str(info.value)
    assert message.startswith(f'{key} = {value!r} is not valid: expected')
    assert accepted in message


def test_unknown_setting_is_an_error_with_a_suggestion():
    with pytest.raises(ConfigurationError) as info:
        parse({'dbtune.cache.max_entires': '5'})
    message = str(info.value)
    assert 'dbtune.cache.max_entires is not a pyramid_dbtune setting' in (
        message
    )
    assert 'did you mean dbtune.cache.max_entries?' in message
    assert 'dbtune.cache_time.<method>' in message


def test_unknown_setting_without_a_close_match():
    with pytest.raises(ConfigurationError, match='the settings are'):
        parse({'dbtune.zzz': '1'})


def test_other_prefixes_are_not_ours():
    assert parse({'sqlalchemy.pool_size': '5', 'tm.attempts': '3'})


def test_routing_settings():
    settings = parse(
        {
            'dbtune.read_urls': 'sqlite:///a.sqlite\n  sqlite:///b.sqlite',
            'dbtune.read_pool_size': '4',
            'dbtune.write_concurrency': '2',
            'dbtune.write_timeout': '0.5',
            'dbtune.pin_after_write': '3',
        }
    )
    assert settings.read_urls == ('sqlite:///a.sqlite', 'sqlite:///b.sqlite')
    # Commas too, as for every list setting; one inside a URL is its own.
    commas = parse({'dbtune.read_urls': 'sqlite:///a.sqlite,sqlite:///b'})
    assert commas.read_urls == ('sqlite:///a.sqlite', 'sqlite:///b')
    option = 'sqlite:///a.sqlite?mode=ro,x'
    assert parse({'dbtune.read_urls': option}).read_urls == (option,)
    assert (settings.read_pool_size, settings.write_concurrency) == (4, 2)
    assert (settings.write_timeout, settings.pin_after_write) == (0.5, 3)
    assert parse({'dbtune.read_urls': ['sqlite://']}).read_urls == (
        'sqlite://',
    )


@pytest.mark.parametrize(
    'key, value, accepted',
    [
        ('dbtune.read_urls', [], 'one or more database URLs'),
        ('dbtune.read_urls', 'sqlite:// nope', 'a database URL'),
        ('dbtune.read_urls', 5, 'one or more database URLs'),
        ('dbtune.read_urls', 'postgresql://h:port/db', 'a database URL'),
        ('dbtune.read_pool_size', '0', 'a whole number above 0'),
        ('dbtune.write_concurrency', '-1', 'a whole number above 0'),
        ('dbtune.write_timeout', '0', 'a number of seconds above 0'),
        ('dbtune.write_timeout', 'soon', 'a number of seconds above 0'),
        ('dbtune.pin_after_write', '-5', 'a number of seconds, 0 or more'),
        # Its cookie's expiry must be a date: a 500 after the commit, else.
        ('dbtune.pin_after_write', '1e12', 'at most 31536000 (a year)'),
        ('dbtune.statement_timeout', '1e7', 'to 2147483 (24 days)'),
        ('dbtune.connect_timeout', 'soon', '0 (no limit)'),
    ],
)
def test_bad_routing_settings(key, value, accepted):
    with pytest.raises(ConfigurationError) as info:
        parse({key: value})
    assert accepted in str(info.value) and key in str(info.value)


def test_memcached_settings():
    settings = parse(
        {
            'dbtune.cache.backend': 'memcached',
            'dbtune.cache.servers': '127.0.0.1:11211, [::1]:11212',
            'dbtune.cache.secret': 'x' * 16,
            'dbtune.cache.namespace': 'shop-2',
            'dbtune.cache.item_limit': '2MiB',
        }
    )
    assert settings.cache_servers == (('127.0.0.1', 11211), ('::1', 11212))
    assert settings.cache_namespace == 'shop-2'
    assert settings.cache_item_limit == 2 * 1024 * 1024
    assert 'x' * 16 not in repr(settings)
    listed = parse(
        {
            'dbtune.cache.backend': 'memcached',
            'dbtune.cache.servers': ['h:1'],
            'dbtune.cache.secret': 'x' * 16,
        }
    ).cache_servers
    assert listed == (('h', 1),)


@pytest.mark.parametrize(
    'key, value, accepted',
    [
        ('dbtune.cache.servers', 'h:0', 'host:port items'),
        ('dbtune.cache.servers', [], 'host:port items'),
        ('dbtune.cache.servers', 'h:²', 'host:port items'),  # not int()'s
        ('dbtune.cache.servers', 11211, 'host:port items'),  # from Python
        # An IPv6 address without brackets, no host, brackets left over.
        ('dbtune.cache.servers', '::1', r'or \[::1\]:11211'),
        ('dbtune.cache.servers', '2001:db8::5:11211', 'host:port items'),
        ('dbtune.cache.servers', '[]:11211', 'host:port items'),
        ('dbtune.cache.servers', '[::1]x:11211', 'host:port items'),
        ('dbtune.cache.servers', 'a:b:11211', 'host:port items'),
        ('dbtune.cache.namespace', 'a b', 'up to 40 ASCII letters'),
        ('dbtune.cache.namespace', 'café', 'up to 40 ASCII letters'),
        ('dbtune.cache.namespace', 'x' * 41, 'up to 40 ASCII letters'),
        ('dbtune.cache.timeout', '0', 'a number of seconds above 0'),
    ],
)
def test_bad_memcached_settings(key, value, accepted):
    with pytest.raises(ConfigurationError, match=accepted):
        parse({key: value})


@pytest.mark.parametrize(
    'key', ['dbtune.cache.default_time', 'dbtune.cache_time.search']
)
def test_memcached_cache_times_are_thirty_days_at_most(key):
    memcached = {
        'dbtune.cache.backend': 'memcached',
        'dbtune.cache.servers': 'h:1',
        'dbtune.cache.secret': 'x' * 16,
    }
    month = 30 * 24 * 3600
    assert parse({**memcached, key: str(month)})
    with pytest.raises(ConfigurationError) as raised:
        parse({**memcached, key: str(month + 1)})
    assert str(raised.value).startswith(
        f"{key} = '{month + 1}' is not valid: expected at most {month} "
        'seconds (30 days)'
    )
    assert parse({key: str(month + 1)})  # the memory cache: no bound


def test_urls_need_a_known_dialect_and_an_installed_driver():
    with pytest.raises(ConfigurationError, match='a database URL such as'):
        parse({'dbtune.url': 'foo://x'})
    with pytest.raises(ConfigurationError) as info:
        parse({'dbtune.url': 'mysql://u@h/db'})
    message = str(info.value)
    assert "whose driver is installed (No module named 'MySQLdb')" in message
    assert 'mysql+pymysql://' in message
    # psycopg's asyncio driver is installed too; its engine is no Engine.
    with pytest.raises(ConfigurationError) as info:
        parse({'dbtune.read_urls': 'postgresql+psycopg_async://u@h/db'})
    assert str(info.value) == (
        "dbtune.read_urls = 'postgresql+psycopg_async://u@h/db' is not "
        "valid: expected a URL with a driver that is not asyncio's, as "
        'postgresql+psycopg_async is: postgresql+psycopg://, not '
        'postgresql+psycopg_async://'
    )


def test_an_error_hides_a_urls_password():
    for settings in (
        {'dbtune.url': 'mysql://app:hunter2@db/shop'},  # no driver
        {'dbtune.url': 'postgresql://app:hunter2@db:port/shop'},  # bad port
        {'dbtune.read_urls': ['sqlite://', 'mysql://app:hunter2@db/shop']},
    ):
        with pytest.raises(ConfigurationError) as info:
            parse(settings)
        assert 'hunter2' not in str(info.value)
        assert 'app:***@db' in str(info.value)


def test_a_timeout_longer_than_a_lock_can_wait_is_refused():
    with pytest.raises(ConfigurationError, match='dbtune.write_timeout'):
        parse({'dbtune.write_timeout': '1e10'})


def test_memcached_settings_under_another_backend_are_an_error():
    with pytest.raises(ConfigurationError) as info:
        parse({'dbtune.cache.servers': '127.0.0.1:11211'})
    assert str(info.value) == (
        'dbtune.cache.servers is set, but dbtune.cache.backend is memory: '
        'it applies to memcached only'
    )


def test_access_settings():
    settings = parse(
        {
            'dbtune.stats.token': 'x' * 16,
            'dbtune.stats.permission': ' view-stats ',
        }
    )
    assert settings.stats_token == 'x' * 16
    assert settings.stats_permission == 'view-stats'
    # The token is a secret: it is not printed with the settings.
    assert 'x' * 16 not in repr(settings)


@pytest.mark.parametrize(
    'key, value, accepted',
    [
        ('dbtune.stats.token', 'short', 'a secret of 16 characters'),
        # A header carries Latin-1: 'é' would never match there.
        ('dbtune.stats.token', 'é' * 16, 'printable ASCII'),
        ('dbtune.stats.token', 'a\nsixteen-chars-long', 'printable ASCII'),
        ('dbtune.stats.permission', 'view stats', 'a name without spaces'),
    ],
)
def test_bad_access_settings(key, value, accepted):
    with pytest.raises(ConfigurationError, match=accepted):
        parse({key: value})


@pytest.mark.parametrize(
    'key', ['dbtune.stats.token', 'dbtune.cache.secret', 'dbtune.pin_secret']
)
def test_a_bad_secret_is_not_shown(key):
    with pytest.raises(ConfigurationError) as raised:
        parse({key: 'hunter2-short'})
    message = str(raised.value)
    assert 'hunter2' not in message
    assert f'{key} = (a secret of 13 characters) is not valid' in message


def test_secrets_are_not_printed_with_the_settings():
    secrets = ('stats.token', 'cache.secret', 'pin_secret')
    settings = parse(
        {
            **{f'dbtune.{key}': f'hunter2-{key}' for key in secrets},
            'dbtune.cache.backend': 'memcached',
            'dbtune.cache.servers': '127.0.0.1:11211',
        }
    )
    assert 'hunter2' not in repr(settings)


@pytest.mark.parametrize(
    'value, expected',
    [('true', True), (' Yes', True), ('on', True), ('1', True), (True, True),
     ('false', False), ('NO', False), ('off', False), ('0', False),
     (False, False)],
)  # fmt: skip
def test_as_bool(value, expected):
    assert as_bool(value) is expected


@pytest.mark.parametrize('value', ['', 'maybe', 'tru', '2', None])
def test_as_bool_refuses_anything_else(value):
    with pytest.raises(Invalid, match='true or false'):
        as_bool(value)


def test_invalidate_overrides():
    settings = parse(
        {'dbtune.invalidate.search': 'no', 'dbtune.invalidate.areas': 'on'}
    )
    assert dict(settings.invalidates) == {'search': False, 'areas': True}
    with pytest.raises(ConfigurationError) as info:
        parse({'dbtune.invalidate.search': 'sometimes'})
    assert str(info.value).startswith(
        "dbtune.invalidate.search = 'sometimes' is not valid: expected true"
    )


def test_a_setting_added_after_the_include_is_an_error(sqlite_url):
    # Engines, cache and views are made of the settings at the include:
    # a later add_settings was ignored without a word.
    config = Configurator(settings={'dbtune.url': sqlite_url})
    config.include('pyramid_dbtune')
    config.add_settings({'dbtune.stats': 'true'})
    with pytest.raises(ConfigurationExecutionError) as caught:
        config.commit()
    message = str(caught.value)
    assert 'dbtune.stats changed after pyramid_dbtune was included' in message
    assert "before config.include('pyramid_dbtune')" in message
    config.registry.dbtune.router.dispose()


def test_a_setting_re_added_with_the_same_meaning_is_no_change(sqlite_url):
    # Pyramid apps often convert their settings in place, or add them
    # again as numbers: the same value is no change to refuse.
    config = Configurator(
        settings={
            'dbtune.url': sqlite_url,
            'dbtune.cache.max_entries': '5',
            'dbtune.stats': 'yes',
            'dbtune.stats.token': 'x' * 16,
            'dbtune.cache.default_time': '',  # the default
        }
    )
    config.include('pyramid_dbtune')
    config.add_settings({'dbtune.cache.max_entries': 5, 'dbtune.stats': True})
    del config.registry.settings['dbtune.cache.default_time']
    config.make_wsgi_app()
    config.registry.dbtune.router.dispose()


def test_read_urls_without_a_writer_is_an_error():
    # Replicas with no writer would route nothing, without a word.
    config = Configurator(settings={'dbtune.read_urls': 'sqlite://'})
    with pytest.raises(ConfigurationError, match='read_urls is set, but'):
        config.include('pyramid_dbtune')


def test_settings_that_change_only_together_are_a_change(sqlite_url):
    config = Configurator(
        settings={'dbtune.url': sqlite_url, 'sqlalchemy.url': sqlite_url}
    )
    config.include('pyramid_dbtune')
    config.add_settings({'dbtune.url': '', 'sqlalchemy.url': 'sqlite://'})
    with pytest.raises(ConfigurationExecutionError) as caught:
        config.commit()
    assert 'dbtune.url, sqlalchemy.url changed after' in str(caught.value)
    config.registry.dbtune.router.dispose()


def test_a_setting_taken_away_after_the_include_is_a_change(sqlite_url):
    config = Configurator(
        settings={'dbtune.url': sqlite_url, 'dbtune.cache.max_entries': '5'}
    )
    config.include('pyramid_dbtune')
    del config.registry.settings['dbtune.cache.max_entries']
    with pytest.raises(ConfigurationExecutionError) as caught:
        config.commit()
    assert 'dbtune.cache.max_entries changed after' in str(caught.value)
    config.registry.dbtune.router.dispose()
