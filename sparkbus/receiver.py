"""ServiceBusReceiver: receive, settle, defer, dead-letter and peek (azure-servicebus shape).

A receiving client is not aware of partitioning (seed): receive_messages visits every available
partition and locks the oldest available messages of each, partition by partition. This module checks
arguments and shapes results; sparkbus.engine.delivery does the work and sparkbus.core.transitions decides it.

A receiver is connected to one incarnation of its entity (sparkbus.engine.registry). When the entity is
deleted, its locks end with it: settling or renewing a message received before raises
MessageLockLostError, a session receiver's operations raise SessionLockLostError, and once the entity is
gone receiving raises MessagingEntityNotFoundError. When it was created again, the receiver reconnects at
its next use, as an SDK receiver's link does: receive_messages, peek_messages and delete_messages serve
the new entity (prefetched messages and the peek cursor of the old one are dropped), while
receive_deferred_messages raises MessageNotFoundError once (its sequence numbers were the deleted
entity's, and numbers start again in the new one) and serves the new entity from then on.
"""
from __future__ import annotations

import json
import logging
import math
import random
import re
import threading
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from enum import Enum, IntEnum
from typing import (TYPE_CHECKING, Any, Callable, Generic, Iterable, Iterator, Optional, Protocol, TypeVar, Union,
                    overload)

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .amqp import AmqpAnnotatedMessage, AmqpMessageBodyType
from .core import records
from .core import amqp, transitions
from .core.wire import (MAX_MESSAGE_COUNT, MAX_SEQUENCE_NUMBER, check_amqp_ttl, check_dead_letter_text, check_id,
                        check_sequence_numbers, check_text)
from .core.throttling import data_cost
from .core.values import check_properties, decode_properties, encode_properties
from .engine.catalog import Catalog
from .engine.delivery import (DECODE_ERRORS, NEXT_AVAILABLE, Change, Decode, DecodeError, Delivery, Held,
                              SessionLock, available_partitions, policy, poll, session_lost)
from .core.names import key, split_subscription_path, subscription_path
from .engine.namespace import governor_of, open_connection
from .engine import fanout
from .engine.registry import EntityDeleted, EntityInfo, resolve_current
from .engine.retry import DEFAULT as DEFAULT_RETRY, RetryPolicy
from .engine.metrics import Counts
from .engine.throttle import Usage
from .exceptions import (InvalidOperationError, MessageAlreadySettled, MessageNotFoundError, ServiceBusError,
                         MessagingEntityDisabledError, MessagingEntityNotFoundError, SessionLockLostError)
from .core.forwarding import DEAD_LETTER_DESCRIPTION_PROPERTY, DEAD_LETTER_REASON_PROPERTY
from .handler import requires_open
from .message import (AMQP_PROPERTY_FIELDS, PARTITION_KEY_ANNOTATION, SCHEDULED_TIME_ANNOTATION, amqp_text,
                      amqp_ttl, body_text, public_body, str_keys, to_utc)
from .core.schemas import ACTIVE, DEAD_LETTERED, DEFERRED, TRANSFER_DEAD_LETTERED
from .engine import clock

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

T = TypeVar("T")
RECEIVER_KINDS = ("queue", "subscription")
MAX_DELETE_COUNT = 4000  # messages one delete_messages call removes at most, as Service Bus
# Receives of several messages in a row that visit the partitions in the same order while each gets all
# it asked for: a receiver stays with the partitions it has read (four receivers of one queue had each
# read every partition, taking turns), and every SAME_ORDER-th receive starts elsewhere, so that no
# partition waits behind another that keeps filling. Receives of one message start elsewhere each time
# (staying cost a single receive + complete about 1 ms more CPU: its partition's small files pile up).
SAME_ORDER = 16


class ServiceBusReceiveMode(str, Enum):
    PEEK_LOCK = "peeklock"
    RECEIVE_AND_DELETE = "receiveanddelete"


class ServiceBusSubQueue(str, Enum):
    DEAD_LETTER = "deadletter"
    TRANSFER_DEAD_LETTER = "transferdeadletter"  # messages auto-forwarding could not deliver


SUB_QUEUE_STATES = {ServiceBusSubQueue.DEAD_LETTER: DEAD_LETTERED,
                    ServiceBusSubQueue.TRANSFER_DEAD_LETTER: TRANSFER_DEAD_LETTERED}


class ServiceBusSessionFilter(Enum):
    NEXT_AVAILABLE = 0


NEXT_AVAILABLE_SESSION = ServiceBusSessionFilter.NEXT_AVAILABLE


class ServiceBusMessageState(IntEnum):
    ACTIVE = 0
    DEFERRED = 1
    SCHEDULED = 2


class _Stored(Generic[T]):
    """An attribute of a received message read from its stored row the first time it is asked for, then
    kept on the message. A non-data descriptor: what is kept (or set, as on any attribute) shadows it."""

    __slots__ = ("name", "read")

    def __init__(self, read: Callable[["ServiceBusReceivedMessage"], T]) -> None:
        self.read = read
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, message: None, owner: Optional[type] = None) -> "_Stored[T]": ...

    @overload
    def __get__(self, message: "ServiceBusReceivedMessage", owner: Optional[type] = None) -> T: ...

    def __get__(self, message: Optional["ServiceBusReceivedMessage"], owner: Optional[type] = None
                ) -> Union[T, "_Stored[T]"]:
        if message is None:
            return self
        value = message.__dict__[self.name] = self.read(message)
        return value


def _column(name: str) -> _Stored[Any]:
    """An attribute that is the stored column of that name."""
    return _Stored(lambda m: m._rows.column(name)[m._index])


def _ttl(milliseconds: Optional[int]) -> Optional[timedelta]:
    return None if milliseconds is None else timedelta(milliseconds=milliseconds)


