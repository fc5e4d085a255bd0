"""Which rows a cached read holds, from its text; how a change of rows
matches it and is applied to it (``pyramid_dbtune.sql.shapes``,
``pyramid_dbtune.sql.patch``)."""

import datetime
import decimal
from decimal import Decimal

import pytest

from pyramid_dbtune.sql.patch import patch
from pyramid_dbtune.sql.rows import Rows
from pyramid_dbtune.sql.shapes import (
    UNEQUAL,
    Change,
    compare,
    matches,
    parse_snapshot,
    parsed_otherwise,
    read_shape,
    touches,
    visible,
)

T = frozenset(['property'])
SEARCH = read_shape(
    'SELECT id, rent FROM property WHERE area = :area AND rent <= :rent '
    'ORDER BY rent, id',
    T,
)
COUNT = read_shape(
    'SELECT count(*) AS n FROM property WHERE area = :area AND :rent >= rent',
    T,
)
AREAS = read_shape(
    'SELECT area, count(*) AS n, min(rent) AS low, max(rent) AS high, '
    'sum(rent) AS total, count(rooms) AS told FROM property GROUP BY area '
    'ORDER BY area',
    T,
)
PARAMS = {'area': 'Headingley', 'rent': 100}


def row(id, rent, area='Headingley', rooms=2):
    return {'id': id, 'rent': rent, 'area': area, 'rooms': rooms}


def held(*pairs, truncated=False, snapshot=None):
    return Rows(('id', 'rent'), pairs, truncated=truncated, snapshot=snapshot)


def test_a_reads_shape_is_its_conditions_its_kind_and_its_order():
    assert SEARCH.conditions == (
        ('area', '=', 'area'),
        ('rent', '<=', 'rent'),
    )
    assert (SEARCH.kind, SEARCH.order) == ('rows', ((1, False), (0, False)))
    assert SEARCH.columns == {'id', 'rent', 'area'}
    assert SEARCH.keys == {'area', 'rent'}
    # The parameter first: the comparison turned round.
    assert COUNT.conditions[1] == ('rent', '<=', 'rent')
    assert COUNT.kind == 'count'
    assert AREAS.kind == 'groups' and AREAS.keys == {'area'}
    assert AREAS.items[2:4] == (('min', 'rent'), ('max', 'rent'))
    shape = read_shape(
        'SELECT a FROM property WHERE a != :x AND b <> :y ORDER BY a DESC', T
    )
    assert [op for _, op, _ in shape.conditions] == ['<>', '<>']
    assert shape.order == ((0, True),)
    assert read_shape('SELECT a, b FROM property', T).kind == 'rows'


@pytest.mark.parametrize(
    'sql',
    [
        'SELECT a FROM property WHERE a = :a OR b = :b',
        'SELECT a FROM property WHERE a = 1',
        'SELECT a FROM property WHERE lower(a) = :a',
        'SELECT a FROM property p WHERE a = :a',
        'SELECT DISTINCT a FROM property',
        'SELECT a FROM property LIMIT 5',
        'SELECT a FROM property ORDER BY lower(a)',
        'SELECT a FROM property GROUP BY lower(a)',
        'SELECT a FROM property WHERE a = :a junk',
        'SELECT 1',
        "SELECT a FROM property WHERE a = '\\' OR 1=1 --'",
        'UPDATE property SET a = 1',
    ],
)
def test_a_read_the_module_cannot_place_has_no_shape(sql):
    assert read_shape(sql, T) is None


def test_a_read_of_two_tables_has_no_shape():
    assert read_shape('SELECT a FROM t', frozenset(['t', 'u'])) is None


@pytest.mark.parametrize(
    'sql',
    [
        'SELECT a + 1 FROM property',
        'SELECT avg(a) FROM property',
        'SELECT min(*) FROM property',
        'SELECT a, count(*) FROM property',
        'SELECT a FROM property ORDER BY b',
        'SELECT a, count(*) FROM property GROUP BY a, b',
        'SELECT a, count(*) FROM property GROUP BY a ORDER BY count',
    ],
)
def test_a_read_of_another_kind_is_matched_but_not_patched(sql):
    shape = read_shape(sql, T)
    assert shape is None or shape.kind is None


