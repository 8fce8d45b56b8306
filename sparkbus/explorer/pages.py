"""What the Explorer's pages show, read through the public API and returned as typed records (the pages
render them; the JSON API returns them as they are): the dashboard's namespace and entities, an entity with
its settings, rules, sessions and charts' data, a page of messages and one message.

Nothing here writes: browsing is peeking (no locks taken, no delivery counted). Every entity path that comes
from a URL is checked as the API checks names (entity_path) before it is used, so a path reaches storage
only as the name of an entity that exists.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Optional

from ..client import ServiceBusClient
from ..amqp import AmqpMessageBodyType
from ..core.durations import format_duration
from ..core.names import split_subscription_path, validate_child_name, validate_entity_name
from ..core.shown import filter_text, plain
from ..core.wire import MAX_SEQUENCE_NUMBER
from ..engine.admin import EntityProperties
from ..engine.clock import now
from ..engine.metrics import MINUTE, Metrics
from ..engine.sessions import SessionSummary
from ..management import ServiceBusAdministrationClient
from ..receiver import ServiceBusReceivedMessage, ServiceBusReceiver, ServiceBusSubQueue

SUB_QUEUES = ("active", "deferred", "scheduled", "dead-letter")  # the message lists of an entity page
PAGE_SIZE = 25
MAX_PAGE_SIZE = 250
SCAN_LIMIT = 5000  # messages one page may look through for those of one state
MAX_BODY_SHOWN = 256 * 1024  # characters of a body a message page shows (the rest: "cut")
METRICS_WINDOW = timedelta(hours=1)  # what an entity page's charts span


def entity_path(text: str) -> str:
    """A queue or topic name, or '<topic>/Subscriptions/<name>', checked as the administration client checks
    names (ValueError saying what a name may hold); the path as given."""
    subscription = split_subscription_path(text)
    if subscription is None:
        return validate_entity_name(text, "entity")
    validate_entity_name(subscription[0], "topic")
    validate_child_name(subscription[1], "subscription")
    return text


def sub_queue(text: str) -> str:
    """One of SUB_QUEUES, else ValueError naming them."""
    if text not in SUB_QUEUES:
        raise ValueError(f"queue must be one of {', '.join(SUB_QUEUES)}, got {text!r}")
    return text


# ---- dashboard ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EntityRow:
    """One queue, topic or subscription on the dashboard."""

    kind: str  # "queue", "topic" or "subscription"
    path: str  # subscriptions as '<topic>/Subscriptions/<name>'
    status: str
    availability: str
    partitions: int
    active: int  # deferred ones included, as Service Bus counts them
    deferred: int
    dead_letter: int
    scheduled: int
    transfer: int  # waiting to be forwarded
    transfer_dead_letter: int
    size_in_bytes: int
    max_size_in_bytes: Optional[int]  # the quota (subscriptions count against their topic's: None)
    awaiting_fanout: Optional[int]  # a topic's messages no fan-out has delivered yet
    requires_session: bool
    forward_to: Optional[str]
    archive_retention: Optional[str] = None  # ISO 8601; None: no archive
    archive_messages: int = 0  # what the archive holds (not counted in size_in_bytes)

    @property
    def used_percent(self) -> Optional[float]:
        return None if not self.max_size_in_bytes else 100.0 * self.size_in_bytes / self.max_size_in_bytes


@dataclass(frozen=True)
class NamespaceSummary:
    """The namespace line of the dashboard: tier, partitions, the credit budget and recent throttling."""

    path: str
    name: str
    tier: str
    partition_count: int
    messaging_units: int
    credits_per_second: Optional[int]  # basic/standard; None: throttling off
    throttled_requests: int  # in the last five minutes
    credits_used: int  # in the last five minutes
    incoming_messages: int  # in the last five minutes
    outgoing_messages: int  # in the last five minutes


@dataclass(frozen=True)
class Dashboard:
    namespace: NamespaceSummary
    entities: list[EntityRow]
    time_utc: datetime


def dashboard(admin: ServiceBusAdministrationClient) -> Dashboard:
    """Every queue, topic and subscription with its counts now, and the namespace's last five minutes."""
    ns = admin.get_namespace_properties()
    recent = admin.get_namespace_metrics(start_time=now() - timedelta(minutes=5), period=MINUTE)
    summary = NamespaceSummary(ns.path, ns.name, ns.tier, ns.partition_count, ns.messaging_units,
                               ns.credits_per_second, recent.throttled_requests, recent.credits_used,
                               recent.incoming_messages, recent.outgoing_messages)
    rows: list[EntityRow] = []
    queues = {q.name: q for q in admin.list_queues()}
    for queue_runtime in admin.list_queues_runtime_properties():
        rows.append(_row("queue", queue_runtime.name, queues[queue_runtime.name], queue_runtime, None))
    topics = {t.name: t for t in admin.list_topics()}
    for topic_runtime in admin.list_topics_runtime_properties():
        topic = topics[topic_runtime.name]
        rows.append(_row("topic", topic.name, topic, topic_runtime, admin.get_topic_awaiting_fanout(topic.name)))
        subscriptions = {s.name: s for s in admin.list_subscriptions(topic.name)}
        for sub_runtime in admin.list_subscriptions_runtime_properties(topic.name):
            rows.append(_row("subscription", f"{topic.name}/Subscriptions/{sub_runtime.name}",
                             subscriptions[sub_runtime.name], sub_runtime, None))
    return Dashboard(summary, rows, now())


