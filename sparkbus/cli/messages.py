"""The message commands of the `sparkbus` CLI: send (arguments, a JSON-lines file or stdin), peek (from a
sequence number, with each message's state), receive (settled as --settle says; deferred messages by
sequence number), `dead-letter list|resubmit` (all, or chosen by sequence number) and `replay` (what an
entity's archive holds, from a time). Tables for people,
`--json` (one object per line) for scripts, progress bars on stderr when it is a terminal. An entity is a
queue or topic to send to, a queue or '<topic>/Subscriptions/<name>' to read.

All or nothing where it can be: `send` reads and checks every message (JSON, the message's values, the
entity's status, session and size rules) and packs the batches before it sends the first, so a bad line
sends nothing; only a failure of a send itself (e.g. the entity's quota) can stop it part way, and its error
then says how many messages were sent, through which line. `dead-letter resubmit` checks its target (it
exists, is a queue or topic and takes sends) before it receives anything.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from datetime import datetime, timedelta, timezone
from typing import Any, Iterator, Optional, TypeVar, Union

from tqdm import tqdm

from ..client import ServiceBusClient
from ..engine import clock
from ..management import ServiceBusAdministrationClient
from ..rules import SqlRuleFilter
from ..core.durations import MAX_DURATION, parse_duration
from ..core.names import split_subscription_path
from ..core.wording import plural
from ..definitions import parse_nested
from ..message import ServiceBusMessage
from ..packing import Numbered, pack, reworded
from ..receiver import ServiceBusReceivedMessage, ServiceBusReceiver, ServiceBusSubQueue
from ..resubmit import MESSAGE_FIELDS, default_destination, resubmit_dead_lettered
from .text import UsageError, cut, format_table, property_argument, seconds, sequence_number, whole

TIMED_FIELDS = ("time_to_live", "scheduled_enqueue_time_utc")  # JSON has no durations or times: see _timed
SHOWN = ("sequence_number", "state", "enqueued_time_utc", "message_id", "session_id", "subject", "delivery_count",
         "body")
DEAD_LETTER_SHOWN = ("dead_letter_reason", "dead_letter_error_description")
ParserT = TypeVar("ParserT", bound=argparse.ArgumentParser)


def message_from_json(line: str, where: str) -> ServiceBusMessage:
    """One JSON line: a string (the body) or an object with "body" and ServiceBusMessage's keywords.
    ValueError or TypeError, its message starting with where (e.g. "messages.jsonl line 3"), when the line is
    not JSON, nests deeper than MAX_NESTING_DEPTH, or ServiceBusMessage refuses its values."""
    try:
        value = parse_nested(line, "json", where, json.loads)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where}: not JSON ({error.msg} at column {error.colno})") from None
    except ValueError as error:  # an integer of more digits than Python converts
        raise ValueError(f"{where}: not JSON ({error})") from None
    if not isinstance(value, (str, dict)) or isinstance(value, dict) and "body" not in value:
        raise ValueError(f"{where}: expected a string or an object with \"body\", got {line.strip()[:60]!r}")
    if isinstance(value, dict):
        unknown = sorted(set(value) - {"body", "application_properties", *MESSAGE_FIELDS, *TIMED_FIELDS})
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {unknown}; allowed: body, application_properties, "
                             f"{', '.join(MESSAGE_FIELDS + TIMED_FIELDS)}")
        if isinstance(value["body"], (dict, list)):
            raise TypeError(f"{where}: \"body\" is a JSON {type(value['body']).__name__.replace('dict', 'object')}"
                            "; a body is a string: send JSON as a string (e.g. \"body\": \"{\\\"a\\\": 1}\")")
    try:
        if isinstance(value, str):
            return ServiceBusMessage(value)
        return ServiceBusMessage(**{**value, **_timed(value)})
    except (ValueError, TypeError) as error:
        raise reworded(error, f"{where}: {error}") from None


def _timed(value: dict[str, Any]) -> dict[str, Union[timedelta, datetime]]:
    """The time fields of a JSON message as ServiceBusMessage takes them: time_to_live from seconds (a
    number) or ISO 8601 duration text, scheduled_enqueue_time_utc from ISO 8601 date-time text (UTC when
    it names no offset). ValueError or TypeError saying what is allowed."""
    timed: dict[str, Union[timedelta, datetime]] = {}
    if "time_to_live" in value:
        ttl = value["time_to_live"]
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float, str)):
            raise TypeError(f"time_to_live is seconds (a number) or an ISO 8601 duration such as \"PT5M\", got {ttl!r}")
        if isinstance(ttl, str):
            timed["time_to_live"] = parse_duration(ttl, "time_to_live")
        elif not 0 < ttl < MAX_DURATION.total_seconds():
            raise ValueError(f"time_to_live must be more than 0 seconds and less than {MAX_DURATION.days} days, got {ttl!r}")
        else:
            timed["time_to_live"] = timedelta(seconds=ttl)
    if "scheduled_enqueue_time_utc" in value:
        when = value["scheduled_enqueue_time_utc"]
        try:
            parsed = datetime.fromisoformat(when) if isinstance(when, str) else None
        except ValueError:
            parsed = None
        if parsed is None:
            raise ValueError("scheduled_enqueue_time_utc is an ISO 8601 date-time such as "
                             f"\"2026-01-31T12:00:00Z\", got {when!r}")
        timed["scheduled_enqueue_time_utc"] = parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)
    return timed


def _file_lines(name: str) -> Iterator[tuple[str, str]]:
    """(where, text) of every line with something on it of a file ('-': stdin), decoded as UTF-8 (a byte
    order mark at the start is skipped); ValueError names a line that is not UTF-8."""
    handle = sys.stdin.buffer if name == "-" else open(name, "rb")
    label = "stdin" if name == "-" else name
    try:
        for number, raw in enumerate(handle, 1):
            where = f"{label} line {number}"
            try:
                text = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(f"{where}: not UTF-8 text ({error.reason} at byte {error.start + 1})") from None
            if text.strip():
                yield where, text
    finally:
        if name != "-":
            handle.close()


def _messages(args: argparse.Namespace) -> Iterator[Numbered]:
    extra: dict[str, Any] = {name: getattr(args, name) for name in ("session_id", "subject") if getattr(args, name)}
    if args.property:
        extra["application_properties"] = dict(args.property)
    for number, body in enumerate(args.body or (), 1):
        yield f"--body {number}", ServiceBusMessage(body, **extra)
    if args.file:
        for where, line in _file_lines(args.file):
            yield where, message_from_json(line, where)


def send(args: argparse.Namespace) -> None:
    """Check every message and pack the batches (as large as the entity allows, each one commit), then send
    them: a message that is refused sends nothing."""
    if not args.body and not args.file:
        raise UsageError("send needs --body TEXT (repeatable) or --file FILE.jsonl ('-' for stdin)")
    with ServiceBusClient(args.namespace) as client, client.get_queue_sender(args.entity) as sender:
        batches = pack(sender, _messages(args))
        total, sent, through = sum(len(batch) for batch, _ in batches), 0, ""
        with progress("sending", total) as bar:
            for batch, last in batches:
                try:
                    sender.send_messages(batch)
                except (Exception, KeyboardInterrupt) as error:
                    if sent:  # say where to resume
                        told = f"{sent} of {total} messages were sent, through {through}; the rest were not"
                        raise reworded(error, f"{error} ({told})" if str(error) else told)
                    raise
                sent, through = sent + len(batch), last
                bar.update(len(batch))
    print(json.dumps({"sent": sent}) if args.json else f"sent {sent} message(s) to {args.entity}")


def progress(what: str, total: Optional[int] = None) -> tqdm:
    """A progress bar on stderr, shown only when stderr is a terminal."""
    return tqdm(total=total, desc=what, unit="msg", file=sys.stderr, disable=None, leave=False)


def _receiver(args: argparse.Namespace, client: ServiceBusClient) -> ServiceBusReceiver:
    """A receiver of --entity (or its dead-letter sub-queue), waiting --wait for a first message (the
    commands that receive take --wait; a peek does not wait)."""
    sub_queue = ServiceBusSubQueue.DEAD_LETTER if args.dead_letter else None
    subscription = split_subscription_path(args.entity)
    wait = vars(args).get("wait")
    if subscription is None:
        return client.get_queue_receiver(args.entity, sub_queue=sub_queue, max_wait_time=wait)
    return client.get_subscription_receiver(*subscription, sub_queue=sub_queue, max_wait_time=wait)


def peek(args: argparse.Namespace) -> None:
    """Browse up to --count messages from --from-sequence-number (default: the first), in order."""
    with ServiceBusClient(args.namespace) as client, _receiver(args, client) as receiver:
        found: list[ServiceBusReceivedMessage] = []
        start = args.from_sequence_number
        while len(found) < args.count:
            more = receiver.peek_messages(args.count - len(found), sequence_number=start)
            if not more:
                break
            found += more
            start = 0  # then on from where the last peek ended
    _print(found, args.json, args.dead_letter)


SETTLEMENTS = ("complete", "abandon", "dead-letter", "defer")


def receive(args: argparse.Namespace) -> None:
    """Receive up to --count messages (or with --sequence-number the deferred messages of those numbers,
    all or none) and settle them as --settle says: complete (they leave the entity), abandon (available
    again at once, their delivery count raised), dead-letter (with --reason and --description) or defer
    (kept, to be received by sequence number)."""
    if args.settle != "dead-letter" and (args.reason is not None or args.description is not None):
        raise UsageError("--reason and --description go with --settle dead-letter")
    with ServiceBusClient(args.namespace) as client, _receiver(args, client) as receiver:
        if args.sequence_number:
            got = receiver.receive_deferred_messages(args.sequence_number)
        else:
            got = receiver.receive_messages(max_message_count=args.count)
        if args.settle == "complete":
            receiver.complete_messages(got)
        for message in got if args.settle != "complete" else ():
            if args.settle == "abandon":
                receiver.abandon_message(message)
            elif args.settle == "defer":
                receiver.defer_message(message)
            else:
                receiver.dead_letter_message(message, reason=args.reason, error_description=args.description)
    _print(got, args.json, args.dead_letter)
    if not args.json and got:
        done = {"complete": "completed", "abandon": "abandoned", "dead-letter": "dead-lettered", "defer": "deferred"}
        print(f"{done[args.settle]} {plural(len(got), 'message')}")


def resubmit(args: argparse.Namespace) -> None:
    """Move up to --count dead-lettered messages back (or those of --sequence-number, all or none) to --to
    (default: the queue itself, or the topic of a subscription): sparkbus.resubmit.resubmit_dead_lettered."""
    destination = args.to or default_destination(args.entity)
    wanted = len(set(args.sequence_number or ())) or args.count
    with ServiceBusClient(args.namespace) as client, progress("resubmitting", wanted) as bar:
        moved = resubmit_dead_lettered(client, args.entity, to=destination, sequence_numbers=args.sequence_number,
                                       max_message_count=args.count, max_wait_time=args.wait, progress=bar.update)
    print(json.dumps({"resubmitted": moved, "to": destination}) if args.json
          else f"resubmitted {moved} message(s) from {args.entity} to {destination}")


def _record(message: ServiceBusReceivedMessage, dead_letter: bool = False) -> dict[str, object]:
    record: dict[str, object] = {name: getattr(message, name) for name in SHOWN if name != "state"}
    record["state"] = "dead-lettered" if dead_letter else message.state.name.lower()
    enqueued = message.enqueued_time_utc
    record.update(body=str(message), enqueued_time_utc=None if enqueued is None else enqueued.isoformat(),
                  application_properties=message.str_application_properties,
                  dead_letter_reason=message.dead_letter_reason,
                  dead_letter_error_description=message.dead_letter_error_description)
    return record


def _print(messages: list[ServiceBusReceivedMessage], as_json: bool, dead_letter: bool = False) -> None:
    """Messages as a table (bodies, properties and dead-letter texts cut at 40 characters, ending in '…'
    where cut) or JSON lines (whole); dead-lettered ones with their reason and description."""
    if as_json:
        for message in messages:
            print(json.dumps(_record(message, dead_letter), default=str))
        return
    if not messages:
        print("no messages")
        return
    columns = SHOWN + ("application_properties",) + (DEAD_LETTER_SHOWN if dead_letter else ())
    rows = [{**_record(m, dead_letter), "application_properties": json.dumps(m.str_application_properties, default=str)
             if m.str_application_properties else ""} for m in messages]
    print(format_table([{k: ("" if v is None else cut(v)) for k, v in r.items()} for r in rows], columns))


def point_in_time(text: str) -> datetime:
    """--since/--until: an ISO 8601 time (UTC when it names no zone, e.g. 2026-11-28T09:30) or an ISO 8601
    duration meaning that long ago (PT1H: an hour ago). ArgumentTypeError saying what is allowed."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        try:
            return clock.now() - parse_duration(text, "time")
        except ValueError:
            raise argparse.ArgumentTypeError(f"takes an ISO 8601 time such as 2026-11-28T09:30 (UTC unless a zone is "
                                             f"given) or a duration ago such as PT1H or P2D, got {text!r}") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def replay(args: argparse.Namespace) -> None:
    """Send again what an entity's archive holds from --since (to --until), to --to (default: the entity),
    selected by --filter; --id names the replay so that running it again continues it."""
    admin = ServiceBusAdministrationClient(args.namespace)
    rule_filter = SqlRuleFilter(args.filter) if args.filter is not None else None
    with progress("replayed") as bar:
        result = admin.replay_messages(args.entity, start_time=args.since, end_time=args.until, to=args.to,
                                       rule_filter=rule_filter, replay_id=args.id, progress=bar.update)
    if args.json:
        print(json.dumps(dataclasses.asdict(result), default=str))
    else:
        before = f" ({result.already_replayed} sent before under this id)" if result.already_replayed else ""
        print(f"replayed {result.replayed} message(s) from {result.entity_path} to {result.to}{before}; "
              f"replay id {result.replay_id}")