class ServiceBusReceivedMessage:
    """A received (or peeked) message: the sent properties plus broker-assigned ones.

    As azure-servicebus: `application_properties` has bytes keys and str values as bytes (what the SDK decodes
    from the wire; datetimes as epoch milliseconds); `str_application_properties` is the sparkbus alternative
    with the keys and values as they were sent.

    A received message is a view of the rows its receive read and wrote (sparkbus.records.Columns, shared
    by the messages of one receive): each attribute is read from them the first time it is asked for and
    then kept, so a receive decodes only what its caller reads. Attributes can be set, as on any object."""

    # What a view holds from the start (_blank): its rows, its row's index in them, and its state.
    _rows: records.Columns
    _states: records.Columns
    _index: int
    state: ServiceBusMessageState
    _settled: bool = False
    _sections: Optional[amqp.Sections] = None  # as decoded by from_bytes
    _source: Optional[tuple[str, str]] = None  # (namespace, entity path) of the receiver that locked it
    _incarnation: Optional[str] = None  # of the entity it was locked in (sparkbus.engine.registry)

    _body_type: _Stored[Optional[str]] = _Stored(lambda m: m._optional("body_type"))
    _stored_body: _Stored[bytes] = _column("body")
    # The stored application properties, decoded once (str_application_properties is a copy of them).
    _properties = _Stored(lambda m: decode_properties(m._rows.column("application_properties")[m._index]))
    str_application_properties = _Stored(lambda m: dict(m._properties))
    # keys as the wire gives them (bytes)
    application_properties: _Stored[dict[Any, Any]] = _Stored(lambda m: amqp.wire_form(m._properties))
    message_id: _Stored[Optional[str]] = _column("message_id")
    session_id: _Stored[Optional[str]] = _column("session_id")
    partition_key: _Stored[Optional[str]] = _column("partition_key")
    correlation_id: _Stored[Optional[str]] = _column("correlation_id")
    content_type: _Stored[Optional[str]] = _column("content_type")
    subject: _Stored[Optional[str]] = _column("subject")
    to: _Stored[Optional[str]] = _column("to")
    reply_to: _Stored[Optional[str]] = _column("reply_to")
    reply_to_session_id: _Stored[Optional[str]] = _column("reply_to_session_id")
    sequence_number: _Stored[Optional[int]] = _column("sequence_number")  # None: from_bytes found none
    enqueued_time_utc: _Stored[Optional[datetime]] = _column("enqueued_time_utc")
    scheduled_enqueue_time_utc: _Stored[Optional[datetime]] = _column("scheduled_enqueue_time_utc")
    expires_at_utc: _Stored[Optional[datetime]] = _column("expires_at_utc")
    time_to_live = _Stored(lambda m: _ttl(m._rows.column("time_to_live_ms")[m._index]))
    delivery_count: _Stored[int] = _Stored(
        lambda m: m._state("delivery_count", m._optional("prior_deliveries", 0)) or 0)
    lock_token: _Stored[Optional[str]] = _Stored(lambda m: m._state("lock_token"))
    locked_until_utc: _Stored[Optional[datetime]] = _Stored(lambda m: m._state("locked_until_utc"))
    # A message forwarded out of a dead-letter sub-queue carries them as application properties and a column.
    dead_letter_reason: _Stored[Optional[str]] = _Stored(
        lambda m: m._state("dead_letter_reason", m._optional("prior_reason"))
        or m._properties.get(DEAD_LETTER_REASON_PROPERTY))
    dead_letter_error_description: _Stored[Optional[str]] = _Stored(
        lambda m: m._state("dead_letter_error_description", m._optional("prior_description"))
        or m._properties.get(DEAD_LETTER_DESCRIPTION_PROPERTY))
    dead_letter_source: _Stored[Optional[str]] = _Stored(
        lambda m: m._state("dead_letter_source") or m._optional("dead_letter_source_entity"))
    _partition_id: _Stored[Optional[int]] = _column("partition_id")
    # as counted when sent (or copied to a subscription)
    _size: _Stored[int] = _Stored(
        lambda m: m._rows.column("body_size")[m._index] + m._rows.column("header_size")[m._index])
    # the state row as locked, so settling reads nothing (None unless locked)
    _state_row: _Stored[Optional[Mapping[str, Any]]] = _Stored(
        lambda m: None if m.lock_token is None else records.Row(m._states, m._index))

    def __init__(self, row: Mapping[str, Any], state_row: Optional[Mapping[str, Any]],
                 state: ServiceBusMessageState) -> None:
        """A message of one stored row and its state row; raises what reading the row raises
        (DECODE_ERRORS for a row that does not decode).

        Args:
            row: A row of the messages table, with the state columns a receive or peek adds.
            state_row: Its state row (None: none).
            state: The message's state.
        """
        self._bind(records.Columns.of_rows([row]), records.Columns.of_rows([state_row or {}]), 0, state)
        self._load()

    @classmethod
    def _view(cls, rows: records.Columns, states: records.Columns, index: int,
              state: ServiceBusMessageState) -> "ServiceBusReceivedMessage":
        """The message of row `index` of a receive's rows and state rows, read when asked (nothing checked)."""
        message = cls.__new__(cls)
        message._bind(rows, states, index, state)
        return message

    def _bind(self, rows: records.Columns, states: records.Columns, index: int, state: ServiceBusMessageState) -> None:
        """Start as the view of row `index` (of a new message: whatever it held is dropped)."""
        self.__dict__ = {**_blank(rows, states, state), "_index": index}

    def _load(self) -> None:
        """Read every attribute from the stored rows now, in the order the first sparkbus versions read
        them; raises what reading one raises."""
        for name in _LOADED:
            getattr(self, name)

    def _optional(self, name: str, default: Any = None) -> Any:
        """The stored column's value, default when the rows have no such column."""
        return self._rows.column(name)[self._index] if self._rows.has(name) else default

    def _state(self, name: str, default: Any = None) -> Any:
        """The state row's value, default when there is no such column."""
        return self._states.column(name)[self._index] if self._states.has(name) else default

    @classmethod
    def from_bytes(cls, message: bytes) -> "ServiceBusReceivedMessage":
        """A message decoded from an AMQP 1.0 message payload, as azure-servicebus' from_bytes: broker
        annotations in it (sequence number, enqueued time, lock token, ...) fill those properties, absent ones
        are None. It has no receiver and cannot be settled.

        Args:
            message: The AMQP 1.0 message payload.

        Returns:
            The decoded message.

        Raises:
            TypeError: message is not bytes.
            ValueError: message is empty or not an AMQP message.
        """
        if not isinstance(message, bytes):
            raise TypeError(f"message must be bytes, got {type(message).__name__}")
        if not message:
            raise ValueError("message cannot be empty")
        try:
            sections = amqp.decode_message(message)
            row = _row_of(sections)
            delivery: dict[Any, Any] = {**sections.delivery_annotations, **sections.annotations}
            lock_token = delivery.get(LOCK_TOKEN_ANNOTATION)
            state_row = {"delivery_count": sections.header.get("delivery_count", 0),
                         "lock_token": None if lock_token is None else str(lock_token),
                         "locked_until_utc": _time(delivery.get(LOCKED_UNTIL_ANNOTATION))}
        except (ValueError, TypeError, OverflowError) as e:  # OverflowError: a time beyond datetime's range
            raise ValueError(f"message is not a valid AMQP 1.0 message payload: {e}") from e
        received = cls(row, state_row, ServiceBusMessageState.ACTIVE)
        received.application_properties = sections.application_properties
        received._state_row = None  # no receiver: nothing to settle with
        received._sections = sections
        return received

    @property
    def body(self) -> Any:
        """As azure-servicebus: a data body iterates its sections (and is bytes too when it is one section,
        the usual case), a sequence body iterates its lists, a value body is the value."""
        return public_body(self._body_type, self._stored_body)

    @property
    def size_in_bytes(self) -> int:
        """Body + header bytes as stored: what the entity's size quota counted for this message."""
        return self._size

    @property
    def body_bytes(self) -> bytes:
        """The body as stored, plain bytes (a sparkbus addition): a one-section data body's bytes, or the AMQP
        encoding of the sections of any other body."""
        return bytes(self._stored_body)

    @property
    def body_type(self) -> AmqpMessageBodyType:
        return AmqpMessageBodyType(self._body_type or amqp.DATA)

    @property
    def enqueued_sequence_number(self) -> Optional[int]:
        """The sequence number assigned where the message was enqueued (the entity it is read from: a
        forwarded message is numbered anew by its destination, which is the number kept)."""
        return self.sequence_number

    @property
    def raw_amqp_message(self) -> AmqpAnnotatedMessage:
        """The message as AMQP sections: the sent body, properties and application properties, the broker's
        header (delivery_count, time_to_live) and annotations (x-opt-sequence-number, x-opt-enqueued-time,
        x-opt-locked-until, x-opt-partition-key, ...)."""
        if self._sections is not None:
            return AmqpAnnotatedMessage._from_sections(self._sections)
        kind, body = amqp.loaded_body(self._body_type, self._stored_body)
        annotations: dict[Any, Any] = {SEQUENCE_NUMBER_ANNOTATION: self.sequence_number,
                       ENQUEUED_TIME_ANNOTATION: amqp.wire_form(self.enqueued_time_utc),
                       PARTITION_KEY_ANNOTATION: self.partition_key,
                       SCHEDULED_TIME_ANNOTATION: amqp.wire_form(self.scheduled_enqueue_time_utc),
                       LOCKED_UNTIL_ANNOTATION: amqp.wire_form(self.locked_until_utc),
                       DEAD_LETTER_SOURCE_ANNOTATION: self.dead_letter_source}
        properties = {a: amqp.wire_form(getattr(self, n)) for n, a in AMQP_PROPERTY_FIELDS.items()}
        ttl = amqp_ttl(self.time_to_live)
        return AmqpAnnotatedMessage._from_sections(amqp.Sections(
            body_type=kind, body=body, header={"delivery_count": self.delivery_count, "time_to_live": ttl},
            annotations={k: amqp.wire_form(v) for k, v in annotations.items() if v is not None},
            properties={k: v for k, v in properties.items() if v is not None},
            application_properties=self.application_properties))

    def __str__(self) -> str:
        return body_text(self._body_type, self._stored_body)

    def __repr__(self) -> str:
        return (f"ServiceBusReceivedMessage(sequence_number={self.sequence_number}, message_id={self.message_id!r}, "
                f"delivery_count={self.delivery_count})")


def _blank(rows: records.Columns, states: records.Columns, state: ServiceBusMessageState) -> dict[str, Any]:
    """What a view of these rows holds before anything is read, but its row's index (_index)."""
    return {"_rows": rows, "_states": states, "state": state, "_settled": False,
            "_sections": None,  # as decoded by from_bytes
            "_source": None,  # (namespace, entity path) of the receiver that locked it
            "_incarnation": None}  # of the entity it was locked in (sparkbus.engine.registry)


