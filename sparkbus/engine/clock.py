"""The service's clock: the time every decision of the engine is judged by. A lock lapses, a message expires,
a scheduled message comes due, a duplicate-detection window passes, a throttling period or metrics bucket
starts, a found partition fault is tried again and cached entity settings are re-read when this clock says
so; rules in sparkbus.core take the time it gives as an argument.

Tests move it forward (advance) instead of sleeping, then reset it. It moves this process only: other
processes keep the real time, and so does what storage records or times itself (Delta commit times, leases
between processes and machines, how long a commit took), as do the pauses of waiting receives and
retries, which are real waits.
"""
from __future__ import annotations

import time as _time
from datetime import datetime, timedelta, timezone

_offset = 0.0  # seconds this process's service clock runs ahead of the real one


def now() -> datetime:
    """The current UTC time."""
    return datetime.now(timezone.utc) + timedelta(seconds=_offset) if _offset else datetime.now(timezone.utc)


def time() -> float:
    """Seconds since the epoch (time.time()'s scale)."""
    return _time.time() + _offset


def monotonic() -> float:
    """Seconds on a clock that never goes back (time.monotonic()'s scale)."""
    return _time.monotonic() + _offset


def advance(seconds: float) -> None:
    """Move the clock forward: what would have happened after that long happens now. ValueError for a
    negative step (the clock never goes back while a test runs)."""
    global _offset
    if not seconds >= 0:
        raise ValueError(f"the clock only moves forward; got {seconds} seconds")
    _offset += seconds


def reset() -> None:
    """Back to the real time (the end of a test that moved the clock)."""
    global _offset
    _offset = 0.0
