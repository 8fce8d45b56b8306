"""Subscription rule types (as in azure-servicebus) and their stored form: the rule model under sparkbus.rules.

Filters decide which topic messages a subscription receives; an action rewrites a copy's properties.
Rules are stored and returned faithfully here; check_filter/check_action (create_rule, update_rule and
namespace definitions) also parse SQL text with sparkbus.core.language, so a syntax error is a ValueError
naming the position and nothing is stored. Every value a rule holds must have a wire form
(sparkbus.core.wire): a rule holding one a message could not carry would fail for every message of the
topic, so it is refused here. compile_filter makes a filter evaluable (sparkbus.core.language); the
fan-out and replays evaluate them (sparkbus.engine.fanout, sparkbus.engine.replay).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Optional, TypeVar, Union

from .language import CompiledRule, check_action_text, check_filter_text, compile_correlation, compile_sql
from .language.syntax import ID_PROPERTIES, Parameter, SetStatement
from .values import check_properties, decode_properties, encode_properties
from .wire import MAX_ID_LENGTH, check_text

T = TypeVar("T")

MAX_SQL_EXPRESSION_LENGTH = 1024
CORRELATION_FIELDS = (
    "correlation_id", "message_id", "to", "reply_to", "subject", "session_id", "reply_to_session_id",
    "content_type",
)


def _check_sql(expression: object, what: str) -> str:
    if not isinstance(expression, str):
        raise TypeError(f"{what} sql_expression must be a str, got {type(expression).__name__}")
    if not expression.strip() or len(expression) > MAX_SQL_EXPRESSION_LENGTH:
        raise ValueError(f"{what} sql_expression must be 1 to {MAX_SQL_EXPRESSION_LENGTH} characters, got {len(expression)}")
    return expression


def _check_parameters(parameters: object, what: str) -> dict[str, Any]:
    params = check_properties(parameters, f"{what} parameters", allow_timedelta=True)
    for name in params:
        if not name.startswith("@") or len(name) < 2:
            raise ValueError(f"{what} parameter names start with '@' (e.g. '@color'), got {name!r}")
    return params


class SqlRuleFilter:
    """A Service Bus SQL filter expression over message properties, with optional @parameters."""

    def __init__(self, sql_expression: str, parameters: Optional[dict[str, Any]] = None) -> None:
        self.sql_expression = _check_sql(sql_expression, "SqlRuleFilter")
        self.parameters = _check_parameters(parameters, "SqlRuleFilter")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and (other.sql_expression, other.parameters) == (self.sql_expression, self.parameters)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.sql_expression!r}, parameters={self.parameters!r})"


class TrueRuleFilter(SqlRuleFilter):
    """Matches every message (the '$Default' rule's filter)."""

    def __init__(self) -> None:
        super().__init__("1=1")

    def __repr__(self) -> str:
        return "TrueRuleFilter()"


class FalseRuleFilter(SqlRuleFilter):
    """Matches no message."""

    def __init__(self) -> None:
        super().__init__("1=0")

    def __repr__(self) -> str:
        return "FalseRuleFilter()"


@dataclass(eq=True)
class CorrelationRuleFilter:
    """Equality match on system properties and application properties (all given must match)."""

    correlation_id: Optional[str] = None
    message_id: Optional[str] = None
    to: Optional[str] = None
    reply_to: Optional[str] = None
    subject: Optional[str] = None
    session_id: Optional[str] = None
    reply_to_session_id: Optional[str] = None
    content_type: Optional[str] = None
    properties: dict[str, Any] = field(default_factory=dict[str, Any])

    def __init__(self, *, correlation_id: Optional[str] = None, message_id: Optional[str] = None,
                 to: Optional[str] = None, reply_to: Optional[str] = None, subject: Optional[str] = None,
                 session_id: Optional[str] = None, reply_to_session_id: Optional[str] = None,
                 content_type: Optional[str] = None, properties: Optional[dict[str, Any]] = None,
                 label: Optional[str] = None) -> None:
        if label is not None and subject is not None and label != subject:
            raise ValueError("label is the older name of subject; give one of them")
        values = dict(correlation_id=correlation_id, message_id=message_id, to=to, reply_to=reply_to,
                      subject=subject if subject is not None else label, session_id=session_id,
                      reply_to_session_id=reply_to_session_id, content_type=content_type)
        for name, value in values.items():
            if value is not None and not isinstance(value, str):
                raise TypeError(f"CorrelationRuleFilter {name} must be a str, got {type(value).__name__}")
            if value is not None:
                check_text(value, f"CorrelationRuleFilter {name}")
            setattr(self, name, value)
        self.properties = check_properties(properties, "CorrelationRuleFilter properties")
        if all(v is None for v in values.values()) and not self.properties:
            raise ValueError("CorrelationRuleFilter needs at least one system property or application property to match")

    @property
    def label(self) -> Optional[str]:
        return self.subject


@dataclass(eq=True)
class SqlRuleAction:
    """A Service Bus SQL action (SET/REMOVE statements) applied to matching messages."""

    sql_expression: str
    parameters: dict[str, Any] = field(default_factory=dict[str, Any])

    def __post_init__(self) -> None:
        _check_sql(self.sql_expression, "SqlRuleAction")
        self.parameters = _check_parameters(self.parameters, "SqlRuleAction")


RuleFilter = Union[SqlRuleFilter, CorrelationRuleFilter]


@dataclass
class RuleProperties:
    """A subscription rule as returned by get_rule/list_rules; update_rule takes it back."""

    name: str
    filter: RuleFilter = field(default_factory=TrueRuleFilter)
    action: Optional[SqlRuleAction] = None
    created_at_utc: Optional[datetime] = None


def check_filter(value: object) -> RuleFilter:
    """A rule's filter, its SQL parsed (ValueError with the position on a syntax error)."""
    if value is None:
        return TrueRuleFilter()
    if not isinstance(value, (SqlRuleFilter, CorrelationRuleFilter)):
        raise TypeError(
            "filter must be a SqlRuleFilter, CorrelationRuleFilter, TrueRuleFilter or FalseRuleFilter, "
            f"got {type(value).__name__}"
        )
    if isinstance(value, SqlRuleFilter):  # checked again: a filter's attributes can be changed after it was made
        _check_sql(value.sql_expression, "SqlRuleFilter")
        _check_parameters(value.parameters, "SqlRuleFilter")
        _with_text(check_filter_text, value.sql_expression, value.parameters)
    else:
        CorrelationRuleFilter(**{name: getattr(value, name) for name in (*CORRELATION_FIELDS, "properties")})
    return value


def _with_text(check: Callable[[str, dict[str, Any]], T], expression: str, parameters: dict[str, Any]) -> T:
    """check(expression, parameters), its ValueError naming the expression."""
    try:
        return check(expression, parameters)
    except ValueError as error:
        shown = repr(expression) if len(expression) <= 80 else f"{expression[:60]!r}... ({len(expression)} characters)"
        raise ValueError(f"{shown}: {error}") from None


def check_action(value: object) -> Optional[SqlRuleAction]:
    """A rule's action, its SQL parsed (ValueError with the position on a syntax error)."""
    if value is not None and not isinstance(value, SqlRuleAction):
        raise TypeError(f"action must be a SqlRuleAction or None, got {type(value).__name__}")
    if value is not None:
        _check_sql(value.sql_expression, "SqlRuleAction")
        _check_parameters(value.parameters, "SqlRuleAction")
        statements = _with_text(check_action_text, value.sql_expression, value.parameters)
        _check_id_parameters(statements, value.parameters)
    return value


def _check_id_parameters(statements: tuple[Any, ...], parameters: dict[str, Any]) -> None:
    """An action that sets an id system property to a @parameter: the parameter, when a str, has 1 to
    MAX_ID_LENGTH characters (the parser checks string constants)."""
    lowered = {k.lower(): v for k, v in parameters.items()}
    for statement in statements:
        if isinstance(statement, SetStatement) and statement.target.scope == "sys" \
                and statement.target.name in ID_PROPERTIES and isinstance(statement.value, Parameter):
            value = lowered.get(statement.value.name.lower())
            if isinstance(value, str) and not 0 < len(value) <= MAX_ID_LENGTH:
                raise ValueError(f"SqlRuleAction sets sys.{statement.target.name} to {statement.value.name}, which "
                                 f"has {len(value)} characters; sys.{statement.target.name} is 1 to "
                                 f"{MAX_ID_LENGTH} characters")


def filter_quota_kind(rule_filter: RuleFilter) -> Optional[str]:
    """Which per-topic filter quota a filter counts toward: "SQL", "correlation", or None (True/False)."""
    if isinstance(rule_filter, CorrelationRuleFilter):
        return "correlation"
    return "SQL" if type(rule_filter) is SqlRuleFilter else None


def filter_to_json(rule_filter: RuleFilter) -> str:
    if isinstance(rule_filter, CorrelationRuleFilter):
        body = {f: getattr(rule_filter, f) for f in CORRELATION_FIELDS if getattr(rule_filter, f) is not None}
        body["properties"] = encode_properties(rule_filter.properties)
        return json.dumps({"type": "correlation", **body})
    kind = {TrueRuleFilter: "true", FalseRuleFilter: "false"}.get(type(rule_filter), "sql")
    return json.dumps({"type": kind, "sql_expression": rule_filter.sql_expression,
                       "parameters": encode_properties(rule_filter.parameters)})


def _as_stored(cls: type[T], make: Callable[[], T], **attributes: object) -> T:
    """make(), or, when the stored values no longer pass its checks (written by an older version, or by
    hand), the object with those values unchecked: reading must show a bad rule, not fail the listing it
    is in. Fan-out reports and skips such a rule when it cannot be evaluated (see
    sparkbus.engine.fanout), and update_rule replaces it."""
    try:
        return make()
    except (ValueError, TypeError):
        stored = cls.__new__(cls)
        stored.__dict__.update(attributes)
        return stored


def filter_from_json(text: str) -> RuleFilter:
    data = json.loads(text)
    kind = data.pop("type")
    if kind == "true":
        return TrueRuleFilter()
    if kind == "false":
        return FalseRuleFilter()
    if kind == "correlation":
        properties = decode_properties(data.pop("properties"))
        return _as_stored(CorrelationRuleFilter, lambda: CorrelationRuleFilter(properties=properties, **data),
                          properties=properties, **data)
    expression, parameters = data["sql_expression"], decode_properties(data["parameters"])
    return _as_stored(SqlRuleFilter, lambda: SqlRuleFilter(expression, parameters), sql_expression=expression,
                      parameters=parameters)


def action_to_json(action: Optional[SqlRuleAction]) -> Optional[str]:
    if action is None:
        return None
    return json.dumps({"sql_expression": action.sql_expression, "parameters": encode_properties(action.parameters)})


def action_from_json(text: Optional[str]) -> Optional[SqlRuleAction]:
    if not text:
        return None
    data = json.loads(text)
    expression, parameters = data["sql_expression"], decode_properties(data["parameters"])
    return _as_stored(SqlRuleAction, lambda: SqlRuleAction(expression, parameters), sql_expression=expression,
                      parameters=parameters)


def compile_filter(name: str, rule_filter: RuleFilter, action: Optional[SqlRuleAction] = None) -> CompiledRule:
    """A rule's filter (and action) ready to evaluate; one that does not parse keeps its problem."""
    action_text = action.sql_expression if action else None
    action_parameters = action.parameters if action else None
    if isinstance(rule_filter, CorrelationRuleFilter):
        fields = {f: getattr(rule_filter, f) for f in CORRELATION_FIELDS}
        return compile_correlation(name, fields, rule_filter.properties or {}, action_text, action_parameters)
    return compile_sql(name, rule_filter.sql_expression, rule_filter.parameters or {}, action_text, action_parameters)