def test_values_are_compared_only_where_every_database_agrees():
    assert compare(1, Decimal('1.0')) == 0
    assert compare(2.5, 3) == -1
    assert compare('2026-09-01', '2026-10-01') == -1
    assert compare(datetime.date(2026, 9, 1), '2026-09-01') == 0
    # A time, or a date, written two ways: not even equality is told.
    assert compare('10:30', '9:30') is None
    assert compare('2026-1-1', '2026-01-01') is None
    # Day or month first: as a DATE column parses it, not as it reads.
    assert compare('12/01/2025', '01/15/2026') is None
    assert compare('01.12.2025', '15.01.2026') is None
    # Text of digits that is no such date is stored as it is written.
    for text in ('10.0.0.1', '1.2.3', '06-12-345678', '2026-01-15'):
        assert not parsed_otherwise(text), text
    assert parsed_otherwise('01/15/2026 10:30')
    assert compare(Decimal('0.1'), 0.1) == 0  # as floats, as databases do
    assert compare(Decimal('NaN'), 1) is None
    assert compare('Leeds', 'York') is UNEQUAL
    assert compare('Leeds', 'leeds ') is None  # equal in MySQL's collation
    assert compare('1', 1) is None
    assert compare(True, 1) is None
    assert compare(1, True) is None and compare(1, 1) == 0  # not mixed up
    assert compare([1], [1]) is None  # an array column, as JSON tells it


def test_instants_are_compared_whatever_their_offsets():
    new_york = datetime.timezone(datetime.timedelta(hours=-5))
    los_angeles = datetime.timezone(datetime.timedelta(hours=-8))
    # 16:00 UTC as the app has it, 15:30 UTC as a notice tells it (the
    # database's session in another zone): the text would order them
    # the other way.
    since = datetime.datetime(2026, 1, 1, 8, 0, tzinfo=los_angeles)
    told = '2026-01-01T10:30:00-05:00'
    assert compare(told, since) == -1 and compare(since, told) == 1
    assert compare('2026-01-01 11:00:00-05', since) == 0
    kept = datetime.datetime(2026, 1, 1, 11, 30, tzinfo=new_york)
    assert compare(kept, since) == 1
    # An instant and a local time, or a time of day with an offset: not
    # even equality is told.
    assert compare(since, '2026-01-01T08:00:00') is None
    local = datetime.datetime(2026, 1, 1, 8, 0)
    assert compare(local, '2026-01-01T08:00:00') == 0
    assert compare(datetime.time(8, 0, tzinfo=los_angeles), '08:00') is None
    assert compare('2026-01-01T10:30:00-99:00', told) is None
    assert compare('10:30:00-05:00', told) is None
    events = read_shape(
        'SELECT id, starts FROM event WHERE starts >= :since ORDER BY starts',
        frozenset(['event']),
    )
    rows = Rows(('id', 'starts'), [(1, kept)])
    inserted = {'id': 9, 'starts': told}
    assert not matches(events, {'since': since}, inserted)
    assert patch(events, rows, {'since': since}, (), (inserted,), 20) == rows


