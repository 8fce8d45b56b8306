"""AMQP 1.0 encoding of values and message sections (pure: bytes in, bytes out).

sparkbus stores an ordinary message body (one data section) as its bytes. Bodies azure-servicebus can also
send (several data sections, amqp-sequence sections, one amqp-value section) are stored as their AMQP 1.0
section encoding, with the messages table's `body_type` column naming the kind, so they come back as sent.
The same codec reads whole AMQP messages (ServiceBusReceivedMessage.from_bytes).

Decoding follows what azure-servicebus returns after a trip over the wire: strings and symbols come back as
bytes and timestamps as integer milliseconds since the epoch; `wire_form` gives that form of a value.

Both directions keep to sparkbus.core.wire: values nested deeper than MAX_DEPTH levels are a ValueError
(counted as they are met, so hostile input never exhausts the stack), and so is a str holding a lone
surrogate (AMQP strings are UTF-8) or an int beyond 64 bits. An array whose count of zero-width elements
exceeds the bytes left is refused before a list of billions is built.
"""
from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Optional

from . import wire

DATA, SEQUENCE, VALUE = "data", "sequence", "value"
BODY_TYPES = (DATA, SEQUENCE, VALUE)

# Section descriptors (AMQP 1.0 part 3.2) by code, and their symbolic names.
HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS, PROPERTIES, APPLICATION_PROPERTIES = 0x70, 0x71, 0x72, 0x73, 0x74
DATA_SECTION, SEQUENCE_SECTION, VALUE_SECTION, FOOTER = 0x75, 0x76, 0x77, 0x78
_SECTION_NAMES = {b"amqp:header:list": HEADER, b"amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
                  b"amqp:message-annotations:map": MESSAGE_ANNOTATIONS, b"amqp:properties:list": PROPERTIES,
                  b"amqp:application-properties:map": APPLICATION_PROPERTIES, b"amqp:data:binary": DATA_SECTION,
                  b"amqp:amqp-sequence:list": SEQUENCE_SECTION, b"amqp:amqp-value:*": VALUE_SECTION,
                  b"amqp:footer:map": FOOTER}
HEADER_FIELDS = ("durable", "priority", "time_to_live", "first_acquirer", "delivery_count")
PROPERTY_FIELDS = ("message_id", "user_id", "to", "subject", "reply_to", "correlation_id", "content_type",
                   "content_encoding", "absolute_expiry_time", "creation_time", "group_id", "group_sequence",
                   "reply_to_group_id")
ENCODABLE = "None, bool, int, float, str, bytes, UUID, datetime, list, tuple or dict of those"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class Described:
    """A described value other than a message section: its descriptor and value."""

    descriptor: Any
    value: Any


def _sized(small: int, large: int, payload: bytes, count: Optional[int] = None) -> bytes:
    """A variable-width or compound value: one-byte size (and count) when it fits, four bytes otherwise."""
    if count is None:
        if len(payload) < 256:
            return bytes((small, len(payload))) + payload
        return bytes((large,)) + struct.pack(">I", len(payload)) + payload
    if len(payload) + 1 < 256 and count < 256:
        return bytes((small, len(payload) + 1, count)) + payload
    return bytes((large,)) + struct.pack(">II", len(payload) + 4, count) + payload


class _Unencodable(Exception):
    """A value without an AMQP encoding, found `path` deep inside the value being encoded."""

    def __init__(self, error: type, message: str) -> None:
        super().__init__(message)
        self.error, self.message, self.path = error, message, ""


def encode(value: Any, what: str = "the value") -> bytes:
    """The AMQP encoding of one value. TypeError for a type AMQP cannot carry; ValueError for an int beyond
    64 bits, a str holding a lone surrogate or lists and maps nested deeper than MAX_DEPTH; each error
    names `what` and where inside it the value is (e.g. "value_body[2]['k']")."""
    try:
        return _encode(value, 0)
    except _Unencodable as refused:
        path = refused.path if len(refused.path) <= 60 else refused.path[:60] + "..."
        raise refused.error(f"{what}{path} {refused.message}") from None


