"""Query results: :class:`Rows`, an immutable sequence of :class:`Record`.

Results are shared between requests through the cache, so they are
immutable; they pickle as plain tuples, never as driver or SQLAlchemy
objects.
"""

from collections.abc import Sequence


class Record:
    """One row: ``record.rent``, ``record['rent']`` and ``record[3]``.

    A record compares equal to another record with the same columns and
    values, and to a tuple of its values. Where a statement returns two
    columns of one name, the name gives the first of them.
    """

    __slots__ = ('_values', '_index')

    def __init__(self, values, index):
        object.__setattr__(self, '_values', tuple(values))
        object.__setattr__(self, '_index', index)

    def __getattr__(self, name):
        # Only called when normal lookup fails; the guard stops recursion
        # on a half-built record (copy, pickle).
        if name in Record.__slots__:
            raise AttributeError(name)
        try:
            return self._values[self._index[name]]
        except KeyError:
            raise AttributeError(
                f'record has no column {name!r}; columns: '
                + ', '.join(self._index)
            ) from None

    def __getitem__(self, key):
        if isinstance(key, str):
            try:
                return self._values[self._index[key]]
            except KeyError:
                raise KeyError(key) from None
        return self._values[key]

    def __setattr__(self, name, value):
        raise AttributeError('records are immutable')

    def __delattr__(self, name):
        raise AttributeError('records are immutable')

    def __len__(self):
        return len(self._values)

    def __iter__(self):
        return iter(self._values)

    def __eq__(self, other):
        if isinstance(other, Record):
            return (
                self._values == other._values
                and self._index.keys() == other._index.keys()
            )
        if isinstance(other, tuple):
            return self._values == other
        return NotImplemented

    def __hash__(self):
        return hash(self._values)

    def __reduce__(self):
        return (Record, (self._values, self._index))

    def __repr__(self):
        fields = ' '.join(f'{k}={self[k]!r}' for k in self._index)
        return f'<Record {fields}>'

    def _asdict(self):
        """The record as a dict of column name to value."""
        return {name: self._values[i] for name, i in self._index.items()}

    @property
    def _fields(self):
        """The column names."""
        return tuple(self._index)


def _index(columns):
    index = {}
    for position, name in enumerate(columns):
        index.setdefault(name, position)
    return index


_CLASSES = {}
_MAX_CLASSES = 1000


def _column(position):
    return property(lambda record: record._values[position])


def _record_class(columns, index):
    """A :class:`Record` class whose columns are properties.

    ``record.rent`` is how pages read rows; a property is ten times as
    quick as :meth:`Record.__getattr__`, which Python calls only after its
    own lookup has failed. One class per set of columns, made once.
    """
    made = _CLASSES.get(columns)
    if made is None:
        attributes = {
            name: _column(position)
            for name, position in index.items()
            if name.isidentifier()
            and not name.startswith('_')
            and not hasattr(Record, name)
        }
        made = type('Record', (Record,), {'__slots__': (), **attributes})
        if len(_CLASSES) < _MAX_CLASSES:
            _CLASSES[columns] = made
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
        '_records', '_reserve',
    )  # fmt: skip

    def __init__(
        self, columns=(), data=(), *, truncated=False, rowcount=-1,
        position=None, snapshot=None,
    ):  # fmt: skip
        columns = tuple(columns)
        index = _index(columns)
        record = _record_class(columns, index)
        records = tuple(record(row, index) for row in data)
        _set(self, columns, records, (), truncated, rowcount, position,
             snapshot)  # fmt: skip

    def __setattr__(self, name, value):
        raise AttributeError('Rows are immutable')

    def __delattr__(self, name):
        raise AttributeError('Rows are immutable')

    def __getitem__(self, index):
        if isinstance(index, slice):
            return Rows(
                self.columns, (r._values for r in self._records[index])
            )
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

    def tuples(self):
        """The rows as a tuple of plain value tuples."""
        return tuple(r._values for r in self._records)

    def held(self):
        """``(values, items, more)``: new lists of the value tuples of the
        rows kept and then of those held in reserve, and of the same rows
        as records (the kept ones) and tuples (the reserve's); ``more``,
        whether the read had rows beyond them. :meth:`derive` takes
        ``items`` back."""
        reserve, more = self._reserve
        values = [r._values for r in self._records]
        values += reserve
        return values, [*self._records, *reserve], more

    def edge(self):
        """``(last, more)``: the value tuple of the last row held (kept, or
        in reserve; None for none), and whether the read had rows beyond
        it."""
        reserve, more = self._reserve
        if reserve:
            return reserve[-1], more
        return (self._records[-1]._values if self._records else None), more

    def derive(self, items, more, keep=0):
        """Rows like these (columns, position, snapshot) of ``items``,
        each a record of these rows or a tuple of values (as
        :meth:`held` gives them): the first ``keep`` kept (0: all) and
        the rest in reserve; ``more``, whether rows follow them. Records
        are reused, not made anew."""
        if self._records:
            first = self._records[0]
            record, index = type(first), first._index
        else:
            index = _index(self.columns)
            record = _record_class(self.columns, index)
        kept = items[:keep] if keep else items
        records = tuple(
            item if isinstance(item, Record) else record(item, index)
            for item in kept
        )
        reserve = tuple(
            item._values if isinstance(item, Record) else tuple(item)
            for item in items[len(kept) :]
        )
        derived = object.__new__(Rows)
        _set(derived, self.columns, records, reserve, more, -1,
             self.position, self.snapshot)  # fmt: skip
        return derived

    def dictionaries(self):
        """The rows as a list of dicts (the ZSQL ``Results`` name)."""
        return [r._asdict() for r in self._records]


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
    ):
        object.__setattr__(rows, name, value)


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