# What ServiceBusReceivedMessage._load reads, in order.
_LOADED = ("_body_type", "_stored_body", "_properties", "str_application_properties", "application_properties",
           "message_id", "session_id", "partition_key", "correlation_id", "content_type", "subject", "to",
           "reply_to", "reply_to_session_id", "sequence_number", "enqueued_time_utc", "scheduled_enqueue_time_utc",
           "expires_at_utc", "time_to_live", "delivery_count", "lock_token", "locked_until_utc",
           "dead_letter_reason", "dead_letter_error_description", "dead_letter_source", "_partition_id", "_size",
           "_state_row")
SEQUENCE_NUMBER_ANNOTATION = b"x-opt-sequence-number"
ENQUEUED_TIME_ANNOTATION = b"x-opt-enqueued-time"
LOCKED_UNTIL_ANNOTATION = b"x-opt-locked-until"
LOCK_TOKEN_ANNOTATION = b"x-opt-lock-token"
DEAD_LETTER_SOURCE_ANNOTATION = b"x-opt-deadletter-source"


def _time(value: Any) -> Optional[datetime]:
    """An AMQP timestamp (epoch milliseconds) as a UTC datetime."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"an AMQP timestamp is an integer of milliseconds, got {value!r}")
    return datetime.fromtimestamp(value / 1000, timezone.utc)


def _row_of(sections: amqp.Sections) -> dict[str, Any]:
    """A messages-table row for a decoded AMQP message (what from_bytes builds its message from)."""
    annotations: dict[Any, Any] = {**sections.delivery_annotations, **sections.annotations}
    body_type, body = amqp.stored_body(sections.body_type, sections.body)
    props = {name: amqp_text(sections.properties.get(a), a) for name, a in AMQP_PROPERTY_FIELDS.items()}
    ttl = check_amqp_ttl(sections.header.get("time_to_live"), "header time_to_live")
    enqueued = _time(annotations.get(ENQUEUED_TIME_ANNOTATION))
    app = str_keys(sections.application_properties)
    check_properties(app, "application_properties")
    return {**props, "body": body, "body_type": body_type, "application_properties": encode_properties(app),
            "partition_key": amqp_text(annotations.get(PARTITION_KEY_ANNOTATION), "x-opt-partition-key"),
            "sequence_number": annotations.get(SEQUENCE_NUMBER_ANNOTATION), "enqueued_time_utc": enqueued,
            "scheduled_enqueue_time_utc": _time(annotations.get(SCHEDULED_TIME_ANNOTATION)),
            "time_to_live_ms": ttl,
            "expires_at_utc": None if enqueued is None or ttl is None else enqueued + timedelta(milliseconds=ttl),
            "dead_letter_source_entity": amqp_text(annotations.get(DEAD_LETTER_SOURCE_ANNOTATION), "deadletter-source"),
            "partition_id": None, "body_size": len(body), "header_size": 0}


class ServiceBusSession:
    """The session a session receiver holds (azure-servicebus shape): its id, lock and durable state."""

    def __init__(self, delivery: Delivery, lock: SessionLock, held: dict[int, str]) -> None:
        self._delivery = delivery
        self._lock = lock
        self._held = held  # the receiver's unsettled messages of this session: seq -> lock token
        self.session_id: str = lock.session_id

    @property
    def locked_until_utc(self) -> datetime:
        return self._lock.locked_until_utc

    def get_state(self) -> Optional[bytes]:
        """The session state last set (bytes), or None."""
        state: Optional[bytes] = self._delivery.update_session(self._lock, lambda row, info, now: None)["state"]
        return state

    def set_state(self, state: Union[str, bytes, bytearray, None]) -> None:
        """Replace the session state (durable before this returns).

        Args:
            state: The new state: bytes, or str (stored as UTF-8), at most the entity's max message size;
                None removes it.

        Raises:
            TypeError: state is not bytes, str or None.
            ValueError: state is larger than the entity's max message size.
        """
        if isinstance(state, str):
            state = check_text(state, "session state").encode("utf-8")
        if state is not None and not isinstance(state, (bytes, bytearray)):
            raise TypeError(f"session state must be bytes, str or None, got {type(state).__name__}")

        def stored(row: dict[str, Any], info: EntityInfo, now: datetime) -> dict[str, Any]:
            if state is not None and len(state) > info.max_message_bytes:
                raise ValueError(f"session state of {len(state)} bytes exceeds the {info.max_message_bytes}-byte "
                                 "maximum message size")
            return {**row, "state": None if state is None else bytes(state)}
        self._delivery.update_session(self._lock, stored)

    def renew_lock(self) -> datetime:
        """Extend the session lock (and the locks of its unsettled messages) by lock_duration from now."""
        def renewed(row: dict[str, Any], info: EntityInfo, now: datetime) -> dict[str, Any]:
            return {**row, "locked_until_utc": now + info.options.lock_duration}
        until: datetime = self._delivery.update_session(self._lock, renewed)["locked_until_utc"]
        self._delivery.extend_locks(self._lock, dict(self._held), until)
        self._lock.locked_until_utc = until  # once the messages' locks are extended too
        return until

    def _release(self) -> None:
        """End the locks of its unsettled messages now (they are delivered again first), then its own."""
        self._delivery.extend_locks(self._lock, dict(self._held), clock.now())
        self._delivery.update_session(self._lock, lambda row, info, now: {**row, "lock_token": None,
                                                                           "locked_until_utc": None})
        self._lock.locked_until_utc = clock.now()  # settling now reads the session row back

    def __repr__(self) -> str:
        return f"ServiceBusSession(session_id={self.session_id!r}, locked_until_utc={self.locked_until_utc})"


LOG = logging.getLogger("sparkbus")
# An empty receive from a subscription checks (at most every FANOUT_HINT_EVERY seconds, until it has said it
# once) whether the topic holds messages older than FANOUT_HINT_AGE that no fan-out took: ported code that
# forgets the namespace service otherwise waits without a word.
FANOUT_HINT_AGE = timedelta(seconds=5)
FANOUT_HINT_EVERY = 10.0


class LockRenewer(Protocol):
    """What a receiver's auto_lock_renewer is (sparkbus.AutoLockRenewer): it registers what to keep locked."""

    def register(self, receiver: "ServiceBusReceiver",
                 renewable: Union["ServiceBusReceivedMessage", "ServiceBusSession"]) -> None: ...