def _row(kind: str, path: str, props: EntityProperties, runtime: Any, awaiting: Optional[int]) -> EntityRow:
    quota = getattr(props, "total_max_size_in_megabytes", None)
    return EntityRow(kind, path, str(props.status), runtime.availability_status, props.partition_count,
                     runtime.active_message_count, runtime.deferred_message_count, runtime.dead_letter_message_count,
                     runtime.scheduled_message_count, getattr(runtime, "transfer_message_count", 0),
                     getattr(runtime, "transfer_dead_letter_message_count", 0), runtime.size_in_bytes,
                     None if quota is None else int(quota) * 1024 * 1024, awaiting,
                     bool(getattr(props, "requires_session", False)), getattr(props, "forward_to", None),
                     None if props.archive_retention is None else format_duration(props.archive_retention),
                     runtime.archive_message_count)


# ---- one entity --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RuleView:
    name: str
    filter: str  # the filter in one line: SQL, TRUE/FALSE, or the correlation filter's fields
    action: Optional[str]


@dataclass(frozen=True)
class MetricsPointView:
    time_utc: datetime
    incoming_messages: int
    outgoing_messages: int
    throttled_requests: int


@dataclass(frozen=True)
class EntityView:
    """An entity page: its row's counts, every setting, rules (subscriptions), subscriptions (topics),
    sessions, messages per partition and messages in and out per minute over the last hour."""

    row: EntityRow
    settings: dict[str, Any]
    rules: list[RuleView] = field(default_factory=list)
    subscriptions: list[str] = field(default_factory=list)
    sessions: list[SessionSummary] = field(default_factory=list)
    partitions: dict[int, int] = field(default_factory=dict)
    metrics: list[MetricsPointView] = field(default_factory=list)


