"""Messages as azure-servicebus shapes them; sparkbus.core.encoding gives them their columnar form.

Every value a message holds must have a wire form (sparkbus.core.wire): it is checked when the message
is constructed and again when it is sent or scheduled (to_outgoing), since its attributes may change in
between; a refused message raises TypeError or ValueError naming the field before anything is written."""
from __future__ import annotations

import operator
import uuid
from datetime import datetime, timedelta, timezone
from itertools import chain
from typing import Any, Iterable, Iterator, Optional, Sequence, Union

import pyarrow as pa

from .amqp import AmqpAnnotatedMessage, AmqpMessageBodyType, AmqpMessageHeader, AmqpMessageProperties
from .core import amqp, records
from .core.encoding import LENGTH_LIMITED, OUTGOING, STRING_PROPERTIES, header_size, suspect_rows
from .core.values import check_properties, checked_encoding, encode_properties
from .core.wire import MAX_AMQP_TTL_MS, check_amqp_ttl, check_id, check_text, encoded
from .exceptions import MessageSizeExceededError

# AMQP properties that are ServiceBusMessage fields, by their ServiceBusMessage name.
AMQP_PROPERTY_FIELDS = {"message_id": "message_id", "to": "to", "subject": "subject", "reply_to": "reply_to",
                        "correlation_id": "correlation_id", "content_type": "content_type",
                        "session_id": "group_id", "reply_to_session_id": "reply_to_group_id"}
PARTITION_KEY_ANNOTATION = b"x-opt-partition-key"
SCHEDULED_TIME_ANNOTATION = b"x-opt-scheduled-enqueue-time"


class MessageBody(bytes):
    """A data body of one section: bytes, and what azure-servicebus gives for a data body, an iterator of
    its byte sections. So sparkbus code comparing or decoding `msg.body` and ported code doing
    `b"".join(msg.body)`, `next(msg.body)` or `for section in msg.body` both work; iterating gives the whole
    body as one section, not its byte values (`bytes(msg.body)` or `msg.body_bytes` for plain bytes)."""

    def __iter__(self) -> Iterator[bytes]:  # type: ignore[override]  # sections, as the SDK's body; not bytes' ints
        return iter((bytes(self),))

    def __next__(self) -> bytes:
        if self.__dict__.get("_read"):
            raise StopIteration
        self.__dict__["_read"] = True
        return bytes(self)


def public_body(body_type: Optional[str], stored: bytes) -> Any:
    """`message.body` of a stored body: MessageBody for one data section (the usual case), an iterator of
    sections for several data or sequence sections, the value of a value body.

    Args:
        body_type: The stored body type (None: one data section, stored as it is).
        stored: The stored body.

    Returns:
        The body, as message.body gives it.
    """
    if body_type is None:
        return MessageBody(stored)
    kind, body = amqp.loaded_body(body_type, stored)
    return body if kind == amqp.VALUE else iter(list(body))


def body_text(body_type: Optional[str], stored: bytes, encoding: str = "utf-8") -> str:
    """str(message) as azure-servicebus gives it: data sections decoded and joined, otherwise str(body).

    Args:
        body_type: The stored body type (None: one data section, stored as it is).
        stored: The stored body.
        encoding: The data sections' encoding (bytes it cannot decode are replaced).

    Returns:
        The text.
    """
    if body_type is None:
        return stored.decode(encoding, errors="replace")
    kind, body = amqp.loaded_body(body_type, stored)
    if kind == amqp.DATA:
        return "".join(section.decode(encoding, errors="replace") for section in body)
    return str(body)


def amqp_text(value: Any, name: str) -> Optional[str]:
    """An AMQP property read as a ServiceBusMessage str field (bytes are UTF-8 text on the wire).

    Args:
        value: The property's value: None, str, bytes, int or uuid.UUID.
        name: The property's name, for error messages.

    Returns:
        The text, or None.

    Raises:
        TypeError: a value of another type.
        ValueError: bytes that are not UTF-8.
    """
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return _utf8(value, f"AMQP property {name}")
    if isinstance(value, (int, uuid.UUID)):
        return str(value)
    raise TypeError(f"AMQP property {name} must be a string, got {type(value).__name__}")


def str_keys(props: Optional[dict[Any, Any]], what: str = "property map") -> Optional[dict[str, Any]]:
    """Property keys as str: azure-servicebus hands back bytes keys, and re-sending them must work.

    Args:
        props: A property map; anything else is returned as it is.
        what: What holds the map, named by the error.

    Returns:
        The map with its bytes keys decoded.

    Raises:
        ValueError: a bytes key is not UTF-8.
    """
    if not isinstance(props, dict):
        return props
    return {_utf8(k, f"the {what} key {k!r}") if isinstance(k, bytes) else k: v for k, v in props.items()}


