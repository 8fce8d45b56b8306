"""The management commands of the `sparkbus` CLI: `namespace create|show`, `queue`, `topic`,
`subscription` and `rule` with `list|show|create|delete` (`update` and `runtime` for the first three, `purge`
for queues and subscriptions), and `maintain`. Tables or `key  value` lines for people, `--json` for scripts (one
object; lists one object per line). Entity settings are given as `--set NAME=VALUE` with the
administration client's keyword names; a duration as seconds or ISO 8601 (lock_duration=30 or PT30S).

"""
from __future__ import annotations

import argparse
import dataclasses
import json
from typing import TYPE_CHECKING, Any, Sequence, TypeVar, Union

from ..client import ServiceBusClient
from ..core.durations import MAX_DURATION_TEXT
from ..core.filters import CorrelationRuleFilter, RuleProperties, SqlRuleAction, SqlRuleFilter
from ..core.shown import filter_record, filter_text, plain
from ..engine.housekeeping import sweep
from ..engine.namespace import NamespaceProperties, create_namespace, open_catalog
from ..management import ServiceBusAdministrationClient
from ..receiver import ServiceBusSubQueue
from .text import correlation, credits_argument, format_table, setting, whole

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

KINDS = ("queue", "topic", "subscription", "rule")
LIST_COLUMNS = {"queue": ("name", "status", "partition_count", "max_size_in_megabytes", "requires_session"),
                "topic": ("name", "status", "partition_count", "max_size_in_megabytes"),
                "subscription": ("name", "status", "requires_session", "max_delivery_count", "forward_to"),
                "rule": ("name", "filter", "action")}
ParserT = TypeVar("ParserT", bound=argparse.ArgumentParser)
RuleOption = Union[SqlRuleFilter, CorrelationRuleFilter, SqlRuleAction]


def record(item: DataclassInstance) -> dict[str, Any]:
    """A properties object (or rule) as a flat dict of plain values."""
    if isinstance(item, RuleProperties):
        return {"name": item.name, "filter": filter_record(item.filter),
                "action": item.action.sql_expression if item.action else None}
    flat: dict[str, Any]  # plain makes a dict a dict
    if isinstance(item, NamespaceProperties):
        out = {f.name: getattr(item, f.name) for f in dataclasses.fields(item) if f.name != "limits"}
        flat = plain({**out, "name": item.name, **dataclasses.asdict(item.limits)})
    else:
        flat = plain(dataclasses.asdict(item))
    return flat


def print_records(items: Sequence[DataclassInstance], kind: str, as_json: bool) -> None:

    rows = [record(item) for item in items]
    if as_json:
        for row in rows:
            print(json.dumps(row, default=str))
        return
    if not rows:
        print(f"no {kind}s")
        return
    columns = LIST_COLUMNS[kind]
    shown = [_for_people(item, row) for item, row in zip(items, rows)]
    print(format_table([{c: "" if r.get(c) is None else r[c] for c in columns} for r in shown], columns))


def print_record(item: DataclassInstance, as_json: bool) -> None:
    row = record(item)
    if as_json:
        print(json.dumps(row, default=str))
        return
    row = _for_people(item, row)
    width = max(len(k) for k in row)
    for key, value in row.items():
        print(f"{key.ljust(width)}  {'' if value is None else value}")


def _for_people(item: DataclassInstance, row: dict[str, Any]) -> dict[str, Any]:
    """A record as text output shows it: "never" for TimeSpan.MaxValue, a rule's filter in one line."""
    shown = {k: "never" if v == MAX_DURATION_TEXT else v for k, v in row.items()}
    if isinstance(item, RuleProperties):
        shown["filter"] = filter_text(item.filter)
    return shown


def _parent(args: argparse.Namespace, kind: str) -> tuple[str, ...]:
    """The arguments naming where an entity of `kind` lives: (topic,) for subscriptions, (topic, sub) for rules."""
    if kind == "subscription":
        return (args.topic,)
    if kind == "rule":
        return (args.topic, args.subscription)
    return ()


def _rule_options(args: argparse.Namespace) -> dict[str, RuleOption]:
    options: dict[str, RuleOption] = {}
    if args.sql is not None:
        options["filter"] = SqlRuleFilter(args.sql)
    elif args.correlation:
        fields = dict(args.correlation)
        known = {f.name for f in dataclasses.fields(CorrelationRuleFilter)} - {"properties"}
        options["filter"] = CorrelationRuleFilter(**{k: v for k, v in fields.items() if k in known},
                                                  properties={k: v for k, v in fields.items() if k not in known} or None)
    if args.sql_action is not None:
        options["action"] = SqlRuleAction(args.sql_action)
    return options


def entity_command(args: argparse.Namespace) -> None:
    """list / show / create / update / delete / runtime of a queue, topic, subscription or rule."""
    kind, action = args.kind, args.action
    admin = ServiceBusAdministrationClient(args.namespace)
    parent = _parent(args, kind)
    if action == "list":
        print_records(getattr(admin, f"list_{kind}s")(*parent), kind, args.json)
        return
    if action == "purge":
        purge(args)
        return
    if action == "create":
        options = dict(args.set or ())
        if kind == "rule":
            options.update(_rule_options(args))
        created = getattr(admin, f"create_{kind}")(*parent, args.name, **options)
        print_record(created, args.json)
    elif action == "update":
        getattr(admin, f"update_{kind}")(*parent, args.name, **dict(args.set))
        print_record(getattr(admin, f"get_{kind}")(*parent, args.name), args.json)
    elif action == "delete":
        getattr(admin, f"delete_{kind}")(*parent, args.name)
        print(json.dumps({"deleted": args.name}) if args.json else f"deleted {kind} {args.name}")
    else:
        read = f"get_{kind}_runtime_properties" if action == "runtime" else f"get_{kind}"
        print_record(getattr(admin, read)(*parent, args.name), args.json)


