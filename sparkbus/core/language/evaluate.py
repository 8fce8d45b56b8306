"""Evaluating filter trees and running actions over a batch of messages (pure: Arrow in, Arrow out).

A MessageView is a batch of stored message rows (the MESSAGES columns) with their application
properties decoded once. evaluate() walks a tree once per batch, not once per message: every node
becomes a typed vector (sparkbus.core.language.vectors). A missing user property is NULL (unknown); a
missing or unknown system property cannot occur, the parser rejects it. Errors (type mismatches,
division by zero, a stored property value no vector can hold or a stored text that does not decode) mark
rows; what raises is a rule that cannot be evaluated at all (a parameter no vector can hold) or a row
malformed beyond that, which sparkbus.core.language.compiled.select isolates.
"""
from __future__ import annotations

import uuid
from typing import Any, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..encoding import LENGTH_LIMITED
from ..wire import MAX_ID_LENGTH
from ..values import decode_properties
from . import vectors
from .properties import simple_rows, user_property
from .syntax import (Binary, Call, Constant, Exists, In, IsNull, Like, Node, Parameter, Property, RemoveStatement,
                     Statement, Unary)
from .vectors import Vec

# System property -> (column, type tag); Label is Subject's older name.
SYSTEM_COLUMNS = {
    "MessageId": ("message_id", "str"), "CorrelationId": ("correlation_id", "str"), "To": ("to", "str"),
    "ReplyTo": ("reply_to", "str"), "Label": ("subject", "str"), "Subject": ("subject", "str"),
    "SessionId": ("session_id", "str"), "ReplyToSessionId": ("reply_to_session_id", "str"),
    "ContentType": ("content_type", "str"), "PartitionKey": ("partition_key", "str"),
    "SequenceNumber": ("sequence_number", "int"), "EnqueuedTimeUtc": ("enqueued_time_utc", "datetime"),
    "ScheduledEnqueueTimeUtc": ("scheduled_enqueue_time_utc", "datetime"),
}
_MISSING = object()


class MessageView:
    """A batch of message rows as filters see them; actions change a view in place (set_user/set_system)."""

    def __init__(self, rows: pa.Table, properties: Optional[list[dict[str, Any]]] = None) -> None:
        self.rows = rows
        self.n = rows.num_rows
        self._properties = properties
        self._lowered: Optional[list[dict[str, Any]]] = None
        self._users: dict[str, Vec] = {}  # by lower-case name: every rule of every subscription shares them
        self._system: dict[str, pa.Array] = {}
        self._texts: Optional[pa.Array] = None  # stored application property texts, and which are simple
        self._simple: Optional[np.ndarray] = None

    def properties(self) -> list[dict[str, Any]]:
        """Decoded application properties per row (decoded on first use)."""
        if self._properties is None:
            texts = self.rows["application_properties"].to_pylist() if self.n else []
            self._properties = [decode_properties(t) for t in texts]
        return self._properties

    def user(self, name: str) -> Vec:
        """A user property by name, matched case-insensitively; absent -> NULL, EXISTS false."""
        low = name.lower()
        if low in self._users:
            return self._users[low]
        if self._properties is None:  # the stored texts are current: read the one property, vectorised
            if self._texts is None:
                self._texts = self.rows["application_properties"].combine_chunks() if self.n else pa.array([], pa.string())
                self._simple = simple_rows(self._texts)
            vec = user_property(self._texts, name, self._simple)
        else:
            if self._lowered is None:
                self._lowered = [{k.lower(): v for k, v in p.items()} if p else {} for p in self.properties()]
            found = [p.get(low, _MISSING) for p in self._lowered]
            exists = np.fromiter((v is not _MISSING for v in found), dtype=bool, count=self.n)
            vec = vectors.from_values([None if v is _MISSING else v for v in found], exists)
        if vec.error is not None:
            vec.reason = f"user property {name!r}: {vec.reason}"
        self._users[low] = vec
        return vec

    def system(self, name: str) -> Vec:
        if name in self._system:
            return vectors.column("str", self._system[name])
        if name in ("Label", "Subject") and ("Subject" in self._system or "Label" in self._system):
            return vectors.column("str", self._system.get("Subject", self._system.get("Label")))
        if name in SYSTEM_COLUMNS:
            column, tag = SYSTEM_COLUMNS[name]
            return vectors.column(tag, self._column(column, vectors.ARROW_TYPES[tag]))
        if name == "TimeToLive":
            ms = self._column("time_to_live_ms", pa.int64())
            return vectors.column("timespan", pc.multiply(ms, 1000).cast(pa.duration("us")))
        if name == "DeliveryCount":
            return vectors.column("int", self._column("delivery_count", pa.int64(), default=0))
        if name == "Size":
            return vectors.column("int", pc.add(self._column("body_size", pa.int64(), default=0),
                                                self._column("header_size", pa.int64(), default=0)))
        raise ValueError(f"unknown system property {name!r}")

    def _column(self, name: str, dtype: pa.DataType, default: object = None) -> pa.Array:
        if name in self.rows.column_names:
            return pc.cast(self.rows[name].combine_chunks(), dtype)
        return pa.repeat(pa.scalar(default, dtype), self.n)

    def rows_at(self, positions: np.ndarray) -> pa.Table:
        """The stored rows at the given positions, in that order."""
        return take_rows(self.rows, positions)

    def take(self, rows: np.ndarray) -> "MessageView":
        """The given rows as a new view, with copies of their properties and changed system columns."""
        taken = self.rows_at(rows)
        properties = None if self._properties is None else [dict(self._properties[i]) for i in rows.tolist()]
        view = MessageView(taken, properties)  # not decoded yet: decoded from the rows taken when needed
        view._system = {name: values.take(rows) for name, values in self._system.items()}
        return view

    def set_user(self, name: str, values: Optional[list[Any]], rows: np.ndarray) -> None:
        """Set a user property on the given rows to values[i], or remove it when values is None."""
        props = self.properties()
        for i in np.flatnonzero(rows).tolist():
            row = props[i] = {k: v for k, v in props[i].items() if k.lower() != name.lower()}
            if values is not None:
                row[name] = values[i]
        self._lowered = None
        self._users.clear()

    def set_system(self, name: str, values: pa.Array, rows: np.ndarray) -> None:
        name = "Subject" if name == "Label" else name
        current = self.system(name).parts.get("str", pa.nulls(self.n, pa.string()))
        self._system[name] = pc.if_else(pa.array(rows), values, current)

    def system_overrides(self) -> dict[str, pa.Array]:
        """Changed system columns (column name -> values) after actions ran."""
        return {SYSTEM_COLUMNS[name][0]: values for name, values in self._system.items()}


