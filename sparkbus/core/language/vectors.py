"""Typed value vectors: the values of one expression over a batch of messages, column by column.

A property may hold an int in one message and a string in the next, so a vector keeps one Arrow array
per value type ("parts"); a row has its value in at most one part, and in none when it is NULL or
unknown. Operators combine parts pairwise, so mixed types stay vectorised. Types follow the Service Bus
(C#) rules: int and float mix (int widens to float), strings compare ordinally, and any other pairing is
an evaluation error for the rows where both sides have values ("error" mask), never an exception. So is
a stored value no vector can hold (from_values).
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Optional, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..records import EPOCH

ARROW_TYPES = {
    "int": pa.int64(), "float": pa.float64(), "str": pa.string(), "bool": pa.bool_(),
    "datetime": pa.timestamp("us", tz="UTC"), "timespan": pa.duration("us"), "uuid": pa.string(),
    "bytes": pa.binary(),
}
NUMERIC = ("int", "float")
# What evaluating a stored row or rule that a check of this version would refuse (written by an older
# version or by another tool) can raise: caught where one message or one rule must not stop the rest.
EVALUATION_ERRORS = (ValueError, TypeError, KeyError, AttributeError, ArithmeticError, RecursionError,
                     pa.ArrowException)
ORDERED = {"int", "float", "str", "datetime", "timespan"}


def type_of(value: object) -> Optional[str]:
    """The type tag of a Python property value (None for NULL)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, datetime):
        return "datetime"
    if isinstance(value, timedelta):
        return "timespan"
    if isinstance(value, uuid.UUID):
        return "uuid"
    if isinstance(value, (bytes, bytearray)):
        return "bytes"
    raise TypeError(f"unsupported property value type {type(value).__name__}")


def _storable(tag: str, value: Any) -> object:
    """value (of the type tag names) as its vector holds it; OverflowError for an int beyond 64 bits."""
    if tag == "uuid":
        return str(value)
    if tag == "datetime" and value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    if tag == "int" and not -2 ** 63 <= value < 2 ** 63:
        raise OverflowError
    return value


@dataclass
class Vec:
    """parts: type tag -> array over all n rows (null where the row's value is not of that type);
    error: rows whose evaluation failed, with `reason` describing the first failure; exists: for property
    references, rows where the property is present (EXISTS)."""

    n: int
    parts: dict[str, pa.Array] = field(default_factory=dict)
    error: Optional[np.ndarray] = None
    reason: str = ""
    exists: Optional[np.ndarray] = None

    def valid(self) -> np.ndarray:
        """Rows that have a (non-NULL) value."""
        mask = np.zeros(self.n, dtype=bool)
        for array in self.parts.values():
            mask |= valid_mask(array)
        return mask

    def failed(self, mask: np.ndarray, reason: str) -> None:
        if mask.any():
            self.error = mask if self.error is None else (self.error | mask)
            self.reason = self.reason or reason

    def values(self) -> list[Any]:
        """Python values per row (None for NULL or failed rows)."""
        out: list[Any] = [None] * self.n
        for tag, array in self.parts.items():
            for i, v in enumerate(_to_python(tag, array)):
                if v is not None:
                    out[i] = v
        return out


def valid_mask(array: pa.Array) -> np.ndarray:
    return np.asarray(pc.is_valid(array).to_numpy(zero_copy_only=False), dtype=bool)


def _to_python(tag: str, array: pa.Array) -> list[Any]:
    if tag == "uuid":
        return [None if v is None else uuid.UUID(v) for v in array.to_pylist()]
    if tag == "datetime":
        micros = array.cast(pa.int64()).to_pylist()
        return [None if v is None else EPOCH + timedelta(microseconds=v) for v in micros]
    return cast(list[Any], array.to_pylist())


