"""One user property of a batch of messages, read out of the stored encoding without decoding every row.

Application properties are stored as JSON objects of type-tagged values (sparkbus.core.values:
`{"amount":["int",5],"kind":["str","a"]}`, compact separators, ASCII only). A filter needs a few
properties of every message, and decoding each row's JSON in Python costs more than evaluating all rules
together, so a property is extracted with one regular expression over the whole column (RE2, in Arrow).

The expression is exact only where the text is simple: no backslash (so every `"` delimits a JSON string,
and `"name":` can only be a key) and ASCII only (so RE2's case folding is Python's str.lower). Rows that
are not simple, and values of the tags the expression does not convert (bytes, datetime, uuid, timedelta,
integers too long to be sure they fit), are decoded in Python. Property names are matched
case-insensitively; a row that has the name twice in different cases is decoded in Python, where the last
one wins, as when the decoded dict is lowered.
"""
from __future__ import annotations

import json
import re
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..values import decode_properties
from . import vectors
from .vectors import Vec

_VALUE = r':\["(?P<tag>[a-z]+)",(?P<raw>"[^"]*"|[^\]]*)\]'
_MISSING = object()
_LONGEST_SURE_INT = 18  # digits (plus a sign) that always fit in int64


def simple_rows(texts: pa.Array) -> np.ndarray:
    """Rows whose text the regular expressions read exactly: ASCII without backslashes (or no text)."""
    complex_rows: np.ndarray = _mask(pc.invert(pc.string_is_ascii(texts))) | _mask(pc.match_substring(texts, "\\"))
    return ~complex_rows


def user_property(texts: pa.Array, name: str, simple: Optional[np.ndarray] = None) -> Vec:
    """The values of user property `name` (case-insensitive) for each stored text; absent -> NULL with
    EXISTS false. simple: simple_rows(texts), when the caller reads several properties of the same texts.
    A value no vector can hold, or a stored text that does not decode, is an evaluation error of its row
    (as in vectors.from_values)."""
    n = len(texts)
    key = json.dumps(name.lower())
    simple = (simple_rows(texts) if simple is None else simple).copy()
    if "\\" in key or not key.isascii():
        simple[:] = False
    name_pattern = "[{,](?i:" + re.escape(key) + ")"
    simple &= ~_mask(pc.greater(pc.count_substring_regex(texts, name_pattern + ":"), 1))  # last one wins: Python
    found = pc.extract_regex(texts, name_pattern + _VALUE)
    matched = _mask(pc.is_valid(found)) & simple
    tags, raws = found.field("tag"), found.field("raw")
    exists = matched.copy()
    vec = Vec(n, exists=exists)
    handled = matched & _mask(pc.equal(tags, "null"))
    for tag in ("int", "float", "str", "bool"):
        rows = matched & _mask(pc.equal(tags, tag))
        if tag == "int":
            rows &= _mask(pc.less_equal(pc.utf8_length(raws), _LONGEST_SURE_INT + 1))
        if not rows.any():
            continue
        handled |= rows
        picked = pc.if_else(pa.array(rows), raws, pa.nulls(n, pa.string()))
        vec.parts[tag] = _convert(tag, picked)
    slow = ~(handled | (simple & ~matched))  # simple rows without the key: absent, nothing to decode
    if slow.any():
        _decode_rows(vec, texts, name.lower(), np.flatnonzero(slow))
    return vec


def _convert(tag: str, raw: pa.Array) -> pa.Array:
    if tag == "int":
        return pc.cast(raw, pa.int64())
    if tag == "float":
        return pc.cast(raw, pa.float64())
    if tag == "bool":
        return pc.equal(raw, "true")
    return pc.utf8_slice_codeunits(raw, 1, -1)  # the quotes; no escapes in a simple row


def _decode_rows(vec: Vec, texts: pa.Array, lowered: str, rows: np.ndarray) -> None:
    """Decode the given rows in Python and merge their values into vec's parts."""
    values, undecodable, problem = [], np.zeros(vec.n, dtype=bool), ""
    for row, text in zip(rows.tolist(), texts.take(pa.array(rows)).to_pylist()):
        found = _MISSING
        try:
            stored = decode_properties(text)
        except vectors.EVALUATION_ERRORS as error:  # written by another tool: an error of its row
            undecodable[row] = True
            problem = problem or f"the stored application properties cannot be decoded: {error}"
            stored = {}
        for k, v in stored.items():
            if k.lower() == lowered:
                found = v
        values.append(found)
    vec.failed(undecodable, problem)
    present = np.array([v is not _MISSING for v in values], dtype=bool)
    assert vec.exists is not None  # a property reference's vector (made with exists)
    vec.exists[rows] = present
    decoded = vectors.from_values([None if v is _MISSING else v for v in values])
    mask = np.zeros(vec.n, dtype=bool)
    mask[rows] = True
    if decoded.error is not None:
        failed = np.zeros(vec.n, dtype=bool)
        failed[rows] = decoded.error
        vec.failed(failed, decoded.reason)
    for tag, part in decoded.parts.items():
        base = vec.parts.get(tag, pa.nulls(vec.n, vectors.ARROW_TYPES[tag]))
        vec.parts[tag] = pc.replace_with_mask(base, pa.array(mask), part)


def _mask(array: pa.Array) -> np.ndarray:
    return np.asarray(pc.fill_null(array, False).to_numpy(zero_copy_only=False), dtype=bool)