class ServiceBusReceiver:
    """Receiver of a queue or subscription (or its dead-letter sub-queue); with session_id, of one session."""

    def __init__(self, catalog: Catalog, entity_path: str, *,
                 receive_mode: Union[ServiceBusReceiveMode, str] = ServiceBusReceiveMode.PEEK_LOCK,
                 sub_queue: Optional[Union[ServiceBusSubQueue, str]] = None, prefetch_count: int = 0,
                 max_wait_time: Optional[float] = None, session_id: Union[str, ServiceBusSessionFilter, None] = None,
                 spark: Optional["SparkSession"] = None, retry: RetryPolicy = DEFAULT_RETRY,
                 auto_lock_renewer: Optional["LockRenewer"] = None) -> None:
        self.receive_mode = ServiceBusReceiveMode(receive_mode)
        self.sub_queue = None if sub_queue is None else ServiceBusSubQueue(sub_queue)
        if isinstance(prefetch_count, bool) or not isinstance(prefetch_count, int) or prefetch_count < 0:
            raise ValueError(f"prefetch_count must be an int >= 0, got {prefetch_count!r}")
        self.prefetch_count = prefetch_count
        self.max_wait_time = _check_wait(max_wait_time)
        self.entity_path = entity_path
        self._delivery = Delivery(catalog, entity_path, RECEIVER_KINDS, retry)
        self._catalog = catalog
        topic = split_subscription_path(entity_path)
        self._topic = topic[0] if topic is not None and sub_queue is None else None  # whose fan-out feeds it
        self._fanout_checked: Optional[float] = None  # monotonic time of the last check (_hint_fanout)
        self._fanout_hinted = False
        self._source = (catalog.root, key(entity_path))
        self._closed = False
        self._closing = threading.Event()  # set by close(): wakes a receive waiting in another thread
        self._governor = governor_of(catalog)
        self._retry = retry
        # Where this receiver starts its round of the partitions: receivers that all started at partition 0
        # raced for the same oldest messages on every call (4 processes: complete p50 109 ms, p99 488 ms).
        self._next_partition = random.randrange(1 << 16)
        self._same_order = 0  # receives in a row that started at _next_partition (SAME_ORDER)
        self._peek_cursor: Optional[int] = None
        self._prefetched: list[ServiceBusReceivedMessage] = []
        self._spark = spark
        if session_id is not None and not isinstance(session_id, (str, ServiceBusSessionFilter)):
            raise TypeError(f"session_id must be a str or NEXT_AVAILABLE_SESSION, got {type(session_id).__name__}")
        if isinstance(session_id, str):
            check_id("session_id", session_id)
        if auto_lock_renewer is not None and not callable(getattr(auto_lock_renewer, "register", None)):
            raise TypeError(f"auto_lock_renewer must be an AutoLockRenewer, got {type(auto_lock_renewer).__name__}")
        self._renewer = auto_lock_renewer  # registers every message received in PEEK_LOCK mode, and the session
        self._session_requested = session_id is not None
        self.session: Optional[ServiceBusSession] = None
        self._session_held: dict[int, str] = {}  # unsettled messages received under the session: seq -> token
        self._session_closed = False
        info = self._delivery.entity.get()
        self._incarnation = info.incarnation  # the incarnation this receiver is connected to (see above)
        self._check_receivable(info, receiving=False)
        if session_id is not None:
            requested = NEXT_AVAILABLE if isinstance(session_id, ServiceBusSessionFilter) else session_id
            lock = self._delivery.lock_session(info, requested, self.max_wait_time)
            self.session = ServiceBusSession(self._delivery, lock, self._session_held)
            if self._renewer is not None:
                self._renewer.register(self, self.session)

    @classmethod
    def _from_connection_string(cls, conn_str: str, *, queue_name: Optional[str] = None,
                                topic_name: Optional[str] = None, subscription_name: Optional[str] = None,
                                **kwargs: Any) -> "ServiceBusReceiver":
        """A receiver straight from a connection string, as the SDK's (underscored, but used by its
        samples); receiver keywords (receive_mode, sub_queue, max_wait_time, ...) and retry_* as the
        client's, the SDK's others ignored."""

        if queue_name is not None and topic_name is None and subscription_name is None:
            path = queue_name
        elif queue_name is None and topic_name is not None and subscription_name is not None:
            path = subscription_path(topic_name, subscription_name)
        else:
            raise TypeError("give queue_name, or topic_name and subscription_name")
        catalog, _ = open_connection(conn_str)
        options = {k: kwargs[k] for k in _RECEIVER_KEYWORDS if k in kwargs}
        return cls(catalog, path, retry=RetryPolicy.from_keywords(kwargs), **options)

    def __enter__(self) -> "ServiceBusReceiver":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Message locks simply expire, as in Service Bus. A held session is released: the locks of its
        unsettled messages end now (they are delivered again first), then the session lock. The receiver
        refuses further operations; a receive waiting in another thread returns what it has (nothing).
        Prefetched messages, never handed out, are given back at once (as if never received)."""
        prefetched, self._prefetched = self._prefetched, []
        if prefetched and not self._deletes and not self._closed:
            try:
                self._give_back(prefetched)
            except ServiceBusError:
                pass  # their locks lapse on their own
        self._closed = True
        self._closing.set()
        if self.session is not None and not self._session_closed:
            self._session_closed = True
            try:
                self.session._release()
            except SessionLockLostError:
                pass  # another receiver holds the session already
        self._delivery.close()

    def __iter__(self) -> Iterator[ServiceBusReceivedMessage]:
        """Yields messages as they arrive; stops once the receiver's max_wait_time passes without one (never
        when it is None, as the SDK's) or the receiver is closed."""
        while not self._closed:
            got = self.receive_messages(max_message_count=1)
            if not got:
                return
            yield got[0]

    # ---- receiving -------------------------------------------------------------------------------------

    @requires_open
    def receive_messages(self, max_message_count: Optional[int] = 1,
                         max_wait_time: Optional[float] = None) -> list[ServiceBusReceivedMessage]:
        """Up to max_message_count available messages from any partitions, oldest first in each.

        Args:
            max_message_count: At most this many messages.
            max_wait_time: Seconds to wait for the first message, then what is available is returned
                (default: the receiver's; with neither set it waits until a message arrives, as the SDK's,
                or the receiver is closed from another thread, then []). 0 returns at once.

        Returns:
            The messages, locked until their locked_until_utc (PEEK_LOCK) or already removed
            (RECEIVE_AND_DELETE).
        """
        count, wait = self._receive_arguments(max_message_count, max_wait_time)
        return self._renewed(poll(lambda: self._attempt(count), wait,
                                  changed=None if wait == 0 else self._delivery.watch(), stop=self._closing) or [])

    def _renewed(self, messages: list[ServiceBusReceivedMessage]) -> list[ServiceBusReceivedMessage]:
        """messages, registered with the receiver's auto_lock_renewer (PEEK_LOCK mode), as the SDK does; under
        a session the renewer keeps the session lock, which holds its messages' locks too."""
        if self._renewer is not None and not self._deletes and self.session is None:
            for message in messages:
                self._renewer.register(self, message)
        return messages

    @requires_open
    def _receive_arguments(self, max_message_count: Optional[int], max_wait_time: Optional[float]
                           ) -> tuple[int, Optional[float]]:
        """(count, wait) of a receive_messages call; ValueError for a count or wait it cannot take, or when
        the receiver is closed."""
        count = 1 if max_message_count is None else max_message_count
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"max_message_count must be an int >= 1, got {max_message_count!r}")
        return count, _check_wait(max_wait_time) if max_wait_time is not None else self.max_wait_time

    def _attempt(self, count: int) -> list[ServiceBusReceivedMessage]:
        """One try of a receive (no waiting); an empty subscription may log why (_hint_fanout)."""
        got = self._receive(count)
        if not got and self._topic is not None:
            self._hint_fanout(self._topic)
        return got

    def _give_back(self, messages: list[ServiceBusReceivedMessage]) -> None:
        """Messages a receive took but never handed to its caller (sparkbus.aio: a cancelled receive): their
        locks are released as if never taken (delivery counts lowered again), or in RECEIVE_AND_DELETE mode,
        already removed from the entity, they are kept for this receiver's next receive."""
        if self._deletes:
            self._prefetched = messages + self._prefetched
        elif messages:
            self._settle(messages, transitions.returned)

    def _hint_fanout(self, topic_path: str) -> None:
        """Log one warning (once per receiver) when this subscription is empty while its topic holds messages
        older than FANOUT_HINT_AGE that no fan-out has taken, saying what delivers them."""
        now = clock.monotonic()
        if self._fanout_hinted or (self._fanout_checked is not None and now < self._fanout_checked + FANOUT_HINT_EVERY):
            return
        self._fanout_checked = now
        try:
            topic = resolve_current(self._catalog, topic_path, ("topic",))
            waiting = fanout.awaiting(topic, older_than=FANOUT_HINT_AGE)
        except Exception as error:  # a hint never fails a receive (the topic deleted meanwhile, a storage fault)
            LOG.debug("could not count the messages awaiting fan-out in topic %r: %s", topic_path, error)
            return
        if waiting:
            self._fanout_hinted = True
            LOG.warning("%s received nothing, but topic %r holds %d message(s) older than %d s that no fan-out has "
                        "delivered to its subscriptions: run the namespace service (`sparkbus serve`, "
                        "sparkbus.streaming.serve) or fan out (`sparkbus fanout --once`, "
                        "sparkbus.streaming.fanout_once)", self.entity_path, topic_path, waiting,
                        FANOUT_HINT_AGE.total_seconds())

    @requires_open
    def receive_deferred_messages(self, sequence_numbers: Union[int, Iterable[int]]) -> list[ServiceBusReceivedMessage]:
        """Lock and return deferred messages by sequence number (they keep their numbers). All or none.

        Args:
            sequence_numbers: One sequence number or several, of messages defer_message set aside.

        Returns:
            The messages, locked, in the order the numbers were given.

        Raises:
            MessageNotFoundError: a number is not a deferred, unlocked message of this entity (nothing is
                locked).
        """
        return self._numbered(sequence_numbers, DEFERRED)

    @requires_open
    def receive_messages_by_sequence_number(self, sequence_numbers: Union[int, Iterable[int]]
                                            ) -> list[ServiceBusReceivedMessage]:
        """Lock and return these messages of the receiver's queue (the active messages of the entity, or
        of its dead-letter sub-queue) by sequence number, all or none, as receive_deferred_messages does
        for deferred ones: a sparkbus addition (Service Bus receives only deferred messages by number) for
        acting on a message a user picked from a peek, e.g. resubmitting one dead-lettered message.

        Args:
            sequence_numbers: One sequence number or several, of messages of the receiver's queue.

        Returns:
            The messages, locked, in the order the numbers were given.

        Raises:
            MessageNotFoundError: a number is not such a message, unlocked (nothing is locked).
        """
        return self._numbered(sequence_numbers, SUB_QUEUE_STATES[self.sub_queue] if self.sub_queue else ACTIVE)

    def _numbered(self, sequence_numbers: Union[int, Iterable[int]], queue: str) -> list[ServiceBusReceivedMessage]:
        """Lock exactly these messages of `queue` (all or none), in the order the numbers were given."""
        numbers = check_sequence_numbers(sequence_numbers)
        info = self._entity_info()
        self._check_receivable(info)

        if not numbers:
            return []
        try:
            if self._follow(info):
                raise _renumbered(info)
            found = self._charged(info, lambda: self._delivered(self._delivery.lock_exactly(
                info, queue, sorted(set(numbers)), delete=self._deletes, session=self._session_lock,
                decode=_decoder(queue))))
        except EntityDeleted as gone:  # deleted while this ran (the cached settings still named it)
            self._reconnect(gone)  # raises unless it was created again
            assert gone.current is not None
            raise _renumbered(gone.current) from gone
        return self._renewed(sorted(found, key=lambda m: numbers.index(_number(m))))

    def _follow(self, info: EntityInfo) -> bool:
        """Reconnect to info's incarnation if it is not the one this receiver is connected to (the entity
        was deleted and created again): prefetched messages and the peek cursor of the deleted one are
        dropped; a session receiver's session ended with it (SessionLockLostError). Whether it changed."""
        if info.incarnation == self._incarnation:
            return False
        if self.session is not None:
            raise session_lost(self.session._lock, f"{info.kind} {info.path!r} was deleted and created again")
        self._incarnation, self._prefetched, self._peek_cursor = info.incarnation, [], None
        return True

    def _connected(self) -> EntityInfo:
        """The entity's settings, the receiver reconnected to its current incarnation (_follow)."""
        info = self._entity_info()
        self._follow(info)
        return info

    def _record(self, counts: Counts) -> None:
        """Count what a processor or a lock renewer did with this receiver's messages in the namespace's
        metrics (sparkbus.engine.metrics); never raises (metrics must not fail the work they count)."""
        try:
            self._governor.recorder.add(self._delivery.entity.get().path, counts)
        except Exception:
            LOG.debug("metrics of %s not recorded", self.entity_path, exc_info=True)

    def _entity_info(self) -> EntityInfo:
        """The entity's settings; for a session receiver, SessionLockLostError once the entity it locked
        its session in was deleted (MessagingEntityNotFoundError for others once it is gone)."""
        if self.session is not None:
            return self._delivery.lock_info(self.session._lock)
        return self._delivery.entity.get()

    def _reconnect(self, gone: EntityDeleted) -> None:
        """After an operation found the incarnation it used deleted: reconnect to the new one (_follow) if
        the entity was created again; raise what the caller sees otherwise (a session receiver's session
        ended with it: SessionLockLostError; the entity is gone: MessagingEntityNotFoundError)."""
        if self.session is not None:
            raise session_lost(self.session._lock, str(gone)) from gone
        if gone.current is None:
            raise MessagingEntityNotFoundError(str(gone)) from gone
        self._follow(gone.current)

    def _receive(self, count: int) -> list[ServiceBusReceivedMessage]:
        """_receive_once; if the entity was deleted while it ran and created again, once more from the new
        incarnation (the messages locked in the deleted one went with it)."""
        try:
            return self._receive_once(count)
        except EntityDeleted as gone:
            self._reconnect(gone)
            return self._receive_once(count)

    def _receive_once(self, count: int) -> list[ServiceBusReceivedMessage]:
        """Serve from the prefetch cache (dropping messages whose lock lapsed), then lock more, caching
        up to prefetch_count extra messages for later calls. The cache is taken from once nothing can fail
        any more: a throttled or failed fetch leaves it as it was."""
        info = self._connected()
        now = clock.now()
        self._prefetched = [m for m in self._prefetched if m.locked_until_utc is None or m.locked_until_utc > now]
        got = self._prefetched[:count]
        if len(got) == count:
            self._prefetched = self._prefetched[count:]
        else:
            self._check_receivable(info)
            queue = SUB_QUEUE_STATES[self.sub_queue] if self.sub_queue else ACTIVE
            asked = count - len(got) + self.prefetch_count
            fetched = self._charged(info, lambda: self._delivered(self._delivery.lock_any(
                info, queue, asked, delete=self._deletes,
                start=self._next_partition, session=self._session_lock, decode=_decoder(queue))))
            self._same_order += 1
            if asked == 1 or len(fetched) < asked or self._same_order >= SAME_ORDER:
                self._next_partition += 1
                self._same_order = 0
            wanted = count - len(got)
            got, self._prefetched = got + fetched[:wanted], fetched[wanted:]  # the whole cache was in got
        return got

    def _charged(self, info: EntityInfo, operation: Callable[[], list[ServiceBusReceivedMessage]], *,
                 peeking: bool = False) -> list[ServiceBusReceivedMessage]:
        """operation (receiving or peeking), admitted and charged 1 credit per message it returned;
        received messages count as outgoing messages, peeked ones do not."""
        def usage(messages: list[ServiceBusReceivedMessage]) -> Usage:
            return Usage(data_cost(len(messages)), outgoing_messages=0 if peeking else len(messages))
        return self._governor.call(info.path, operation, usage, self._retry)

    def _delivered(self, messages: list[ServiceBusReceivedMessage]) -> list[ServiceBusReceivedMessage]:
        for message in messages:
            message._source = self._source
            message._incarnation = self._incarnation  # connected to before locking (_connected, _follow)
        if self.session is not None and not self._deletes:
            self._session_held.update(_lock(m) for m in messages)
        return messages

    @property
    def _deletes(self) -> bool:
        return self.receive_mode is ServiceBusReceiveMode.RECEIVE_AND_DELETE

    @property
    def _session_lock(self) -> Optional[SessionLock]:
        return None if self.session is None else self.session._lock

    @requires_open
    def receive_dataframe(self, max_message_count: int = 1000, max_wait_time: Optional[float] = None) -> "DataFrame":
        """Locked messages as a Spark DataFrame (one row per message, lock_token included).

        Args:
            max_message_count: At most this many messages.
            max_wait_time: Seconds to wait for the first message, as receive_messages' (default: the
                receiver's).

        Returns:
            The messages, one row each.

        Raises:
            InvalidOperationError: the client has no SparkSession (ServiceBusClient(path, spark=spark)).
        """
        if self._spark is None:
            raise InvalidOperationError("receive_dataframe needs a SparkSession: ServiceBusClient(path, spark=spark)")
        from .spark.dataframes import messages_to_arrow

        got = self.receive_messages(max_message_count=max_message_count, max_wait_time=max_wait_time)
        return self._spark.createDataFrame(messages_to_arrow(got), schema=_received_schema())

    # ---- settlement ------------------------------------------------------------------------------------

    @requires_open
    def complete_message(self, message: ServiceBusReceivedMessage) -> None:
        """Remove the message from the entity; durable before this returns.

        Args:
            message: A message this receiver received.

        Raises:
            MessageLockLostError: its lock expired or was taken over.
        """
        self.complete_messages([message])

    @requires_open
    def complete_messages(self, messages: Iterable[ServiceBusReceivedMessage]) -> int:
        """Complete many messages with one commit per partition (a sparkbus addition).

        Args:
            messages: Messages this receiver received.

        Returns:
            How many were completed.

        Raises:
            MessageLockLostError: a lock was lost; nothing is completed.
        """
        messages = list(messages)
        self._settle(messages, transitions.completed)
        return len(messages)

    @requires_open
    def complete_dataframe(self, df: "DataFrame") -> int:
        """Complete the messages of a DataFrame, one commit per partition.

        Args:
            df: The messages' sequence_number and lock_token columns, as receive_dataframe returns them.

        Returns:
            How many were completed.

        Raises:
            ValueError: df lacks the sequence_number or lock_token column.
            InvalidOperationError: the receiver is in RECEIVE_AND_DELETE mode (its messages are settled already).
            MessageLockLostError: a lock was lost, before anything is completed.
        """
        from .spark.dataframes import check_dataframe

        check_dataframe(df, "complete_dataframe")
        missing = sorted({"sequence_number", "lock_token"} - set(df.columns))
        if missing:
            raise ValueError(f"complete_dataframe needs the columns sequence_number and lock_token (as "
                             f"receive_dataframe returns them); the DataFrame lacks {missing}")
        if self._deletes:
            raise InvalidOperationError("messages received in RECEIVE_AND_DELETE mode are already settled")
        rows = df.select("sequence_number", "lock_token").collect()
        held = {row.sequence_number: Held(row.lock_token) for row in rows}
        self._settle_held(held, transitions.completed)
        return len(held)

    @requires_open
    def abandon_message(self, message: ServiceBusReceivedMessage) -> None:
        """Release the lock: the message is available again at once, its delivery count raised; at the
        entity's max_delivery_count it is dead-lettered instead (reason MaxDeliveryCountExceeded).

        Args:
            message: A message this receiver received.

        Raises:
            MessageLockLostError: its lock expired or was taken over.
        """
        rules = policy(self._delivery.lock_info(self._session_lock))
        self._settle([message], lambda row, now: transitions.abandoned(row, now, rules))

    @requires_open
    def defer_message(self, message: ServiceBusReceivedMessage) -> None:
        """Set the message aside; only receive_deferred_messages returns it again (by its sequence number).

        Args:
            message: A message this receiver received.

        Raises:
            MessageLockLostError: its lock expired or was taken over.
        """
        self._settle([message], transitions.deferred)

    @requires_open
    def dead_letter_message(self, message: ServiceBusReceivedMessage, reason: Optional[str] = None,
                            error_description: Optional[str] = None) -> None:
        """Move the message to the entity's dead-letter sub-queue.

        Args:
            message: A message this receiver received.
            reason: Why, at most 4096 characters of valid Unicode, as Service Bus allows.
            error_description: More about why, the same limits.

        Raises:
            ValueError: reason or error_description is too long or not valid Unicode.
            InvalidOperationError: the message is in a sub-queue already.
            MessageLockLostError: its lock expired or was taken over.
        """
        check_dead_letter_text(reason, "reason")
        check_dead_letter_text(error_description, "error_description")
        if self.sub_queue is not None:
            raise InvalidOperationError(f"a message in the {self.sub_queue.name.lower()} sub-queue cannot be dead-lettered again")
        self._settle([message], lambda row, now: transitions.dead_lettered(row, now, reason, error_description))

    @requires_open
    def renew_message_lock(self, message: ServiceBusReceivedMessage) -> datetime:
        """Extend the lock by lock_duration from now.

        Args:
            message: A message this receiver received.

        Returns:
            The new locked_until_utc.

        Raises:
            TypeError: the receiver holds a session: renew the session lock (receiver.session.renew_lock()).
            MessageLockLostError: its lock expired or was taken over.
        """
        if self.session is not None:
            raise TypeError("renewing a message lock is not possible with sessions: renew the session lock "
                            "(receiver.session.renew_lock()) instead")
        self._check_settleable(message)
        info = self._delivery.lock_info()
        rules = policy(info)
        written = self._governor.count(info.path, lambda: self._delivery.settle(
            info, _held([message]), lambda row, now: transitions.renewed(row, now, rules)))
        message._state_row = records.as_rows(written)[0]
        message.locked_until_utc = message._state_row["locked_until_utc"]
        return message.locked_until_utc

    def _settle(self, messages: list[ServiceBusReceivedMessage], change: Change) -> None:
        for message in messages:
            self._check_settleable(message)
        self._settle_held(_held(messages), change)
        for message in messages:
            message._settled = True

    def _settle_held(self, held: dict[int, Held], change: Change) -> None:
        """Settlement is counted as a request but neither throttled nor charged: the receive paid, and
        refusing the settlement would only let the lock lapse and deliver the message again. A lock of a
        deleted entity is lost (sparkbus.engine.delivery: MessageLockLostError, SessionLockLostError)."""
        info = self._delivery.lock_info(self._session_lock)
        self._governor.count(info.path, lambda: self._delivery.settle(info, held, change, self._session_lock))
        for seq in held:
            self._session_held.pop(seq, None)

    def _check_settleable(self, message: ServiceBusReceivedMessage) -> None:
        if not isinstance(message, ServiceBusReceivedMessage):
            raise TypeError(f"expected a ServiceBusReceivedMessage, got {type(message).__name__}")
        if message._sections is not None:
            raise InvalidOperationError("a message decoded by from_bytes has no receiver and cannot be settled")
        if self._deletes:
            raise InvalidOperationError("messages received in RECEIVE_AND_DELETE mode are already settled")
        if message._settled:
            raise MessageAlreadySettled(f"message {message.sequence_number} was already settled")
        if message.lock_token is None:
            raise InvalidOperationError("peeked messages carry no lock and cannot be settled")
        assert message._source is not None  # a message with a lock token was received, which set its source
        if message._source != self._source:
            raise InvalidOperationError(
                f"message {message.sequence_number} was received from {message._source[1]!r} of namespace "
                f"{message._source[0]}; settle it through a receiver of that entity, not of {self.entity_path!r}")
        if self.session is not None and message.session_id != self.session.session_id:
            raise InvalidOperationError(f"message {message.sequence_number} belongs to session {message.session_id!r}; "
                                        f"this receiver holds session {self.session.session_id!r}")

    # ---- batch delete ----------------------------------------------------------------------------------

    @requires_open
    def delete_messages(self, *, max_message_count: int, before_enqueued_time_utc: Optional[datetime] = None) -> int:
        """Remove messages without receiving them, oldest first in each partition: unlocked messages of the
        receiver's queue or sub-queue (of its session, for a session receiver). Deferred messages and
        scheduled ones not yet due stay. 1 credit each.

        Args:
            max_message_count: At most this many, 1 to 4,000.
            before_enqueued_time_utc: Only messages enqueued before this time (default: now).

        Returns:
            How many were removed.

        Raises:
            ValueError: max_message_count is out of range.
        """
        if isinstance(max_message_count, bool) or not isinstance(max_message_count, int) or \
                not 1 <= max_message_count <= MAX_DELETE_COUNT:
            raise ValueError(f"max_message_count must be an int from 1 to {MAX_DELETE_COUNT}, got {max_message_count!r}")
        before = to_utc(before_enqueued_time_utc, "before_enqueued_time_utc") or clock.now()
        try:
            return self._delete(max_message_count, before)
        except EntityDeleted as gone:  # deleted while this ran: the new incarnation's, if created again
            self._reconnect(gone)
            return self._delete(max_message_count, before)

    def _delete(self, max_message_count: int, before: datetime) -> int:
        info = self._connected()
        self._check_receivable(info)
        queue = SUB_QUEUE_STATES[self.sub_queue] if self.sub_queue else ACTIVE

        def delete() -> int:
            removed = 0
            for partition in available_partitions(info):
                if self._session_lock is not None and partition != self._session_lock.partition:
                    continue
                removed += self._delivery.delete(info, partition, queue, max_message_count - removed, before,
                                                 self._session_lock)
                if removed == max_message_count:
                    break
            return removed
        return self._governor.call(info.path, delete, lambda n: Usage(data_cost(n)), self._retry)

    @requires_open
    def purge_messages(self, *, before_enqueued_time_utc: Optional[datetime] = None) -> int:
        """delete_messages until none is left that qualifies.

        Args:
            before_enqueued_time_utc: Only messages enqueued before this time (default: the time of the call).

        Returns:
            How many were removed.
        """
        before = to_utc(before_enqueued_time_utc, "before_enqueued_time_utc") or clock.now()
        total = 0
        while True:
            removed = self.delete_messages(max_message_count=MAX_DELETE_COUNT, before_enqueued_time_utc=before)
            total += removed
            if removed == 0:
                return total

    # ---- peek ------------------------------------------------------------------------------------------

    @requires_open
    def peek_messages(self, max_message_count: int = 1, *, sequence_number: int = 0) -> list[ServiceBusReceivedMessage]:
        """Browse without locking: the oldest messages of one partition from the cursor (or sequence_number).

        Repeated calls continue where the last ended, partition by partition, until every message was
        seen once; a call may return fewer messages than asked (seed, "Browse/Peek messages").

        Args:
            max_message_count: At most this many messages, 1 to 2**31 - 1.
            sequence_number: Where to start; 0 (the default): at the cursor, where the last call ended.

        Returns:
            The messages, not locked: they cannot be settled.

        Raises:
            ValueError: max_message_count or sequence_number is out of range.
        """
        if isinstance(max_message_count, bool) or not isinstance(max_message_count, int) \
                or not 1 <= max_message_count <= MAX_MESSAGE_COUNT:
            raise ValueError(f"max_message_count must be an int in 1..{MAX_MESSAGE_COUNT}, got {max_message_count!r}")
        if isinstance(sequence_number, bool) or not isinstance(sequence_number, int) \
                or not 0 <= sequence_number <= MAX_SEQUENCE_NUMBER:
            raise ValueError(f"sequence_number must be an int in 0..{MAX_SEQUENCE_NUMBER}, got {sequence_number!r}")
        try:
            return self._peek(max_message_count, sequence_number)
        except EntityDeleted as gone:  # deleted while this ran: the new incarnation's, if created again
            self._reconnect(gone)
            return self._peek(max_message_count, sequence_number)

    def _peek(self, max_message_count: int, sequence_number: int) -> list[ServiceBusReceivedMessage]:
        info = self._connected()
        cursor = sequence_number if sequence_number or self._peek_cursor is None else self._peek_cursor

        def peek() -> list[ServiceBusReceivedMessage]:
            found, self._peek_cursor = self._delivery.peek(
                info, cursor, max_message_count,
                sub_queue=SUB_QUEUE_STATES[self.sub_queue] if self.sub_queue else None,
                session_id=None if self.session is None else self.session.session_id)
            now = clock.now()
            return [m for m in (_peeked(r, now) for r in found) if m is not None]
        return self._charged(info, peek, peeking=True)

    def _check_receivable(self, info: EntityInfo, receiving: bool = True) -> None:
        """Status and session rules; a plain receiver of a session entity may peek but not receive."""
        status = info.options.status
        if status in ("Disabled", "ReceiveDisabled"):
            raise MessagingEntityDisabledError(f"{info.kind} {info.path!r} is {status}; receiving is not allowed")
        if receiving and self.sub_queue is None and info.options.forward_to:
            raise InvalidOperationError(f"{info.kind} {info.path!r} forwards its messages to {info.options.forward_to!r}; "
                                        "it cannot be received from (peek still works)")
        if (receiving and self.sub_queue is ServiceBusSubQueue.DEAD_LETTER
                and info.options.forward_dead_lettered_messages_to):
            raise InvalidOperationError(
                f"{info.kind} {info.path!r} forwards its dead-lettered messages to "
                f"{info.options.forward_dead_lettered_messages_to!r}; its dead-letter sub-queue cannot be received from")
        sessionful = info.options.requires_session
        if receiving and sessionful and self.sub_queue is None and not self._session_requested:
            raise InvalidOperationError(
                f"{info.kind} {info.path!r} requires sessions: receive with a session receiver (session_id=...)")
        if self._session_requested and (not sessionful or self.sub_queue is not None):
            raise InvalidOperationError(
                f"session receivers need an entity created with requires_session=True (not {info.path!r}"
                f"{' and not its dead-letter sub-queue' if self.sub_queue is not None else ''})")