def test_a_row_matches_a_read_when_it_meets_every_condition():
    assert matches(SEARCH, PARAMS, row(1, 90)) is True
    assert matches(SEARCH, PARAMS, row(1, 110)) is False
    assert matches(SEARCH, PARAMS, row(1, 90, 'Burley')) is False
    assert matches(SEARCH, PARAMS, row(1, None)) is False  # NULL
    assert matches(SEARCH, PARAMS, {'id': 1, 'rent': 90}) is None
    assert matches(SEARCH, PARAMS, row(1, 90, 'headingley')) is None
    # Unsure of one condition, sure that another fails: not among them.
    assert matches(SEARCH, PARAMS, row(1, 120, 'headingley')) is False
    assert matches(SEARCH, PARAMS, row(1, '90')) is None
    assert matches(SEARCH, PARAMS, row(1, [90])) is None  # a JSON array
    shape = read_shape(
        'SELECT id FROM property WHERE a < :a AND b > :b AND c >= :c', T
    )
    image = {'a': 1, 'b': 2, 'c': 3, 'id': 1}
    assert matches(shape, {'a': 2, 'b': 1, 'c': 3}, image) is True
    assert matches(shape, {'a': 2, 'b': 1, 'c': 4}, image) is False
    image['a'] = 'x'
    assert matches(shape, {'a': 'y', 'b': 1, 'c': 3}, image) is None
    not_equal = read_shape('SELECT id FROM property WHERE a <> :a', T)
    assert matches(not_equal, {'a': 'x'}, {'a': 'y', 'id': 1}) is True


def test_a_change_touches_a_read_where_any_image_may_be_its():
    change = Change('property', (row(1, 150),), (row(1, 90),), 7)
    assert touches(SEARCH, PARAMS, change)
    assert not touches(SEARCH, {**PARAMS, 'rent': 80}, change)


def test_a_snapshot_tells_which_transactions_it_holds():
    snapshot = parse_snapshot('100:105:101,103')
    assert snapshot == (100, 105, (101, 103))
    assert visible(99, snapshot) and visible(102, snapshot)
    assert not visible(101, snapshot) and not visible(105, snapshot)
    assert parse_snapshot('7:7:') == (7, 7, ())


def test_a_row_enters_leaves_and_moves_within_the_rows():
    rows = held((1, 80), (2, 90), snapshot=(1, 1, frozenset()))
    entered = patch(SEARCH, rows, PARAMS, [row(3, 150)], [row(3, 85)], 50)
    assert entered.tuples() == ((1, 80), (3, 85), (2, 90))
    assert entered.snapshot == rows.snapshot
    left = patch(SEARCH, rows, PARAMS, [row(1, 80)], [row(1, 150)], 50)
    assert left.tuples() == ((2, 90),)
    moved = patch(SEARCH, rows, PARAMS, [row(2, 90)], [row(2, 70)], 50)
    assert moved.tuples() == ((2, 70), (1, 80))
    # Untouched: the same rows.
    assert patch(SEARCH, rows, PARAMS, [row(4, 150)], [row(4, 160)], 50) is (
        rows
    )
    # A row it should hold, and does not: not sure of anything.
    assert patch(SEARCH, rows, PARAMS, [row(9, 85)], [], 50) is None
    # Beyond max_rows: the last goes, and the rows say so.
    full = patch(SEARCH, rows, PARAMS, [], [row(3, 85)], 2)
    assert full.tuples() == ((1, 80), (3, 85)) and full.truncated


def test_a_window_of_the_first_rows_is_patched_where_it_stays_whole():
    rows = held((1, 80), (2, 90), truncated=True)
    # A row beyond the window leaves, or comes: the window is the same.
    assert patch(SEARCH, rows, PARAMS, [row(5, 95)], [], 2) is rows
    assert patch(SEARCH, rows, PARAMS, [], [row(5, 95)], 2) is rows
    # Every row of it leaves: nothing is known of what follows.
    assert patch(
        SEARCH, held((1, 80), truncated=True), PARAMS, [row(1, 80)],
        [row(7, 99)], 1,
    ) is None  # fmt: skip
    # One enters it: the last is pushed out.
    assert patch(SEARCH, rows, PARAMS, [], [row(5, 70)], 2).tuples() == (
        (5, 70),
        (1, 80),
    )
    # One leaves it: what comes next is not held.
    assert patch(SEARCH, rows, PARAMS, [row(1, 80)], [], 2) is None
    # A tie with the last row: in the window or not, cannot be told.
    assert patch(SEARCH, rows, PARAMS, [], [row(2, 90)], 2) is None
    # A row from beyond the window moves into it.
    moved_in = patch(SEARCH, rows, PARAMS, [row(5, 95)], [row(5, 70)], 2)
    assert moved_in.tuples() == ((5, 70), (1, 80)) and moved_in.truncated
    unordered = read_shape('SELECT id, rent FROM property', T)
    assert patch(unordered, rows, {}, [], [row(5, 70)], 2) is None
    assert patch(unordered, held((1, 80)), {}, [], [row(5, 70)], 9).tuples(
    ) == ((1, 80), (5, 70))  # fmt: skip


