"""Subscription rules ready to evaluate, and which copies a subscription gets of a batch of messages.

Service Bus semantics ("Topic filters and actions"): per message and subscription, all matching rules
without an action together give at most one copy; each matching rule with an action gives its own copy,
with the action applied and the application property RuleName set to the rule's name. A message whose
evaluation fails on any rule gets no copy; it is dead-lettered in that subscription when the subscription
says so (dead_lettering_on_filter_evaluation_exceptions). So is a message an action gives a value Service
Bus would refuse (sys.MessageId, SessionId, PartitionKey or ReplyToSessionId outside 1 to 128 characters).

Defence in depth (stored rows and rules can hold what this version's checks refuse): a message that makes
evaluation raise fails the same way, and a rule that cannot be evaluated at all is skipped and reported
(see select).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, TypeVar

import numpy as np

from .evaluate import MessageView, condition, run_action
from .vectors import EVALUATION_ERRORS
from .syntax import (Binary, Constant, Node, Parameter, Property, Statement, balanced, parameters_used, parse_action,
                     parse_filter)

# CorrelationRuleFilter field -> system property.
CORRELATION_PROPERTIES = {
    "correlation_id": "CorrelationId", "message_id": "MessageId", "to": "To", "reply_to": "ReplyTo",
    "subject": "Subject", "session_id": "SessionId", "reply_to_session_id": "ReplyToSessionId",
    "content_type": "ContentType",
}
RULE_NAME_PROPERTY = "RuleName"
T = TypeVar("T")


def _check_parameters(tree: object, parameters: dict[str, Any], what: str) -> None:
    defined = {k.lower() for k in parameters}
    missing = sorted(p for p in parameters_used(tree) if p.lower() not in defined)
    if missing:
        raise ValueError(f"{what} uses parameter(s) {missing} that are not defined; defined: {sorted(parameters)}")


def check_filter_text(text: str, parameters: dict[str, Any]) -> Node:
    """Parse a SQL filter and check its parameters; ValueError says where and what was expected."""
    tree = parse_filter(text)
    _check_parameters(tree, parameters, "the filter")
    return tree


def check_action_text(text: str, parameters: dict[str, Any]) -> tuple[Statement, ...]:
    statements = parse_action(text)
    _check_parameters(statements, parameters, "the action")
    return statements


@dataclass(frozen=True)
class CompiledRule:
    """A rule ready to evaluate. A stored rule that no longer parses keeps its problem, and select skips it."""

    name: str
    condition: Optional[Node] = None
    parameters: dict[str, Any] = field(default_factory=dict[str, Any])
    action: Optional[tuple[Statement, ...]] = None
    action_parameters: dict[str, Any] = field(default_factory=dict[str, Any])
    problem: str = ""
    errors_are_misses: bool = False  # correlation filters: a value of another type simply does not match


def compile_sql(name: str, text: str, parameters: dict[str, Any], action_text: Optional[str] = None,
                action_parameters: Optional[dict[str, Any]] = None) -> CompiledRule:
    try:
        tree = check_filter_text(text, parameters)
        action = check_action_text(action_text, action_parameters or {}) if action_text else None
    except ValueError as error:
        return CompiledRule(name, problem=f"the rule does not parse: {error}")
    return CompiledRule(name, tree, dict(parameters), action, dict(action_parameters or {}))


def compile_correlation(name: str, fields: dict[str, Any], properties: dict[str, Any], action_text: Optional[str] = None,
                        action_parameters: Optional[dict[str, Any]] = None) -> CompiledRule:
    """Equality on every field that is set (case-sensitive strings) and every application property, ANDed."""
    parameters: dict[str, Any] = {}
    terms: list[Node] = []
    for field_name, value in fields.items():
        if value is not None:
            terms.append(Binary("=", Property("sys", CORRELATION_PROPERTIES[field_name]), Constant(value)))
    for i, (key, value) in enumerate(sorted(properties.items())):
        parameters[f"@p{i}"] = value
        terms.append(Binary("=", Property("user", key), Parameter(f"@p{i}")))
    tree = balanced("and", terms)  # shallow however many properties the filter matches
    try:
        action = check_action_text(action_text, action_parameters or {}) if action_text else None
    except ValueError as error:
        return CompiledRule(name, problem=f"the rule's action does not parse: {error}")
    return CompiledRule(name, tree, parameters, action, dict(action_parameters or {}), errors_are_misses=True)


@dataclass
class Copies:
    """What one subscription receives of a batch: `plain` rows (one copy each), `actions` (rule, rows,
    changed view) per matching action rule, `dead_letter` rows with the reason for each, and the rules
    that could not be evaluated at all and were skipped, (name, error)."""

    plain: np.ndarray
    actions: list[tuple[str, np.ndarray, MessageView]]
    dead_letter: np.ndarray
    reasons: list[Optional[str]]
    evaluations: int
    skipped: list[tuple[str, str]] = field(default_factory=list)


class _Unusable(Exception):
    """A rule that raises even for no message at all: it cannot be evaluated (its error is the text)."""


def select(rules: list[CompiledRule], view: MessageView, eligible: np.ndarray) -> Copies:
    """Evaluate every rule of a subscription on the eligible rows of a view.

    Stored rows and rules can hold what this version's checks refuse (written by an older version or by
    another tool). A rule that cannot be evaluated at all (its stored form does not parse, or it raises
    even for no message, e.g. for a parameter no vector can hold) is skipped and listed in
    Copies.skipped; the other rules still select. A message that makes a rule raise is found by
    evaluating halves of the batch, only when the whole batch raised, so the usual path stays one
    vectorised pass; it fails as a message a filter errs on, with the error as reason."""
    n = view.n
    plain = np.zeros(n, dtype=bool)
    failed = np.zeros(n, dtype=bool)
    reasons: list[Optional[str]] = [None] * n
    matches: list[tuple[CompiledRule, np.ndarray]] = []
    skipped: list[tuple[str, str]] = []
    evaluations = 0
    for rule in rules:
        if rule.problem:
            skipped.append((rule.name, rule.problem))
            continue
        try:
            matched, rule_failed, reason, raised = _evaluated(rule, view)
        except _Unusable as error:
            skipped.append((rule.name, str(error)))
            continue
        evaluations += int(eligible.sum())
        matched &= eligible
        rule_failed &= eligible
        if rule.errors_are_misses:
            rule_failed = np.zeros(n, dtype=bool)
        _note_failures(rule.name, rule_failed & ~failed, reason, raised, reasons)
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
        try:
            rows, changed, action_failed, reason, raised = _acted(rule, view, np.flatnonzero(matched))
        except _Unusable as error:
            skipped.append((rule.name, str(error)))
            continue
        dropped = np.zeros(n, dtype=bool)
        dropped[list(raised)] = True
        dropped[rows[action_failed]] = True
        # these rows get no copy from any rule: evaluation failed for the message
        _note_failures(rule.name, dropped & ~failed, reason, raised, reasons)
        failed |= dropped
        changed.set_user(RULE_NAME_PROPERTY, [rule.name] * changed.n, np.ones(changed.n, dtype=bool))
        actions.append((rule.name, rows, changed))
    plain &= ~failed
    final = []
    for name, rows, changed in actions:
        keep = ~failed[rows]
        if keep.any():
            final.append((name, rows[keep], changed if keep.all() else changed.take(np.flatnonzero(keep))))
    return Copies(plain, final, failed, reasons, evaluations, skipped)


def _evaluated(rule: CompiledRule, view: MessageView) -> tuple[np.ndarray, np.ndarray, str, dict[int, str]]:
    """(matched, failed, reason, {row: reason} of rows failed otherwise) of a rule's filter over the view.
    _Unusable when the rule itself cannot be evaluated."""
    assert rule.condition is not None  # only a rule without a problem is evaluated
    when = rule.condition

    def run(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, str]:
        return condition(when, view.take(rows), rule.parameters)

    try:
        matched, failed, reason = condition(when, view, rule.parameters)
        return matched, failed, reason, {}
    except EVALUATION_ERRORS as error:
        _usable_or_raise(run, error)
        done, raised = _isolating(run, np.arange(view.n), error)
    matched, failed = np.zeros(view.n, dtype=bool), np.zeros(view.n, dtype=bool)
    row_reasons = dict(raised)
    for rows, (part_matched, part_failed, part_reason) in done:
        matched[rows], failed[rows] = part_matched, part_failed
        row_reasons.update((int(row), part_reason) for row in rows[part_failed])
    failed[list(raised)] = True
    return matched, failed, "", row_reasons


def _acted(rule: CompiledRule, view: MessageView,
           rows: np.ndarray) -> tuple[np.ndarray, MessageView, np.ndarray, str, dict[int, str]]:
    """A rule's action run on copies of the given rows: (rows that have a copy, the changed copies,
    which of them failed, reason, {row: error} of rows the action raised for, which have no copy).
    _Unusable when the action itself cannot be run."""
    assert rule.action is not None  # only a rule with an action runs one
    statements = rule.action

    def run(taken: np.ndarray) -> tuple[MessageView, np.ndarray, str]:
        changed = view.take(taken)
        failed, reason = run_action(statements, changed, rule.action_parameters)
        return changed, failed, reason

    try:
        return (rows, *run(rows), {})
    except EVALUATION_ERRORS as error:
        _usable_or_raise(run, error)
        _, raised = _isolating(run, rows, error)
    rows = rows[~np.isin(rows, list(raised))]
    try:
        return (rows, *run(rows), raised)
    except EVALUATION_ERRORS as error:  # the rows that ran alone raise together: none of them is copied
        raised.update((int(row), _error_text(error)) for row in rows)
        return (rows[:0], *run(rows[:0]), raised)


def _usable_or_raise(run: Callable[[np.ndarray], object], error: BaseException) -> None:
    """Nothing when run (an evaluation of a rule) succeeds for no rows; _Unusable (from error) otherwise."""
    try:
        run(np.zeros(0, dtype=np.int64))
    except EVALUATION_ERRORS as again:
        raise _Unusable(f"{type(again).__name__}: {again}") from error


def _isolating(run: Callable[[np.ndarray], T], rows: np.ndarray,
               error: BaseException) -> tuple[list[tuple[np.ndarray, T]], dict[int, str]]:
    """After run(rows) raised error: run on halves of the rows, and on halves of the halves that raise,
    down to single rows. Returns ([(rows, run(rows))] of the parts that ran, {row: error text} of the
    rows it raises for alone): about 2 log2(n) runs, on ever fewer rows, per such row."""
    done: list[tuple[np.ndarray, T]] = []
    raised: dict[int, str] = {}
    pending = [(rows, error)]
    while pending:
        part, failure = pending.pop()
        if len(part) == 1:
            raised[int(part[0])] = _error_text(failure)
            continue
        half = len(part) // 2
        for piece in (part[half:], part[:half]):
            try:
                done.append((piece, run(piece)))
            except EVALUATION_ERRORS as again:
                pending.append((piece, again))
    return done, raised


def _error_text(error: BaseException) -> str:
    return f"the message cannot be evaluated: {type(error).__name__}: {error}"


def _note_failures(rule: str, rows: np.ndarray, reason: str, row_reasons: dict[int, str], reasons: list[Any]) -> None:
    for i in np.flatnonzero(rows).tolist():
        reasons[i] = f"rule '{rule}': {row_reasons.get(i, reason)}"