def take_rows(table: pa.Table, positions: np.ndarray) -> pa.Table:
    """table.take(positions) at a cost proportional to the rows taken: Arrow's take on a table of many
    chunks concatenates every chunk first (0.5 s for 200,000 rows of 1 KiB, however few are taken)."""
    positions = np.asarray(positions, dtype=np.int64)
    batches = table.to_batches()
    if len(batches) <= 1:
        return table.take(pa.array(positions))
    starts = np.cumsum([0] + [b.num_rows for b in batches])
    chunk = np.searchsorted(starts, positions, side="right") - 1
    order = np.argsort(chunk, kind="stable")
    pieces = [pa.Table.from_batches([batches[c]]).take(pa.array(positions[chunk == c] - starts[c]))
              for c in np.unique(chunk)]
    grouped = pa.concat_tables(pieces) if pieces else table.schema.empty_table()
    return grouped.combine_chunks().take(pa.array(np.argsort(order, kind="stable")))


def evaluate(node: Node, view: MessageView, parameters: dict[str, Any]) -> Vec:
    """The values of an expression (or condition) for every row of the view."""
    n = view.n
    if isinstance(node, Constant):
        return vectors.constant(node.value, n)
    if isinstance(node, Parameter):
        try:
            return vectors.constant(parameter_value(parameters, node.name), n)
        except ValueError as error:
            raise ValueError(f"parameter {node.name}: {error}") from None
    if isinstance(node, Property):
        return view.system(node.name) if node.scope == "sys" else view.user(node.name)
    if isinstance(node, Exists):
        target = evaluate(node.property, view, parameters)
        present = target.exists if target.exists is not None else target.valid()
        return Vec(n, {"bool": pa.array(present)})
    if isinstance(node, Unary):
        operand = evaluate(node.operand, view, parameters)
        if node.op == "not":
            return vectors.invert(operand)
        return vectors.negate(operand) if node.op == "-" else vectors.binary("+", operand, vectors.constant(0, n))
    if isinstance(node, Binary):
        left, right = evaluate(node.left, view, parameters), evaluate(node.right, view, parameters)
        if node.op in ("and", "or"):
            return vectors.logical(node.op, left, right)
        return vectors.binary(node.op, left, right)
    if isinstance(node, IsNull):
        return vectors.is_null(evaluate(node.operand, view, parameters), node.negated)
    if isinstance(node, In):
        operand = evaluate(node.operand, view, parameters)
        result = None
        for value in node.values:
            equal = vectors.binary("=", operand, evaluate(value, view, parameters))
            result = equal if result is None else vectors.logical("or", result, equal)
        assert result is not None  # IN names at least one value (syntax)
        return vectors.invert(result) if node.negated else result
    if isinstance(node, Like):
        regex = vectors.like_regex(node.pattern, node.escape)
        return vectors.like(evaluate(node.operand, view, parameters), regex, node.negated)
    if isinstance(node, Call):
        if node.function == "newid":
            return vectors.from_values([uuid.uuid4() for _ in range(n)])
        return _dynamic_property(evaluate(node.args[0], view, parameters), view)
    raise TypeError(f"not an expression node: {node!r}")


