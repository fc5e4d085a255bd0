"""Query results: :class:`Rows`, an immutable sequence of :class:`Record`.

Results are shared between requests through the cache, so they are
immutable, and a value that is not (a JSON object, an array) is each
caller's own copy (:meth:`Rows.own`); they pickle as plain tuples, never
as driver or SQLAlchemy objects.
"""

import copy
from collections import namedtuple
from collections.abc import Sequence
from itertools import repeat


class Record(tuple):
    """One row: ``record.rent``, ``record['rent']`` and ``record[3]``.

    A record is a tuple of its values, with its columns' names. It
    compares equal to another record with the same columns and values,
    and to a tuple of its values. Where a statement returns two columns of
    one name, the name gives the first of them. Being a tuple, ``json``
    encodes it as an array: :meth:`_asdict` gives a dict of it.
    """

    __slots__ = ()
    #: Column name: position. The class of a set of columns has its own.
    _index = {}
    #: The names of its columns, first to last, where each names one.
    _names = ()

    def __new__(cls, values=(), index=None):
        if index is not None:
            cls = _record_class(tuple(index.items()))
        return tuple.__new__(cls, values)

    def __getattr__(self, name):
        # Only called when normal lookup fails: a column whose name
        # cannot be an attribute of the class, or none.
        try:
            return tuple.__getitem__(self, self._index[name])
        except KeyError:
            raise AttributeError(
                f'record has no column {name!r}; columns: '
                + ', '.join(self._index)
            ) from None

    def __getitem__(self, key):
        if isinstance(key, str):
            try:
                key = self._index[key]
            except KeyError:
                raise KeyError(key) from None
        return tuple.__getitem__(self, key)

    def __setattr__(self, name, value):
        raise AttributeError('records are immutable')

    def __delattr__(self, name):
        raise AttributeError('records are immutable')

    def __eq__(self, other):
        if (
            isinstance(other, Record)
            and type(other) is not type(self)  # one class, one index
            and self._index != other._index  # the names, in their order
        ):
            return False
        if isinstance(other, tuple):
            return tuple.__eq__(self, other)
        return NotImplemented

    def __ne__(self, other):
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = tuple.__hash__

    def __reduce__(self):
        return (Record, (tuple(self), self._index))

    def __repr__(self):
        fields = ' '.join(f'{k}={self[k]!r}' for k in self._index)
        return f'<Record {fields}>'

    def _asdict(self):
        """The record as a dict of column name to value."""
        if self._names is not None:
            return dict(zip(self._names, self, strict=False))
        return {name: self[name] for name in self._index}

    @property
    def _fields(self):
        """The column names."""
        return tuple(self._index)


def _index(columns):
    index = {}
    for position, name in enumerate(columns):
        index.setdefault(name, position)
    return index


def _class_of(columns):
    """The :class:`Record` class of a statement's ``columns``."""
    return _record_class(tuple(_index(columns).items()))


_CLASSES = {}
#: How many record classes (one a set of columns) are kept for reuse;
#: past it, each result of columns not seen before makes its own.
MAX_CLASSES = 1000
_GETTERS = ()


def _column(position):
    """What reads item ``position`` of a tuple as an attribute: the getter
    of a namedtuple's field, which Python runs without a frame of its
    own (a page reads hundreds of them)."""
    global _GETTERS
    getters = _GETTERS  # another thread may put fewer in its place
    if position >= len(getters):
        size = max(position + 1, 2 * len(getters), 32)
        fields = namedtuple('Fields', [f'c{n}' for n in range(size)])
        getters = _GETTERS = tuple(vars(fields)[f'c{n}'] for n in range(size))
    return getters[position]


def _record_class(items):
    """The :class:`Record` class of columns ``items`` (``(name,
    position)`` pairs), whose columns are attributes.

    ``record.rent`` is how pages read rows: an attribute of the class is
    ten times as quick as :meth:`Record.__getattr__`, which Python calls
    only after its own lookup has failed. One class per set of columns,
    made once.
    """
    made = _CLASSES.get(items)
    if made is None:
        attributes = {
            name: _column(position)
            for name, position in items
            if name.isidentifier()
            and not name.startswith('_')
            and name not in Record.__dict__
        }
        index = dict(items)
        names = tuple(index)
        if list(index.values()) != list(range(len(names))):
            names = None  # a name given twice: zip() would pair them wrong
        made = type(
            'Record',
            (Record,),
            {'__slots__': (), '_index': index, '_names': names, **attributes},
        )
        if len(_CLASSES) < MAX_CLASSES:
            _CLASSES[items] = made
    return made


