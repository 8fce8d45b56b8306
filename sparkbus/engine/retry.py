"""One retry policy for every transient condition, configured as azure-servicebus configures it.

Delta commits are optimistic. A commit that loses to another writer's commit (a conflict), or whose
table object needs log entries another process's cleanup removed (an expired snapshot), is transient:
the operation re-reads what it decides on and is planned again. Under contention that is routine, so a
round of up to REPLANS immediate re-plans (a few ms of jitter apart) is part of every operation. When a
whole round fails, the client's policy takes over: up to `total` more rounds, each after a backoff
(exponential: backoff_factor x 2^(retry-1), or fixed: backoff_factor; at most backoff_max; with jitter),
and then the last conflict is raised as CommitConflictError, a ServiceBusServerBusyError: a delta-rs
CommitFailedError never reaches a caller. A failed commit wrote nothing, so retrying a send never
duplicates a message.

An operation's timeout (the SDK's `timeout=` keyword, seconds) bounds the waiting between attempts: a
retry that would start after the deadline raises OperationTimeoutError instead. A commit under way is
never cut short, and one that succeeds after the deadline is reported as the success it is: answering
"timed out" for a written message would make the caller send it twice.

A store that throttles a request or does not answer in time (after its HTTP client's own retries) is
transient too, but re-planning at once would only add load: each try waits the policy's backoff, and the
last one's error is raised (ServiceBusServerBusyError, OperationTimeoutError). A store that could not be
reached is retried the same way only where the operation knows that its try changed nothing (Unchanged):
a request whose connection broke may have been carried out, so repeating any other would risk doing it
twice.

Pauses handed over (sparkbus.aio): a call run through `handing_over` does not sleep where a request was
refused before it did anything (a throttled request, sparkbus.engine.throttle); it raises Backoff, and its
caller waits on its event loop, holding no thread, and calls again with Backoff.resume, which carries the
retry count and the deadline on, so the retries and the timeout are the policy's as in a sync call.
"""
from __future__ import annotations

import math
import random
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, TypeVar

from .. import storage
from ..storage import CommitFailedError, DeltaError
from ..exceptions import CommitConflictError, OperationTimeoutError, ServiceBusCommunicationError
from ..storage.errors import StoreBusy, StoreTimeout

T = TypeVar("T")
REPLANS = 20          # immediate re-plans in one round
REPLAN_DELAY = 0.002  # seconds: the jitter between them grows to REPLAN_DELAY x 8
MODES = ("exponential", "fixed")


