"""A committed change applied to the rows a cached read holds: the rows
as they are once it is made, or None where that cannot be told (then the
rows are dropped). The reads, their shapes and how values compare are
:mod:`.shapes`'.
"""

import datetime
import decimal

from .rows import reserve_for
from .shapes import UNEQUAL, compare, holds_for, tests_of

_NONE = type(None)


_EXACT = decimal.Context(prec=1000, traps=[decimal.Inexact])


class _Unsure(Exception):
    """What a patch cannot be sure of: the rows are dropped."""


def patch(shape, rows, params, old, new, max_rows, tests=None):
    """``rows``, a read of ``shape`` with ``params`` that held at most
    ``max_rows`` rows, as they are once rows of images ``old`` became
    ``new``: the same object where the change does not touch them, new
    :class:`~pyramid_dbtune.sql.rows.Rows` where it does, or None where
    that cannot be told (drop them). ``tests``: ``tests_of(shape,
    params)``, where the caller keeps them."""
    if tests is None:
        tests = tests_of(shape, params)
    gone, came = [], []
    for images, found in ((old, gone), (new, came)):
        for image in images:
            matched = holds_for(tests, image)
            if matched is None:
                return None
            if matched:
                found.append(image)
    if not (gone or came):
        return rows
    if shape.kind is None:
        return None
    try:
        if shape.kind == 'count':
            return _count(rows, len(came) - len(gone))
        types = _types(rows)
        if shape.kind == 'rows':
            return _rows(shape, rows, types, gone, came, max_rows)
        return _groups(shape, rows, types, gone, came, max_rows)
    except (_Unsure, ValueError, TypeError, LookupError, ArithmeticError):
        return None


def _count(rows, delta):
    if len(rows) != 1 or len(rows.columns) != 1:
        raise _Unsure
    (value,) = rows[0]
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Unsure
    if not delta:  # a row changed, and counts still
        return rows
    return rows.derive([(value + delta,)], False)


def _types(rows):
    """The type of each column's values, where rows show one."""
    if not rows:
        return [None] * len(rows.columns)
    types = list(map(type, rows[0]))  # a row with no NULL tells them all
    if _NONE in types:
        types = [None] * len(types)
        for record in rows:
            for n, value in enumerate(record):
                if types[n] is None and value is not None:
                    types[n] = type(value)
            if None not in types:
                break
    return types


def _as(value, kind):
    """``value`` of a row image as the driver gave the column's values."""
    if kind in (dict, list):
        # JSON: the image's numbers are Decimals, the driver's floats.
        raise _Unsure
    if value is None or type(value) is kind:
        return value
    if kind is None:
        raise _Unsure  # no value of the column seen: its type is unknown
    if kind is decimal.Decimal and isinstance(value, int | str):
        return decimal.Decimal(value)
    if kind is int and isinstance(value, decimal.Decimal):
        if value != value.to_integral_value():
            raise _Unsure
        return int(value)
    if kind in (datetime.date, datetime.datetime) and isinstance(value, str):
        value = kind.fromisoformat(value)
        if getattr(value, 'tzinfo', None) is not None:
            # In the writer's time zone; the driver gives the reader's.
            raise _Unsure
        return value
    raise _Unsure


def _row(shape, image, types):
    return tuple(
        _as(image[column], kind)
        for (_, column), kind in zip(shape.items, types, strict=True)
    )


def _sort_key(shape, image, types):
    """What :func:`_before` reads of a row image: the values it is
    ordered by, by their place in the row."""
    items = shape.items
    key = {}
    for n, _ in shape.order:
        value, kind = image[items[n][1]], types[n]
        key[n] = value if type(value) is kind else _as(value, kind)
    return key


def _before(shape, a, b):
    """Whether row ``a`` comes before row ``b`` (False where they tie);
    :class:`_Unsure` where that cannot be told."""
    for n, descending in shape.order:
        x, y = a[n], b[n]
        if x is None or y is None:
            raise _Unsure  # databases put NULLs first, or last
        if type(x) is int and type(y) is int:  # most keys: no memo needed
            order = (x > y) - (x < y)
        else:
            order = compare(x, y)
        if order is None or order == UNEQUAL:
            raise _Unsure
        if order:
            return (order < 0) != descending
    return False


def _place(shape, held, row):
    """Where ``row`` goes among ``held``, rows in the order of ``shape``:
    before the first it comes before (a binary search)."""
    low, high = 0, len(held)
    while low < high:
        middle = (low + high) // 2
        if _before(shape, row, held[middle]):
            high = middle
        else:
            low = middle + 1
    return low


def _after(shape, last, types, images):
    """Whether every row of ``images`` comes after ``last``: False where
    that cannot be told (a NULL, a string a collation orders)."""
    try:
        for image in images:
            if not _before(shape, last, _sort_key(shape, image, types)):
                return False
    except _Unsure:
        return False
    return True