def _utf8(value: bytes, name: str) -> str:
    """bytes that stand for text (AMQP strings and symbols are UTF-8); ValueError naming them otherwise."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{name} is not UTF-8 text: {error}") from None


def to_utc(value: object, name: str) -> Optional[datetime]:
    """value in UTC (a naive datetime is taken as UTC).

    Args:
        value: A datetime, or None.
        name: The argument's name, for error messages.

    Returns:
        The time in UTC, or None for None.

    Raises:
        TypeError: value is not a datetime.
        ValueError: the time has no UTC datetime (beyond year 9999 once converted).
    """
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise TypeError(f"{name} must be a datetime, got {type(value).__name__}")
    try:
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)
    except OverflowError:
        raise ValueError(f"{name}={value.isoformat()} is out of range: in UTC it must fall within years 1 to "
                         "9999") from None


def check_string_property(name: str, value: object) -> None:
    """Check a str system property (message_id, subject, ...).

    Args:
        name: The property's name.
        value: None or valid text; the ids (message_id, session_id, partition_key, reply_to_session_id) 1 to
            128 characters.

    Raises:
        TypeError: value is not a str, naming the property.
        ValueError: value is not valid text or an id's length is out of range, naming the property.
    """
    if value is None:
        return
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    if name in LENGTH_LIMITED:
        check_id(name, value)
    else:
        check_text(value, name)


def check_time_to_live(value: object) -> None:
    """Check a time-to-live.

    Args:
        value: None or a positive timedelta.

    Raises:
        TypeError: value is not a timedelta.
        ValueError: value is not positive.
    """
    if value is None:
        return
    if not isinstance(value, timedelta):
        raise TypeError(f"time_to_live must be a timedelta, got {type(value).__name__}")
    if value <= timedelta(0):
        raise ValueError(f"time_to_live must be positive, got {value}")


def amqp_ttl(value: Optional[timedelta]) -> Optional[int]:
    """A time-to-live as an AMQP header's time_to_live: milliseconds, at most the AMQP uint maximum (a
    longer time-to-live, such as an entity's default of TimeSpan.MaxValue, is given as that maximum, about
    49.7 days: the header has no room for more).

    Args:
        value: The time-to-live, or None.

    Returns:
        The milliseconds, or None for None.
    """
    return None if value is None else min(value // timedelta(milliseconds=1), MAX_AMQP_TTL_MS)


class ServiceBusMessage:
    """A message to send, constructed as azure-servicebus'. ServiceBusMessage.from_amqp wraps an
    AmqpAnnotatedMessage.

    Args:
        body: bytes, or str (encoded with encoding), or a list of them (one data section each); None is an
            empty body.
        application_properties: str keys (bytes keys are decoded as UTF-8) and values of str, int, float, bool,
            bytes, datetime, uuid.UUID or None, each with a wire form.
        session_id: The session the message belongs to, 1 to 128 characters.
        message_id: Its id, 1 to 128 characters; default: a new uuid4 hex.
        partition_key: The key that places it in a partition of a partitioned entity, 1 to 128 characters.
        scheduled_enqueue_time_utc: When the message becomes receivable (a naive datetime is UTC).
        time_to_live: A positive timedelta; the entity's default_message_time_to_live when shorter or not given.
        content_type: The body's content type.
        correlation_id: An application-defined id, such as the message_id of the message this one answers.
        subject: An application-defined label.
        to: An application-defined destination address.
        reply_to: The entity to send replies to.
        reply_to_session_id: The session to send replies to, 1 to 128 characters.
        encoding: The encoding of a str body.
        label: The older SDKs' name of subject (still in the SDK's samples): sets subject when subject is not
            given.

    Raises:
        TypeError: a value of a type the field does not take.
        ValueError: a value without a wire form, such as text with a lone surrogate or an id that is too long.
    """

    session_id: Optional[str]
    message_id: Optional[str]
    partition_key: Optional[str]
    content_type: Optional[str]
    correlation_id: Optional[str]
    subject: Optional[str]
    to: Optional[str]
    reply_to: Optional[str]
    reply_to_session_id: Optional[str]

    def __init__(self, body: Union[bytes, str, Sequence[Union[bytes, bytearray, str]], None], *,
                 application_properties: Optional[dict[Any, Any]] = None,
                 session_id: Optional[str] = None, message_id: Optional[str] = None,
                 partition_key: Optional[str] = None, scheduled_enqueue_time_utc: Optional[datetime] = None,
                 time_to_live: Optional[timedelta] = None, content_type: Optional[str] = None,
                 correlation_id: Optional[str] = None, subject: Optional[str] = None, to: Optional[str] = None,
                 reply_to: Optional[str] = None, reply_to_session_id: Optional[str] = None,
                 encoding: str = "UTF-8", label: Optional[str] = None) -> None:
        """As azure-servicebus' constructor; its arguments are described on the class."""
        if subject is None:
            subject = label
        if body is None:
            body = b""
        if isinstance(body, (list, tuple)):
            if not all(isinstance(s, (bytes, bytearray, str)) for s in body):
                raise TypeError("a list body holds data sections: bytes or str")
            body = [encoded(s, encoding, f"body[{i}]") if isinstance(s, str) else bytes(s) for i, s in enumerate(body)]
            self._body_type, self._body = amqp.stored_body(amqp.DATA, body)
        else:
            if isinstance(body, str):
                body = encoded(body, encoding, "body")
            if not isinstance(body, (bytes, bytearray, memoryview)):
                raise TypeError(f"body must be bytes, str, a list of them or None, got {type(body).__name__}")
            self._body_type, self._body = None, bytes(body)
        self._encoding = encoding
        self.application_properties = check_properties(str_keys(application_properties, "application_properties"),
                                                       "application_properties")
        message_id = message_id or uuid.uuid4().hex
        # the values checked here, in STRING_PROPERTIES' order (str is immutable: the same object later
        # needs no second check)
        self._checked = (message_id, session_id, partition_key, correlation_id, content_type, subject, to,
                         reply_to, reply_to_session_id)
        for name, value in zip(STRING_PROPERTIES, self._checked):
            if value is not None:
                check_string_property(name, value)
        self.message_id, self.session_id, self.partition_key = message_id, session_id, partition_key
        self.correlation_id, self.content_type, self.subject, self.to = correlation_id, content_type, subject, to
        self.reply_to, self.reply_to_session_id = reply_to, reply_to_session_id
        check_time_to_live(time_to_live)
        self.time_to_live = time_to_live
        self.scheduled_enqueue_time_utc = to_utc(scheduled_enqueue_time_utc, "scheduled_enqueue_time_utc")

    @classmethod
    def from_amqp(cls, message: AmqpAnnotatedMessage) -> "ServiceBusMessage":
        """The message a sender sends for an AmqpAnnotatedMessage: its body of any kind, application
        properties, the properties that are message fields, header time_to_live (ms) and the partition-key
        and scheduled-time annotations.

        Args:
            message: The AMQP message.

        Returns:
            The message to send.

        Raises:
            TypeError: as the constructor does.
            ValueError: as the constructor does.
        """
        properties = message.properties or AmqpMessageProperties()
        fields = {name: amqp_text(properties.get(amqp_name), amqp_name) for name, amqp_name in AMQP_PROPERTY_FIELDS.items()}
        annotations = str_keys(message.annotations, "annotations") or {}
        ttl = check_amqp_ttl(message.header.time_to_live if message.header is not None else None,
                             "header time_to_live")
        scheduled: Any = annotations.get(SCHEDULED_TIME_ANNOTATION.decode())  # any value: the constructor checks it
        if isinstance(scheduled, int) and not isinstance(scheduled, bool):
            scheduled = _from_epoch_ms(scheduled, SCHEDULED_TIME_ANNOTATION.decode())
        out = cls(None, application_properties=message.application_properties,
                  partition_key=amqp_text(annotations.get(PARTITION_KEY_ANNOTATION.decode()), "x-opt-partition-key"),
                  scheduled_enqueue_time_utc=scheduled,
                  time_to_live=None if not ttl else timedelta(milliseconds=ttl), message_id=fields["message_id"],
                  to=fields["to"], subject=fields["subject"], reply_to=fields["reply_to"],
                  correlation_id=fields["correlation_id"], content_type=fields["content_type"],
                  session_id=fields["session_id"], reply_to_session_id=fields["reply_to_session_id"])
        kind = message.body_type.value
        out._body_type, out._body = amqp.stored_body(kind, message.body if kind == amqp.VALUE else list(message.body),
                                                     f"{kind}_body")
        return out

    @property
    def body(self) -> Any:
        """As azure-servicebus: a data body iterates its sections (here also bytes when it is one section),
        a sequence body iterates its lists, a value body is the value."""
        return public_body(self._body_type, self._body)

    @property
    def body_type(self) -> AmqpMessageBodyType:
        return AmqpMessageBodyType(self._body_type or amqp.DATA)

    @property
    def raw_amqp_message(self) -> AmqpAnnotatedMessage:
        """The message as AMQP sections (built on each access; changes to it do not change the message)."""
        kind, body = amqp.loaded_body(self._body_type, self._body)
        annotations: dict[bytes, Union[str, datetime]] = {}
        if self.partition_key is not None:
            annotations[PARTITION_KEY_ANNOTATION] = self.partition_key
        if self.scheduled_enqueue_time_utc is not None:
            annotations[SCHEDULED_TIME_ANNOTATION] = self.scheduled_enqueue_time_utc
        ttl = amqp_ttl(self.time_to_live)
        return AmqpAnnotatedMessage(
            **{f"{kind}_body": body}, application_properties=dict(self.application_properties) or None,
            properties=AmqpMessageProperties(**{a: getattr(self, n) for n, a in AMQP_PROPERTY_FIELDS.items()}),
            header=AmqpMessageHeader(time_to_live=ttl), annotations=annotations or None)

    @property
    def size_in_bytes(self) -> int:
        """Body + header bytes: what the sender's size limits and the entity's size quota count."""
        return message_size(self)

    def __str__(self) -> str:
        return body_text(self._body_type, self._body, self._encoding)

    def __repr__(self) -> str:
        return f"ServiceBusMessage(message_id={self.message_id!r}, session_id={self.session_id!r}, body={len(self._body)} bytes)"


