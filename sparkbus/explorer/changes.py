"""What the Explorer changes, only when it was started with allow_changes: send messages; settle one
message (complete, abandon, defer, dead-letter; cancel a scheduled one); resubmit dead-lettered messages,
optionally edited; purge; create, update and delete entities and rules.

Each change takes the form's text as the user typed it and checks all of it before it writes anything
(ValueError or TypeError saying what was wrong and what is allowed): names as the API checks them, settings as
the command line's --set reads them, properties as a JSON object, times as ISO 8601. Settling a message locks
exactly that message (by sequence number, as receive_deferred_messages does for deferred ones): a message
another receiver holds is refused, never taken from it. A session entity's message is settled through a
session receiver of its session, which must be free.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Optional

from ..client import ServiceBusClient
from ..core.filters import CORRELATION_FIELDS, CorrelationRuleFilter, SqlRuleAction, SqlRuleFilter, TrueRuleFilter
from ..core.names import split_subscription_path, validate_child_name, validate_entity_name
from ..core.option_text import duration, settings
from ..exceptions import MessageNotFoundError
from ..management import ServiceBusAdministrationClient
from ..message import ServiceBusMessage
from ..packing import pack
from ..receiver import ServiceBusReceivedMessage, ServiceBusReceiver
from ..resubmit import default_destination, resubmit_dead_lettered
from .pages import entity_path, message as peeked, receiver as peek_receiver

MAX_REPEAT = 1000  # copies one send form may send
SETTLEMENTS = ("complete", "abandon", "defer", "dead-letter", "cancel")
KINDS = ("queue", "topic", "subscription")


@dataclass(frozen=True)
class Outgoing:
    """A message as the send form (and the resubmit form's edits) give it, every field text."""

    body: str
    application_properties: str = ""  # a JSON object, or nothing
    content_type: str = ""
    message_id: str = ""
    session_id: str = ""
    partition_key: str = ""
    correlation_id: str = ""
    subject: str = ""
    time_to_live: str = ""  # seconds or ISO 8601
    scheduled_enqueue_time_utc: str = ""  # ISO 8601 date-time, UTC unless it names an offset


def json_object(text: str, what: str = "application properties") -> Optional[dict[str, Any]]:
    """A JSON object typed into a form (None for blank text). ValueError saying what it must be otherwise."""
    if not text.strip():
        return None
    example = 'such as {"region": "eu"}'
    try:
        value = json.loads(text)
    except ValueError as error:
        raise ValueError(f"{what} must be a JSON object {example}: {error}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{what} must be a JSON object {example}, got a JSON {type(value).__name__}")
    return value


def scheduled_time(text: str) -> Optional[datetime]:
    if not text.strip():
        return None
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"scheduled time must be an ISO 8601 date-time such as 2026-01-31T12:00:00Z, "
                         f"got {text!r}") from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def build(form: Outgoing) -> ServiceBusMessage:
    """The message of a form (every field checked by ServiceBusMessage as any send checks it)."""
    fields: dict[str, Any] = {name: getattr(form, name) or None for name in
                              ("content_type", "message_id", "session_id", "partition_key", "correlation_id", "subject")}
    ttl = form.time_to_live.strip()
    return ServiceBusMessage(
        form.body, application_properties=json_object(form.application_properties),
        time_to_live=duration("time_to_live", float(ttl) if _number(ttl) else ttl) if ttl else None,
        scheduled_enqueue_time_utc=scheduled_time(form.scheduled_enqueue_time_utc), **fields)


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def send(client: ServiceBusClient, path: str, form: Outgoing, repeat: int = 1) -> int:
    """Send the form's message `repeat` times (1..MAX_REPEAT) to a queue or topic, all packed and checked
    before the first is sent. Returns how many were sent."""
    path = validate_entity_name(path, "queue or topic")
    if not 1 <= repeat <= MAX_REPEAT:
        raise ValueError(f"repeat count must be from 1 to {MAX_REPEAT}, got {repeat}")
    with client.get_queue_sender(path) as sender:  # each copy its own message (and id, unless the form names one)
        batches = pack(sender, [(f"copy {n}", build(form)) for n in range(1, repeat + 1)])
        for batch, _ in batches:
            sender.send_messages(batch)
    return repeat


