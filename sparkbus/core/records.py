"""Rows as stored and as Python sees them: times as microseconds since the epoch, rows as dicts or as views of
a table's columns, and back to Arrow. Pure conversions, no storage: the engine's reads hand their tables
here, and received messages read their fields through Columns and Row.
"""
from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any, Optional, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_US = timedelta(microseconds=1)


def micros(moment: datetime) -> int:
    """A UTC time as stored: microseconds since the epoch."""
    return (moment - EPOCH) // _US


@functools.lru_cache(maxsize=256)
def _few_nulls(count: int, kind: pa.DataType) -> pa.Array:
    return pa.nulls(count, kind)


def nulls(count: int, kind: pa.DataType) -> pa.Array:
    """pa.nulls(count, kind), the same immutable array each time for a few (a single message's row leaves
    most of its columns null: made afresh, they cost it 20 us)."""
    return _few_nulls(count, kind) if count <= 16 else pa.nulls(count, kind)


def conformed(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """The table's columns of the schema, in its order and types (ValueError when a non-nullable one holds a
    null): the table itself when it is so already, relabelled when only nullability differs (Table.cast
    calls a cast kernel per column even then: a single receive + complete made 58 of them)."""
    if table.schema.equals(schema):
        return table
    if table.schema.names != schema.names:
        table = table.select(schema.names)
    if any(a.type != b.type for a, b in zip(table.schema, schema)):
        return table.cast(schema)
    for field, column in zip(schema, table.columns):
        if not field.nullable and column.null_count:
            raise ValueError(f"Casting field {field.name!r} with null values to non-nullable")
    return pa.Table.from_arrays(table.columns, schema=schema)


def from_rows(rows: Sequence[Mapping[str, Any]], schema: pa.Schema) -> pa.Table:
    """Rows (dicts) as a table, column by column: Table.from_pylist took 15.6 ms for 1,000 state rows
    with two timestamp columns, this 1.2 ms."""
    return pa.table([pa.array([row[f.name] for row in rows], f.type) for f in schema], schema=schema)


def as_rows(table: pa.Table) -> list[dict[str, Any]]:
    """Rows as dicts, like Table.to_pylist but about 20x faster on timestamp columns (pyarrow spends
    ~8 us per tz-aware datetime; epoch + timedelta takes a fraction of that)."""
    columns = [_values(table[field.name], field.type) for field in table.schema]
    names = table.schema.names
    return [dict(zip(names, values)) for values in zip(*columns)]


def _values(column: pa.ChunkedArray, kind: pa.DataType) -> list[Any]:
    """A column as Python values (timestamps in microseconds as UTC datetimes, the fast way)."""
    if pa.types.is_timestamp(kind) and kind.unit == "us":
        return [None if v is None else EPOCH + timedelta(microseconds=v) for v in column.cast(pa.int64()).to_pylist()]
    return cast(list[Any], column.to_pylist())


# Microseconds since the epoch that a datetime can hold (years 1 to 9999).
_DATETIME_MICROS = tuple(micros(limit.replace(tzinfo=timezone.utc)) for limit in (datetime.min, datetime.max))


def stored_int64s(column: pa.ChunkedArray) -> np.ndarray:
    """The values a signed integer or timestamp column stores, as int64, read from its buffers without a
    cast or a kernel (a cast, a fill and a conversion cost a single receive 40 us); arbitrary where null.
    Copied only across chunks and from narrower integers."""
    width = column.type.bit_width // 8
    chunks = [np.zeros(len(chunk), np.int64) if (data := chunk.buffers()[1]) is None else
              np.frombuffer(data, dtype=f"<i{width}", count=len(chunk), offset=chunk.offset * width).astype(
                  np.int64, copy=False) for chunk in column.chunks]
    return chunks[0] if len(chunks) == 1 else np.concatenate(chunks) if chunks else np.zeros(0, np.int64)


class Columns:
    """A table's rows read column by column, each column made Python values (as as_rows makes them) the
    first time one of its values is asked for: one conversion per column a caller uses instead of a dict
    per row (received messages read their fields this way, sparkbus.receiver).

    Made from a table, every value is checked up front, vectorised, to have a Python form (text that is
    UTF-8, times within datetime's range): a table where one has none raises what as_rows raises for it,
    here and not where the value is read later. KeyError names a column the rows do not have. Threads may
    share one: a column two of them convert at once is converted twice, to equal lists, and either kept.
    Whoever keeps a row keeps the whole table (a receive's messages share theirs)."""

    __slots__ = ("_lists", "_names", "table")

    def __init__(self, table: pa.Table) -> None:
        _check_convertible(table)
        self.table: Optional[pa.Table] = table
        self._names = table.column_names
        self._lists: dict[str, list[Any]] = {}

    @classmethod
    def of_rows(cls, rows: list[Mapping[str, Any]]) -> "Columns":
        """Rows given as mappings of the same keys (no table behind them)."""
        made = cls.__new__(cls)
        made.table = None
        made._lists = {name: [row[name] for row in rows] for name in (rows[0] if rows else ())}
        made._names = list(made._lists)
        return made

    def column(self, name: str) -> list[Any]:
        """The column's values."""
        values = self._lists.get(name)
        if values is None:
            if self.table is None or name not in self._names:
                raise KeyError(name)
            values = self._lists[name] = _values(self.table[name], self.table.schema.field(name).type)
        return values

    def names(self) -> list[str]:
        return list(self._names)

    def has(self, name: str) -> bool:
        return name in self._lists or name in self._names


def _check_convertible(table: pa.Table) -> None:
    """Raise what as_rows would raise for the table when one of its values has no Python form (text that
    is not UTF-8: Parquet readers do not check; a time beyond datetime's range)."""
    try:
        table.validate(full=True)
        for i, kind in enumerate(table.schema.types):  # (not the fields and columns: 20 us a row)
            if not isinstance(kind, pa.TimestampType):
                continue
            column = table.column(i)
            if column.null_count == len(column):
                continue
            # numpy's min and max: Arrow's cast and kernel cost 5x as much on a single receive's row
            if kind.unit == "us":
                micros = stored_int64s(column)
                if column.null_count:
                    micros = micros[np.asarray(pc.is_valid(column), dtype=bool)]
            else:
                micros = column.drop_null().to_numpy().astype("datetime64[us]").view(np.int64)
            if micros.min() < _DATETIME_MICROS[0] or micros.max() > _DATETIME_MICROS[1]:
                raise OverflowError(f"{table.schema.names[i]} holds a time beyond datetime's range")
    except (pa.ArrowInvalid, OverflowError):
        as_rows(table)
        raise


class Row(Mapping[str, Any]):
    """One row of Columns, as a read-only mapping of column name to value."""

    __slots__ = ("columns", "index")

    def __init__(self, columns: Columns, index: int) -> None:
        self.columns = columns
        self.index = index

    def __getitem__(self, name: str) -> object:
        return self.columns.column(name)[self.index]

    def get(self, name: str, default: object = None) -> object:
        return self.columns.column(name)[self.index] if self.columns.has(name) else default

    def __iter__(self) -> Iterator[str]:
        return iter(self.columns.names())

    def __len__(self) -> int:
        return len(self.columns.names())