def entity(admin: ServiceBusAdministrationClient, path: str) -> EntityView:
    """The entity page of a queue, topic or '<topic>/Subscriptions/<name>' (MessagingEntityNotFoundError
    when there is none; ValueError for a name no entity can have)."""
    path = entity_path(path)
    subscription = split_subscription_path(path)
    rules: list[RuleView] = []
    subscriptions: list[str] = []
    props: EntityProperties
    if subscription is not None:
        props = admin.get_subscription(*subscription)
        runtime: Any = admin.get_subscription_runtime_properties(*subscription)
        row = _row("subscription", path, props, runtime, None)
        rules = [RuleView(r.name, filter_text(r.filter), r.action.sql_expression if r.action else None)
                 for r in admin.list_rules(*subscription)]
    elif _is_topic(admin, path):
        props = admin.get_topic(path)
        row = _row("topic", props.name, props, admin.get_topic_runtime_properties(path),
                   admin.get_topic_awaiting_fanout(path))
        subscriptions = [s.name for s in admin.list_subscriptions(path)]
    else:
        props = admin.get_queue(path)
        row = _row("queue", props.name, props, admin.get_queue_runtime_properties(path), None)
    report = admin.get_entity_metrics(path, start_time=now() - METRICS_WINDOW, period=MINUTE)
    return EntityView(row, {k: plain(v) for k, v in dataclasses.asdict(props).items()}, rules, subscriptions,
                      [] if row.kind == "topic" else admin.list_sessions(path),
                      admin.get_partition_message_counts(path), _points(report))


def _is_topic(admin: ServiceBusAdministrationClient, path: str) -> bool:
    return any(t.name.lower() == path.lower() for t in admin.list_topics())


def _points(report: Metrics) -> list[MetricsPointView]:
    return [MetricsPointView(p.time_utc, p.incoming_messages, p.outgoing_messages, p.throttled_requests)
            for p in report.points]


# ---- messages ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Body:
    """A body as a page shows it: kind "json" (pretty-printed), "text" (UTF-8), "hex" (other bytes) or
    "value" (an AMQP value or sequence body, as JSON); cut when longer than MAX_BODY_SHOWN."""

    kind: str
    text: str
    size: int  # bytes
    cut: bool
    source: str = ""  # text and JSON bodies: the text as sent (what an edit starts from)


@dataclass(frozen=True)
class MessageView:
    """A message with its system and application properties, body and dead-letter details."""

    sequence_number: int
    state: str  # "active", "deferred", "scheduled" or "dead-lettered"
    message_id: Optional[str]
    session_id: Optional[str]
    partition_key: Optional[str]
    correlation_id: Optional[str]
    content_type: Optional[str]
    subject: Optional[str]
    to: Optional[str]
    reply_to: Optional[str]
    reply_to_session_id: Optional[str]
    enqueued_time_utc: Optional[datetime]
    scheduled_enqueue_time_utc: Optional[datetime]
    expires_at_utc: Optional[datetime]
    time_to_live: Optional[timedelta]
    delivery_count: Optional[int]
    size_in_bytes: int
    dead_letter_reason: Optional[str]
    dead_letter_error_description: Optional[str]
    dead_letter_source: Optional[str]
    application_properties: dict[str, Any]
    body: Body


@dataclass(frozen=True)
class MessagePage:
    """Up to `count` messages of one of SUB_QUEUES from a sequence number, in the order peek returns them
    (a partitioned entity's partition by partition); next_from: where the next page starts, None at the end."""

    entity: str
    queue: str
    from_sequence_number: int
    messages: list[MessageView]
    next_from: Optional[int]