def settle(client: ServiceBusClient, admin: ServiceBusAdministrationClient, path: str, queue: str,
           sequence_number: int, action: str, *, reason: str = "", description: str = "") -> str:
    """Settle one message of a page (module docstring). queue is where it was shown: active and deferred
    messages take complete, abandon, defer and dead-letter; a dead-lettered one complete (it is deleted) or
    abandon; a scheduled one cancel. Returns what was done, in words. MessageNotFoundError when the message
    is not there any more (or is locked)."""
    path = entity_path(path)
    if action not in SETTLEMENTS:
        raise ValueError(f"action must be one of {', '.join(SETTLEMENTS)}, got {action!r}")
    allowed = {"active": SETTLEMENTS[:4], "deferred": SETTLEMENTS[:4], "dead-letter": ("complete", "abandon"),
               "scheduled": ("cancel",)}[queue]
    if action not in allowed:
        raise ValueError(f"a message of the {queue} list can be {', '.join(allowed)}, not {action}")
    if queue == "scheduled":
        found = peeked(client, path, queue, sequence_number)
        if found is None:
            raise MessageNotFoundError(f"no scheduled message {sequence_number} in {path!r}")
        with client.get_queue_sender(path) as sender:
            sender.cancel_scheduled_messages(sequence_number)
        return f"cancelled scheduled message {sequence_number}"
    session = _session_of(client, admin, path, queue, sequence_number)
    with _settling_receiver(client, path, queue, session) as receiver:
        got = (receiver.receive_deferred_messages([sequence_number]) if queue == "deferred"
               else receiver.receive_messages_by_sequence_number([sequence_number]))
        _apply(receiver, got[0], action, reason, description)
    done = {"complete": "completed", "abandon": "abandoned", "defer": "deferred", "dead-letter": "dead-lettered"}
    return f"{done[action]} message {sequence_number}"


def _session_of(client: ServiceBusClient, admin: ServiceBusAdministrationClient, path: str, queue: str,
                sequence_number: int) -> Optional[str]:
    """The session id of an active or deferred message of a session entity (None otherwise)."""
    subscription = split_subscription_path(path)
    props = admin.get_subscription(*subscription) if subscription else admin.get_queue(path)
    if queue == "dead-letter" or not props.requires_session:
        return None
    found = peeked(client, path, queue, sequence_number)
    return None if found is None else found.session_id


def _settling_receiver(client: ServiceBusClient, path: str, queue: str, session: Optional[str]) -> ServiceBusReceiver:
    if session is None:
        return peek_receiver(client, path, queue)
    subscription = split_subscription_path(path)
    if subscription is None:
        return client.get_queue_receiver(path, session_id=session)
    return client.get_subscription_receiver(*subscription, session_id=session)


def _apply(receiver: ServiceBusReceiver, message: ServiceBusReceivedMessage, action: str, reason: str,
           description: str) -> None:
    if action == "complete":
        receiver.complete_message(message)
    elif action == "abandon":
        receiver.abandon_message(message)
    elif action == "defer":
        receiver.defer_message(message)
    else:
        receiver.dead_letter_message(message, reason=reason or None, error_description=description or None)


def resubmit(client: ServiceBusClient, path: str, sequence_numbers: list[int], *, all_messages: bool = False,
             to: str = "", edit: Optional[Outgoing] = None) -> int:
    """Resubmit the chosen dead-lettered messages (all or none), or every one (all_messages), to `to`
    (default: the queue itself, or a subscription's topic); edit (one message only) replaces the copy's body,
    application properties, content type, subject and session id. Returns how many were resubmitted."""
    path = entity_path(path)
    destination = validate_entity_name(to.strip(), "queue or topic") if to.strip() else default_destination(path)
    if not sequence_numbers and not all_messages:
        raise ValueError("choose the dead-lettered messages to resubmit (or resubmit all)")
    if edit is not None and (all_messages or len(sequence_numbers) != 1):
        raise ValueError("an edited resubmit takes exactly one message")

    def edited(copy: ServiceBusMessage) -> ServiceBusMessage:
        """The form's message; what the form leaves blank (or has no field for) kept from the copy."""
        assert edit is not None  # (only passed with an edit)
        made = build(edit)
        for name in ("message_id", "session_id", "correlation_id", "partition_key", "time_to_live"):
            if not getattr(edit, name).strip():
                setattr(made, name, getattr(copy, name))
        for name in ("to", "reply_to", "reply_to_session_id"):
            setattr(made, name, getattr(copy, name))
        return made

    if edit is not None:
        build(edit)  # refused before anything is locked
    return resubmit_dead_lettered(client, path, to=destination,
                                  sequence_numbers=None if all_messages else sequence_numbers,
                                  max_message_count=2**31 - 1, max_wait_time=0,
                                  edit=edited if edit is not None else None)