def _encode(value: Any, depth: int) -> bytes:
    if value is None:
        return b"\x40"
    if isinstance(value, bool):
        return b"\x41" if value else b"\x42"
    if isinstance(value, int):
        if -128 <= value <= 127:
            return b"\x54" + struct.pack(">b", value)
        if -2**31 <= value < 2**31:
            return b"\x71" + struct.pack(">i", value)
        if -2**63 <= value < 2**63:
            return b"\x81" + struct.pack(">q", value)
        if 0 <= value < 2**64:
            return b"\x80" + struct.pack(">Q", value)
        raise _Unencodable(ValueError, f"holds the int {wire.show_int(value)}, which does not fit in 64 bits, the "
                           f"largest AMQP integer (-2**63..2**64-1)")
    if isinstance(value, float):
        return b"\x82" + struct.pack(">d", value)
    if isinstance(value, str):
        index = wire.lone_surrogate(value)
        if index >= 0:
            raise _Unencodable(ValueError, f"holds a lone surrogate {value[index]!r} at index {index} of a string; "
                               "text must be valid Unicode (encodable as UTF-8)")
        return _sized(0xA1, 0xB1, value.encode("utf-8"))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _sized(0xA0, 0xB0, bytes(value))
    if isinstance(value, uuid.UUID):
        return b"\x98" + value.bytes
    if isinstance(value, datetime):
        aware = value if value.tzinfo else value.replace(tzinfo=timezone.utc)
        return b"\x83" + struct.pack(">q", round((aware - _EPOCH).total_seconds() * 1000))
    if isinstance(value, (list, tuple, dict)) and depth >= wire.MAX_DEPTH:
        raise _Unencodable(ValueError, f"is nested deeper than {wire.MAX_DEPTH} levels of lists and maps")
    if isinstance(value, (list, tuple)):
        if not value:
            return b"\x45"
        parts = []
        for i, item in enumerate(value):
            try:
                parts.append(_encode(item, depth + 1))
            except _Unencodable as refused:
                refused.path = f"[{i}]{refused.path}"
                raise
        return _sized(0xC0, 0xD0, b"".join(parts), len(value))
    if isinstance(value, dict):
        parts = []
        for key, item in value.items():
            try:
                parts.append(_encode(key, depth + 1))
            except _Unencodable as refused:
                refused.path = f" key {key!r}{refused.path}"
                raise
            try:
                parts.append(_encode(item, depth + 1))
            except _Unencodable as refused:
                refused.path = f"[{key!r}]{refused.path}"
                raise
        return _sized(0xC1, 0xD1, b"".join(parts), 2 * len(value))
    raise _Unencodable(TypeError, f"holds a {type(value).__name__}: AMQP cannot carry a value of type "
                       f"{type(value).__name__}; allowed: {ENCODABLE}")


def section(code: int, value: Any, what: str = "the section") -> bytes:
    """One message section: the descriptor (a small ulong) and its value."""
    return b"\x00\x53" + bytes((code,)) + encode(value, what)


_FIXED = {0x50: ">B", 0x51: ">b", 0x60: ">H", 0x61: ">h", 0x70: ">I", 0x71: ">i", 0x52: ">B", 0x54: ">b",
          0x80: ">Q", 0x81: ">q", 0x53: ">B", 0x55: ">b", 0x72: ">f", 0x82: ">d", 0x83: ">q"}
_CONSTANTS = {0x40: None, 0x41: True, 0x42: False, 0x43: 0, 0x44: 0}