def register(commands: argparse._SubParsersAction[ParserT]) -> list[ParserT]:
    """Add send, peek, receive and dead-letter list|resubmit; returns their parsers (they take --namespace
    like the others)."""
    snd = commands.add_parser("send", help="send messages: --body TEXT ... or --file F.jsonl ('-': stdin)")
    snd.add_argument("--entity", required=True, help="queue or topic")
    snd.add_argument("--body", action="append", help="a message body (repeatable)")
    snd.add_argument("--file", help="JSON lines: a string body, or {\"body\": ..., \"session_id\": ..., ...}")
    snd.add_argument("--session-id", help="session id of the --body messages")
    snd.add_argument("--subject", help="subject of the --body messages")
    snd.add_argument("--property", action="append", type=property_argument, metavar="KEY=VALUE",
                     help="an application property of the --body messages (repeatable); true/false, whole and "
                          "decimal numbers and none are typed, anything else is text")
    snd.set_defaults(run=send)
    made = [snd]
    for name, run, text in (("peek", peek, "browse messages without locking them"),
                            ("receive", receive, "receive messages and settle them (complete by default)")):
        cmd = commands.add_parser(name, help=text)
        cmd.add_argument("--entity", required=True, help="queue or '<topic>/Subscriptions/<name>'")
        cmd.add_argument("--count", type=whole(1), default=10, help="at most this many messages")
        cmd.add_argument("--from-dead-letter", dest="dead_letter", action="store_true",
                         help="read the entity's dead-letter sub-queue instead of the entity")
        if name == "peek":
            cmd.add_argument("--from-sequence-number", type=sequence_number(0), default=0, metavar="N",
                             help="start at this sequence number (default: the first message)")
        if name == "receive":
            cmd.add_argument("--wait", type=seconds(zero=True), default=1.0,
                             help="seconds (or an ISO 8601 duration such as PT5S) to wait for a first message")
            cmd.add_argument("--sequence-number", type=sequence_number(0), action="append", metavar="N",
                             help="receive the deferred message of this sequence number instead (repeatable; "
                                  "all or none)")
            cmd.add_argument("--settle", choices=SETTLEMENTS, default="complete",
                             help="what to do with the received messages (default: complete)")
            cmd.add_argument("--reason", help="dead-letter reason (--settle dead-letter)")
            cmd.add_argument("--description", help="dead-letter error description (--settle dead-letter)")
        cmd.set_defaults(run=run)
        made.append(cmd)
    dead = commands.add_parser("dead-letter", help="list or resubmit an entity's dead-lettered messages")
    dead_actions = dead.add_subparsers(dest="action", required=True)
    for name, run, text in (("list", peek, "browse dead-lettered messages"),
                            ("resubmit", resubmit, "send dead-lettered messages again and complete them")):
        cmd = dead_actions.add_parser(name, help=text)
        cmd.add_argument("--entity", required=True, help="queue or '<topic>/Subscriptions/<name>'")
        cmd.add_argument("--count", type=whole(1), default=10 if name == "list" else 1000, help="at most this many")
        if name == "resubmit":
            cmd.add_argument("--wait", type=seconds(zero=True), default=1.0,
                             help="seconds (or an ISO 8601 duration such as PT5S) to wait for a first message")
            cmd.add_argument("--to", help="queue or topic to send to; default: the queue, or the subscription's topic")
            cmd.add_argument("--sequence-number", type=sequence_number(0), action="append", metavar="N",
                             help="resubmit the dead-lettered message of this sequence number (repeatable; all or "
                                  "none), instead of the first --count")
        else:
            cmd.add_argument("--from-sequence-number", type=sequence_number(0), default=0, metavar="N",
                             help="start at this sequence number (default: the first message)")
        cmd.set_defaults(run=run, dead_letter=True)
        made.append(cmd)
    again = commands.add_parser("replay", help="send again what an entity's archive holds (archive_retention)")
    again.add_argument("--entity", required=True, help="queue, topic or '<topic>/Subscriptions/<name>'")
    again.add_argument("--since", required=True, type=point_in_time, metavar="TIME",
                       help="the earliest enqueue time: ISO 8601 (UTC unless a zone is given) or a duration ago, "
                            "e.g. PT1H")
    again.add_argument("--until", type=point_in_time, metavar="TIME", help="enqueue times before this (default: all)")
    again.add_argument("--to", help="the entity to send to (default: the entity itself)")
    again.add_argument("--filter", metavar="SQL", help="only messages this SQL filter matches, e.g. \"region = 'eu'\"")
    again.add_argument("--id", help="names the replay: run again with the same id, it continues and sends nothing twice")
    again.set_defaults(run=replay)
    made.append(again)
    for cmd in made:
        cmd.add_argument("--json", action="store_true", help="one JSON object per line")
    return made