_RECEIVER_KEYWORDS = ("receive_mode", "sub_queue", "prefetch_count", "max_wait_time", "session_id",
                      "auto_lock_renewer")


def _held(messages: list[ServiceBusReceivedMessage]) -> dict[int, Held]:
    held: dict[int, Held] = {}
    for m in messages:
        number, token = m.sequence_number, m.lock_token
        assert number is not None and token is not None  # received with a lock
        held[number] = Held(token, m._state_row, m._incarnation)
    return held


def _number(message: ServiceBusReceivedMessage) -> int:
    """The sequence number of a message read from an entity (only from_bytes makes messages without one)."""
    number = message.sequence_number
    assert number is not None
    return number


def _lock(message: ServiceBusReceivedMessage) -> tuple[int, str]:
    """(sequence number, lock token) of a message received with a lock."""
    number, token = _number(message), message.lock_token
    assert token is not None
    return number, token


def _renumbered(info: EntityInfo) -> MessageNotFoundError:
    """A receive by sequence number's answer when the entity it was connected to was deleted and created again."""
    return MessageNotFoundError(
        f"{info.kind} {info.path!r} was deleted and created again since this receiver last used it: the sequence "
        "numbers of the deleted one's messages name nothing in the new one (numbering starts again); "
        "nothing was received")