def test_a_row_that_leaves_a_full_window_is_made_good_from_the_reserve():
    # Two rows kept of a read that had more: two more held in reserve.
    rows = held((1, 80)).derive([(1, 80), (2, 85), (3, 90), (4, 95)], True, 2)
    assert rows.tuples() == ((1, 80), (2, 85)) and rows.truncated
    assert len(rows) == 2 and list(rows) == [(1, 80), (2, 85)]
    left = patch(SEARCH, rows, PARAMS, [row(1, 80)], [row(1, 150)], 2)
    assert left.tuples() == ((2, 85), (3, 90)) and left.truncated
    assert left[0] is rows[1]  # the records kept are not made anew
    # One moves from the window to beyond the rows held.
    moved_out = patch(SEARCH, rows, PARAMS, [row(1, 80)], [row(1, 99)], 2)
    assert moved_out.tuples() == ((2, 85), (3, 90))
    assert moved_out.held()[0] == [(2, 85), (3, 90), (4, 95)]
    gone = patch(SEARCH, left, PARAMS, [row(2, 85)], [], 2)
    assert gone.tuples() == ((3, 90), (4, 95)) and gone.truncated
    # The reserve spent: what comes next is not held.
    assert patch(SEARCH, gone, PARAMS, [row(3, 90)], [], 2) is None
    # One that comes pushes the last kept into the reserve, and the last
    # held out: a read holds no more than it did.
    came = patch(SEARCH, rows, PARAMS, [], [row(5, 70)], 2)
    assert came.tuples() == ((5, 70), (1, 80))
    assert came.held()[0] == [(5, 70), (1, 80), (2, 85), (3, 90)]
    # Rows that were all the read had: the reserve is the rest of them.
    whole = held((1, 80)).derive([(1, 80), (2, 85), (3, 90)], False, 2)
    assert whole.truncated
    left = patch(SEARCH, whole, PARAMS, [row(1, 80)], [], 2)
    assert left.tuples() == ((2, 85), (3, 90)) and not left.truncated
    # max_rows and half as many again at the most: the rest let go.
    grown = patch(SEARCH, whole, PARAMS, [], [row(5, 70), row(6, 75)], 2)
    assert grown.held()[0] == [(5, 70), (6, 75), (1, 80)]
    assert grown.held()[2] and grown.truncated


def test_a_row_that_stays_in_its_place_is_changed_there():
    """An update of what the rows are not ordered by: the row is found
    by its order and changed where it is; the other records are kept."""
    shape = read_shape(
        'SELECT id, rent, rooms FROM property WHERE area = :area '
        'ORDER BY rent, id',
        T,
    )
    rows = Rows(('id', 'rent', 'rooms'), [(1, 80, 2)]).derive(
        [(1, 80, 2), (2, 90, 2), (3, 95, 2)], True, 2
    )
    changed = patch(
        shape, rows, PARAMS, [row(2, 90)], [row(2, 90, rooms=3)], 2
    )
    assert changed.tuples() == ((1, 80, 2), (2, 90, 3))
    assert changed[0] is rows[0] and changed.held()[0][2] == (3, 95, 2)
    assert changed.truncated
    # What they do not show changed: the same rows.
    same = patch(
        shape, rows, PARAMS, [row(1, 80)], [{**row(1, 80), 'x': 1}], 2
    )
    assert same is rows
    # In reserve: patched the long way, as any change.
    reserve = patch(
        shape, rows, PARAMS, [row(3, 95)], [row(3, 95, rooms=4)], 2
    )
    assert reserve.tuples() == rows.tuples()
    # Not held, and it should be: not sure of anything.
    missing = patch(
        shape, rows, PARAMS, [row(9, 70)], [row(9, 70, rooms=1)], 2
    )
    assert missing is None
    # No order can be told of a NULL: found the long way.
    unknown = Rows(('id', 'rent', 'rooms'), [(1, None, 2)])
    nulls = patch(
        shape, unknown, PARAMS, [row(1, None)], [row(1, None, rooms=3)], 2
    )
    assert nulls.tuples() == ((1, None, 3),)


