"""Parquet files of a few rows, encoded in Python.

Why: a single send, receive or settlement commits a data file of one row, and pyarrow's writer costs a
fixed 150-450 us for it (its writer's set-up, its per-column encoders and footer; the upper figure after
a commit's wait, with the caches cold). A file of a few flat rows is simple to encode: one row group, one
data page per column (PLAIN values, no compression, definition levels for the nullable columns), a Thrift
footer. This module writes exactly that and nothing else: `encoded` returns None for a table it does not
cover (more than MAX_ROWS rows or MAX_BYTES of buffers, or a column type other than int32, int64, string,
binary and timestamp[us]), which the caller then writes with pyarrow.

The files are plain Parquet that pyarrow, delta-rs and Spark read back as the same Arrow types (format
version 1 data pages; strings with the STRING logical type, timestamps as TIMESTAMP(MICROS), adjusted to
UTC when the type has a time zone). Like the files sparkbus writes with pyarrow, they carry no Arrow
schema and no page index; they carry no Parquet statistics either (a Delta table's are in its log).
Values are copied from the columns' buffers as they are (strings as their bytes, never decoded), so a
row read from an older file is written back unchanged.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Collection, Optional

import pyarrow as pa

MAX_ROWS = 64
MAX_BYTES = 1 << 20
CREATED_BY = b"sparkbus"

# Parquet's enums (parquet.thrift)
_INT32, _INT64, _BYTE_ARRAY = 1, 2, 6
_REQUIRED, _OPTIONAL = 0, 1
_UTF8, _TIMESTAMP_MICROS = 0, 10
_PLAIN, _RLE = 0, 3
_DATA_PAGE, _UNCOMPRESSED = 0, 0
# Thrift compact protocol's types
_TRUE, _FALSE, _I32, _I64, _BINARY, _LIST, _STRUCT = 1, 2, 5, 6, 8, 9, 12

Field = tuple[int, int, bytes]  # (field id, compact type, encoded value)


def encoded(table: pa.Table, statistics: Collection[str] = ()) -> Optional[bytes]:
    """The table as the bytes of a Parquet file, with Parquet statistics (null count, minimum and maximum)
    for the columns named in statistics (as pyarrow, none in a file of no rows), or None when this module
    does not cover it (see the module docstring)."""
    rows = table.num_rows
    if rows > MAX_ROWS or table.get_total_buffer_size() > MAX_BYTES:
        return None
    plan = _plan(table.schema)
    if plan is None:
        return None
    columns = table.columns
    if any(column.null_count and not kind.nullable for kind, column in zip(plan.columns, columns)):
        return None  # (pyarrow says what is wrong with it)
    # The structs below are spelled out byte by byte (the struct helpers cost a one-row file 60 us): a field
    # header is (id - previous id) << 4 | type, so 0x15/0x16 is the next field, an i32/i64; 0x19 the next, a
    # list; 0x1c the next, a struct; 0x26, 0x28, 0x2c two ids on, an i64, a binary, a struct; 0x00 ends one.
    out = bytearray(b"PAR1")
    chunks = bytearray()
    count = _int(rows)
    # data_page_header: num_values, encoding PLAIN, definition and repetition levels RLE; both structs end
    page_tail = b"\x2c\x15" + count + b"\x15" + _int(_PLAIN) + b"\x15" + _int(_RLE) + b"\x15" + _int(_RLE) + b"\x00\x00"
    total = 0
    for kind, column, name in zip(plan.columns, columns, table.schema.names):
        page, values = _page(kind, column)
        size = _int(len(page))
        header = b"\x15\x00\x15" + size + b"\x15" + size + page_tail
        offset = _int(len(out))
        chunk = len(header) + len(page)
        total += chunk
        out += header
        out += page
        length = _int(chunk)
        # ColumnChunk: file_offset, meta_data (its fixed fields, then num_values, sizes, data_page_offset)
        chunks += b"\x26" + offset + b"\x1c" + kind.meta + b"\x16" + count + b"\x16" + length + b"\x16" + length \
            + b"\x26" + offset + (_statistics(kind, values, rows - len(values)) if rows and name in statistics else b"") \
            + b"\x00\x00"
    # FileMetaData: version 1, schema, num_rows, row_groups (one: columns, total_byte_size, num_rows,
    # file_offset, total_compressed_size), created_by
    footer = b"\x15\x02\x19" + plan.schema + b"\x16" + count + b"\x19\x1c\x19" + plan.columns_header + chunks \
        + b"\x16" + _int(total) + b"\x16" + count + b"\x26" + _int(4) + b"\x16" + _int(total) + b"\x00" \
        + b"\x28" + _bytes(CREATED_BY) + b"\x19" + plan.column_orders + b"\x00"
    out += footer
    out += struct.pack("<I", len(footer)) + b"PAR1"
    return bytes(out)


@dataclass(frozen=True)
class _Column:
    """What a column's pages and metadata need, fixed for its field."""

    physical: int
    nullable: bool
    view: pa.DataType  # the type its values are read as (bytes or integers)
    format: str  # struct's code of one value (integers)
    meta: bytes  # ColumnMetaData's fields 1-4: type, encodings, path_in_schema, codec