def _received_schema() -> str:
    from .spark.dataframes import RECEIVED_SPARK_SCHEMA

    return RECEIVED_SPARK_SCHEMA


def _check_wait(value: object) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise ValueError(f"max_wait_time must be a finite number of seconds >= 0 or None, got {value!r}")
    return float(value)


def _decoder(queue: str) -> Decode[ServiceBusReceivedMessage]:
    """How a receive from `queue` turns the rows it locked (message rows, state rows written) into
    messages (sparkbus.engine.delivery.Decode): as received (a row that cannot be decoded gives its error,
    and the receive dead-letters it), or in the dead-letter sub-queues, where nothing can be dead-lettered
    again, as presented. Rows that certainly decode (_needs_check) become views read when asked; only the
    others are decoded in full here."""
    kind = ServiceBusMessageState.DEFERRED if queue == DEFERRED else ServiceBusMessageState.ACTIVE
    make = _presented if queue in (DEAD_LETTERED, TRANSFER_DEAD_LETTERED) else _received

    def decode(taken: pa.Table, states: pa.Table) -> list[Union[ServiceBusReceivedMessage, DecodeError]]:
        rows, state_rows = records.Columns(taken), records.Columns(states)
        # _view, inlined: a view's attributes, with what settling reads of it, read a column at a time
        blank, new, row = _blank(rows, state_rows, kind), ServiceBusReceivedMessage.__new__, records.Row
        # the keys each view is given below, there from the start: a copy then never grows its table
        blank.update(_index=0, sequence_number=None, lock_token=None, _state_row=None)
        if "body_type" not in taken.column_names or taken["body_type"].null_count == taken.num_rows:
            blank["_body_type"] = None  # ordinary bodies (every row's is null): nothing to read when body is
        numbers, tokens = rows.column("sequence_number"), state_rows.column("lock_token")
        made: list[Union[ServiceBusReceivedMessage, DecodeError]] = []
        for i, check in enumerate(_needs_check(taken).tolist()):
            if not check:
                known = blank.copy()
                token = tokens[i]
                known["_index"], known["sequence_number"], known["lock_token"] = i, numbers[i], token
                known["_state_row"] = None if token is None else row(state_rows, i)
                message = new(ServiceBusReceivedMessage)
                message.__dict__ = known
                made.append(message)
                continue
            try:
                made.append(make(rows, state_rows, i, kind))
            except DECODE_ERRORS as error:
                made.append(error)
        return made
    return decode


