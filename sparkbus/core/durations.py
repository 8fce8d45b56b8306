"""Durations as azure-servicebus takes them: datetime.timedelta or an ISO 8601 duration string."""
from __future__ import annotations

import re
from datetime import timedelta
from decimal import ROUND_HALF_EVEN, Decimal

# .NET TimeSpan.MaxValue, Service Bus' "never" for time-to-live and idle deletion: 2**63-1 ticks of 100 ns,
# which a timedelta holds to the microsecond (MAX_DURATION) and ISO 8601 text exactly (MAX_DURATION_TEXT).
MAX_TICKS = 2**63 - 1
MAX_DURATION = timedelta(days=10675199, hours=2, minutes=48, seconds=5, microseconds=477580)
MAX_DURATION_TEXT = "P10675199DT2H48M5.4775807S"
_TICKS_PER = {"days": 864_000_000_000, "hours": 36_000_000_000, "minutes": 600_000_000, "seconds": 10_000_000}
_ISO = re.compile(
    r"^P(?:(?P<days>\d+(?:\.\d+)?)D)?"
    r"(?:T(?:(?P<hours>\d+(?:\.\d+)?)H)?(?:(?P<minutes>\d+(?:\.\d+)?)M)?(?:(?P<seconds>\d+(?:\.\d+)?)S)?)?$"
)


def parse_duration(value: object, name: str, *, clamp: bool = False) -> timedelta:
    """A timedelta from a timedelta or ISO 8601 string such as 'PT1M'; TypeError/ValueError otherwise.

    A string longer than TimeSpan.MaxValue (MAX_DURATION_TEXT) is a ValueError naming the field, or, with
    clamp (stored text, which older versions wrote unchecked), MAX_DURATION. Up to it, the text is read
    exactly and rounded to the microsecond, so MAX_DURATION_TEXT itself (which rounds up past
    MAX_DURATION) is MAX_DURATION."""
    if isinstance(value, timedelta):
        return value
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a datetime.timedelta or an ISO 8601 duration string, got {type(value).__name__}")
    match = _ISO.match(value.strip())
    if not match or value.strip() in ("P", "PT") or value.strip().endswith("T"):
        raise ValueError(f"{name}={value!r} is not an ISO 8601 duration such as 'PT30S', 'PT5M' or 'P1DT2H'")
    ticks = sum((Decimal(v) * _TICKS_PER[k] for k, v in match.groupdict().items() if v is not None), Decimal(0))
    if ticks > MAX_TICKS and clamp:
        return MAX_DURATION
    if ticks > MAX_TICKS:
        raise ValueError(f"{name}={value[:40]!r} is longer than the longest duration, {MAX_DURATION_TEXT} "
                         "(TimeSpan.MaxValue, about 29,227 years)")
    micros = int((ticks / 10).to_integral_value(ROUND_HALF_EVEN))
    return min(timedelta(microseconds=micros), MAX_DURATION)


def format_duration(value: timedelta) -> str:
    """ISO 8601 text of a timedelta (round-trips through parse_duration)."""
    total_us = value.days * 86_400_000_000 + value.seconds * 1_000_000 + value.microseconds
    days, rest = divmod(total_us, 86_400_000_000)
    hours, rest = divmod(rest, 3_600_000_000)
    minutes, rest = divmod(rest, 60_000_000)
    seconds, micros = divmod(rest, 1_000_000)
    text = "P" + (f"{days}D" if days else "")
    clock = (f"{hours}H" if hours else "") + (f"{minutes}M" if minutes else "")
    if seconds or micros:
        clock += f"{seconds}.{micros:06d}S".replace(".000000S", "S") if micros else f"{seconds}S"
    if clock:
        text += "T" + clock
    return text if text != "P" else "PT0S"