def purge(client: ServiceBusClient, path: str, queue: str, confirmation: str) -> int:
    """Remove every message of a queue or subscription (queue "active": its messages; "dead-letter": its
    dead-letter sub-queue) enqueued before now, once `confirmation` is the entity's path as shown. Locked
    messages stay. Returns how many were removed."""
    path = entity_path(path)
    if confirmation.strip() != path:
        raise ValueError(f"type the entity's name, {path}, to confirm the purge")
    if queue not in ("active", "dead-letter"):
        raise ValueError(f"purge empties the active messages or the dead-letter sub-queue, not {queue!r}")
    with peek_receiver(client, path, queue) as receiver:
        return receiver.purge_messages()


def create_entity(admin: ServiceBusAdministrationClient, kind: str, name: str, topic: str = "",
                  settings_text: str = "") -> str:
    """Create a queue, topic or subscription (of topic) with settings, one NAME=VALUE per line as the
    command line's --set takes them. Returns its path."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    options = settings(settings_text)
    name = name.strip()
    if kind == "subscription":
        admin.create_subscription(validate_entity_name(topic.strip(), "topic"), validate_child_name(name), **options)
        return f"{topic.strip()}/Subscriptions/{name}"
    getattr(admin, f"create_{kind}")(validate_entity_name(name, kind), **options)
    return name


def update_entity(admin: ServiceBusAdministrationClient, path: str, settings_text: str) -> None:
    """Change an entity's settings (NAME=VALUE lines); the others keep their values."""
    path = entity_path(path)
    options = settings(settings_text)
    if not options:
        raise ValueError("give at least one setting to change, as NAME=VALUE, e.g. max_delivery_count=5")
    subscription = split_subscription_path(path)
    if subscription is not None:
        admin.update_subscription(subscription[0], subscription[1], **options)
    elif _kind(admin, path) == "topic":
        admin.update_topic(path, **options)
    else:
        admin.update_queue(path, **options)


def delete_entity(admin: ServiceBusAdministrationClient, path: str, confirmation: str) -> None:
    """Delete an entity and its messages once `confirmation` is its path as shown."""
    path = entity_path(path)
    if confirmation.strip() != path:
        raise ValueError(f"type the entity's name, {path}, to confirm deleting it")
    subscription = split_subscription_path(path)
    if subscription is not None:
        admin.delete_subscription(*subscription)
    elif _kind(admin, path) == "topic":
        admin.delete_topic(path)
    else:
        admin.delete_queue(path)


def _kind(admin: ServiceBusAdministrationClient, path: str) -> str:
    return "topic" if any(t.name.lower() == path.lower() for t in admin.list_topics()) else "queue"


def create_rule(admin: ServiceBusAdministrationClient, path: str, name: str, *, sql: str = "",
                correlation: str = "", action: str = "") -> None:
    """Add a rule to a subscription: a SQL filter, or a correlation filter given as a JSON object of its
    fields (correlation_id, subject, ...) and application properties, or TRUE when both are blank; an
    optional SQL action."""
    subscription = split_subscription_path(entity_path(path))
    if subscription is None:
        raise ValueError(f"rules belong to subscriptions ('<topic>/Subscriptions/<name>'), not {path!r}")
    if sql.strip() and correlation.strip():
        raise ValueError("a rule has a SQL filter or a correlation filter, not both")
    rule_filter: Any = TrueRuleFilter()
    if sql.strip():
        rule_filter = SqlRuleFilter(sql.strip())
    elif correlation.strip():
        fields = json_object(correlation, "a correlation filter") or {}
        known = {k: v for k, v in fields.items() if k in CORRELATION_FIELDS}
        rest = {k: v for k, v in fields.items() if k not in CORRELATION_FIELDS}
        rule_filter = CorrelationRuleFilter(**known, properties=rest or None)
    admin.create_rule(subscription[0], subscription[1], validate_child_name(name.strip(), "rule"), filter=rule_filter,
                      action=SqlRuleAction(action.strip()) if action.strip() else None)


def delete_rule(admin: ServiceBusAdministrationClient, path: str, name: str) -> None:
    subscription = split_subscription_path(entity_path(path))
    if subscription is None:
        raise ValueError(f"rules belong to subscriptions ('<topic>/Subscriptions/<name>'), not {path!r}")
    admin.delete_rule(subscription[0], subscription[1], validate_child_name(name, "rule"))
