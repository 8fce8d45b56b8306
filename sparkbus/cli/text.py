"""What every command of the `sparkbus` CLI shares: the argument types (whole numbers, seconds or ISO 8601
durations, KEY=VALUE pairs, typed option values), UsageError (what a command line gets wrong in itself is
refused before anything is opened, with exit code 2) and the aligned text tables people read, with cut
cells marked.
"""
from __future__ import annotations

import argparse
import re
from typing import Any, Callable, Mapping, Optional, Sequence

from ..core.durations import parse_duration
from ..core.option_text import setting as option_setting, typed
from ..core.filters import CORRELATION_FIELDS
from ..core.wire import MAX_SEQUENCE_NUMBER

MAX_NUMBER = 2**31 - 1  # the largest whole number any option takes (Service Bus's counts are 32-bit)
MAX_SECONDS = 86_400.0  # the longest time in seconds any option takes (a day)


class UsageError(ValueError):
    """A command line that is wrong in itself: an option that is missing, malformed, out of range or
    combined with one it excludes. main() answers it as argparse's own errors, one line and exit code 2;
    prog is the command (e.g. 'sparkbus peek'), when known where it is raised."""

    def __init__(self, message: str, prog: Optional[str] = None) -> None:
        super().__init__(message)
        self.prog = prog


def whole(minimum: int, maximum: int = MAX_NUMBER) -> Callable[[str], int]:
    """An argparse type: a whole number (ASCII digits) from minimum to maximum (default MAX_NUMBER)."""
    def number(text: str) -> int:
        if not re.fullmatch(r"[+-]?[0-9]{1,20}", text) or not minimum <= int(text) <= maximum:
            raise argparse.ArgumentTypeError(f"takes a whole number from {minimum} to {maximum}, got {text!r}")
        return int(text)
    return number


def sequence_number(minimum: int) -> Callable[[str], int]:
    """An argparse type: a sequence number (a partitioned entity's carry the partition in their top bits)."""
    return whole(minimum, MAX_SEQUENCE_NUMBER)


def seconds(*, zero: bool) -> Callable[[str], float]:
    """An argparse type: seconds (a number) or an ISO 8601 duration such as PT30S, up to MAX_SECONDS, from 0
    when zero is allowed, else above 0; the value in seconds."""
    def number(text: str) -> float:
        value = duration_seconds(text)
        if value is None or not (0 <= value if zero else 0 < value) or not value <= MAX_SECONDS:  # nan fails both
            low = "from 0" if zero else "above 0"
            raise argparse.ArgumentTypeError(f"takes seconds {low} up to {MAX_SECONDS:g} (a number, or an ISO 8601 "
                                             f"duration such as PT30S), got {text!r}")
        return value
    return number


def duration_seconds(text: str) -> Optional[float]:
    """Seconds from a number or an ISO 8601 duration (PT30S, P1D); None for text that is neither."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return parse_duration(text, "duration").total_seconds()
    except ValueError:
        return None


def pair(text: str) -> tuple[str, str]:
    """An argparse type: KEY=VALUE with a key, as text."""
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise argparse.ArgumentTypeError(f"takes KEY=VALUE, got {text!r}")
    return key, value


def setting(text: str) -> tuple[str, Any]:
    """An argparse type: --set NAME=VALUE with a keyword name such as max_delivery_count; the value typed."""
    try:
        return option_setting(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def correlation(text: str) -> tuple[str, Any]:
    """An argparse type: --correlation KEY=VALUE, a filter field or any application property name. A field
    (correlation_id, subject, ...) is text as given (correlation_id=5 matches the id '5'); a property's
    value is typed as `typed` reads it, as `send --property` types it."""
    key, value = pair(text)
    return key, value if key in CORRELATION_FIELDS else typed(value)


def property_argument(text: str) -> tuple[str, Any]:
    """An argparse type: --property KEY=VALUE, an application property with its value typed (`typed`:
    true/false, whole and decimal numbers, none; else text)."""
    key, value = pair(text)
    return key, typed(value)


def credits_argument(text: str) -> Optional[int]:
    """An argparse type: --credits-per-second, a whole number from 1, or 'off' (None)."""
    if text == "off":
        return None
    try:
        return whole(1)(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"takes a whole number or 'off', from 1 to {MAX_NUMBER}, got {text!r}") from None


def cut(value: object, width: int = 40) -> str:
    """value as text of at most width characters; longer text ends in '…' to show it was cut."""
    text = str(value)
    return text if len(text) <= width else text[:width - 1] + "…"


def format_table(rows: Sequence[Mapping[str, object]], columns: Sequence[str]) -> str:
    """Rows as aligned text columns under a header (every command's tables)."""
    cells = [list(columns)] + [[str(r[c]) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
