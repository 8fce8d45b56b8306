"""Subscription rules ready to evaluate, and which copies a subscription gets of a batch of messages.

Service Bus semantics ("Topic filters and actions"): per message and subscription, all matching rules
without an action together give at most one copy; each matching rule with an action gives its own copy,
with the action applied and the application property RuleName set to the rule's name. A message whose
evaluation fails on any rule gets no copy; it is dead-lettered in that subscription when the subscription
says so (dead_lettering_on_filter_evaluation_exceptions).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .evaluate import MessageView, condition, run_action
from .syntax import Binary, Constant, Node, Parameter, Property, Statement, parameters_used, parse_action, parse_filter

# CorrelationRuleFilter field -> system property.
CORRELATION_PROPERTIES = {
    "correlation_id": "CorrelationId", "message_id": "MessageId", "to": "To", "reply_to": "ReplyTo",
    "subject": "Subject", "session_id": "SessionId", "reply_to_session_id": "ReplyToSessionId",
    "content_type": "ContentType",
}
RULE_NAME_PROPERTY = "RuleName"


def _check_parameters(tree: object, parameters: dict, what: str) -> None:
    defined = {k.lower() for k in parameters}
    missing = sorted(p for p in parameters_used(tree) if p.lower() not in defined)
    if missing:
        raise ValueError(f"{what} uses parameter(s) {missing} that are not defined; defined: {sorted(parameters)}")


def check_filter_text(text: str, parameters: dict) -> Node:
    """Parse a SQL filter and check its parameters; ValueError says where and what was expected."""
    tree = parse_filter(text)
    _check_parameters(tree, parameters, "the filter")
    return tree


def check_action_text(text: str, parameters: dict) -> tuple[Statement, ...]:
    statements = parse_action(text)
    _check_parameters(statements, parameters, "the action")
    return statements


@dataclass(frozen=True)
class CompiledRule:
    """A rule ready to evaluate. A stored rule that no longer parses keeps its problem: every evaluation
    of it is an error (validated when evaluated)."""

    name: str
    condition: Optional[Node] = None
    parameters: dict = field(default_factory=dict)
    action: Optional[tuple] = None
    action_parameters: dict = field(default_factory=dict)
    problem: str = ""
    errors_are_misses: bool = False  # correlation filters: a value of another type simply does not match


def compile_sql(name: str, text: str, parameters: dict, action_text: Optional[str] = None,
                action_parameters: Optional[dict] = None) -> CompiledRule:
    try:
        tree = check_filter_text(text, parameters)
        action = check_action_text(action_text, action_parameters or {}) if action_text else None
    except ValueError as error:
        return CompiledRule(name, problem=f"the rule does not parse: {error}")
    return CompiledRule(name, tree, dict(parameters), action, dict(action_parameters or {}))


def compile_correlation(name: str, fields: dict, properties: dict, action_text: Optional[str] = None,
                        action_parameters: Optional[dict] = None) -> CompiledRule:
    """Equality on every field that is set (case-sensitive strings) and every application property, ANDed."""
    parameters: dict = {}
    terms: list[Node] = []
    for field_name, value in fields.items():
        if value is not None:
            terms.append(Binary("=", Property("sys", CORRELATION_PROPERTIES[field_name]), Constant(value)))
    for i, (key, value) in enumerate(sorted(properties.items())):
        parameters[f"@p{i}"] = value
        terms.append(Binary("=", Property("user", key), Parameter(f"@p{i}")))
    tree = terms[0]
    for term in terms[1:]:
        tree = Binary("and", tree, term)
    try:
        action = check_action_text(action_text, action_parameters or {}) if action_text else None
    except ValueError as error:
        return CompiledRule(name, problem=f"the rule's action does not parse: {error}")
    return CompiledRule(name, tree, parameters, action, dict(action_parameters or {}), errors_are_misses=True)


@dataclass
class Copies:
    """What one subscription receives of a batch: `plain` rows (one copy each), `actions` (rule, rows,
    changed view) per matching action rule, and `dead_letter` rows with the reason for each."""

    plain: np.ndarray
    actions: list[tuple[str, np.ndarray, MessageView]]
    dead_letter: np.ndarray
    reasons: list[Optional[str]]
    evaluations: int


def select(rules: list[CompiledRule], view: MessageView, eligible: np.ndarray) -> Copies:
    """Evaluate every rule of a subscription on the eligible rows of a view."""
    n = view.n
    plain = np.zeros(n, dtype=bool)
    failed = np.zeros(n, dtype=bool)
    reasons: list[Optional[str]] = [None] * n
    matches: list[tuple[CompiledRule, np.ndarray]] = []
    evaluations = 0
    for rule in rules:
        evaluations += int(eligible.sum())
        if rule.problem:
            rule_failed, reason, matched = eligible.copy(), rule.problem, np.zeros(n, dtype=bool)
        else:
            matched, rule_failed, reason = condition(rule.condition, view, rule.parameters)
            matched &= eligible
            rule_failed &= eligible
            if rule.errors_are_misses:
                rule_failed = np.zeros(n, dtype=bool)
        _note_failures(rule.name, rule_failed & ~failed, reason, reasons)
        failed |= rule_failed
        matches.append((rule, matched))
    actions = []
    for rule, matched in matches:
        matched = matched & ~failed
        if not matched.any():
            continue
        if rule.action is None:
            plain |= matched
            continue
        rows = np.flatnonzero(matched)
        changed = view.take(rows)
        action_failed, reason = run_action(rule.action, changed, rule.action_parameters)
        if action_failed.any():  # these rows get no copy from any rule: evaluation failed for the message
            for position in np.flatnonzero(action_failed).tolist():
                row = int(rows[position])
                if not failed[row]:
                    reasons[row] = f"rule '{rule.name}': {reason}"
                failed[row] = True
        changed.set_user(RULE_NAME_PROPERTY, [rule.name] * changed.n, np.ones(changed.n, dtype=bool))
        actions.append((rule.name, rows, changed, action_failed))
    plain &= ~failed
    final = []
    for name, rows, changed, action_failed in actions:
        keep = ~failed[rows]
        if keep.any():
            final.append((name, rows[keep], changed if keep.all() else changed.take(np.flatnonzero(keep))))
    return Copies(plain, final, failed, reasons, evaluations)


def _note_failures(rule: str, rows: np.ndarray, reason: str, reasons: list) -> None:
    for i in np.flatnonzero(rows).tolist():
        reasons[i] = f"rule '{rule}': {reason}"