def test_a_row_that_leaves_is_found_where_no_order_can_be_told():
    # Titles a collation orders: which comes after the last, unknown; the
    # row that leaves is found among those held all the same.
    shape = read_shape('SELECT id, title FROM property ORDER BY title', T)
    rows = Rows(('id', 'title'), [(1, 'a'), (2, 'b')]).derive(
        [(1, 'a'), (2, 'b'), (3, 'c')], True, 2
    )
    left = patch(shape, rows, {}, [{'id': 1, 'title': 'a'}], [], 2)
    assert left.tuples() == ((2, 'b'), (3, 'c'))


def test_a_row_is_patched_in_as_the_driver_gave_its_columns():
    rows = Rows(('id', 'rent', 'when'), [(1, Decimal('80.50'), None)])
    shape = read_shape('SELECT id, rent, when FROM property ORDER BY id', T)
    image = {'id': 2, 'rent': 90, 'when': None}
    patched = patch(shape, rows, {}, [], [image], 0)
    assert patched.tuples()[1] == (2, Decimal(90), None)
    assert isinstance(patched[1].rent, Decimal)
    # A column whose type no held value shows.
    image['when'] = '2026-09-01'
    assert patch(shape, rows, {}, [], [image], 0) is None
    dated = Rows(('id', 'rent', 'when'), [(1, 80, datetime.date(2026, 1, 1))])
    patched = patch(shape, dated, {}, [], [{**image, 'rent': Decimal(9)}], 0)
    assert patched[1].when == datetime.date(2026, 9, 1)
    assert patched[1].rent == 9 and type(patched[1].rent) is int
    # A NULL in the first row: a later row tells its column's type.
    later = Rows(
        ('id', 'rent', 'when'),
        [(1, 80, None), (2, 85, datetime.date(2026, 1, 1)), (3, 90, None)],
    )
    patched = patch(shape, later, {}, [], [{**image, 'id': 4}], 0)
    assert patched[3].when == datetime.date(2026, 9, 1)
    half = {**image, 'rent': Decimal('9.5')}
    assert patch(shape, dated, {}, [], [half], 0) is None
    assert patch(shape, dated, {}, [], [{**image, 'rent': 'x'}], 0) is None
    # NULLs are ordered first or last, as the database pleases.
    assert patch(shape, dated, {}, [], [{**image, 'id': None}], 0) is None
    # JSON, whose numbers the image holds as Decimals, the driver as
    # floats; a time with a zone, in the writer's zone, not the reader's.
    utc = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    for held, told in (
        ({'score': 3.5}, {'score': Decimal('3.5')}),
        ([1.5], [Decimal('1.5')]),
        (utc, '2026-09-01T12:00:00+01:00'),
    ):
        other = Rows(('id', 'rent', 'when'), [(1, 80, held)])
        assert (
            patch(shape, other, {}, [], [{**image, 'when': told}], 0) is None
        )


def test_a_row_ordered_by_a_collation_is_not_placed():
    shape = read_shape('SELECT id, area FROM property ORDER BY area DESC', T)
    rows = Rows(('id', 'area'), [(1, 'York')])
    assert patch(shape, rows, {}, [], [{'id': 2, 'area': 'Leeds'}], 0) is None