def from_values(values: list[Any], exists: Optional[np.ndarray] = None) -> Vec:
    """A vector of Python values (one per row), grouped by type. A value no vector can hold (an int beyond
    64 bits, a str with a lone surrogate, a value of another type: only a stored row written by an older
    version or another tool has one) is an evaluation error of its row, as a type mismatch is; the rows
    are looked at one by one only when a column cannot be built."""
    n = len(values)
    tags = [_tag_or_none(v) for v in values]  # None: a null; _UNUSABLE: no vector holds it
    vec = Vec(n, exists=exists)
    bad, problems = np.zeros(n, dtype=bool), []
    for tag in {t for t in tags if t is not None and t != _UNUSABLE}:
        try:
            vec.parts[tag] = pa.array([_storable(tag, v) if t == tag else None for v, t in zip(values, tags)],
                                      ARROW_TYPES[tag])
        except (OverflowError, ValueError, pa.ArrowException):
            usable = [t != tag or _fits(tag, v) for v, t in zip(values, tags)]
            bad |= ~np.array(usable, dtype=bool)
            problems.append(_UNFIT.get(tag, f"a {tag} value no vector can hold"))
            vec.parts[tag] = pa.array([_storable(tag, v) if t == tag and ok else None
                                       for v, t, ok in zip(values, tags, usable)], ARROW_TYPES[tag])
    if _UNUSABLE in tags:
        unusable = np.array([t == _UNUSABLE for t in tags], dtype=bool)
        bad |= unusable
        kind = type(values[int(np.flatnonzero(unusable)[0])]).__name__
        problems.append(f"a value of type {kind}, which filters and actions cannot use")
    vec.failed(bad, " or ".join(sorted(problems)))  # one reason for the vector's rows: each of them is one of these
    return vec


_UNUSABLE = "unusable"  # the tag from_values gives a value of a type filters have no vector for
_UNFIT = {"int": "an int beyond the signed 64-bit range", "str": "a str holding a lone surrogate (not Unicode text)"}


def _tag_or_none(value: object) -> Optional[str]:
    try:
        return type_of(value)
    except TypeError:
        return _UNUSABLE


def _fits(tag: str, value: object) -> bool:
    """Whether a value of the tag's type can be put in a vector (pa.array refused a column holding it)."""
    try:
        pa.array([_storable(tag, value)], ARROW_TYPES[tag])
    except (OverflowError, ValueError, pa.ArrowException):
        return False
    return True


def constant(value: object, n: int) -> Vec:
    """value in every row; ValueError for a value no vector can hold (a rule stored before it was checked)."""
    tag = type_of(value)
    if tag is None:
        return Vec(n)
    try:
        return Vec(n, {tag: pa.repeat(pa.scalar(_storable(tag, value), ARROW_TYPES[tag]), n)})
    except (OverflowError, ValueError, pa.ArrowException):
        raise ValueError(f"the value is {_UNFIT.get(tag, f'a {tag} value no vector can hold')}") from None


def column(tag: str, array: pa.Array) -> Vec:
    return Vec(len(array), {tag: array.cast(ARROW_TYPES[tag])})


def _merge_errors(*vecs: Vec) -> tuple[Optional[np.ndarray], str]:
    error, reason = None, ""
    for v in vecs:
        if v.error is not None:
            error = v.error if error is None else (error | v.error)
            reason = reason or v.reason
    return error, reason


def _add_part(out: Vec, tag: str, array: pa.Array) -> None:
    out.parts[tag] = array if tag not in out.parts else pc.coalesce(out.parts[tag], array)


def _both(a: pa.Array, b: pa.Array) -> np.ndarray:
    return cast(np.ndarray, valid_mask(a) & valid_mask(b))


def _numbers(array: pa.Array, dtype: type) -> np.ndarray:
    return np.asarray(pc.fill_null(array, 0).to_numpy(zero_copy_only=False), dtype=dtype)