class Rows(Sequence):
    """The rows a SQL method returned: an immutable sequence of records.

    ``columns`` names the columns; ``truncated`` is true when the statement
    had more rows than the method's ``max_rows`` and only the first
    ``max_rows`` were kept (as ZSQL Methods did); ``rowcount`` is what the
    database reported for a write (``-1`` when it reported nothing).
    ``position``, with causal reads, is the log position of the replica
    they were read from, or an earlier one (None: read from the writer):
    a client whose pin is later does not get them from the cache.
    ``snapshot``, on PostgreSQL, is the transaction snapshot a cache fill
    read them in (``(xmin, xmax, running)``): which committed changes they
    hold, and so which a listener must apply to them.
    """

    __slots__ = (
        'columns', 'truncated', 'rowcount', 'position', 'snapshot',
        '_records', '_reserve', '_mutable',
    )  # fmt: skip

    def __init__(
        self, columns=(), data=(), *, truncated=False, rowcount=-1,
        position=None, snapshot=None,
    ):  # fmt: skip
        columns = tuple(columns)
        record = _class_of(columns)
        records = tuple(map(record, data))
        _set(self, columns, records, (), truncated, rowcount, position,
             snapshot)  # fmt: skip

    def __setattr__(self, name, value):
        raise AttributeError('Rows are immutable')

    def __delattr__(self, name):
        raise AttributeError('Rows are immutable')

    def __getitem__(self, index):
        if isinstance(index, slice):
            return Rows(self.columns, self._records[index])
        return self._records[index]

    def __len__(self):
        return len(self._records)

    def __iter__(self):
        return iter(self._records)

    def __eq__(self, other):
        if not isinstance(other, Rows):
            return NotImplemented
        return (
            self.columns == other.columns
            and self.tuples() == other.tuples()
            and self.truncated == other.truncated
        )

    __hash__ = None

    def __reduce__(self):
        return (
            _rebuild,
            (self.columns, self.tuples(), self.truncated, self.rowcount),
        )

    def __repr__(self):
        more = ', truncated' if self.truncated else ''
        return f'<Rows {len(self)} x ({", ".join(self.columns)}){more}>'

    def own(self):
        """These rows, for a caller that may change what they hold: the
        same, or where a value can be changed (a JSON column's dict or
        list, an array), a copy holding copies of those values. A
        cache's rows are every caller's, and the change of one would be
        the next one's rows."""
        mutable = self._mutable
        if mutable is None:  # looked for once
            mutable = any(
                isinstance(value, _MUTABLE)
                for record in self._records
                for value in record
            )
            object.__setattr__(self, '_mutable', mutable)
        if not mutable:
            return self
        records = tuple(
            type(record)(
                [
                    copy.deepcopy(value)
                    if isinstance(value, _MUTABLE)
                    else value
                    for value in record
                ]
            )
            for record in self._records
        )
        own = object.__new__(Rows)
        reserve, more = self._reserve
        _set(own, self.columns, records, reserve, more, self.rowcount,
             self.position, self.snapshot)  # fmt: skip
        return own

    def tuples(self):
        """The rows as a tuple of plain value tuples."""
        return tuple(map(tuple, self._records))

    def held(self):
        """``(values, items, more)``: new lists of the value tuples of the
        rows kept and then of those held in reserve, and of the same rows
        as records (the kept ones) and tuples (the reserve's); ``more``,
        whether the read had rows beyond them. :meth:`derive` takes
        ``items`` back."""
        reserve, more = self._reserve
        values = list(map(tuple, self._records))
        values += reserve
        return values, [*self._records, *reserve], more

    def edge(self):
        """``(last, more)``: the value tuple of the last row held (kept, or
        in reserve; None for none), and whether the read had rows beyond
        it."""
        reserve, more = self._reserve
        if reserve:
            return reserve[-1], more
        return (tuple(self._records[-1]) if self._records else None), more

    def replaced(self, index, values):
        """Rows like these, with the values of kept record ``index``
        ``values`` (a tuple as long)."""
        records = list(self._records)
        records[index] = type(records[index])(values)
        reserve, more = self._reserve
        replaced = object.__new__(Rows)
        _set(replaced, self.columns, tuple(records), reserve, more, -1,
             self.position, self.snapshot)  # fmt: skip
        return replaced

    def derive(self, items, more, keep=0):
        """Rows like these (columns, position, snapshot) of ``items``,
        each a record of these rows or a tuple of values (as
        :meth:`held` gives them): the first ``keep`` kept (0: all) and
        the rest in reserve; ``more``, whether rows follow them. Records
        are reused, not made anew."""
        if self._records:
            record = type(self._records[0])
        else:
            record = _class_of(self.columns)
        kept = items[:keep] if keep else items
        # Most are the records of these rows: kept as they are.
        records = tuple(
            [item if type(item) is record else record(item) for item in kept]
        )
        reserve = tuple(map(tuple, items[len(kept) :]))
        derived = object.__new__(Rows)
        _set(derived, self.columns, records, reserve, more, -1,
             self.position, self.snapshot)  # fmt: skip
        return derived

    def dictionaries(self):
        """The rows as a list of dicts (the ZSQL ``Results`` name)."""
        records = self._records
        names = records[0]._names if records else ()
        if names is None:  # a name given twice: the first is kept
            return [r._asdict() for r in records]
        # Every record of one Rows has the same columns: one zip of the
        # names with each, and no method call a row (half the time).
        return list(map(dict, map(zip, repeat(names), records)))


def _set(rows, columns, records, reserve, more, rowcount, position,
         snapshot):  # fmt: skip
    """Give new ``rows`` their attributes: ``reserve``, a cache fill's
    rows beyond the ``records`` kept, as value tuples, and ``more``,
    whether the read had more still (a change that takes a kept row away
    is made good from the reserve, :meth:`Rows.held`)."""
    for name, value in (
        ('columns', columns),
        ('truncated', bool(more or reserve)),
        ('rowcount', rowcount),
        ('position', position),
        ('snapshot', snapshot),
        ('_records', records),
        ('_reserve', (reserve, bool(more))),
        ('_mutable', None),
    ):
        object.__setattr__(rows, name, value)


#: The values a caller could change in place.
_MUTABLE = (dict, list, set, bytearray)

#: The most rows a cache fill holds in reserve beyond its ``max_rows``.
MAX_RESERVE = 50


def reserve_for(max_rows):
    """How many rows beyond ``max_rows`` a cache fill whose rows changes
    are applied to holds in reserve: half as many again, at most
    :data:`MAX_RESERVE`. A change that takes a kept row away brings up the
    first of them, where without them the rows would be dropped."""
    return min(max_rows // 2, MAX_RESERVE)


def _rebuild(columns, data, truncated, rowcount):
    return Rows(columns, data, truncated=truncated, rowcount=rowcount)
