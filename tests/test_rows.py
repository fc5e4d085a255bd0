"""Cached rows as the package hands them back: records read by name, key
and position, pickled, compared, and their classes bounded."""

import pickle

import pytest

from pyramid_dbtune import Record, Rows


@pytest.fixture
def rows():
    return Rows(('id', 'area', 'rent'), [(1, 'Burley', 70), (2, 'Hyde', 80)])


def test_record_access_by_attribute_key_and_index(rows):
    record = rows[0]
    assert (record.id, record['area'], record[2]) == (1, 'Burley', 70)
    assert record[-1] == 70 and record[:2] == (1, 'Burley')
    assert list(record) == [1, 'Burley', 70] and len(record) == 3
    assert isinstance(record, tuple) and tuple(record) == (1, 'Burley', 70)
    assert record._asdict() == {'id': 1, 'area': 'Burley', 'rent': 70}
    assert record._fields == ('id', 'area', 'rent')
    assert repr(record) == "<Record id=1 area='Burley' rent=70>"


def test_missing_columns_say_which_exist(rows):
    with pytest.raises(AttributeError, match='columns: id, area, rent'):
        rows[0].price
    with pytest.raises(KeyError, match='price'):
        rows[0]['price']
    with pytest.raises(IndexError):
        rows[0][3]


def test_rows_and_records_are_immutable(rows):
    with pytest.raises(AttributeError):
        rows[0].rent = 1
    with pytest.raises(AttributeError):
        del rows[0].rent
    with pytest.raises(AttributeError):
        rows.columns = ()
    with pytest.raises(AttributeError):
        del rows.columns
    with pytest.raises(TypeError):
        rows[0] = None
    with pytest.raises(TypeError):
        hash(rows)


def test_rows_sequence(rows):
    assert rows.columns == ('id', 'area', 'rent')
    assert len(rows) == 2 and rows[-1].id == 2
    assert [r.id for r in rows] == [1, 2]
    assert rows.tuples() == ((1, 'Burley', 70), (2, 'Hyde', 80))
    assert rows.dictionaries()[1] == {'id': 2, 'area': 'Hyde', 'rent': 80}
    assert rows[1:] == Rows(rows.columns, [(2, 'Hyde', 80)])
    assert repr(rows) == '<Rows 2 x (id, area, rent)>'
    assert not rows.truncated and rows.rowcount == -1


def test_the_edge_is_the_last_row_held_and_whether_more_follow(rows):
    assert rows.edge() == ((2, 'Hyde', 80), False)
    assert Rows(rows.columns).edge() == (None, False)
    reserve = rows.derive([*rows, (3, 'Hyde', 90)], True, 2)
    assert reserve.edge() == ((3, 'Hyde', 90), True)


def test_equality(rows):
    assert rows[0] == (1, 'Burley', 70)
    assert rows[0] == Record(
        (1, 'Burley', 70), {'id': 0, 'area': 1, 'rent': 2}
    )
    assert rows[0] != Record((1, 'Burley', 70), {'x': 0, 'y': 1, 'z': 2})
    # The same names in another order: other columns.
    swapped = Record((1, 'Burley', 70), {'area': 0, 'id': 1, 'rent': 2})
    assert rows[0] != swapped and swapped != rows[0]
    assert rows[0] != [1, 'Burley', 70]
    assert hash(rows[0]) == hash((1, 'Burley', 70))
    assert rows != rows.tuples()
    assert rows == Rows(['id', 'area', 'rent'], rows.tuples())


def test_pickle_round_trip_keeps_everything(rows):
    truncated = Rows(rows.columns, rows.tuples(), truncated=True)
    for value in (rows, truncated, Rows(rowcount=3)):
        copy = pickle.loads(pickle.dumps(value))
        assert copy == value
        assert copy.truncated == value.truncated
        assert copy.rowcount == value.rowcount
    record = pickle.loads(pickle.dumps(rows[1]))
    assert record.area == 'Hyde'


def test_pickle_holds_no_sqlalchemy_objects(rows):
    assert b'sqlalchemy' not in pickle.dumps(rows)


def test_duplicate_column_names_give_the_first():
    rows = Rows(('id', 'id'), [(1, 2)])
    assert rows[0].id == 1 and rows[0][1] == 2
    again = Rows(('a', 'b', 'a', 'c'), [(1, 2, 3, 4)])[0]
    assert again._asdict() == {'a': 1, 'b': 2, 'c': 4}
    last = Rows(('a', 'b', 'a'), [(1, 2, 3), (4, 5, 6)])
    assert last.dictionaries() == [{'a': 1, 'b': 2}, {'a': 4, 'b': 5}]
    between = Rows(('a', 'b', 'a', 'c'), [(1, 2, 3, 4)])
    assert between.dictionaries() == [{'a': 1, 'b': 2, 'c': 4}]
    assert Rows(('a',), []).dictionaries() == []
    assert again._fields == ('a', 'b', 'c') and again.c == 4
    assert (
        repr(Rows(('a',), [], truncated=True)) == '<Rows 0 x (a), truncated>'
    )


def test_half_built_record_raises_rather_than_recursing():
    with pytest.raises(AttributeError):
        Record.__new__(Record).anything


def test_columns_are_properties_of_a_class_made_once():

    one = Rows(['id', 'count', '2nd', '_private'], [(1, 5, 'b', 'p')])
    two = Rows(['id', 'count', '2nd', '_private'], [(2, 6, 'c', 'q')])
    assert type(one[0]) is type(two[0])
    assert isinstance(one[0], Record)
    # Of the class, not looked up by __getattr__; tuple's count() too.
    assert 'count' in type(one[0]).__dict__
    assert one[0].count == 5 and two[0].id == 2
    # Names that cannot be properties are still read.
    assert getattr(one[0], '2nd') == 'b' and one[0]['2nd'] == 'b'
    assert one[0]._private == 'p'
    with pytest.raises(AttributeError, match='immutable'):
        one[0].count = 1
    # Equal to, and pickled as, a plain record.
    assert one[0] == Record((1, 5, 'b', 'p'), one[0]._index)
    assert pickle.loads(pickle.dumps(one)) == one


def test_the_classes_made_are_bounded(monkeypatch):
    from pyramid_dbtune.sql import rows as rows_module

    monkeypatch.setattr(rows_module, 'MAX_CLASSES', 0)
    first = Rows(['unseen_column'], [(1,)])
    again = Rows(['unseen_column'], [(1,)])
    assert type(first[0]) is not type(again[0])
    assert first == again and again[0].unseen_column == 1