# The stored application-properties texts that certainly decode to properties with a wire form: JSON as
# encode_properties writes it (no whitespace, each value tagged with its type), each value in a form that
# decodes. Strings: JSON strings (text in Arrow is valid UTF-8) without \uD800-\uDFFF escapes (a lone
# surrogate, or half of a pair: checked in full); ints of at most 18 digits (within 64 bits); floats: JSON
# numbers (with a fraction or exponent, or else at most 18 digits: json reads those as ints), or the
# non-finite ones json.dumps writes; bytes: padded base64; uuid: 8-4-4-4-12 hex digits; datetime:
# isoformat with an offset, on a day every month has (29th to 31st only where every year has them:
# February 29th is checked in full).
_JSON_STRING = r'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u(?:[0-9a-cA-CeEfF][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2}))*"'
_JSON_INT = r"-?(?:0|[1-9][0-9]{0,17})"
_EXPONENT = r"[eE][-+]?[0-9]+"
_JSON_FLOAT = (r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+(?:" + _EXPONENT + ")?|" + _EXPONENT + ")|" + _JSON_INT
               + r"|-?Infinity|NaN")
_BASE64 = r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?"
_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_DATE = (r"(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])-"
         r"(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1[0-9]|2[0-8])|(?:0[13-9]|1[0-2])-(?:29|30)|(?:0[13578]|1[02])-31)")
_CLOCK = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]"
_DATETIME = (_DATE + "T" + _CLOCK + r":[0-5][0-9](?:\.[0-9]{6})?[-+]" + _CLOCK
             + r"(?::[0-5][0-9](?:\.[0-9]{6})?)?")
