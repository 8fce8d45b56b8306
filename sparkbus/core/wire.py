"""What has a wire form: the values and limits a message, a rule or a session state must meet to be sent
over AMQP and stored by Service Bus. Pure: no I/O.

A value without a wire form, once stored, breaks every later read of it (a receive that cannot encode a
property, a fan-out whose rule cannot compare it), for every client of the entity. azure-servicebus never
gets that far: its AMQP encoder refuses such a value at send. So every boundary (send and schedule,
rule create and update, session set_state, dead-letter, sequence-number arguments) checks its input with
the functions below before anything is written, and each error names the field and what is allowed:

- text: a str without lone surrogates, i.e. valid Unicode, encodable as UTF-8 (an AMQP string is UTF-8);
- ints of application properties and rule parameters: AMQP long, -2**63..2**63-1;
- message_id, session_id, partition_key and reply_to_session_id: 1 to MAX_ID_LENGTH characters;
- a dead-letter reason and error description: at most MAX_DEAD_LETTER_TEXT characters (the limit the
  Service Bus clients enforce for both);
- sequence numbers: 0..MAX_SEQUENCE_NUMBER (a Service Bus sequence number is a non-negative long);
- a count of messages to peek: 1..MAX_MESSAGE_COUNT (an int);
- an AMQP header time_to_live: an AMQP uint of milliseconds, 0..MAX_AMQP_TTL_MS;
- nesting: MAX_DEPTH levels at most for every recursive input (rule expressions, AMQP values), far beyond
  what a real filter or message body uses, so each parser refuses deep input with a ValueError instead
  of exhausting Python's stack.
"""
from __future__ import annotations

from typing import Iterable, Optional

INT64_MIN, INT64_MAX = -2**63, 2**63 - 1
MAX_ID_LENGTH = 128
MAX_DEAD_LETTER_TEXT = 4096
MAX_SEQUENCE_NUMBER = INT64_MAX
MAX_MESSAGE_COUNT = 2**31 - 1  # a count of messages to peek: an int in the Service Bus clients
MAX_AMQP_TTL_MS = 2**32 - 1
MAX_DEPTH = 64
INT64_RANGE = f"{INT64_MIN}..{INT64_MAX}"


def lone_surrogate(text: str) -> int:
    """Index of the first lone surrogate in text (a code point U+D800..U+DFFF, which UTF-8 cannot
    encode), or -1 when text is valid Unicode."""
    if text.isascii():
        return -1
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return error.start
    return -1


def surrogate_error(name: str, text: str, index: int) -> ValueError:
    return ValueError(f"{name} holds a lone surrogate {text[index]!r} at index {index}; text must be valid "
                      "Unicode (encodable as UTF-8)")


def check_text(value: str, name: str) -> str:
    """value, a str; ValueError naming the field when it holds a lone surrogate."""
    index = lone_surrogate(value)
    if index >= 0:
        raise surrogate_error(name, value, index)
    return value


def encoded(text: str, encoding: str, name: str) -> bytes:
    """A str body (or body section) in `encoding`; ValueError naming it when the text has no encoding
    there (a lone surrogate, or a character outside the encoding)."""
    try:
        return text.encode(encoding)
    except UnicodeEncodeError as error:
        raise ValueError(f"{name} cannot be encoded as {encoding}: {error}") from None


def show_int(value: int) -> str:
    """An int for an error message (an int too long to print in full is described by its size)."""
    return str(value) if value.bit_length() <= 256 else f"an int of {value.bit_length()} bits"


def check_long(value: int, name: str) -> int:
    """value when it is an AMQP long (signed 64-bit); ValueError naming the field otherwise."""
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(f"{name} = {show_int(value)} is outside the signed 64-bit range {INT64_RANGE}")
    return value


def check_id(name: str, value: str) -> str:
    """A message_id, session_id, partition_key or reply_to_session_id: valid text of 1 to MAX_ID_LENGTH
    characters (ValueError otherwise)."""
    if not 0 < len(value) <= MAX_ID_LENGTH:
        raise ValueError(f"{name} must be 1 to {MAX_ID_LENGTH} characters, got {len(value)}")
    return check_text(value, name)


def check_dead_letter_text(value: object, name: str) -> Optional[str]:
    """A dead-letter reason or error description: None or valid text of at most MAX_DEAD_LETTER_TEXT
    characters; TypeError or ValueError naming the field otherwise."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    if len(value) > MAX_DEAD_LETTER_TEXT:
        raise ValueError(f"{name} must be at most {MAX_DEAD_LETTER_TEXT} characters, got {len(value)}")
    return check_text(value, name)


def check_sequence_numbers(value: object, name: str = "sequence_numbers") -> list[int]:
    """One sequence number or an iterable of them as a list; TypeError for anything but ints, ValueError
    for a number outside 0..MAX_SEQUENCE_NUMBER."""
    if isinstance(value, int) and not isinstance(value, bool):
        numbers = [value]
    elif isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(f"{name} must be an int or an iterable of ints, got {type(value).__name__}")
    else:
        numbers = list(value)
    for n in numbers:
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"sequence numbers must be non-negative ints, got {n!r}")
        if not 0 <= n <= MAX_SEQUENCE_NUMBER:
            raise ValueError(f"sequence numbers must be non-negative ints in the range 0..{MAX_SEQUENCE_NUMBER}, "
                             f"got {show_int(n)}")
    return numbers


def check_amqp_ttl(value: object, name: str) -> Optional[int]:
    """An AMQP header time_to_live: None or an int of milliseconds in 0..MAX_AMQP_TTL_MS (an AMQP uint)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int of milliseconds, got {type(value).__name__}")
    if not 0 <= value <= MAX_AMQP_TTL_MS:
        raise ValueError(f"{name} = {show_int(value)} ms is outside the AMQP uint range 0..{MAX_AMQP_TTL_MS}")
    return value


def depth_error(what: str, where: str = "") -> ValueError:
    return ValueError(f"{what} is nested deeper than {MAX_DEPTH} levels{where}")