EXACT_CHECKS = 8  # sends of up to this many messages check each exactly: cheaper than suspect_rows' kernels


def to_outgoing(messages: Iterable[ServiceBusMessage]) -> pa.Table:
    """The OUTGOING Arrow rows of messages, in order, every value with a wire form (sparkbus.core.wire).

    Messages are checked again here, not only when constructed: their attributes can be changed after
    construction, and what is sent is what they hold now. A batch costs one vectorised pass (suspect_rows)
    over it, a send of up to EXACT_CHECKS messages the exact check of each; only a row the pass flags, or a
    batch whose conversion failed, is checked value by value, which raises TypeError or ValueError naming
    the message and the field.

    Args:
        messages: The messages to send.

    Returns:
        Their rows, in order.

    Raises:
        TypeError: a value of a type its field does not take.
        ValueError: a value without a wire form.
    """
    messages = list(messages)
    try:
        columns: dict[str, list[Any]] = {name: [getattr(m, name) for m in messages] for name in STRING_PROPERTIES}
        properties = [m.application_properties for m in messages]
        "".join(chain.from_iterable(filter(None, properties)))  # TypeError unless every key is a str
        columns["application_properties"] = [encode_properties(p) for p in properties]
        columns["body"] = [m._body for m in messages]
        columns["body_type"] = [m._body_type for m in messages]
        columns["time_to_live_ms"] = [None if m.time_to_live is None else m.time_to_live // timedelta(milliseconds=1)
                                      for m in messages]
        columns["scheduled_enqueue_time_utc"] = [m.scheduled_enqueue_time_utc for m in messages]
        count = len(messages)  # (a column of Nones made once and kept: most of a single message's are)
        rows = pa.Table.from_arrays([records.nulls(count, field.type) if values.count(None) == count
                                     else pa.array(values, field.type)
                                     for field, values in ((f, columns[f.name]) for f in OUTGOING)], schema=OUTGOING)
    except (TypeError, ValueError, AttributeError):  # a value of the wrong type or without a wire form
        _check_each(messages, range(len(messages)))
        raise
    _check_each(messages, range(len(messages)) if len(messages) <= EXACT_CHECKS else suspect_rows(rows))
    return rows


