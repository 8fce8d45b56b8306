"""azure.servicebus.amqp's classes: AMQP messages with data, sequence or value bodies and their sections.

Senders take an AmqpAnnotatedMessage wherever they take a ServiceBusMessage; received messages expose theirs
as `raw_amqp_message`. What sparkbus keeps of a sent AmqpAnnotatedMessage is what Service Bus keeps: the body
(of any of the three kinds), the application properties, the properties that are message fields (message_id,
to, subject, reply_to, correlation_id, content_type, group_id as session_id, reply_to_group_id as
reply_to_session_id), the header's time_to_live and the annotations x-opt-partition-key and
x-opt-scheduled-enqueue-time. Received messages carry the broker's header (delivery_count) and annotations
(x-opt-sequence-number, x-opt-enqueued-time, x-opt-locked-until, ...) instead of what was sent in those.
"""
from __future__ import annotations

from dataclasses import Field, asdict, dataclass
from enum import Enum
from typing import Any, ClassVar, Optional, Union

from .core import amqp
from .core.wire import encoded


class AmqpMessageBodyType(str, Enum):
    DATA = amqp.DATA
    SEQUENCE = amqp.SEQUENCE
    VALUE = amqp.VALUE


class _Fields:
    """Attribute records readable as mappings too, as the SDK's (header["priority"], .get, .items)."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # each subclass is a dataclass

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        setattr(self, key, value)

    def __contains__(self, key: str) -> bool:
        return hasattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)

    def keys(self) -> list[str]:
        return list(asdict(self))

    def values(self) -> list[Any]:
        return list(asdict(self).values())

    def items(self) -> list[tuple[str, Any]]:
        return list(asdict(self).items())


@dataclass
class AmqpMessageHeader(_Fields):
    """The AMQP header section (time_to_live in milliseconds)."""

    delivery_count: Optional[int] = None
    time_to_live: Optional[int] = None
    first_acquirer: Optional[bool] = None
    durable: Optional[bool] = None
    priority: Optional[int] = None


@dataclass
class AmqpMessageProperties(_Fields):
    """The AMQP properties section."""

    message_id: Any = None
    user_id: Optional[bytes] = None
    to: Any = None
    subject: Any = None
    reply_to: Any = None
    correlation_id: Any = None
    content_type: Any = None
    content_encoding: Any = None
    creation_time: Optional[int] = None
    absolute_expiry_time: Optional[int] = None
    group_id: Any = None
    group_sequence: Optional[int] = None
    reply_to_group_id: Any = None


def _data_sections(body: Any, encoding: str) -> list[bytes]:
    """A data body as its sections: bytes or str is one section, a list of them one section each."""
    items = body if isinstance(body, (list, tuple)) else [body]
    out = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            item = encoded(item, encoding, "data_body" if items is not body else f"data_body[{i}]")
        if not isinstance(item, (bytes, bytearray, memoryview)):
            raise TypeError(f"a data body is bytes, str or a list of them, got {type(item).__name__}")
        out.append(bytes(item))
    return out


def _sequence_sections(body: Any) -> list[list[Any]]:
    """A sequence body as its sections: a list of lists is one section per list, any other list one section."""
    if not isinstance(body, (list, tuple)):
        raise TypeError(f"a sequence body is a list (or a list of lists), got {type(body).__name__}")
    if body and all(isinstance(item, (list, tuple)) for item in body):
        return [list(item) for item in body]
    return [list(body)]


class AmqpAnnotatedMessage:
    """An AMQP message: exactly one of data_body, sequence_body or value_body, and optional sections.
    Raises ValueError unless exactly one body is given; TypeError for a body of a type AMQP cannot carry,
    ValueError for one holding a value it cannot (an int beyond 64 bits, a str with a lone surrogate) or
    nested deeper than sparkbus.core.wire.MAX_DEPTH levels."""

    _body_type: AmqpMessageBodyType
    _body: Any  # data: list[bytes]; sequence: list[list[Any]]; value: the value

    def __init__(self, *, header: Union[AmqpMessageHeader, dict[str, Any], None] = None,
                 footer: Optional[dict[Any, Any]] = None,
                 properties: Union[AmqpMessageProperties, dict[str, Any], None] = None,
                 application_properties: Optional[dict[Any, Any]] = None, annotations: Optional[dict[Any, Any]] = None,
                 delivery_annotations: Optional[dict[Any, Any]] = None, encoding: str = "UTF-8", **body: Any) -> None:
        unknown = sorted(set(body) - {"data_body", "sequence_body", "value_body"})
        if unknown:
            raise TypeError(f"unexpected keyword arguments {unknown}; the body is data_body, sequence_body or "
                            "value_body")
        if len(body) != 1:
            raise ValueError("There should be one and only one of either data_body, sequence_body or value_body "
                             "being set as the body of the AmqpAnnotatedMessage.")
        self._encoding = encoding
        if "data_body" in body:
            self._body_type, self._body = AmqpMessageBodyType.DATA, _data_sections(body["data_body"], encoding)
        elif "sequence_body" in body:
            self._body_type, self._body = AmqpMessageBodyType.SEQUENCE, _sequence_sections(body["sequence_body"])
        else:
            self._body_type, self._body = AmqpMessageBodyType.VALUE, body["value_body"]
        # TypeError or ValueError now for a body AMQP cannot carry (sparkbus.core.amqp.encode)
        amqp.encode_body(self._body_type.value, self._body, f"{self._body_type.value}_body")
        self.header = AmqpMessageHeader(**dict(header)) if isinstance(header, dict) else header
        self.properties = AmqpMessageProperties(**dict(properties)) if isinstance(properties, dict) else properties
        self.footer = footer
        self.application_properties = application_properties
        self.annotations = annotations
        self.delivery_annotations = delivery_annotations

    @classmethod
    def _from_sections(cls, sections: amqp.Sections) -> "AmqpAnnotatedMessage":
        message = cls(**{f"{sections.body_type}_body": sections.body})
        message.header = AmqpMessageHeader(**sections.header) if sections.header else None
        message.properties = AmqpMessageProperties(**sections.properties) if sections.properties else None
        message.footer = sections.footer or None
        message.application_properties = sections.application_properties or None
        message.annotations = sections.annotations or None
        message.delivery_annotations = sections.delivery_annotations or None
        return message

    @property
    def body_type(self) -> AmqpMessageBodyType:
        return self._body_type

    @property
    def body(self) -> Any:
        """data: an iterator of bytes sections; sequence: an iterator of lists; value: the value."""
        if self._body_type == AmqpMessageBodyType.VALUE:
            return self._body
        return iter(list(self._body))

    def __str__(self) -> str:
        if self._body_type == AmqpMessageBodyType.DATA:
            return "".join(section.decode(self._encoding) for section in self._body)
        return str(self._body)

    def __repr__(self) -> str:
        return (f"AmqpAnnotatedMessage(body={self!s:.200}, body_type={self._body_type.value}, header={self.header}, "
                f"properties={self.properties}, application_properties={self.application_properties})")[:1024]

