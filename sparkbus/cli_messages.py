"""The message commands of the `sparkbus` CLI: send (arguments, a JSON-lines file or stdin), peek and
receive (receive completes what it prints), and `dead-letter list|resubmit`. Tables for people, `--json`
(one object per line) for scripts, progress bars on stderr when it is a terminal. An entity is a queue or
topic to send to, a queue or '<topic>/Subscriptions/<name>' to read.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Iterable, Iterator, Optional, Sequence

from tqdm import tqdm

from .amqp import AmqpAnnotatedMessage
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
    with ServiceBusClient(args.namespace) as client, client.get_queue_sender(args.entity) as sender, \
            progress("sending") as bar:
        sent = _send_batches(sender, _messages(args), bar.update)
    print(json.dumps({"sent": sent}) if args.json else f"sent {sent} message(s) to {args.entity}")


def progress(what: str, total: Optional[int] = None) -> tqdm:
    """A progress bar on stderr, shown only when stderr is a terminal."""
    return tqdm(total=total, desc=what, unit="msg", file=sys.stderr, disable=None, leave=False)


def _send_batches(sender, messages: Iterable[ServiceBusMessage], sent_some=lambda n: None) -> int:
    sent, batch = 0, sender.create_message_batch()
    for message in messages:
        try:
            batch.add_message(message)
        except MessageSizeExceededError:  # the batch is full: send it, start the next
            if not len(batch):
                raise
            sender.send_messages(batch)
            sent += len(batch)
            sent_some(len(batch))
            batch = sender.create_message_batch()
            batch.add_message(message)
    if len(batch):
        sender.send_messages(batch)
        sent += len(batch)
        sent_some(len(batch))
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


def copy_to_resubmit(message: ServiceBusReceivedMessage) -> ServiceBusMessage:
    """A new message with a dead-lettered message's body (of any kind), properties, application
    properties (as sent) and time to live; the broker's fields (numbers, counts, reasons) are not copied."""
    kind = message.body_type.value
    body = message.body if kind == "value" else list(message.body)
    copy = ServiceBusMessage.from_amqp(AmqpAnnotatedMessage(**{f"{kind}_body": body}))
    for name in MESSAGE_FIELDS:
        setattr(copy, name, getattr(message, name))
    copy.application_properties = dict(message.str_application_properties)
    copy.time_to_live = message.time_to_live
    return copy


def resubmit(args: argparse.Namespace) -> None:
    """Move up to --count dead-lettered messages back: each copy is sent to --to (default: the queue itself,
    or the topic of a subscription, whose rules then route it again), then the dead-lettered message is
    completed. A crash between the two leaves the message dead-lettered and its copy sent: resubmitting
    again sends a second copy unless the destination detects duplicates (the message id is kept)."""
    subscription = split_subscription_path(args.entity)
    destination = args.to or (subscription[0] if subscription else args.entity)
    moved = 0
    with ServiceBusClient(args.namespace) as client, _receiver(args, client) as receiver, \
            client.get_queue_sender(destination) as sender, progress("resubmitting", args.count) as bar:
        while moved < args.count:
            got = receiver.receive_messages(min(args.count - moved, 100), max_wait_time=args.wait if not moved else 0)
            if not got:
                break
            sender.send_messages([copy_to_resubmit(m) for m in got])
            receiver.complete_messages(got)
            moved += len(got)
            bar.update(len(got))
    print(json.dumps({"resubmitted": moved, "to": destination}) if args.json
          else f"resubmitted {moved} message(s) from {args.entity} to {destination}")


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
    """Add send, peek, receive and dead-letter list|resubmit; returns their parsers (they take --namespace
    like the others)."""
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
    dead = commands.add_parser("dead-letter", help="list or resubmit an entity's dead-lettered messages")
    dead_actions = dead.add_subparsers(dest="action", required=True)
    for name, run, text in (("list", peek, "browse dead-lettered messages"),
                            ("resubmit", resubmit, "send dead-lettered messages again and complete them")):
        cmd = dead_actions.add_parser(name, help=text)
        cmd.add_argument("--entity", required=True, help="queue or '<topic>/Subscriptions/<name>'")
        cmd.add_argument("--count", type=int, default=10 if name == "list" else 1000, help="at most this many")
        cmd.add_argument("--wait", type=float, default=1.0, help="seconds to wait for a first message")
        if name == "resubmit":
            cmd.add_argument("--to", help="queue or topic to send to; default: the queue, or the subscription's topic")
        cmd.set_defaults(run=run, dead_letter=True)
        made.append(cmd)
    for cmd in made:
        cmd.add_argument("--json", action="store_true", help="one JSON object per line")
    return made
