"""What this process keeps per namespace, in one place, and how long it keeps it.

A namespace's context is made at the first use of the namespace by any client of this process and shared
by all of them: clients of one namespace share its budget, its request counts and what they learned about
its faulty partitions. It holds
- the metrics recorder (sparkbus.engine.metrics.Recorder): counts not persisted yet;
- the throttling governor (sparkbus.engine.throttle.Governor: the credit ledger, premium slots, the budget
  lease on object storage), made at the first admitted operation, once the namespace's budget is known,
  and made again when the namespace's ledger was removed (the namespace deleted and created again);
- the partitions found faulty (sparkbus.engine.availability) and when each is tried again.

Lifetime: a context lives until `close(root)` (its metrics persisted) or `discard(root)` (a namespace that
goes away: its counts dropped unwritten); at interpreter exit every context still open is persisted.
Threads of the process share a context under its lock; processes share nothing here (the ledger and the
metrics table are how they share a budget and counts). The storage layer keeps its own process state
(thread pools, the maintenance worker, storage options by location: sparkbus.storage), the service clock
its offset (sparkbus.engine.clock); docs/architecture.md, "Process state", lists all of it with lifetimes.
"""
from __future__ import annotations

import atexit
import os
import threading
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..core.throttling import Budget
from ..storage import location
from .metrics import Recorder
from .throttle import LEDGER_FILE, Governor


@dataclass
class NamespaceContext:
    """The process's state of one namespace (module docstring)."""

    root: str
    recorder: Recorder
    governor: Optional[Governor] = None
    faults: dict[tuple[str, int], float] = field(default_factory=dict)  # (entity key, partition) -> tried again at
    lock: threading.Lock = field(default_factory=threading.Lock)


_contexts: dict[str, NamespaceContext] = {}
_guard = threading.Lock()


def of(root: str) -> NamespaceContext:
    """The context of the namespace at root, made at its first use."""
    with _guard:
        found = _contexts.get(root)
        if found is None:
            found = _contexts[root] = NamespaceContext(root, Recorder(root, resources=False))
        return found


def known(root: str) -> Optional[NamespaceContext]:
    """The context of the namespace at root if this process has used it, else None."""
    with _guard:
        return _contexts.get(root)


def recorder(root: str) -> Optional[Recorder]:
    """The recorder of the namespace at root (its counts not yet persisted), if this process has used it."""
    found = known(root)
    return None if found is None else found.recorder


def governor(root: str, initial: Callable[[], Budget]) -> Governor:
    """The namespace's governor; initial() gives the budget when the namespace has no ledger yet."""
    context = of(root)
    with context.lock:
        ledger_gone = not os.path.exists(os.path.join(location.state_dir(root), LEDGER_FILE))
        if context.governor is None or ledger_gone:
            context.governor = Governor(root, initial, context.recorder)
        return context.governor


def close(root: str) -> None:
    """Persist the namespace's metrics and forget its context."""
    with _guard:
        found = _contexts.pop(root, None)
    if found is not None:
        found.recorder.flush()


def discard(root: str) -> None:
    """Forget the context of a namespace that is going away, its unpersisted counts with it (nothing is
    written for it, now or at interpreter exit)."""
    with _guard:
        found = _contexts.pop(root, None)
    if found is not None:
        found.recorder.clear()


def roots() -> list[str]:
    """The namespaces this process holds a context of."""
    with _guard:
        return list(_contexts)


@atexit.register
def _persist_at_exit() -> None:
    with _guard:
        contexts = list(_contexts.values())
    for context in contexts:
        try:
            context.recorder.flush()
        except Exception:  # at exit: the namespace may be gone (a test's temporary directory)
            pass