def body_view(message: ServiceBusReceivedMessage) -> Body:
    if message.body_type is not AmqpMessageBodyType.DATA:
        text = json.dumps(plain(message.body if message.body_type is AmqpMessageBodyType.VALUE
                                else list(message.body)), indent=2, ensure_ascii=False)
        return _shown("value", text, message.size_in_bytes)
    data = message.body_bytes
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return _shown("hex", data[:MAX_BODY_SHOWN // 3].hex(" "), len(data), cut=len(data) > MAX_BODY_SHOWN // 3)
    try:
        parsed = json.loads(text) if text.lstrip()[:1] in ("{", "[") else None
    except ValueError:
        parsed = None
    if parsed is not None:
        return _shown("json", json.dumps(parsed, indent=2, ensure_ascii=False), len(data), source=text)
    return _shown("text", text, len(data), source=text)


def _shown(kind: str, text: str, size: int, cut: bool = False, source: str = "") -> Body:
    return Body(kind, text[:MAX_BODY_SHOWN], size, cut or len(text) > MAX_BODY_SHOWN, source)


def message_view(message: ServiceBusReceivedMessage, dead_lettered: bool = False) -> MessageView:
    state = "dead-lettered" if dead_lettered else message.state.name.lower()
    return MessageView(
        message.sequence_number or 0, state, message.message_id, message.session_id, message.partition_key,
        message.correlation_id, message.content_type, message.subject, message.to, message.reply_to,
        message.reply_to_session_id, message.enqueued_time_utc, message.scheduled_enqueue_time_utc,
        message.expires_at_utc, message.time_to_live, message.delivery_count, message.size_in_bytes,
        message.dead_letter_reason, message.dead_letter_error_description, message.dead_letter_source,
        {str(k): v for k, v in message.str_application_properties.items()}, body_view(message))


def receiver(client: ServiceBusClient, path: str, queue: str) -> ServiceBusReceiver:
    """A receiver of the entity (or its dead-letter sub-queue) that is only used to peek."""
    dead = ServiceBusSubQueue.DEAD_LETTER if queue == "dead-letter" else None
    subscription = split_subscription_path(path)
    if subscription is None:
        return client.get_queue_receiver(path, sub_queue=dead)
    return client.get_subscription_receiver(*subscription, sub_queue=dead)


def _wanted(message: ServiceBusReceivedMessage, queue: str) -> bool:
    return queue == "dead-letter" or message.state.name.lower() == queue


def messages(client: ServiceBusClient, path: str, queue: str = "active", from_sequence_number: int = 0,
             count: int = PAGE_SIZE) -> MessagePage:
    """A page of messages of one of SUB_QUEUES (module docstring: peeked, nothing locked). For deferred or
    scheduled ones up to SCAN_LIMIT messages are looked through; next_from then says where to go on."""
    path, queue = entity_path(path), sub_queue(queue)
    if not 0 <= from_sequence_number <= MAX_SEQUENCE_NUMBER:
        raise ValueError(f"from must be a sequence number from 0 to {MAX_SEQUENCE_NUMBER}, got {from_sequence_number}")
    if not 1 <= count <= MAX_PAGE_SIZE:
        raise ValueError(f"count must be from 1 to {MAX_PAGE_SIZE}, got {count}")
    found: list[MessageView] = []
    scanned, last, ended = 0, None, False
    with receiver(client, path, queue) as peeker:
        start = from_sequence_number
        while len(found) < count and scanned < SCAN_LIMIT:
            batch = peeker.peek_messages(max(count - len(found), 1) if queue in ("active", "dead-letter") else 100,
                                         sequence_number=start)
            if not batch:
                ended = True
                break
            start = 0  # on from where the peek ended
            for message in batch:
                scanned += 1
                last = message.sequence_number
                if _wanted(message, queue) and len(found) < count:
                    found.append(message_view(message, queue == "dead-letter"))
                elif len(found) >= count:
                    break
    next_from = None if ended or last is None else (found[-1].sequence_number + 1 if len(found) >= count
                                                     else last + 1)
    return MessagePage(path, queue, from_sequence_number, found, next_from)


def message(client: ServiceBusClient, path: str, queue: str, sequence_number: int) -> Optional[MessageView]:
    """The message of this sequence number in one of SUB_QUEUES, or None when there is none (any more)."""
    path, queue = entity_path(path), sub_queue(queue)
    if not 1 <= sequence_number <= MAX_SEQUENCE_NUMBER:
        return None
    with receiver(client, path, queue) as peeker:
        found = peeker.peek_messages(1, sequence_number=sequence_number)
    if not found or found[0].sequence_number != sequence_number or not _wanted(found[0], queue):
        return None
    return message_view(found[0], queue == "dead-letter")