def _int_division(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C# integer / (truncating toward zero) and % (sign of the dividend)."""
    quotient: np.ndarray = (np.abs(a) // np.abs(b)) * np.sign(a) * np.sign(b)
    return quotient if op == "/" else a - quotient * b


def _arithmetic(op: str, ta: str, a: pa.Array, tb: str, b: pa.Array, out: Vec) -> None:
    both = _both(a, b)
    if ta in NUMERIC and tb in NUMERIC:
        tag = "int" if ta == tb == "int" else "float"
        dtype = np.int64 if tag == "int" else np.float64
        x, y = _numbers(a, dtype), _numbers(b, dtype)
        if op in "/%":
            zero = both & (y == 0)
            out.failed(zero, "division by zero")
            both = both & ~zero
            y = np.where(y == 0, 1, y)
            if tag == "int":
                result = _int_division(op, x, y)
            else:
                result = x / y if op == "/" else np.fmod(x, y)
        else:
            with np.errstate(over="ignore"):
                result = {"+": np.add, "-": np.subtract, "*": np.multiply}[op](x, y)
        _add_part(out, tag, pa.array(result, ARROW_TYPES[tag], mask=~both))
        return
    if op == "+" and ta == tb == "str":
        _add_part(out, "str", pc.binary_join_element_wise(a, b, ""))
        return
    timed = {("datetime", "timespan", "+"): "datetime", ("timespan", "datetime", "+"): "datetime",
             ("datetime", "timespan", "-"): "datetime", ("datetime", "datetime", "-"): "timespan",
             ("timespan", "timespan", "+"): "timespan", ("timespan", "timespan", "-"): "timespan"}
    timed_tag = timed.get((ta, tb, op))
    if timed_tag is not None:
        x, y = _numbers(a.cast(pa.int64()), np.int64), _numbers(b.cast(pa.int64()), np.int64)
        result = x + y if op == "+" else x - y
        _add_part(out, timed_tag, pa.array(result, pa.int64(), mask=~both).cast(ARROW_TYPES[timed_tag]))
        return
    out.failed(both, f"operator {op} cannot combine {ta} and {tb} values")


_COMPARE: dict[str, Callable[..., Any]] = {"=": pc.equal, "<>": pc.not_equal, ">": pc.greater, ">=": pc.greater_equal,
                                 "<": pc.less, "<=": pc.less_equal}


def _comparison(op: str, ta: str, a: pa.Array, tb: str, b: pa.Array, out: Vec) -> None:
    if ta in NUMERIC and tb in NUMERIC and ta != tb:
        a, b = a.cast(pa.float64()), b.cast(pa.float64())
    elif ta != tb:
        out.failed(_both(a, b), f"cannot compare {ta} with {tb}")
        return
    elif op not in ("=", "<>") and ta not in ORDERED:
        out.failed(_both(a, b), f"{ta} values can only be compared with = and <>")
        return
    _add_part(out, "bool", _COMPARE[op](a, b))


def binary(op: str, left: Vec, right: Vec) -> Vec:
    """Arithmetic (+ - * / %) or comparison (= <> > >= < <=) of two vectors."""
    error, reason = _merge_errors(left, right)
    out = Vec(left.n, error=error, reason=reason)
    combine = _comparison if op in _COMPARE else _arithmetic
    for ta, a in left.parts.items():
        for tb, b in right.parts.items():
            combine(op, ta, a, tb, b, out)
    if out.error is not None:  # failed rows carry no value
        for tag, array in out.parts.items():
            out.parts[tag] = pc.if_else(pa.array(out.error), pa.nulls(out.n, array.type), array)
    return out


def negate(operand: Vec) -> Vec:
    out = Vec(operand.n, error=operand.error, reason=operand.reason)
    for tag, array in operand.parts.items():
        if tag in NUMERIC or tag == "timespan":
            out.parts[tag] = pc.negate(array)
        else:
            out.failed(valid_mask(array), f"unary - cannot apply to a {tag} value")
    return out


def truth(vec: Vec) -> tuple[pa.Array, Vec]:
    """The vector as a three-valued boolean array; non-boolean values are errors."""
    out = Vec(vec.n, error=vec.error, reason=vec.reason)
    for tag, array in vec.parts.items():
        if tag != "bool":
            out.failed(valid_mask(array), f"a {tag} value is not a condition")
    return vec.parts.get("bool", pa.nulls(vec.n, pa.bool_())), out


def logical(op: str, left: Vec, right: Vec) -> Vec:
    a, ea = truth(left)
    b, eb = truth(right)
    error, reason = _merge_errors(ea, eb)
    kernel = pc.and_kleene if op == "and" else pc.or_kleene
    return Vec(left.n, {"bool": kernel(a, b)}, error, reason)


def invert(operand: Vec) -> Vec:
    a, checked = truth(operand)
    return Vec(operand.n, {"bool": pc.invert(a)}, checked.error, checked.reason)


def is_null(operand: Vec, negated: bool) -> Vec:
    present = operand.valid()
    return Vec(operand.n, {"bool": pa.array(present if negated else ~present)}, operand.error, operand.reason)


def like(operand: Vec, regex: str, negated: bool) -> Vec:
    out = Vec(operand.n, error=operand.error, reason=operand.reason)
    for tag, array in operand.parts.items():
        if tag == "str":
            matched = pc.match_substring_regex(array, regex)
            out.parts["bool"] = pc.invert(matched) if negated else matched
        else:
            out.failed(valid_mask(array), f"LIKE needs a string, got a {tag} value")
    return out


def like_regex(pattern: str, escape: Optional[str]) -> str:
    """An anchored RE2 expression equivalent to a LIKE pattern (% any run, _ one character)."""
    parts, i = ["(?s)^"], 0
    while i < len(pattern):
        c = pattern[i]
        if escape is not None and c == escape and i + 1 < len(pattern):
            parts.append(_re_escape(pattern[i + 1]))
            i += 2
            continue
        parts.append(".*" if c == "%" else "." if c == "_" else _re_escape(c))
        i += 1
    parts.append("$")
    return "".join(parts)


def _re_escape(c: str) -> str:
    return "\\" + c if c in r".^$*+?()[]{}|\/-" else c