def _rows(shape, rows, types, gone, came, max_rows):
    last, more = rows.edge()
    if more and shape.order and _after(shape, last, types, (*gone, *came)):
        return rows  # all of it after the rows held, as most changes are
    if len(gone) == 1 and len(came) == 1 and shape.order:
        changed = _in_place(shape, rows, types, gone[0], came[0])
        if changed is not None:
            return changed
    held, items, more = rows.held()
    # Beyond the rows held, a statement's rows are not known: past as many
    # as a fill holds, the last ones are let go.
    room = len(held) if more else max_rows + reserve_for(max_rows)
    for image in gone:
        row = _row(shape, image, types)
        try:
            at = held.index(row)
        except ValueError:
            if not (more and shape.order and _before(shape, held[-1], row)):
                raise _Unsure from None  # a row it should hold, and does not
            continue  # one of the rows after those held
        del held[at], items[at]
    for image in came:
        row = _row(shape, image, types)
        at = _place(shape, held, row) if shape.order else len(held)
        if at == len(held) and more:
            if not shape.order or not _before(shape, held[-1], row):
                raise _Unsure  # in the window or not: a tie, or no order
            continue  # after the rows held
        held.insert(at, row)
        items.insert(at, row)
    if more and len(held) < max_rows:
        raise _Unsure  # what comes next is not held
    if room and len(held) > room:
        del items[room:]
        more = True
    return rows.derive(items, more, max_rows)


def _in_place(shape, rows, types, old, new):
    """``rows`` with one row kept changed where it stays in its place (an
    update of what they are not ordered by): found by its order, not by
    a scan of them all. None where that is not so: the rows are patched
    the long way."""
    before, after = _row(shape, old, types), _row(shape, new, types)
    if any(before[n] != after[n] for n, _ in shape.order):
        return None  # it may move
    try:
        # The last row kept that it does not come before: itself, where
        # the order tells it from every other row.
        at = _place(shape, rows, before) - 1
    except _Unsure:
        return None
    if at < 0 or tuple(rows[at]) != before:
        return None  # not kept, or another row ties with it
    return rows if before == after else rows.replaced(at, after)


def _groups(shape, rows, types, gone, came, max_rows):
    if rows.truncated or ('count', None) not in shape.items:
        raise _Unsure
    held = [list(r) for r in rows.tuples()]
    keys = [n for n, (a, _) in enumerate(shape.items) if a is None]
    floors = {}  # (group, item): the min or max removed, now unknown
    counted = shape.items.index(('count', None))
    for image, sign in [*((i, -1) for i in gone), *((i, 1) for i in came)]:
        key = tuple(_as(image[shape.items[n][1]], types[n]) for n in keys)
        group = _group(held, keys, key)
        if group is None:
            if sign < 0:
                raise _Unsure  # a row it counted, in no group it holds
            group = _new_group(shape, held, keys, key)
        for n, (aggregate, column) in enumerate(shape.items):
            if aggregate is not None:
                _aggregate(
                    group, n, aggregate, _as(image[column], types[n])
                    if column else 1, sign, floors,
                )  # fmt: skip
        if not group[counted]:
            # Its last row left: what comes is all it will hold.
            _empty(shape, group, floors)
    if floors:
        raise _Unsure  # a min or max left a group that is still there
    kept = [r for r in held if r[counted]]
    if max_rows and len(kept) > max_rows:
        raise _Unsure  # which groups max_rows keeps: not told here
    return rows.derive(kept, False)


def _empty(shape, group, floors):
    for n, (aggregate, _) in enumerate(shape.items):
        if aggregate is not None:
            group[n] = 0 if aggregate == 'count' else None
            floors.pop((id(group), n), None)


def _group(held, keys, key):
    """The held group of ``key``; None where there is none; _Unsure where
    one may be it under a collation."""
    for row in held:
        orders = [compare(row[n], k) for n, k in zip(keys, key, strict=True)]
        if all(o == 0 for o in orders):
            return row
        if not any(o in (-1, 1, UNEQUAL) for o in orders):
            raise _Unsure
    return None


def _new_group(shape, held, keys, key):
    row = [None] * len(shape.items)
    for n, k in zip(keys, key, strict=True):
        row[n] = k
    _empty(shape, row, {})
    at = len(held)
    if shape.order:
        at = next(
            (i for i, h in enumerate(held) if _before(shape, row, h)),
            len(held),
        )
    held.insert(at, row)
    return row


def _aggregate(row, n, aggregate, value, sign, floors):
    current = row[n]
    if aggregate == 'count':
        row[n] = current + sign * (value is not None)
        return
    if value is None:
        return
    if aggregate == 'sum':
        if isinstance(value, float) or isinstance(current, float):
            raise _Unsure  # a float's sum depends on the order it is made
        if sign < 0:
            raise _Unsure  # the last value leaving makes it NULL, not 0
        # The database's sum of decimals is exact; Python's context keeps
        # 28 digits (one that this one would round is not patched).
        with decimal.localcontext(_EXACT):
            row[n] = value if current is None else current + value
        return
    lower = aggregate == 'min'
    floor = floors.get((id(row), n))
    if sign < 0:
        order = compare(value, current)
        if order is None or order == UNEQUAL or (order < 0) == lower and order:
            raise _Unsure
        if order == 0:  # the min (or max) left: the next is not held
            floors[(id(row), n)] = value
        return
    if current is None and floor is None:
        row[n] = value
        return
    order = compare(value, floor if floor is not None else current)
    if order is None or order == UNEQUAL:
        raise _Unsure
    if floor is not None:
        if order == 0 or (order < 0) == lower:
            row[n] = value
            del floors[(id(row), n)]
        return
    if order and (order < 0) == lower:
        row[n] = value