class _Reader:
    """Decodes values from a buffer, front to back; ValueError on anything malformed, and on values nested
    deeper than `limit` levels (lists, maps, arrays and described values each count one)."""

    def __init__(self, data: bytes, limit: int = wire.MAX_DEPTH) -> None:
        self.data, self.pos, self.depth, self.limit = data, 0, 0, limit

    def enter(self) -> None:
        """One level deeper (a compound or described value); ValueError past the limit."""
        self.depth += 1
        if self.depth > self.limit:
            raise wire.depth_error("the AMQP data", f" (at offset {self.pos})")

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ValueError(f"truncated AMQP data: {n} bytes needed at offset {self.pos} of {len(self.data)}")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def value(self) -> Any:
        code = self.take(1)[0]
        if code == 0x00:
            self.enter()
            described = Described(self.value(), self.value())
            self.depth -= 1
            return described
        return self.body(code)

    def body(self, code: int) -> Any:
        if code in _CONSTANTS:
            return _CONSTANTS[code]
        if code == 0x45:
            return []
        if code == 0x56:
            return self.take(1) != b"\x00"
        if code in _FIXED:
            return self.unpack(_FIXED[code])
        if code == 0x73:
            point = self.unpack(">I")
            if point > 0x10FFFF:
                raise ValueError(f"AMQP char 0x{point:x} is not a Unicode code point")
            return chr(point)
        if code == 0x98:
            return uuid.UUID(bytes=self.take(16))
        if code in (0xA0, 0xA1, 0xA3):
            return self.take(self.take(1)[0])
        if code in (0xB0, 0xB1, 0xB3):
            return self.take(self.unpack(">I"))
        if code in (0xC0, 0xC1, 0xD0, 0xD1):
            wide = code >= 0xD0
            self.unpack(">I" if wide else ">B")  # size
            count = self.unpack(">I" if wide else ">B")
            self.enter()
            items = [self.value() for _ in range(count)]
            self.depth -= 1
            if code in (0xC0, 0xD0):
                return items
            if count % 2:
                raise ValueError(f"an AMQP map holds key-value pairs; this one has {count} items")
            return {_key(items[i]): items[i + 1] for i in range(0, count, 2)}
        if code in (0xE0, 0xF0):
            wide = code == 0xF0
            self.unpack(">I" if wide else ">B")
            count = self.unpack(">I" if wide else ">B")
            element = self.take(1)[0]
            if count > len(self.data) - self.pos and (element in _CONSTANTS or element == 0x45):
                # zero-width elements; each element of the other types takes at least a byte, so truncation
                # ends those early
                raise ValueError(f"an AMQP array of {count} elements cannot fit in the {len(self.data) - self.pos} "
                                 f"bytes left at offset {self.pos}")
            self.enter()
            items = [self.body(element) for _ in range(count)]
            self.depth -= 1
            return items
        raise ValueError(f"unsupported AMQP type constructor 0x{code:02x} at offset {self.pos - 1}")


def _key(key: Any) -> Any:
    """Map keys must be hashable: a decoded list key becomes a tuple."""
    return tuple(key) if isinstance(key, list) else key


def decode(data: bytes) -> Any:
    """The one value encoded in data (ValueError if data holds anything else, or values nested deeper
    than MAX_DEPTH levels)."""
    reader = _Reader(bytes(data))
    value = reader.value()
    if reader.pos != len(reader.data):
        raise ValueError(f"{len(reader.data) - reader.pos} bytes left over after the AMQP value")
    return value


