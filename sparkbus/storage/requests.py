"""How many requests an operation sends to its store, and how many it waits for one after another.

On an object store a request costs a round trip (tens of milliseconds in a cloud region), so an operation's
latency is about its sequential requests times that: the number its budget is set in. Every request
sparkbus sends goes through sparkbus.storage.location, which notes it here, and every delta-rs call that
reaches the store through a storage function, noted as one request of its own (it makes one or more).

Requests sent side by side (storage.concurrently: a window of log entries, the files a read lacks, the
tables of many entities) form branches; the sequential count of a group is that of its longest branch.
Each thread keeps the sequential count of the branch it runs (a thread-local), so a tally taken around an
operation in one thread sees the length of its critical path, whatever pools it used. Tallies are
process-wide: count one operation at a time.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")


@dataclass
class Tally:
    """Requests counted while it was open: all of them, those of delta-rs calls among them, and the
    longest chain of requests that waited for each other (sequential)."""

    requests: int = 0
    delta_calls: int = 0
    sequential: int = 0
    kinds: dict[str, int] = field(default_factory=dict)  # requests by kind (GET, PUT, LIST, DELETE, delta-rs)


_tallies: list[Tally] = []
_guard = threading.Lock()
_branch = threading.local()  # .length: sequential requests on this thread's branch so far


def _length() -> int:
    return getattr(_branch, "length", 0)


def note(kind: str) -> None:
    """One request of this kind is being sent (by this thread, after the ones before it on its branch)."""
    _branch.length = _length() + 1
    if not _tallies:
        return
    with _guard:
        for tally in _tallies:
            tally.requests += 1
            tally.delta_calls += kind == "delta-rs"
            tally.kinds[kind] = tally.kinds.get(kind, 0) + 1


@contextmanager
def counting() -> Iterator[Tally]:
    """A tally of the requests sent while the block runs; its sequential count is this thread's."""
    tally = Tally()
    start = _length()
    with _guard:
        _tallies.append(tally)
    try:
        yield tally
    finally:
        with _guard:
            _tallies.remove(tally)
        tally.sequential = _length() - start


def branch(call: Callable[[], T]) -> Callable[[], tuple[T, int]]:
    """call as one branch of a group: run on any thread, it returns its result and its sequential count."""
    def run() -> tuple[T, int]:
        before = getattr(_branch, "length", None)
        _branch.length = 0
        try:
            return call(), _branch.length
        finally:
            if before is None:
                del _branch.length
            else:
                _branch.length = before
    return run


def joined(lengths: list[int]) -> None:
    """The branches of a group this thread waited for ended with these sequential counts."""
    _branch.length = _length() + max(lengths, default=0)