def test_a_count_goes_up_and_down():
    rows = Rows(('n',), [(10,)])
    assert patch(COUNT, rows, PARAMS, [], [row(1, 90)], 0).tuples() == ((11,),)
    assert patch(
        COUNT, rows, PARAMS, [row(1, 90)], [row(1, 120)], 0
    ).tuples() == ((9,),)  # fmt: skip
    # A row that still counts after it changed: the same rows.
    assert patch(COUNT, rows, PARAMS, [row(1, 90)], [row(1, 80)], 0) is rows
    assert patch(COUNT, rows, PARAMS, [row(1, 90, 'headingley')], [], 0) is (
        None
    )
    assert patch(
        COUNT, Rows(('n',), [(1.5,)]), PARAMS, [], [row(1, 9)], 0
    ) is (None)
    unshaped = read_shape('SELECT id FROM property WHERE area = :area', T)
    object.__setattr__(unshaped, 'kind', None)
    assert patch(unshaped, rows, PARAMS, [], [row(1, 9)], 0) is None


def areas(*groups, truncated=False):
    columns = ('area', 'n', 'low', 'high', 'total', 'told')
    return Rows(columns, groups, truncated=truncated)


def test_groups_count_sum_and_keep_their_least_and_most():
    rows = areas(
        ('Burley', 2, 70, 95, 165, 2), ('Headingley', 1, 80, 80, 80, 1)
    )  # fmt: skip
    # A sum whose value leaves: NULL, or not, is not told.
    assert patch(AREAS, rows, {}, [row(9, 90, 'Burley')], [], 0) is None
    bounds = read_shape(
        'SELECT area, count(*) AS n, min(rent) AS low, max(rent) AS high, '
        'count(rooms) AS told FROM property GROUP BY area ORDER BY area',
        T,
    )
    ranges = Rows(
        ('area', 'n', 'low', 'high', 'told'),
        [('Burley', 2, 70, 95, 2), ('Headingley', 1, 80, 80, 1)],
    )
    moved = patch(bounds, ranges, {}, [row(9, 90, 'Burley')], [row(9, 60)], 0)
    assert moved.tuples() == (
        ('Burley', 1, 70, 95, 1),
        ('Headingley', 2, 60, 80, 2),
    )
    # The least left, and a lesser one came: that one is the least.
    cheaper = patch(
        bounds, ranges, {}, [row(1, 80)], [row(1, 75, rooms=None)], 0
    )  # fmt: skip
    assert cheaper.tuples()[1] == ('Headingley', 1, 75, 75, 0)
    # The least left for a dearer rent: the least now is not held.
    dearer = [row(1, 96, 'Burley')]
    assert patch(bounds, ranges, {}, [row(1, 70, 'Burley')], dearer, 0) is (
        None
    )
    # A sum grows.
    grown = patch(AREAS, rows, {}, [], [row(3, 50, 'Burley')], 0)
    assert grown.tuples()[0] == ('Burley', 3, 50, 95, 215, 3)
    rooms = read_shape(
        'SELECT rooms, count(*) FROM property GROUP BY rooms ORDER BY rooms', T
    )
    counted = Rows(('rooms', 'n'), [(1, 5), (3, 2)])
    assert patch(rooms, counted, {}, [], [row(1, 9, rooms=2)], 0).tuples() == (
        (1, 5), (2, 1), (3, 2)
    )  # fmt: skip
    assert patch(rooms, counted, {}, [], [row(1, 9, rooms=2)], 2) is None
    # The last of a group leaves: the group goes.
    gone = patch(bounds, ranges, {}, [row(1, 80)], [], 0)
    assert [r.area for r in gone] == ['Burley']
    # A rent below the least it holds, leaving: not what it holds.
    assert patch(bounds, ranges, {}, [row(1, 60, 'Burley')], [], 0) is None
    # Sums of floats depend on their order.
    floats = areas(('Burley', 1, 70, 70, 70.5, 1))
    assert patch(AREAS, floats, {}, [], [row(2, 71, 'Burley')], 0) is None
    # The database's sum of decimals is exact, to more digits than
    # Python's 28: so is the patched one.
    low, high = decimal.Decimal(1), decimal.Decimal(100)
    big = decimal.Decimal('12345678901.123456789012345678')
    decimals = areas(('Burley', 1, low, high, big, 1))
    fine = decimal.Decimal('50.000000000000000001')
    more = patch(AREAS, decimals, {}, [], [row(2, fine, 'Burley')], 0)
    exact = decimal.Decimal('12345678951.123456789012345679')
    assert more.tuples()[0][4] == exact
    nulls = areas(('Burley', 1, None, None, None, 1))
    assert patch(AREAS, nulls, {}, [], [row(2, None, 'Burley')], 0).tuples(
    ) == (('Burley', 2, None, None, None, 2),)  # fmt: skip
    with_low = areas(('Burley', 1, 70, 70, 70, 1))
    bad = [{**row(2, 'x', 'Burley')}]
    assert patch(AREAS, with_low, {}, [], bad, 0) is None


