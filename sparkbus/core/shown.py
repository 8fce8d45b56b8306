"""How values and rule filters are shown to people and in JSON, the same by the command line and the
Explorer: durations as ISO 8601 (Service Bus' "never" as the service writes it), times as ISO text, enums by
value, bytes as hex, records field by field; a rule filter as plain values or in one line."""
from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from enum import Enum
from typing import Any

from .durations import MAX_DURATION, MAX_DURATION_TEXT, format_duration
from .filters import CORRELATION_FIELDS, CorrelationRuleFilter, FalseRuleFilter, RuleFilter, TrueRuleFilter


def plain(value: Any) -> Any:
    """A value as JSON shows it (module docstring); anything else JSON cannot hold as its text."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, timedelta):
        return MAX_DURATION_TEXT if value >= MAX_DURATION else format_duration(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def filter_record(rule_filter: RuleFilter) -> dict[str, Any]:
    """A rule filter as plain values: {"type": "sql", "sql_expression", "parameters"}, {"type": "true"} or
    "false", or {"type": "correlation", <the fields it sets>, "properties"}."""
    if isinstance(rule_filter, CorrelationRuleFilter):
        fields = {f: getattr(rule_filter, f) for f in CORRELATION_FIELDS if getattr(rule_filter, f) is not None}
        return {"type": "correlation", **fields, "properties": plain(rule_filter.properties)}
    if isinstance(rule_filter, (TrueRuleFilter, FalseRuleFilter)):
        return {"type": "true" if isinstance(rule_filter, TrueRuleFilter) else "false"}
    return {"type": "sql", "sql_expression": rule_filter.sql_expression, "parameters": plain(rule_filter.parameters)}


def filter_text(rule_filter: RuleFilter) -> str:
    """A rule filter in one line for tables: the SQL expression (and its parameters), TRUE, FALSE, or the
    correlation filter's fields and properties as name=value."""
    shown = filter_record(rule_filter)
    kind: str = shown["type"]
    if kind in ("true", "false"):
        return kind.upper()
    if kind == "sql":
        parameters = ", ".join(f"{k}={v!r}" for k, v in shown["parameters"].items())
        expression: str = shown["sql_expression"]
        return expression + (f" ({parameters})" if parameters else "")
    pairs = {k: v for k, v in shown.items() if k not in ("type", "properties")} | shown["properties"]
    return "correlation " + ", ".join(f"{k}={v!r}" for k, v in pairs.items())
