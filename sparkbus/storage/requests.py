"""How many requests an operation sends to its store, and how many it waits for one after another.

On an object store a request costs a round trip (tens of milliseconds in a cloud region), so an operation's
latency is about its sequential requests times that: the number its budget is set in. Every request
sparkbus sends goes through sparkbus.storage.location, which notes it here, and every delta-rs call that
reaches the store through a storage function, noted as one request of its own (it makes one or more).

Requests sent side by side (storage.concurrently: a window of log entries, the files a read lacks, the
tables of many entities) form branches; the sequential count of a group is that of its longest branch.
Each thread keeps the sequential count of the branch it runs and the tallies open around it (thread-locals
a branch hands to the pool thread that runs it), so a tally taken around an operation counts that
operation's requests, whatever pools it used, and not those of other threads (the maintenance thread's
checkpoints, another client's calls); its sequential count is the length of the operation's critical path.
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


_guard = threading.Lock()
_branch = threading.local()  # .length: sequential requests on this thread's branch so far; .tallies: open


def _length() -> int:
    return getattr(_branch, "length", 0)


def _open() -> tuple[Tally, ...]:
    return getattr(_branch, "tallies", ())


def note(kind: str) -> None:
    """One request of this kind is being sent (by this thread, after the ones before it on its branch)."""
    _branch.length = _length() + 1
    tallies = _open()
    if not tallies:
        return
    with _guard:
        for tally in tallies:
            tally.requests += 1
            tally.delta_calls += kind == "delta-rs"
            tally.kinds[kind] = tally.kinds.get(kind, 0) + 1


@contextmanager
def counting() -> Iterator[Tally]:
    """A tally of the requests this thread (and the branches it hands to pools) sends while the block runs;
    its sequential count is this thread's."""
    tally = Tally()
    start, outer = _length(), _open()
    _branch.tallies = (*outer, tally)
    try:
        yield tally
    finally:
        _branch.tallies = outer
        tally.sequential = _length() - start


def branch(call: Callable[[], T]) -> Callable[[], tuple[T, int]]:
    """call as one branch of a group: run on any thread, it returns its result and its sequential count,
    its requests counted in the tallies open where the branch was made."""
    tallies = _open()

    def run() -> tuple[T, int]:
        before, outer = getattr(_branch, "length", None), _open()
        _branch.length, _branch.tallies = 0, tallies
        try:
            return call(), _branch.length
        finally:
            _branch.tallies = outer
            if before is None:
                del _branch.length
            else:
                _branch.length = before
    return run


def joined(lengths: list[int]) -> None:
    """The branches of a group this thread waited for ended with these sequential counts."""
    _branch.length = _length() + max(lengths, default=0)


def position() -> int:
    """This thread's sequential count so far: where a branch started now begins (storage.Started)."""
    return _length()


def rejoined(at: int, length: int) -> None:
    """A branch started at position `at` ended after `length` sequential requests: this thread waited for
    it only where it reaches past the requests this thread sent meanwhile."""
    _branch.length = max(_length(), at + length)
