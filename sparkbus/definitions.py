"""Namespace definitions (TOML files under conf/) applied idempotently to a namespace.

    [namespace]              # used only when the namespace does not exist yet
    tier = "standard"
    [[queues]]
    name = "orders"
    enable_partitioning = true
    lock_duration = "PT30S"
    [[topics]]
    name = "events"
    [[topics.subscriptions]]
    name = "eu"
    [[topics.subscriptions.rules]]
    name = "eu-only"
    sql = "region = 'eu'"                # or: correlation = { subject = "x", properties = { k = "v" } }
    action = "SET priority = 'high'"     # optional

Entities are created when missing and updated when their settings differ. A subscription that lists
rules gets exactly those rules ('$Default' is removed unless listed); nothing else is ever deleted.
The whole definition is checked (names, settings, rule syntax) before anything is applied; what only the
namespace can judge (its tier's sizes and quotas) can still fail part way, and the error then lists what
was applied before it (applying again continues from there).

Arrays and tables nest at most MAX_NESTING_DEPTH levels (the document itself is the first; a full
definition needs 9), in a file as in a definition given as a dict, and so do the arrays and objects of a
JSON line of `sparkbus send --file`: deeper input is a ValueError. Python's tomllib and json parsers
recurse once per level and fail with RecursionError near 1,000 levels, so check_text_nesting counts the
brackets of the text before it is parsed, and check_nesting walks a parsed value without recursing.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .core import entities
from .core.filters import (CorrelationRuleFilter, RuleFilter, SqlRuleAction, SqlRuleFilter, TrueRuleFilter,
                           check_action, check_filter)
from .core.names import DEFAULT_RULE_NAME, validate_child_name, validate_entity_name
from .engine.namespace import create_namespace
from .exceptions import MessagingEntityNotFoundError, ServiceBusError
from .management import ServiceBusAdministrationClient

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


MAX_NESTING_DEPTH = 32

# What the bracket count skips: strings (and TOML comments), whose brackets are text, not nesting.
_JSON_STRING = r'"[^"\\]*(?:\\.[^"\\]*)*"'
_TOML_SKIPPED = r'"""(?:\\.|[^\\])*?"""' + r"|'''.*?'''" + r'|"(?:\\.|[^"\\\n])*"' + r"|'[^'\n]*'" + r"|#[^\n]*"
_BRACKETS = {"json": re.compile(_JSON_STRING + r"|([\[\]{}])"),
             "toml": re.compile(_TOML_SKIPPED + r"|([\[\]{}])", re.DOTALL)}


def too_deep(where: str) -> ValueError:
    """The error for input (where: a file, line or field) nested deeper than MAX_NESTING_DEPTH."""
    return ValueError(f"{where}: arrays and tables (objects) nest deeper than {MAX_NESTING_DEPTH} levels; "
                      f"at most {MAX_NESTING_DEPTH} are allowed")


def check_text_nesting(text: str, syntax: str, where: str) -> None:
    """ValueError (starting with where, plus the line for TOML) when JSON or TOML text (syntax "json" or
    "toml") nests arrays and tables deeper than MAX_NESTING_DEPTH, found by counting the brackets outside
    strings and comments before the text reaches a parser that recurses per level. A TOML document is the
    first level. Text with fewer opening brackets than the limit is not scanned."""
    start = 1 if syntax == "toml" else 0
    if start + text.count("[") + text.count("{") <= MAX_NESTING_DEPTH:
        return
    depth = start
    for match in _BRACKETS[syntax].finditer(text):
        bracket = match.group(1)
        if bracket in ("[", "{"):
            depth += 1
            if depth > MAX_NESTING_DEPTH:
                line = f" line {text.count(chr(10), 0, match.start()) + 1}" if syntax == "toml" else ""
                raise too_deep(where + line)
        elif bracket is not None:
            depth = max(depth - 1, start)


def parse_nested(text: str, syntax: str, where: str, loads: Callable[[str], Any]) -> Any:
    """loads(text) (a JSON or TOML parser, syntax "json" or "toml") once check_text_nesting passed;
    ValueError (too_deep) also should the parser's own recursion limit be reached first. The parser's
    errors for invalid text pass through."""
    check_text_nesting(text, syntax, where)
    try:
        return loads(text)
    except RecursionError:  # the parser's own limit, should the bracket count have missed a level
        raise too_deep(where) from None


def check_nesting(value: object, where: str) -> None:
    """ValueError (starting with where) when dicts and lists (or tuples) inside each other go deeper than
    MAX_NESTING_DEPTH levels, value itself being the first; walked without recursion (a value that
    contains itself is too deep too)."""
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            children = list(item.values())
        elif isinstance(item, (list, tuple)):
            children = list(item)
        else:
            continue
        if depth > MAX_NESTING_DEPTH:
            raise too_deep(where)
        pending.extend((child, depth + 1) for child in children)


@dataclass
class ApplyReport:
    """What apply_definition did, one line per change."""

    changes: list[str] = field(default_factory=list)


def load_definition(path: str) -> dict[str, Any]:
    """The definition in a TOML file. OSError when it cannot be read; ValueError naming the file when it is
    not UTF-8, not TOML, nested deeper than MAX_NESTING_DEPTH or has sections other than namespace, queues
    and topics."""
    with open(path, "rb") as handle:
        raw = handle.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start + 1})") from None
    try:
        data: dict[str, Any] = parse_nested(text, "toml", path, tomllib.loads)
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{path}: not valid TOML: {error}") from None
    check_nesting(data, path)  # dotted keys nest tables without brackets
    unknown = sorted(set(data) - {"namespace", "queues", "topics"})
    if unknown:
        raise ValueError(f"{path}: unknown section(s) {unknown}; allowed: namespace, queues, topics")
    return data


def _split(item: dict[str, Any], where: str,
           children: tuple[str, ...] = ()) -> tuple[str, dict[str, Any], dict[str, Any]]:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise ValueError(f"every entry of {where} needs a name")
    options = {k: v for k, v in item.items() if k != "name" and k not in children}
    return item["name"], options, {k: item[k] for k in children if k in item}


def _rule(item: dict[str, Any], where: str) -> tuple[str, RuleFilter, Optional[SqlRuleAction]]:
    name, options, _ = _split(item, where)
    unknown = sorted(set(options) - {"sql", "correlation", "action", "parameters"})
    if unknown or ("sql" in options and "correlation" in options):
        raise ValueError(f"rule {name!r} in {where}: give 'sql' or 'correlation' (plus optional 'action', "
                         f"'parameters'); got {sorted(options)}")
    if "sql" in options:
        rule_filter: RuleFilter = SqlRuleFilter(options["sql"], options.get("parameters"))
    elif "correlation" in options:
        rule_filter = CorrelationRuleFilter(**options["correlation"])
    else:
        rule_filter = TrueRuleFilter()
    action = SqlRuleAction(options["action"]) if options.get("action") else None
    try:  # syntax errors surface while reading the definition, before anything is applied
        return name, check_filter(rule_filter), check_action(action)
    except ValueError as error:
        raise ValueError(f"rule {name!r} in {where}: {error}") from None


def _differs(current: object, wanted: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entities.check_options_for(current, wanted).items() if getattr(current, k) != v}


def _entries(holder: dict[str, Any], name: str, where: str) -> list[Any]:
    entries = holder.get(name, [])
    if not isinstance(entries, list):
        raise ValueError(f"{where}{name} must be a list of tables ([[{name}]]), got {type(entries).__name__}")
    return entries


def check_definition(definition: dict[str, Any]) -> None:
    """Every name, setting and rule of the definition, checked without a namespace: ValueError or TypeError
    naming the first entry that is wrong (ValueError when it nests deeper than MAX_NESTING_DEPTH)."""
    if not isinstance(definition, dict):
        raise TypeError(f"a definition must be a dict (the tables of a TOML file), got {type(definition).__name__}")
    check_nesting(definition, "the definition")
    if not isinstance(definition.get("namespace", {}), dict):
        raise ValueError("[namespace] must be a table of create_namespace settings")
    for kind in ("queue", "topic"):
        for item in _entries(definition, f"{kind}s", ""):
            name, options, children = _split(item, f"{kind}s", ("subscriptions",) if kind == "topic" else ())
            validate_entity_name(name, kind)
            entities.check_options(kind, options)
            for sub in _entries(children, "subscriptions", f"topic {name}: "):
                sub_name, sub_options, sub_children = _split(sub, f"subscriptions of {name}", ("rules",))
                validate_child_name(sub_name, "subscription")
                entities.check_options("subscription", sub_options)
                for rule in _entries(sub_children, "rules", f"subscription {name}/{sub_name}: "):
                    validate_child_name(_rule(rule, f"rules of {name}/{sub_name}")[0], "rule")


def apply_definition(definition: dict[str, Any], namespace_path: str) -> ApplyReport:
    """Create the namespace if needed, then create or update every entity and rule in the definition
    (checked whole first, see check_definition). An error part way lists what was applied before it."""
    check_definition(definition)
    report = ApplyReport()
    try:
        _apply(definition, namespace_path, report)
    except (ServiceBusError, ValueError, TypeError) as error:
        if report.changes:
            text = f"{error} (applied before this error: {'; '.join(report.changes)})"
            error.args = (text, *error.args[1:])
            if hasattr(error, "message"):
                error.message = text
        raise
    return report


def _apply(definition: dict[str, Any], namespace_path: str, report: ApplyReport) -> None:
    try:
        admin = ServiceBusAdministrationClient(namespace_path)
    except MessagingEntityNotFoundError:
        create_namespace(namespace_path, **definition.get("namespace", {}))
        report.changes.append(f"created namespace {namespace_path}")
        admin = ServiceBusAdministrationClient(namespace_path)
    for kind in ("queue", "topic"):
        existing = {p.name.lower(): p for p in (admin.list_queues() if kind == "queue" else admin.list_topics())}
        for item in definition.get(f"{kind}s", []):
            name, options, children = _split(item, f"{kind}s", ("subscriptions",) if kind == "topic" else ())
            current = existing.get(name.lower())
            if current is None:
                getattr(admin, f"create_{kind}")(name, **options)
                report.changes.append(f"created {kind} {name}")
            elif _differs(current, options):
                getattr(admin, f"update_{kind}")(current, **options)
                report.changes.append(f"updated {kind} {name}: {sorted(_differs(current, options))}")
            for sub in children.get("subscriptions", []):
                _apply_subscription(admin, name, sub, report)


def _apply_subscription(admin: ServiceBusAdministrationClient, topic: str, item: dict[str, Any],
                        report: ApplyReport) -> None:
    name, options, children = _split(item, f"subscriptions of {topic}", ("rules",))
    current = {s.name.lower(): s for s in admin.list_subscriptions(topic)}.get(name.lower())
    if current is None:
        admin.create_subscription(topic, name, **options)
        report.changes.append(f"created subscription {topic}/{name}")
    elif _differs(current, options):
        admin.update_subscription(topic, current, **options)
        report.changes.append(f"updated subscription {topic}/{name}: {sorted(_differs(current, options))}")
    if "rules" not in children:
        return
    wanted = [_rule(r, f"rules of {topic}/{name}") for r in children["rules"]]
    rules = {r.name.lower(): r for r in admin.list_rules(topic, name)}
    for rule_name, rule_filter, action in wanted:
        rule = rules.get(rule_name.lower())
        if rule is None:
            admin.create_rule(topic, name, rule_name, filter=rule_filter, action=action)
            report.changes.append(f"created rule {topic}/{name}/{rule_name}")
        elif (rule.filter, rule.action) != (rule_filter, action):
            admin.update_rule(topic, name, rule, filter=rule_filter, action=action)
            report.changes.append(f"updated rule {topic}/{name}/{rule_name}")
    if DEFAULT_RULE_NAME.lower() in rules and DEFAULT_RULE_NAME.lower() not in {w[0].lower() for w in wanted}:
        admin.delete_rule(topic, name, DEFAULT_RULE_NAME)
        report.changes.append(f"deleted rule {topic}/{name}/{DEFAULT_RULE_NAME}")