@dataclass(frozen=True)
class _Plan:
    columns: tuple[_Column, ...]
    schema: bytes  # FileMetaData's schema list
    columns_header: bytes  # the row group's list header of its column chunks
    column_orders: bytes  # FileMetaData's column orders: each column's type-defined order (its statistics' order)


def _page(kind: _Column, column: pa.ChunkedArray) -> tuple[bytes, list[Any]]:
    """A data page's content (the definition levels of a nullable column, then the PLAIN values set) and
    the values set."""
    chunks = column.chunks
    values = chunks[0].view(kind.view).to_pylist() if len(chunks) == 1 else \
        [value for chunk in chunks for value in chunk.view(kind.view).to_pylist()]
    page = bytearray()
    if kind.nullable:
        if column.null_count:
            levels = _levels([value is not None for value in values])
            values = [value for value in values if value is not None]
        else:
            levels = _varint(len(values) << 1) + b"\x01"
        page += struct.pack("<I", len(levels))
        page += levels
    if kind.physical == _BYTE_ARRAY:
        for value in values:
            page += struct.pack("<I", len(value))
            page += value
    else:
        page += struct.pack(f"<{len(values)}{kind.format}", *values)
    return bytes(page), values


@lru_cache(maxsize=64)
def _plan(schema: pa.Schema) -> Optional[_Plan]:
    """The fixed parts of a schema's files, or None when a field's type is not covered."""
    layout = _layout(schema)
    if layout is None:
        return None
    columns = []
    for field, (physical, nullable) in zip(schema, layout):
        encodings = [_int(_PLAIN), _int(_RLE)] if nullable else [_int(_PLAIN)]
        meta = _struct((1, _I32, _int(physical)), (2, _LIST, _list(_I32, encodings)),
                       (3, _LIST, _list(_BINARY, [_bytes(field.name.encode())])),
                       (4, _I32, _int(_UNCOMPRESSED)))[:-1]  # (open: the varying fields follow)
        view = pa.binary() if physical == _BYTE_ARRAY else pa.int32() if physical == _INT32 else pa.int64()
        columns.append(_Column(physical, nullable, view, "i" if physical == _INT32 else "q", meta))
    orders = _list(_STRUCT, [_struct((1, _STRUCT, _struct()))] * len(columns))  # ColumnOrder.TYPE_ORDER
    return _Plan(tuple(columns), _schema_elements(schema), _list_header(_STRUCT, len(columns)), orders)


def _statistics(kind: _Column, values: list[Any], nulls: int) -> bytes:
    """ColumnMetaData's statistics (field 12): null_count, max_value, min_value (integers little-endian,
    bytes compared unsigned, as Parquet's type-defined order says)."""
    out = b"\x3c\x36" + _int(nulls)
    if values:
        if kind.physical == _BYTE_ARRAY:
            low, high = min(values), max(values)
        else:
            low, high = (struct.pack(f"<{kind.format}", v) for v in (min(values), max(values)))
        out += b"\x28" + _bytes(high) + b"\x18" + _bytes(low)
    return out + b"\x00"