def purge(args: argparse.Namespace) -> None:
    """Remove every message of a queue or subscription (or of its dead-letter sub-queue) enqueued before
    the command started: the receiver's purge_messages; locked messages stay."""
    sub_queue = ServiceBusSubQueue.DEAD_LETTER if args.dead_letter else None
    with ServiceBusClient(args.namespace) as client:
        receiver = (client.get_subscription_receiver(args.topic, args.name, sub_queue=sub_queue)
                    if args.kind == "subscription" else client.get_queue_receiver(args.name, sub_queue=sub_queue))
        with receiver:
            removed = receiver.purge_messages()
    where = ("the dead-letter sub-queue of " if args.dead_letter else "") + f"{args.kind} {args.name}"
    print(json.dumps({"purged": removed}) if args.json else f"purged {removed} message(s) from {where}")


def namespace_command(args: argparse.Namespace) -> None:
    if args.action == "create":
        props = create_namespace(args.namespace, tier=args.tier, partition_count=args.partition_count,
                                 messaging_units=args.messaging_units, credits_per_second=args.credits_per_second)
    else:
        props = ServiceBusAdministrationClient(args.namespace).get_namespace_properties()
    print_record(props, args.json)


def maintain(args: argparse.Namespace) -> None:
    """One maintenance sweep of every entity (what the namespace service does every few seconds)."""
    result = sweep(open_catalog(args.namespace))
    if args.json:
        print(json.dumps(dataclasses.asdict(result)))
    else:
        print(f"maintained {result.tables} tables; {result.removed} settled messages left the tables")


def register(commands: argparse._SubParsersAction[ParserT]) -> list[ParserT]:
    """Add namespace, queue, topic, subscription, rule and maintain; returns the parsers that take
    --namespace (every leaf command)."""
    made: list[ParserT] = []
    ns = commands.add_parser("namespace", help="create a namespace or show its properties")
    ns_actions = ns.add_subparsers(dest="action", required=True)
    create = ns_actions.add_parser("create", help="create a namespace in a new or empty directory")
    create.add_argument("--tier", default="standard", help="basic, standard or premium")
    create.add_argument("--partition-count", type=whole(1), help="premium: 1, 2 or 4 partitions for every entity")
    create.add_argument("--messaging-units", type=whole(1), default=1, help="premium: 1, 2, 4, 8 or 16")
    create.add_argument("--credits-per-second", type=credits_argument, default=1000,
                        help="basic/standard: credit budget (default 1000) or 'off'")
    made += [create, ns_actions.add_parser("show", help="the namespace's tier, partitions, budget and quotas")]
    for parser in made:
        parser.set_defaults(run=namespace_command)
    for kind in KINDS:
        parser = commands.add_parser(kind, help=f"list, show, create, update or delete {kind}s")
        actions = parser.add_subparsers(dest="action", required=True)
        names = ["list", "show", "create", "delete"] + ([] if kind == "rule" else ["update", "runtime"]) + \
            (["purge"] if kind in ("queue", "subscription") else [])
        for action in names:
            leaf = actions.add_parser(action, help={"list": f"list {kind}s", "runtime": f"runtime properties of a {kind}",
                                                    "purge": f"remove every message of a {kind} (locked ones stay)"}
                                     .get(action, f"{action} a {kind}"))
            leaf.set_defaults(run=entity_command, kind=kind)
            if action != "list":
                leaf.add_argument("name", help=f"the {kind}'s name")
            if kind in ("subscription", "rule"):
                leaf.add_argument("--topic", required=True)
            if kind == "rule":
                leaf.add_argument("--subscription", required=True)
            if action == "purge":
                leaf.add_argument("--from-dead-letter", dest="dead_letter", action="store_true",
                                  help="purge the dead-letter sub-queue instead")
            if action == "create":
                leaf.add_argument("--set", action="append", type=setting, metavar="NAME=VALUE",
                                  help="a creation keyword of the administration client (repeatable), e.g. "
                                       "max_delivery_count=5, lock_duration=30 (seconds) or PT30S, requires_session=true")
                if kind == "rule":
                    rule_filter = leaf.add_mutually_exclusive_group()
                    rule_filter.add_argument("--sql", help="a SQL filter expression")
                    rule_filter.add_argument("--correlation", action="append", type=correlation, metavar="KEY=VALUE",
                                             help="a correlation filter field or application property (repeatable)")
                    leaf.add_argument("--action", dest="sql_action", help="a SQL rule action, e.g. \"SET priority = 'high'\"")
            if action == "update":
                leaf.add_argument("--set", action="append", type=setting, metavar="NAME=VALUE", required=True,
                                  help="a setting to change (repeatable), e.g. max_delivery_count=5, "
                                       "archive_retention=P7D, or archive_retention=none to switch the archive off")
            made.append(leaf)
    upkeep = commands.add_parser("maintain", help="one maintenance sweep: retention, compaction, log cleanup")
    upkeep.set_defaults(run=maintain)
    made.append(upkeep)
    for parser in made:
        parser.add_argument("--json", action="store_true", help="JSON output (lists: one object per line)")
    return made