@dataclass(frozen=True)
class RetryPolicy:
    """ServiceBusClient(retry_total=, retry_backoff_factor=, retry_backoff_max=, retry_mode=)."""

    total: int = 3
    backoff_factor: float = 0.8
    backoff_max: float = 120.0
    mode: str = "exponential"
    deadline: Optional[float] = None  # time.monotonic() after which no attempt starts (see bounded)

    def __post_init__(self) -> None:
        if isinstance(self.total, bool) or not isinstance(self.total, int):
            raise TypeError(f"retry_total must be an int (a number of retries), got {type(self.total).__name__}")
        if self.total < 0:
            raise ValueError(f"retry_total must be an int >= 0, got {self.total}")
        for name in ("backoff_factor", "backoff_max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"retry_{name} must be a number of seconds, got {type(value).__name__}")
            if not 0 <= value < math.inf:  # nan compares false too
                raise ValueError(f"retry_{name} must be a finite number of seconds >= 0, got {value}")
        if self.mode not in MODES:
            raise ValueError(f"retry_mode must be one of {', '.join(MODES)}, got {self.mode!r}")

    @classmethod
    def from_keywords(cls, keywords: dict[str, Any]) -> "RetryPolicy":
        """The policy the client keywords retry_total, retry_backoff_factor, retry_backoff_max and
        retry_mode describe (defaults for those not given)."""
        return cls(*(keywords.get(f"retry_{name}", getattr(DEFAULT, name))
                     for name in ("total", "backoff_factor", "backoff_max", "mode")))

    def bounded(self, timeout: object) -> "RetryPolicy":
        """This policy for one call with the SDK's timeout= (seconds; None: no limit). TypeError or
        ValueError unless timeout is None or a finite number > 0."""
        if timeout is None:
            return self
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
            raise ValueError(f"timeout must be a finite number of seconds > 0 or None, got {timeout!r}")
        return replace(self, deadline=time.monotonic() + timeout)

    def pause(self, seconds: float, what: str) -> None:
        """Sleep before the next attempt; OperationTimeoutError when that attempt would start after the
        deadline."""
        self._before_pause(seconds, what)
        time.sleep(seconds)

    def pause_or_hand_over(self, seconds: float, what: str, retry: int) -> None:
        """pause, or where pauses are handed over (handing_over), raise Backoff for retry number `retry`
        (the refused request must have done nothing: its caller calls again)."""
        self._before_pause(seconds, what)
        if getattr(_handover, "active", False):
            raise Backoff(seconds, Resume(retry, self.deadline))
        time.sleep(seconds)

    def resumed(self) -> tuple["RetryPolicy", int]:
        """(this policy, the retry count to start from): as they were when this thread's handed-over call
        raised Backoff, once (the first call of the policy after a resume takes it), else (self, 0)."""
        resume = getattr(_handover, "resume", None)
        if resume is None:
            return self, 0
        _handover.resume = None
        return replace(self, deadline=resume.deadline), resume.retry

    def _before_pause(self, seconds: float, what: str) -> None:
        if self.deadline is not None and time.monotonic() + seconds > self.deadline:
            raise OperationTimeoutError(f"{what} did not complete within its timeout (it was retried and would "
                                        f"have waited another {seconds:.2f} s)")

    def backoff(self, retry: int) -> float:
        """Seconds to wait before retry number `retry` (1-based), jitter included."""
        # the exponent stops at 1000 (any factor of practical size has reached backoff_max by then): a
        # power of 2 beyond about 1023 does not convert to a float
        base = self.backoff_factor if self.mode == "fixed" else self.backoff_factor * 2 ** min(retry - 1, 1000)
        return min(base, self.backoff_max) * random.uniform(0.8, 1.2)


@dataclass(frozen=True)
class Resume:
    """Where a handed-over call stopped: the retries it had made and its deadline."""

    retry: int
    deadline: Optional[float]


class Backoff(Exception):
    """Raised instead of a pause by a call run through handing_over: nothing was done; wait `seconds`,
    then run the call again through handing_over(resume, ...)."""

    def __init__(self, seconds: float, resume: Resume) -> None:
        super().__init__(f"retry after {seconds:.3f} s")
        self.seconds = seconds
        self.resume = resume


_handover = threading.local()


def handing_over(resume: Optional[Resume], function: Callable[..., T], *args: object, **kwargs: object) -> T:
    """function(*args, **kwargs) on this thread with its pauses handed over (Backoff), continuing from
    resume (None: a first call)."""
    _handover.active, _handover.resume = True, resume
    try:
        return function(*args, **kwargs)
    finally:
        _handover.active, _handover.resume = False, None


class Unchanged(ServiceBusCommunicationError):
    """The store could not be reached, and the operation made sure its try changed nothing (its commit is
    not in the log): retried as a busy store is, and raised as the communication error it is at the end."""


DEFAULT = RetryPolicy()
NO_RETRY = RetryPolicy(total=0)  # one round of re-plans only (work that a later pass redoes, or that waits)


def is_transient(error: BaseException) -> bool:
    """A commit conflict or an expired snapshot: planning again may succeed."""
    if isinstance(error, CommitFailedError):
        return True
    return isinstance(error, (DeltaError, FileNotFoundError)) and storage.is_expired_version(error)


def run(operation: Callable[[], T], policy: RetryPolicy = DEFAULT, *, what: str = "the operation",
        on_transient: Optional[Callable[[], None]] = None) -> T:
    """Run operation (which re-reads what it decides on) under the policy; on_transient runs after each
    transient failure (to refresh cached tables). A store that throttled or timed out (storage.errors'
    StoreBusy, StoreTimeout) is waited for as the policy says, then its error raised (a
    ServiceBusServerBusyError / OperationTimeoutError), as is an Unchanged try. Raises CommitConflictError when the policy is
    exhausted by conflicts, and any other error at once."""
    retry = 0
    while True:
        try:
            for replan in range(REPLANS):
                try:
                    return operation()
                except (CommitFailedError, DeltaError, FileNotFoundError) as error:
                    if not is_transient(error):
                        raise
                    last = error
                    if on_transient is not None:
                        on_transient()
                    if replan < REPLANS - 1:
                        time.sleep(random.uniform(0, REPLAN_DELAY * 2 ** min(replan, 3)))
        except (StoreBusy, StoreTimeout, Unchanged):
            if retry >= policy.total:
                raise
        else:
            if retry >= policy.total:
                raise CommitConflictError(
                    f"{what} lost to other writers' commits {REPLANS * (retry + 1)} times in a row "
                    f"(retry_total={policy.total}); try again later or allow more retries") from last
        retry += 1
        policy.pause(policy.backoff(retry), what)