def test_a_group_that_cannot_be_found_or_placed_is_not_patched():
    rows = areas(('Burley', 2, 70, 90, 160, 2))
    assert patch(AREAS, rows, {}, [row(1, 80, 'Leeds')], [], 0) is None
    assert patch(AREAS, rows, {}, [], [row(1, 80, 'burley')], 0) is None
    assert patch(AREAS, rows, {}, [], [row(1, 80, 'Aire')], 0) is None
    unordered = read_shape(
        'SELECT area, count(*) FROM property GROUP BY area', T
    )
    grown = patch(
        unordered, Rows(('area', 'n'), [('Burley', 2)]), {}, [],
        [row(1, 80, 'Aire')], 0,
    )  # fmt: skip
    assert grown.tuples() == (('Burley', 2), ('Aire', 1))
    assert patch(AREAS, areas(truncated=True), {}, [], [row(1, 9)], 0) is None
    uncounted = read_shape(
        'SELECT area, min(rent) FROM property GROUP BY area', T
    )
    assert patch(
        uncounted, Rows(('area', 'min'), [('Burley', 2)]), {}, [],
        [row(1, 80, 'Burley')], 0,
    ) is None  # fmt: skip


def test_the_least_that_left_gives_way_to_a_lesser_one():
    shape = read_shape(
        'SELECT area, count(*), min(rent), max(rent) FROM property '
        'GROUP BY area', T,
    )  # fmt: skip
    rows = Rows(('area', 'n', 'low', 'high'), [('Burley', 2, 70, 95)])
    patched = patch(
        shape, rows, {}, [row(1, 70, 'Burley')], [row(1, 65, 'Burley')], 0
    )  # fmt: skip
    assert patched.tuples() == (('Burley', 2, 65, 95),)
    named = read_shape(
        'SELECT area, count(*), min(title) FROM property GROUP BY area', T
    )
    titled = Rows(('area', 'n', 'first'), [('Burley', 1, 'York')])
    image = {'area': 'Burley', 'title': 'Leeds'}
    assert patch(named, titled, {}, [], [image], 0) is None
    summed = read_shape(
        'SELECT area, count(*), sum(rent) FROM property GROUP BY area', T
    )
    floats = Rows(('area', 'n', 'total'), [('Burley', 1, 70.5)])
    image = {'area': 'Burley', 'rent': 1.5}
    assert patch(summed, floats, {}, [], [image], 0) is None


@pytest.mark.parametrize(
    'sql',
    [
        'SELECT a FROM property ORDER BY 1',
        'SELECT a, count(*) FROM property GROUP BY 1',
        'SELECT a FROM property ORDER BY a,',
    ],
)
def test_a_group_or_order_by_anything_but_columns_has_no_shape(sql):
    assert read_shape(sql, T) is None


def test_a_count_is_one_row_of_one_column():
    rows = Rows(('n', 'm'), [(1, 2)])
    assert patch(COUNT, rows, PARAMS, [], [row(1, 9)], 0) is None