def _check_each(messages: list[ServiceBusMessage], indices: Iterable[int]) -> None:
    """The exact check of the messages at indices: what the constructor checks, of their current values."""
    for i in indices:
        m = messages[i]
        try:
            _check_strings(m)
            check_properties(m.application_properties, "application_properties")
            check_time_to_live(m.time_to_live)
            to_utc(m.scheduled_enqueue_time_utc, "scheduled_enqueue_time_utc")
        except (TypeError, ValueError) as error:
            if len(messages) == 1:
                raise
            raise type(error)(f"message {i} of {len(messages)}: {error}") from None


_STRINGS = operator.attrgetter(*STRING_PROPERTIES)
_UNCHECKED = (None,) * len(STRING_PROPERTIES)


def _check_strings(message: ServiceBusMessage) -> tuple[Any, ...]:
    """The message's string properties (in STRING_PROPERTIES' order), each checked exactly but those still
    holding the value its constructor checked."""
    values: tuple[Any, ...] = _STRINGS(message)
    checked = getattr(message, "_checked", _UNCHECKED)
    if any(map(operator.is_not, values, checked)):
        for name, value, known in zip(STRING_PROPERTIES, values, checked):
            if value is not known:
                check_string_property(name, value)
    return values


def _from_epoch_ms(value: int, name: str) -> datetime:
    """A UTC datetime of an AMQP timestamp (milliseconds since the epoch); ValueError beyond years 1-9999."""
    try:
        return datetime.fromtimestamp(value / 1000, timezone.utc)
    except (OverflowError, OSError, ValueError):
        raise ValueError(f"{name} = {value} ms since the epoch is out of range: it must fall within years 1 to "
                         "9999") from None


