"""Messages as azure-servicebus shapes them; sparkbus.core.encoding gives them their columnar form."""
from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Iterable, Optional, Union

import pyarrow as pa

from .core.encoding import LENGTH_LIMITED, MAX_ID_LENGTH, OUTGOING, STRING_PROPERTIES, body_sizes, header_sizes
from .core.values import check_properties, encode_properties
from .exceptions import MessageSizeExceededError


def to_utc(value: object, name: str) -> Optional[datetime]:
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise TypeError(f"{name} must be a datetime, got {type(value).__name__}")
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


class ServiceBusMessage:
    """A message to send. body is bytes or str (stored as UTF-8); message_id defaults to a new uuid4 hex."""

    def __init__(self, body: Union[bytes, str, None], *, application_properties: Optional[dict] = None,
                 session_id: Optional[str] = None, message_id: Optional[str] = None,
                 partition_key: Optional[str] = None, scheduled_enqueue_time_utc: Optional[datetime] = None,
                 time_to_live: Optional[timedelta] = None, content_type: Optional[str] = None,
                 correlation_id: Optional[str] = None, subject: Optional[str] = None, to: Optional[str] = None,
                 reply_to: Optional[str] = None, reply_to_session_id: Optional[str] = None,
                 encoding: str = "UTF-8", label: Optional[str] = None) -> None:
        """As azure-servicebus' constructor: a str body is encoded with `encoding` and None is an empty body;
        `label`, the older SDKs' name of subject (still in the SDK's samples), sets subject when subject is
        not given."""
        if subject is None:
            subject = label
        if body is None:
            body = b""
        if isinstance(body, str):
            body = body.encode(encoding)
        if not isinstance(body, (bytes, bytearray, memoryview)):
            raise TypeError(f"body must be bytes, str or None, got {type(body).__name__}")
        self._body = bytes(body)
        self.application_properties = check_properties(application_properties, "application_properties")
        strings = dict(session_id=session_id, message_id=message_id or uuid.uuid4().hex, partition_key=partition_key,
                       content_type=content_type, correlation_id=correlation_id, subject=subject, to=to,
                       reply_to=reply_to, reply_to_session_id=reply_to_session_id)
        for name, value in strings.items():
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{name} must be a str, got {type(value).__name__}")
            if name in LENGTH_LIMITED and value is not None and not 0 < len(value) <= MAX_ID_LENGTH:
                raise ValueError(f"{name} must be 1 to {MAX_ID_LENGTH} characters, got {len(value)}")
            setattr(self, name, value)
        if time_to_live is not None:
            if not isinstance(time_to_live, timedelta):
                raise TypeError(f"time_to_live must be a timedelta, got {type(time_to_live).__name__}")
            if time_to_live <= timedelta(0):
                raise ValueError(f"time_to_live must be positive, got {time_to_live}")
        self.time_to_live = time_to_live
        self.scheduled_enqueue_time_utc = to_utc(scheduled_enqueue_time_utc, "scheduled_enqueue_time_utc")

    @property
    def body(self) -> bytes:
        return self._body

    @property
    def size_in_bytes(self) -> int:
        """Body + header bytes: what the sender's size limits and the entity's size quota count."""
        return message_size(self)

    def __str__(self) -> str:
        return self._body.decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return f"ServiceBusMessage(message_id={self.message_id!r}, session_id={self.session_id!r}, body={len(self._body)} bytes)"


def to_outgoing(messages: Iterable[ServiceBusMessage]) -> pa.Table:
    """The OUTGOING Arrow rows of messages, in order."""
    messages = list(messages)
    columns = {name: [getattr(m, name) for m in messages] for name in STRING_PROPERTIES}
    columns["application_properties"] = [encode_properties(m.application_properties) for m in messages]
    columns["body"] = [m.body for m in messages]
    columns["time_to_live_ms"] = [None if m.time_to_live is None else m.time_to_live // timedelta(milliseconds=1)
                                  for m in messages]
    columns["scheduled_enqueue_time_utc"] = [m.scheduled_enqueue_time_utc for m in messages]
    return pa.table(columns, schema=OUTGOING)


def message_size(message: ServiceBusMessage) -> int:
    """Body + header bytes of one message, as the entity will count it."""
    rows = to_outgoing([message])
    return int(body_sizes(rows)[0].as_py() + header_sizes(rows)[0].as_py())


class ServiceBusMessageBatch:
    """Messages that fit in one send; add_message raises MessageSizeExceededError once the batch is full."""

    def __init__(self, max_size_in_bytes: int) -> None:
        self.max_size_in_bytes = max_size_in_bytes
        self._messages: list[ServiceBusMessage] = []
        self._size = 0

    def add_message(self, message: ServiceBusMessage) -> None:
        if not isinstance(message, ServiceBusMessage):
            raise TypeError(f"add_message takes a ServiceBusMessage, got {type(message).__name__}")
        size = message_size(message)
        if self._size + size > self.max_size_in_bytes:
            raise MessageSizeExceededError(
                f"the message ({size} bytes) does not fit: the batch holds {self._size} of "
                f"{self.max_size_in_bytes} bytes")
        self._messages.append(message)
        self._size += size

    @property
    def size_in_bytes(self) -> int:
        return self._size

    @property
    def messages(self) -> list[ServiceBusMessage]:
        return list(self._messages)

    def __len__(self) -> int:
        return len(self._messages)