def parameter_value(parameters: dict[str, Any], name: str) -> object:
    """A parameter's value by name ('@x'), matched case-insensitively; rules are checked for missing ones."""
    if name in parameters:
        return parameters[name]
    for key, value in parameters.items():
        if key.lower() == name.lower():
            return value
    raise ValueError(f"parameter {name} is not defined")


def _dynamic_property(names: Vec, view: MessageView) -> Vec:
    """property(expr): the user property whose name the expression gives, row by row."""
    out = Vec(view.n, error=names.error, reason=names.reason)
    values: list[Any] = [None] * view.n
    for tag, array in names.parts.items():
        if tag != "str":
            out.failed(vectors.valid_mask(array), f"property() needs a string name, got a {tag} value")
            continue
        for name in set(array.to_pylist()) - {None}:
            rows = np.asarray(pc.equal(array, name).to_numpy(zero_copy_only=False), dtype=bool)
            found = view.user(name).values()
            for i in np.flatnonzero(rows).tolist():
                values[i] = found[i]
    result = vectors.from_values(values)
    if out.error is not None:
        result.failed(out.error, out.reason)
    return result


def condition(node: Node, view: MessageView, parameters: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, str]:
    """(matched, failed, reason) per row: matched only where the condition is TRUE without error."""
    truth, checked = vectors.truth(evaluate(node, view, parameters))
    matched = np.asarray(pc.fill_null(truth, False).to_numpy(zero_copy_only=False), dtype=bool)
    failed = checked.error if checked.error is not None else np.zeros(view.n, dtype=bool)
    return matched & ~failed, failed, checked.reason


def run_action(statements: tuple[Statement, ...], view: MessageView, parameters: dict[str, Any]) -> tuple[np.ndarray, str]:
    """Apply SET/REMOVE statements in order to every row of the view (in place); returns (failed, reason)."""
    failed = np.zeros(view.n, dtype=bool)
    reason = ""
    for statement in statements:
        target = statement.target
        if isinstance(statement, RemoveStatement):
            if target.scope == "user":
                view.set_user(target.name, None, ~failed)
            else:
                view.set_system(target.name, pa.nulls(view.n, pa.string()), ~failed)
            continue
        value = evaluate(statement.value, view, parameters)
        if value.error is not None:
            failed |= value.error
            reason = reason or value.reason
        if target.scope == "user":
            view.set_user(target.name, value.values(), ~failed)
            continue
        strings, bad = _as_strings(value)
        if target.name == "MessageId":
            bad |= ~value.valid()
        if bad.any():
            failed |= bad
            reason = reason or f"sys.{target.name} needs a string value"
        if SYSTEM_COLUMNS[target.name][0] in LENGTH_LIMITED:
            length = np.asarray(pc.fill_null(pc.utf8_length(strings), 1).to_numpy(zero_copy_only=False))
            too_long = ~failed & ((length < 1) | (length > MAX_ID_LENGTH))
            if too_long.any():
                failed |= too_long
                reason = reason or (f"the action sets sys.{target.name} to {int(length[too_long].max())} characters; "
                                    f"Service Bus allows 1 to {MAX_ID_LENGTH}")
        view.set_system(target.name, strings, ~failed)
    return failed, reason


def _as_strings(value: Vec) -> tuple[pa.Array, np.ndarray]:
    """A vector as strings for a string system property (uuid allowed); other types are errors."""
    out = pa.nulls(value.n, pa.string())
    bad = np.zeros(value.n, dtype=bool)
    for tag, array in value.parts.items():
        if tag in ("str", "uuid"):
            out = pc.coalesce(out, array)
        else:
            bad |= vectors.valid_mask(array)
    return out, bad