def wire_form(value: Any) -> Any:
    """value as azure-servicebus returns it after an AMQP round trip: str as UTF-8 bytes, datetime as integer
    milliseconds since the epoch, tuples as lists, inside lists and maps too."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, datetime):
        return struct.unpack(">q", encode(value)[1:])[0]
    if isinstance(value, (list, tuple)):
        return [wire_form(v) for v in value]
    if isinstance(value, dict):
        return {_key(wire_form(k)): wire_form(v) for k, v in value.items()}
    return value


@dataclass
class Sections:
    """The sections of one AMQP message: header and properties by field name, the maps, and the body
    (data: list of bytes sections; sequence: list of lists; value: the value)."""

    body_type: str = DATA
    body: Any = field(default_factory=list)
    header: dict[str, Any] = field(default_factory=dict[str, Any])
    # the maps keep their keys as decoded: AMQP symbols and strings arrive as bytes
    delivery_annotations: dict[Any, Any] = field(default_factory=dict[Any, Any])
    annotations: dict[Any, Any] = field(default_factory=dict[Any, Any])
    properties: dict[str, Any] = field(default_factory=dict[str, Any])
    application_properties: dict[Any, Any] = field(default_factory=dict[Any, Any])
    footer: dict[Any, Any] = field(default_factory=dict[Any, Any])


def _descriptor_code(descriptor: Any) -> int:
    if isinstance(descriptor, int):
        return descriptor
    if isinstance(descriptor, bytes) and descriptor in _SECTION_NAMES:
        return _SECTION_NAMES[descriptor]
    raise ValueError(f"not an AMQP message section descriptor: {descriptor!r}")


def _fields(names: tuple[str, ...], values: Any, section_name: str) -> dict[str, Any]:
    if not isinstance(values, list) or len(values) > len(names):
        raise ValueError(f"the {section_name} section must be a list of at most {len(names)} fields")
    return {name: v for name, v in zip(names, values) if v is not None}


def _map(value: Any, section_name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"the {section_name} section must be a map, got {type(value).__name__}")
    return value


def decode_message(data: bytes) -> Sections:
    """The sections of an AMQP 1.0 message payload; ValueError if it is not one (sections out of order,
    mixed body kinds, no body, or malformed values)."""
    if not data:
        raise ValueError("an AMQP message payload cannot be empty")
    # one level more than a value may have: the section's descriptor around it
    reader, out, last, kinds = _Reader(bytes(data), wire.MAX_DEPTH + 1), Sections(), -1, set()
    while reader.pos < len(reader.data):
        described = reader.value()
        if not isinstance(described, Described):
            raise ValueError(f"expected an AMQP message section at offset {reader.pos}, got a plain value")
        code, value = _descriptor_code(described.descriptor), described.value
        body_code = code in (DATA_SECTION, SEQUENCE_SECTION, VALUE_SECTION)
        if code < last or (code == last and not body_code):
            raise ValueError(f"AMQP message section 0x{code:02x} is out of order or repeated")
        last = code
        if code == HEADER:
            out.header = _fields(HEADER_FIELDS, value, "header")
        elif code == PROPERTIES:
            out.properties = _fields(PROPERTY_FIELDS, value, "properties")
        elif code in (DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS, APPLICATION_PROPERTIES, FOOTER):
            name = {DELIVERY_ANNOTATIONS: "delivery_annotations", MESSAGE_ANNOTATIONS: "annotations",
                    APPLICATION_PROPERTIES: "application_properties", FOOTER: "footer"}[code]
            setattr(out, name, _map(value, name))
        elif body_code:
            if code == VALUE_SECTION and code in kinds:
                raise ValueError("an AMQP message has at most one amqp-value section")
            kinds.add(code)
            if code == DATA_SECTION:
                if not isinstance(value, bytes):
                    raise ValueError(f"a data section holds binary, got {type(value).__name__}")
                out.body_type, out.body = DATA, [*out.body, value]
            elif code == SEQUENCE_SECTION:
                out.body_type, out.body = SEQUENCE, [*out.body, _fields_list(value)]
            else:
                out.body_type, out.body = VALUE, value
        else:
            raise ValueError(f"unknown AMQP message section 0x{code:02x}")
    if len(kinds) != 1:
        raise ValueError("an AMQP message has a body of exactly one kind: data, amqp-sequence or amqp-value "
                         f"sections; this one has {len(kinds)} kinds")
    return out


def _fields_list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"an amqp-sequence section holds a list, got {type(value).__name__}")
    return value


def encode_body(body_type: str, body: Any, what: str = "the body") -> bytes:
    """The body sections' encoding: data is a list of bytes sections, sequence a list of lists, value any
    value. Errors as encode's, naming `what` (e.g. "value_body")."""
    if body_type == DATA:
        return b"".join(section(DATA_SECTION, bytes(s), what) for s in body)
    if body_type == SEQUENCE:
        return b"".join(section(SEQUENCE_SECTION, list(s), f"{what}[{i}]") for i, s in enumerate(body))
    if body_type == VALUE:
        return section(VALUE_SECTION, body, what)
    raise ValueError(f"body_type must be one of {', '.join(BODY_TYPES)}, got {body_type!r}")


def encode_message(sections: Sections) -> bytes:
    """An AMQP 1.0 message payload of sections (what decode_message reads back)."""
    out = []
    if sections.header:
        out.append(section(HEADER, [sections.header.get(n) for n in HEADER_FIELDS]))
    for code, mapping in ((DELIVERY_ANNOTATIONS, sections.delivery_annotations),
                          (MESSAGE_ANNOTATIONS, sections.annotations)):
        if mapping:
            out.append(section(code, mapping))
    if sections.properties:
        out.append(section(PROPERTIES, [sections.properties.get(n) for n in PROPERTY_FIELDS]))
    if sections.application_properties:
        out.append(section(APPLICATION_PROPERTIES, sections.application_properties))
    out.append(encode_body(sections.body_type, sections.body))
    if sections.footer:
        out.append(section(FOOTER, sections.footer))
    return b"".join(out)


def stored_body(body_type: str, body: Any, what: str = "the body") -> tuple[Optional[str], bytes]:
    """The messages table's (body_type, body) for a body: one data section is stored as its bytes with a
    null body_type, so SQL and DataFrames see ordinary bodies as they are; anything else as its sections."""
    if body_type == DATA and len(body) == 1:
        return None, bytes(body[0])
    return body_type, encode_body(body_type, body, what)


def loaded_body(body_type: Optional[str], stored: bytes) -> tuple[str, Any]:
    """(body type, body) of a stored row, the inverse of stored_body."""
    if body_type is None:
        return DATA, [stored]
    sections = decode_message(stored)
    if sections.body_type != body_type:
        raise ValueError(f"a stored {body_type} body decodes as {sections.body_type}")
    return sections.body_type, sections.body
