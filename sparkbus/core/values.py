"""Typed encoding of property values (application properties, filter parameters) as JSON.

Service Bus properties keep their AMQP type; JSON alone would turn bytes, datetimes and UUIDs into
strings, so each value is stored with a type tag and comes back as the same Python type.
"""
from __future__ import annotations

from typing import Any

import base64
import json
import uuid
from datetime import datetime, timedelta, timezone

from .durations import MAX_DURATION, MAX_DURATION_TEXT, format_duration, parse_duration
from .wire import check_long, check_text

PROPERTY_TYPES = (str, int, float, bool, bytes, datetime, uuid.UUID, type(None))
_NAMES = "str, int, float, bool, bytes, datetime, UUID or None"


def check_properties(props: object, name: str, *, allow_timedelta: bool = False) -> dict[str, Any]:
    """Validate a property mapping: str keys, values of the supported types, each with a wire form
    (sparkbus.core.wire: text without lone surrogates, ints in the signed 64-bit range; durations, where
    allowed, from zero to TimeSpan.MaxValue); returns a plain dict. TypeError for a type, ValueError for a
    value, naming the key."""
    if props is None:
        return {}
    if not isinstance(props, dict):
        raise TypeError(f"{name} must be a dict, got {type(props).__name__}")
    allowed = PROPERTY_TYPES + ((timedelta,) if allow_timedelta else ())
    for k, v in props.items():
        _check_item(k, v, name, allowed)
    return dict(props)


def _check_item(k: object, v: object, name: str, allowed: tuple[type, ...]) -> None:
    """One entry of check_properties."""
    if not isinstance(k, str):
        raise TypeError(f"{name} keys must be str, got {type(k).__name__} for {k!r}")
    check_text(k, f"the {name} key {k!r}")
    if not isinstance(v, allowed):
        extra = ", timedelta" if timedelta in allowed else ""
        raise TypeError(f"{name}[{k!r}] has type {type(v).__name__}; allowed: {_NAMES}{extra}")
    if isinstance(v, str):
        check_text(v, f"{name}[{k!r}]")
    elif isinstance(v, int) and not isinstance(v, bool):
        check_long(v, f"{name}[{k!r}]")
    elif isinstance(v, timedelta) and not timedelta(0) <= v <= MAX_DURATION:
        raise ValueError(f"{name}[{k!r}] = {v} is outside the durations a rule parameter holds, PT0S to "
                         f"{MAX_DURATION_TEXT}")


# Property values whose equal values always encode alike (not floats: -0.0 == 0.0; not datetimes: equal
# instants at different offsets), so that an encoding may be reused for an equal set of them.
_REUSABLE = (str, int, bool, type(None), bytes, uuid.UUID)
_ENCODED_MOST, _ENCODED_LONGEST = 1024, 256  # sets kept at most, and the longest encoding kept (memory)
_encoded: dict[tuple[tuple[Any, type, Any], ...], str | None] = {}  # (key, type, value)s -> encoding


def checked_encoding(props: object, name: str) -> str | None:
    """encode_properties(check_properties(props, name)) in one pass over the entries (what a message
    batch does for every message it adds); raises as check_properties does. Messages mostly repeat a few
    sets of properties: a small set of the _REUSABLE types checked and encoded before is looked up (the
    key carries each value's type, so 1 and True stay apart)."""
    if props is None:
        return None
    if not isinstance(props, dict):
        raise TypeError(f"{name} must be a dict, got {type(props).__name__}")
    entries = tuple((k, v.__class__, v) for k, v in props.items())
    key = entries if all(k.__class__ is str and kind in _REUSABLE for k, kind, _ in entries) else None
    if key is not None:
        try:
            return _encoded[key]
        except (KeyError, TypeError):  # new, or a key that is not hashable (refused below)
            pass
    tagged = {}
    for k, v in props.items():
        _check_item(k, v, name, PROPERTY_TYPES)
        tagged[k] = _encode(v)
    text = _ENCODER.encode(tagged) if tagged else None
    if key is not None and len(text or "") <= _ENCODED_LONGEST:
        if len(_encoded) >= _ENCODED_MOST:
            _encoded.clear()
        _encoded[key] = text
    return text


def _encode(v: object) -> list[Any]:
    if v is None:
        return ["null", None]
    if isinstance(v, bool):
        return ["bool", v]
    if isinstance(v, int):
        return ["int", v]
    if isinstance(v, float):
        return ["float", v]
    if isinstance(v, str):
        return ["str", v]
    if isinstance(v, bytes):
        return ["bytes", base64.b64encode(v).decode("ascii")]
    if isinstance(v, datetime):
        aware = v if v.tzinfo else v.replace(tzinfo=timezone.utc)
        return ["datetime", aware.isoformat()]
    if isinstance(v, uuid.UUID):
        return ["uuid", str(v)]
    if isinstance(v, timedelta):
        return ["timedelta", format_duration(v)]
    raise TypeError(f"unsupported property type {type(v).__name__}")


def _decode(tagged: list[Any]) -> object:
    tag, v = tagged
    if tag == "bytes":
        return base64.b64decode(v)
    if tag == "datetime":
        return datetime.fromisoformat(v)
    if tag == "uuid":
        return uuid.UUID(v)
    if tag == "timedelta":
        return parse_duration(v, "value", clamp=True)
    return v


_ENCODER = json.JSONEncoder(separators=(",", ":"), sort_keys=True)  # one for every call: json.dumps with
# options builds an encoder each time, a third of the cost of a small dict


def encode_properties(props: dict[str, Any] | None) -> str | None:
    """JSON text of a property dict, each value tagged with its type; None for an empty dict."""
    if not props:
        return None
    return _ENCODER.encode({k: _encode(v) for k, v in props.items()})


def decode_properties(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    return {k: _decode(v) for k, v in json.loads(text).items()}