_TAGGED = (r'\["str",' + _JSON_STRING + r'\]|\["int",' + _JSON_INT + r'\]|\["float",(?:' + _JSON_FLOAT
           + r')\]|\["bool",(?:true|false)\]|\["null",null\]|\["bytes","' + _BASE64 + r'"\]|\["uuid","'
           + _UUID + r'"\]|\["datetime","' + _DATETIME + r'"\]')
_ENTRY = _JSON_STRING + ":(?:" + _TAGGED + ")"
_PLAIN_PROPERTIES = r"^\{(?:" + _ENTRY + "(?:," + _ENTRY + r")*)?\}$"
# Arrow compiles the pattern on every call (0.27 ms), Python's re once: a few rows are matched with it
# (the two engines agree on this pattern: no look-arounds or back-references; fullmatch, since re's $ also
# matches before a final newline). tests/test_message_views.py compares them.
_PLAIN_PROPERTIES_RE = re.compile(_PLAIN_PROPERTIES[1:-1])
_FEW_ROWS = 64


def _plain_properties(properties: pa.ChunkedArray) -> np.ndarray:
    """Per row, whether its application-properties text matches _PLAIN_PROPERTIES (null: True). Each
    distinct text is matched once: a batch's messages mostly carry a few (matching every row of a receive
    of 1,000 took a tenth of it)."""
    if len(properties) <= _FEW_ROWS:
        return _plain_texts(properties)
    distinct = pc.unique(properties)
    at = pc.index_in(properties, value_set=distinct)  # null rows: the null in distinct (plain)
    matched: np.ndarray = _plain_texts(distinct)[np.asarray(pc.fill_null(at, 0).to_numpy(zero_copy_only=False),
                                                             dtype=np.int64)] | \
        np.asarray(pc.is_null(properties).to_numpy(zero_copy_only=False), dtype=bool)
    return matched


def _plain_texts(texts: "pa.Array | pa.ChunkedArray") -> np.ndarray:
    """Per text, whether it matches _PLAIN_PROPERTIES (null: True): Python's compiled pattern for a few,
    Arrow's kernel (which compiles it on every call) for many."""
    if len(texts) <= _FEW_ROWS:
        return np.array([text is None or _PLAIN_PROPERTIES_RE.fullmatch(text) is not None
                         for text in texts.to_pylist()], dtype=bool)
    plain: np.ndarray = pc.fill_null(pc.match_substring_regex(texts, _PLAIN_PROPERTIES), True).to_numpy(
        zero_copy_only=False)
    return plain


def _needs_check(rows: pa.Table) -> np.ndarray:
    """Which of a receive's message rows may not decode, vectorised (one pass per column): those a
    receive decodes in full (_received), so it can dead-letter them if they do not. Every other row
    certainly makes a message whose attributes all read without error: application properties that are
    null or _PLAIN_PROPERTIES, an ordinary body (null body_type: nothing to decode), a time-to-live within
    timedelta's range and both sizes set."""
    check = np.zeros(rows.num_rows, dtype=bool)
    if not rows.num_rows:
        return check
    properties = rows["application_properties"]
    if properties.null_count < rows.num_rows:
        check |= ~_plain_properties(properties)
    # (a column's null count answers for most of them without a kernel call: a single receive's row)
    ttl = rows["time_to_live_ms"]
    if ttl.null_count < len(ttl):
        beyond = pc.or_(pc.greater_equal(ttl, _LONGEST_TTL_MS), pc.less_equal(ttl, _SHORTEST_TTL_MS))
        check |= pc.fill_null(beyond, False).to_numpy(zero_copy_only=False)
    if rows["body_type"].null_count < rows.num_rows:
        check |= pc.is_valid(rows["body_type"]).to_numpy(zero_copy_only=False)
    for name in ("body_size", "header_size"):
        if rows[name].null_count:
            check |= pc.is_null(rows[name]).to_numpy(zero_copy_only=False)
    return check


def _received(rows: records.Columns, states: records.Columns, index: int,
              kind: ServiceBusMessageState) -> ServiceBusReceivedMessage:
    """A stored row (row index of a receive's rows and state rows) as a received message, read in full.
    ValueError saying what cannot be decoded (a row written by an older version or another tool:
    properties that do not decode or have no wire form, such as a lone surrogate or an int beyond 64 bits,
    or an AMQP body that does not decode); the receive dead-letters such a message
    (sparkbus.engine.delivery.decoded). Checks beyond reading every attribute cost only a look at each
    property, and a decode of a body that is not a plain data section."""
    message = ServiceBusReceivedMessage._view(rows, states, index, kind)
    try:
        message._load()
    except DECODE_ERRORS as error:
        raise ValueError(_undecodable(rows.column("application_properties")[index], error)) from error
    check_properties(message.str_application_properties, "application_properties")
    if message._body_type is not None:
        try:
            amqp.loaded_body(message._body_type, message._stored_body)
        except DECODE_ERRORS as error:
            raise ValueError(f"the {message._body_type} body does not decode: {error}") from error
    return message


def _undecodable(text: Optional[str], error: BaseException) -> str:
    """What of a stored row a message cannot be made of (text: its stored application properties;
    error: what making it raised)."""
    try:
        properties = decode_properties(text)
    except DECODE_ERRORS as found:
        return f"application_properties do not decode: {found}"
    try:
        check_properties(properties, "application_properties")
    except DECODE_ERRORS as found:
        return str(found)
    return f"{type(error).__name__}: {error}"


def _presented(rows: records.Columns, states: records.Columns, index: int,
               kind: ServiceBusMessageState) -> ServiceBusReceivedMessage:
    """A stored row as peek and the dead-letter sub-queues show it: as received when it decodes, else with
    what does not decode left out: the application properties that do not decode or have no wire form
    are dropped (the others kept), a time-to-live beyond timedelta's range or a missing size reads as
    none. A body that does not decode raises only when .body is read (body_bytes has it as stored).
    Raises DECODE_ERRORS only for a row even that cannot show."""
    message = ServiceBusReceivedMessage._view(rows, states, index, kind)
    try:
        message._load()
        return message
    except DECODE_ERRORS:
        row: dict[str, Any] = dict(records.Row(rows, index))
        ttl = row["time_to_live_ms"]
        shown = {**row, "application_properties": _decodable_properties(row["application_properties"]),
                 "time_to_live_ms": ttl if ttl is None or abs(ttl) < _LONGEST_TTL_MS else None,
                 "body_size": row["body_size"] or 0, "header_size": row["header_size"] or 0}
        return ServiceBusReceivedMessage(shown, records.Row(states, index), kind)


_LONGEST_TTL_MS = timedelta.max // timedelta(milliseconds=1)
_SHORTEST_TTL_MS = timedelta.min // timedelta(milliseconds=1)  # with the longest: timedelta's range


def _decodable_properties(text: Optional[str]) -> Optional[str]:
    """Stored application properties without the entries that do not decode or have no wire form."""
    try:
        stored = json.loads(text) if text else {}
    except ValueError:
        return None
    kept: dict[str, Any] = {}
    for name, tagged in (stored.items() if isinstance(stored, dict) else ()):
        try:
            kept.update(check_properties(decode_properties(json.dumps({name: tagged})), "application_properties"))
        except DECODE_ERRORS:
            continue
    return encode_properties(kept)


def _peeked(row: dict[str, Any], now: datetime) -> Optional[ServiceBusReceivedMessage]:
    """A peeked row as presented; None for a row that cannot even be presented (peek leaves it out)."""
    try:
        return _presented(records.Columns.of_rows([row]), records.Columns.of_rows([_peeked_state(row)]), 0,
                          _peek_state(row, now))
    except DECODE_ERRORS:
        return None


def _peeked_state(row: dict[str, Any]) -> dict[str, Any]:
    return {"delivery_count": row["delivery_count"] or 0, "dead_letter_reason": row["dead_letter_reason"],
            "dead_letter_error_description": row["dead_letter_error_description"],
            "dead_letter_source": row["dead_letter_source"]}


def _peek_state(row: dict[str, Any], now: datetime) -> ServiceBusMessageState:
    if row["lock_state"] == DEFERRED:
        return ServiceBusMessageState.DEFERRED
    scheduled = row["scheduled_enqueue_time_utc"]
    if scheduled is not None and scheduled > now:
        return ServiceBusMessageState.SCHEDULED
    return ServiceBusMessageState.ACTIVE