@lru_cache(maxsize=64)
def _layout(schema: pa.Schema) -> Optional[tuple[tuple[int, bool], ...]]:
    """(physical type, nullable) per field, or None when a field's type is not covered."""
    layout = []
    for field in schema:
        kind = field.type
        if kind == pa.int32():
            physical = _INT32
        elif kind == pa.int64() or (pa.types.is_timestamp(kind) and kind.unit == "us"):
            physical = _INT64
        elif kind in (pa.string(), pa.binary()):
            physical = _BYTE_ARRAY
        else:
            return None
        layout.append((physical, field.nullable))
    return tuple(layout)


@lru_cache(maxsize=64)
def _schema_elements(schema: pa.Schema) -> bytes:
    """FileMetaData's schema list (the root, then one element per column): the same for every file of a
    schema."""
    layout = _layout(schema)
    assert layout is not None
    elements = [_struct((4, _BINARY, _bytes(b"schema")), (5, _I32, _int(len(schema))))]
    for field, (physical, nullable) in zip(schema, layout):
        kind = field.type
        fields: list[Field] = [(1, _I32, _int(physical)), (3, _I32, _int(_OPTIONAL if nullable else _REQUIRED)),
                               (4, _BINARY, _bytes(field.name.encode()))]
        if kind == pa.string():  # converted type UTF8, logical type STRING (LogicalType field 1)
            fields += [(6, _I32, _int(_UTF8)), (10, _STRUCT, _struct((1, _STRUCT, _struct())))]
        elif pa.types.is_timestamp(kind):  # logical type TIMESTAMP (field 8): isAdjustedToUTC, unit MICROS (2)
            utc = kind.tz is not None
            if utc:  # (a converted type says adjusted to UTC)
                fields.append((6, _I32, _int(_TIMESTAMP_MICROS)))
            unit = _struct((2, _STRUCT, _struct()))
            timestamp = _struct((1, _TRUE if utc else _FALSE, b""), (2, _STRUCT, unit))
            fields.append((10, _STRUCT, _struct((8, _STRUCT, timestamp))))
        elements.append(_struct(*fields))
    return _list(_STRUCT, elements)


def _levels(present: list[bool]) -> bytes:
    """Definition levels of bit width 1 in the RLE/bit-packed hybrid encoding: one RLE run per stretch of
    equal levels."""
    out = bytearray()
    start = 0
    for i in range(1, len(present) + 1):
        if i == len(present) or present[i] != present[start]:
            out += _varint((i - start) << 1)
            out.append(1 if present[start] else 0)
            start = i
    return bytes(out)


# Thrift's compact protocol, as far as the structs above need it.

def _struct(*fields: Field) -> bytes:
    """A struct of fields in increasing id order (each header a delta from the previous id), ended."""
    out = bytearray()
    last = 0
    for number, kind, value in fields:
        delta = number - last
        if 0 < delta <= 15:
            out.append((delta << 4) | kind)
        else:
            out.append(kind)
            out += _varint(_zigzag(number))
        out += value
        last = number
    out.append(0)
    return bytes(out)


def _list(kind: int, elements: list[bytes]) -> bytes:
    return _list_header(kind, len(elements)) + b"".join(elements)


def _list_header(kind: int, size: int) -> bytes:
    return bytes(((size << 4) | kind,)) if size < 15 else bytes((0xF0 | kind,)) + _varint(size)


@lru_cache(maxsize=4096)
def _int(value: int) -> bytes:
    """An i32 or i64 field's value: zigzag, then varint (the same few sizes and offsets recur)."""
    return _varint(_zigzag(value))


def _bytes(value: bytes) -> bytes:
    return _varint(len(value)) + value


def _zigzag(value: int) -> int:
    return (value << 1) ^ (value >> 63)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
