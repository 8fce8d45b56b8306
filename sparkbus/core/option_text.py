"""Entity settings as people type them (the command line's --set, the Explorer's forms): NAME=VALUE text,
values typed from their text (true/false, whole and decimal numbers, none), durations as seconds or ISO 8601.
Pure rules: what a name allows is checked where the settings are applied (the administration client)."""
from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from .durations import parse_duration
from .entities import DURATION_OPTIONS


def typed(value: str) -> Any:
    """Option text as a value: true/false as booleans, whole numbers as ints, decimal numbers as floats,
    none as None, anything else as text (durations as ISO 8601, e.g. PT30S)."""
    lowered = value.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered == "none":
        return None
    if re.fullmatch(r"-?[0-9]+", value):
        return int(value)
    if re.fullmatch(r"-?[0-9]+\.[0-9]+", value):
        return float(value)
    return value



def duration(name: str, value: Any) -> timedelta:
    """A duration option's value (--set lock_duration=30 or =PT30S, as typed reads it) as a timedelta:
    a number is seconds. ValueError naming the option and what it takes."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not 0 <= value < timedelta.max.total_seconds():
            raise ValueError(f"{name} takes seconds from 0 or an ISO 8601 duration such as PT30S, got {value!r}")
        return timedelta(seconds=value)
    if isinstance(value, str):
        try:
            return parse_duration(value, name)
        except ValueError:
            pass
    raise ValueError(f"{name} takes seconds (a number) or an ISO 8601 duration such as PT30S, got {value!r}")


def setting(text: str) -> tuple[str, Any]:
    """NAME=VALUE with a keyword name such as max_delivery_count; the value typed (a duration option's as a
    timedelta: `duration`; none as None, which archive_retention takes). ValueError saying what is allowed."""
    name, eq, value = text.partition("=")
    name = name.strip()
    if not eq or not re.fullmatch(r"[a-z_]+", name):
        raise ValueError(f"takes NAME=VALUE with a property name such as max_delivery_count, got {text!r}")
    parsed = typed(value.strip())
    return name, duration(name, parsed) if name in DURATION_OPTIONS and parsed is not None else parsed


def settings(text: str) -> dict[str, Any]:
    """Settings one NAME=VALUE per line (blank lines skipped): `setting` of each; ValueError names the line."""
    found: dict[str, Any] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                name, value = setting(line)
            except ValueError as error:
                raise ValueError(f"line {number}: {error}") from None
            found[name] = value
    return found