def message_size(message: ServiceBusMessage) -> int:
    """Body + header bytes of one message, as the entity will count it (core.encoding.header_size, the
    per-message form of the sizes a send computes).

    Args:
        message: The message.

    Returns:
        Its body and header bytes.

    Raises:
        TypeError: as sending it would.
        ValueError: as sending it would.
    """
    return _row_size(_outgoing_row(message))


def _outgoing_row(message: ServiceBusMessage) -> tuple[Any, ...]:
    """The message's OUTGOING values, in the schema's order, checked exactly as a send checks them
    (TypeError or ValueError naming the field). The properties are checked as they are encoded."""
    strings = _check_strings(message)
    properties = checked_encoding(message.application_properties, "application_properties")
    ttl = message.time_to_live
    check_time_to_live(ttl)
    scheduled = message.scheduled_enqueue_time_utc
    to_utc(scheduled, "scheduled_enqueue_time_utc")
    return (*strings, properties, message._body, message._body_type,
            None if ttl is None else ttl // timedelta(milliseconds=1), scheduled)


_NAMES = len(STRING_PROPERTIES)


def _row_size(row: tuple[Any, ...]) -> int:
    """Body + header bytes of an _outgoing_row."""
    timed = (row[_NAMES + 3] is not None) + (row[_NAMES + 4] is not None)
    return len(row[_NAMES + 1]) + header_size(row[:_NAMES], row[_NAMES], timed)


class ServiceBusMessageBatch:
    """Messages that fit in one send; add_message raises MessageSizeExceededError once the batch is full.
    A message is sent as it was when it was added (its values are taken and checked then, as the SDK
    encodes a message when it is added): changing it afterwards does not change the batch.

    Args:
        max_size_in_bytes: The most body and header bytes its messages may hold together (create_message_batch
            gives the entity's batch limit).
    """

    def __init__(self, max_size_in_bytes: int) -> None:
        self.max_size_in_bytes = max_size_in_bytes
        self._messages: list[ServiceBusMessage] = []
        self._rows: list[tuple[Any, ...]] = []  # _outgoing_row of each message, as added
        self._size = 0

    def add_message(self, message: Union[ServiceBusMessage, AmqpAnnotatedMessage]) -> None:
        """Add a message; when it raises, nothing is added.

        Args:
            message: A ServiceBusMessage, or an AmqpAnnotatedMessage (added as ServiceBusMessage.from_amqp makes
                it).

        Raises:
            MessageSizeExceededError: it does not fit.
            TypeError: it is not such a message, or holds a value without a wire form.
            ValueError: it holds a value without a wire form.
        """
        if isinstance(message, AmqpAnnotatedMessage):
            message = ServiceBusMessage.from_amqp(message)
        if not isinstance(message, ServiceBusMessage):
            raise TypeError(f"add_message takes a ServiceBusMessage or AmqpAnnotatedMessage, "
                            f"got {type(message).__name__}")
        row = _outgoing_row(message)
        size = _row_size(row)
        if self._size + size > self.max_size_in_bytes:
            raise MessageSizeExceededError(
                f"the message ({size} bytes) does not fit: the batch holds {self._size} of "
                f"{self.max_size_in_bytes} bytes")
        self._messages.append(message)
        self._rows.append(row)
        self._size += size

    def outgoing(self) -> pa.Table:
        """The batch as OUTGOING rows, as its messages were when added (what send_messages commits)."""
        columns = zip(*self._rows) if self._rows else [[] for _ in OUTGOING]
        return pa.table([pa.array(list(values), f.type) for values, f in zip(columns, OUTGOING)], schema=OUTGOING)

    @property
    def size_in_bytes(self) -> int:
        return self._size

    @property
    def messages(self) -> list[ServiceBusMessage]:
        return list(self._messages)

    def __len__(self) -> int:
        return len(self._messages)
