"""The message commands of the `sparkbus` CLI: send (arguments, a JSON-lines file or stdin), peek and
receive (receive completes what it prints). Tables for people, `--json` (one object per line) for
scripts. An entity is a queue or topic to send to, a queue or '<topic>/Subscriptions/<name>' to read.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Iterable, Iterator, Sequence

from .client import ServiceBusClient
from .core.names import split_subscription_path
from .exceptions import MessageSizeExceededError
from .message import ServiceBusMessage
from .receiver import ServiceBusReceivedMessage, ServiceBusReceiver, ServiceBusSubQueue

MESSAGE_FIELDS = ("message_id", "session_id", "partition_key", "correlation_id", "content_type", "subject", "to",
                  "reply_to", "reply_to_session_id")
SHOWN = ("sequence_number", "enqueued_time_utc", "message_id", "session_id", "subject", "delivery_count", "body")


def format_table(rows: list[dict], columns: Sequence[str]) -> str:
    """Rows as aligned text columns under a header (every command's tables)."""
    cells = [list(columns)] + [[str(r[c]) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def message_from_json(line: str, number: int) -> ServiceBusMessage:
    """One JSON line: a string (the body) or an object with "body" and ServiceBusMessage's keywords."""
    try:
        value = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"line {number}: not JSON ({error.msg})") from None
    if isinstance(value, str):
        return ServiceBusMessage(value)
    if not isinstance(value, dict) or "body" not in value:
        raise ValueError(f"line {number}: expected a string or an object with \"body\", got {line.strip()[:60]!r}")
    unknown = sorted(set(value) - {"body", "application_properties", *MESSAGE_FIELDS})
    if unknown:
        raise ValueError(f"line {number}: unknown field(s) {unknown}; allowed: body, application_properties, "
                         f"{', '.join(MESSAGE_FIELDS)}")
    return ServiceBusMessage(**value)


def _messages(args: argparse.Namespace) -> Iterator[ServiceBusMessage]:
    extra = {name: getattr(args, name) for name in ("session_id", "subject") if getattr(args, name)}
    for body in args.body or ():
        yield ServiceBusMessage(body, **extra)
    if args.file:
        handle = sys.stdin if args.file == "-" else open(args.file, encoding="utf-8")
        with handle:
            for number, line in enumerate(handle, 1):
                if line.strip():
                    yield message_from_json(line, number)


def send(args: argparse.Namespace) -> None:
    """Send in batches as large as the entity allows (each batch one commit)."""
    if not args.body and not args.file:
        raise ValueError("send needs --body TEXT (repeatable) or --file FILE.jsonl ('-' for stdin)")
    with ServiceBusClient(args.namespace) as client, client.get_queue_sender(args.entity) as sender:
        sent = _send_batches(sender, _messages(args))
    print(json.dumps({"sent": sent}) if args.json else f"sent {sent} message(s) to {args.entity}")


def _send_batches(sender, messages: Iterable[ServiceBusMessage]) -> int:
    sent, batch = 0, sender.create_message_batch()
    for message in messages:
        try:
            batch.add_message(message)
        except MessageSizeExceededError:  # the batch is full: send it, start the next
            if not len(batch):
                raise
            sender.send_messages(batch)
            sent += len(batch)
            batch = sender.create_message_batch()
            batch.add_message(message)
    if len(batch):
        sender.send_messages(batch)
        sent += len(batch)
    return sent


def _receiver(args: argparse.Namespace, client: ServiceBusClient) -> ServiceBusReceiver:
    sub_queue = ServiceBusSubQueue.DEAD_LETTER if args.dead_letter else None
    subscription = split_subscription_path(args.entity)
    if subscription is None:
        return client.get_queue_receiver(args.entity, sub_queue=sub_queue, max_wait_time=args.wait)
    return client.get_subscription_receiver(*subscription, sub_queue=sub_queue, max_wait_time=args.wait)


def peek(args: argparse.Namespace) -> None:
    with ServiceBusClient(args.namespace) as client, _receiver(args, client) as receiver:
        found: list[ServiceBusReceivedMessage] = []
        while len(found) < args.count:
            more = receiver.peek_messages(args.count - len(found))
            if not more:
                break
            found += more
    _print(found, args.json)


def receive(args: argparse.Namespace) -> None:
    """Receive up to --count messages and complete them (they leave the entity)."""
    with ServiceBusClient(args.namespace) as client, _receiver(args, client) as receiver:
        got = receiver.receive_messages(max_message_count=args.count)
        receiver.complete_messages(got)
    _print(got, args.json)


def _record(message: ServiceBusReceivedMessage) -> dict:
    record = {name: getattr(message, name) for name in SHOWN}
    record.update(body=str(message), enqueued_time_utc=message.enqueued_time_utc.isoformat(),
                  application_properties=message.str_application_properties,
                  dead_letter_reason=message.dead_letter_reason)
    return record


def _print(messages: list[ServiceBusReceivedMessage], as_json: bool) -> None:
    if as_json:
        for message in messages:
            print(json.dumps(_record(message), default=str))
        return
    if not messages:
        print("no messages")
        return
    rows = [{**_record(m), "body": str(m)[:40]} for m in messages]
    print(format_table([{k: ("" if v is None else v) for k, v in r.items()} for r in rows], SHOWN))


def register(commands: argparse._SubParsersAction) -> list[argparse.ArgumentParser]:
    """Add send, peek and receive; returns their parsers (they take --namespace like the others)."""
    snd = commands.add_parser("send", help="send messages: --body TEXT ... or --file F.jsonl ('-': stdin)")
    snd.add_argument("--entity", required=True, help="queue or topic")
    snd.add_argument("--body", action="append", help="a message body (repeatable)")
    snd.add_argument("--file", help="JSON lines: a string body, or {\"body\": ..., \"session_id\": ..., ...}")
    snd.add_argument("--session-id", help="session id of the --body messages")
    snd.add_argument("--subject", help="subject of the --body messages")
    snd.set_defaults(run=send)
    made = [snd]
    for name, run, text in (("peek", peek, "browse messages without locking them"),
                            ("receive", receive, "receive messages and complete them")):
        cmd = commands.add_parser(name, help=text)
        cmd.add_argument("--entity", required=True, help="queue or '<topic>/Subscriptions/<name>'")
        cmd.add_argument("--count", type=int, default=10, help="at most this many messages")
        cmd.add_argument("--dead-letter", action="store_true", help="the entity's dead-letter sub-queue")
        cmd.add_argument("--wait", type=float, default=1.0, help="seconds to wait for a first message (receive)")
        cmd.set_defaults(run=run)
        made.append(cmd)
    for cmd in made:
        cmd.add_argument("--json", action="store_true", help="one JSON object per line")
    return made
