"""ServiceBusProcessor: hand sparkbus a function and it runs it for every message of a queue or
subscription, as .NET's ServiceBusProcessor and Java's ServiceBusProcessorClient do.

Concurrency: max_concurrent_calls worker threads, each with a receiver of its own that receives one message
at a time, calls the handler and settles. The workers compete for messages as any receivers of one entity
do (each message is locked by one of them, by a conditional commit), so nothing is shared between them but
the counters, under a lock. Each worker's receiver registers what it receives with an AutoLockRenewer, so a
handler slower than the lock duration keeps its lock up to max_auto_lock_renewal_duration.

Semantics as .NET documents them: a handler that returns completes its message when auto_complete_messages
(unless it settled the message itself); a handler that raises abandons it (so max_delivery_count moves a
poison message to the dead-letter sub-queue) and the error handler is called; a lost lock, a failed settle
or a failed receive goes to the error handler, never up the worker, and a failed receive backs off with the
client's retry settings before the worker goes on. stop() stops receiving, lets the handlers under way
finish and settle, then closes the receivers: nothing stays locked by a stopped processor (prefetch is not
used). A processor killed outright leaves its locked messages to come back when their locks lapse.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Optional, Protocol, Union

from .autolock import AutoLockRenewer
from .core.names import split_subscription_path
from .receiver import ServiceBusReceivedMessage, ServiceBusReceiveMode, ServiceBusReceiver

log = logging.getLogger(__name__)


class Receivers(Protocol):
    """What a processor needs of its client (the client's getters; the client module imports this one)."""

    def get_queue_receiver(self, queue_name: str, **options: Any) -> ServiceBusReceiver: ...

    def get_subscription_receiver(self, topic_name: str, subscription_name: str, **options: Any) -> ServiceBusReceiver: ...
RECEIVE_WAIT_SECONDS = 0.5  # how long a worker's receive waits before it looks at stop() again


@dataclass
class ProcessMessageContext:
    """What a message handler gets: the message, and its settlement (each at most once)."""

    message: ServiceBusReceivedMessage
    receiver: ServiceBusReceiver
    entity_path: str
    settled_as: Optional[str] = None  # "complete", "abandon", "defer", "dead-letter"; "deleted" when received so

    @property
    def settled(self) -> bool:
        return self.settled_as is not None

    def complete(self) -> None:
        self.receiver.complete_message(self.message)
        self.settled_as = "complete"

    def abandon(self) -> None:
        self.receiver.abandon_message(self.message)
        self.settled_as = "abandon"

    def defer(self) -> None:
        self.receiver.defer_message(self.message)
        self.settled_as = "defer"

    def dead_letter(self, reason: Optional[str] = None, error_description: Optional[str] = None) -> None:
        self.receiver.dead_letter_message(self.message, reason=reason, error_description=error_description)
        self.settled_as = "dead-letter"

    def renew_lock(self) -> None:
        self.receiver.renew_message_lock(self.message)


@dataclass(frozen=True)
class ProcessErrorContext:
    """What an error handler gets: the error, where it happened ("process_message": the handler raised;
    "settle", "renew_lock", "receive"), the entity and the message concerned (None for a receive)."""

    error: BaseException
    error_source: str
    entity_path: str
    message: Optional[ServiceBusReceivedMessage] = None


@dataclass
class ProcessorCounts:
    """What a processor did since it was made."""

    received: int = 0
    completed: int = 0  # by auto-completion or by the handler
    abandoned: int = 0  # by a handler that raised, or by the handler itself
    dead_lettered: int = 0
    deferred: int = 0
    failed: int = 0  # handler calls that raised
    errors: int = 0  # error handler calls, of any source
    lock_renewal_failures: int = 0


MessageHandler = Callable[[ProcessMessageContext], Any]


def checked_options(process_message: object, max_concurrent_calls: object,
                    max_auto_lock_renewal_duration: Union[timedelta, float]) -> float:
    """A processor's options checked (the sync and the async one's alike); the renewal duration in seconds.
    ValueError or TypeError saying what is allowed."""
    if isinstance(max_concurrent_calls, bool) or not isinstance(max_concurrent_calls, int) or max_concurrent_calls < 1:
        raise ValueError(f"max_concurrent_calls must be an int of at least 1, got {max_concurrent_calls!r}")
    if not callable(process_message):
        raise TypeError(f"process_message must be callable, got {type(process_message).__name__}")
    renewal = (max_auto_lock_renewal_duration.total_seconds()
               if isinstance(max_auto_lock_renewal_duration, timedelta) else float(max_auto_lock_renewal_duration))
    if not renewal >= 0:
        raise ValueError(f"max_auto_lock_renewal_duration must not be negative, got {max_auto_lock_renewal_duration!r}")
    return renewal


def receiver_options(mode: ServiceBusReceiveMode, renewer: object) -> dict[str, Any]:
    """The keywords of a processor worker's receiver: one message at a time, waits short enough to see stop()."""
    return {"receive_mode": mode, "auto_lock_renewer": renewer, "max_wait_time": RECEIVE_WAIT_SECONDS}
ErrorHandler = Callable[[ProcessErrorContext], Any]


@dataclass
class _Worker:
    thread: Optional[threading.Thread] = None
    receiver: Optional[ServiceBusReceiver] = None
    renewer: Optional[AutoLockRenewer] = None
    busy: bool = False
    idle_since: float = field(default_factory=time.monotonic)


class ServiceBusProcessor:
    """Runs a handler for every message of a queue or '<topic>/Subscriptions/<name>' (module docstring).

    Args:
        client: The ServiceBusClient of the namespace.
        entity_path: A queue's name or '<topic>/Subscriptions/<name>'.
        process_message: Called with a ProcessMessageContext for each message.
        process_error: Called with a ProcessErrorContext for each error (default: logged at warning).
        max_concurrent_calls: Handlers running at once (worker threads), at least 1.
        auto_complete_messages: Complete a message whose handler returned without settling it.
        max_auto_lock_renewal_duration: How long a message's lock is renewed while its handler runs.
        receive_mode: PEEK_LOCK (the default) or RECEIVE_AND_DELETE (nothing to settle or renew).

    Raises:
        ValueError: max_concurrent_calls below 1, or a negative renewal duration.
    """

    def __init__(self, client: Receivers, entity_path: str, process_message: MessageHandler, *,
                 process_error: Optional[ErrorHandler] = None, max_concurrent_calls: int = 1,
                 auto_complete_messages: bool = True,
                 max_auto_lock_renewal_duration: Union[timedelta, float] = timedelta(minutes=5),
                 receive_mode: ServiceBusReceiveMode = ServiceBusReceiveMode.PEEK_LOCK) -> None:
        renewal = checked_options(process_message, max_concurrent_calls, max_auto_lock_renewal_duration)
        self._client, self.entity_path = client, entity_path
        self._handler, self._on_error = process_message, process_error
        self.max_concurrent_calls, self.auto_complete_messages = max_concurrent_calls, auto_complete_messages
        self._renewal, self._mode = renewal, receive_mode
        self.counts = ProcessorCounts()
        self._guard = threading.Lock()
        self._stopping = threading.Event()
        self._workers: list[_Worker] = []

    # ---- lifecycle -----------------------------------------------------------------------------------

    @property
    def is_running(self) -> bool:
        return any(w.thread is not None and w.thread.is_alive() for w in self._workers)

    def start(self) -> None:
        """Start the workers and return at once (a stopped processor may be started again)."""
        if self.is_running:
            return
        self._stopping.clear()
        self._workers = []
        for n in range(self.max_concurrent_calls):
            worker = _Worker()
            worker.thread = threading.Thread(target=self._work, args=(worker,), name=f"sparkbus-processor-{n}",
                                             daemon=True)
            self._workers.append(worker)
            worker.thread.start()

    def stop(self) -> None:
        """Stop receiving; the handlers under way finish and their messages are settled; then the receivers
        close. Returns when every worker has ended."""
        self._stopping.set()
        for worker in self._workers:
            if worker.thread is not None:
                worker.thread.join()

    def run(self, until_idle: Union[timedelta, float, None] = None) -> None:
        """Start, and block until stop() is called from elsewhere, Ctrl-C, or (until_idle) no worker has
        had a message for that long; then stop."""
        idle = until_idle.total_seconds() if isinstance(until_idle, timedelta) else until_idle
        self.start()
        try:
            while self.is_running:
                time.sleep(0.1)
                if idle is not None and self._idle_for() >= idle:
                    break
        except KeyboardInterrupt:
            pass
        self.stop()

    def _idle_for(self) -> float:
        """Seconds since any worker last held a message (0 while one does)."""
        with self._guard:
            if any(w.busy for w in self._workers):
                return 0.0
            return time.monotonic() - max(w.idle_since for w in self._workers)

    def __enter__(self) -> "ServiceBusProcessor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- a worker ------------------------------------------------------------------------------------

    def _receiver(self, renewer: Optional[AutoLockRenewer]) -> ServiceBusReceiver:
        subscription = split_subscription_path(self.entity_path)
        options = receiver_options(self._mode, renewer)
        if subscription is None:
            return self._client.get_queue_receiver(self.entity_path, **options)
        return self._client.get_subscription_receiver(*subscription, **options)

    def _work(self, worker: _Worker) -> None:
        peek_lock = self._mode is ServiceBusReceiveMode.PEEK_LOCK
        renewer = AutoLockRenewer(max_lock_renewal_duration=self._renewal,
                                  on_lock_renew_failure=self._lock_lost) if peek_lock and self._renewal else None
        failures = 0
        try:
            with self._receiver(renewer) as receiver:
                worker.receiver, worker.renewer = receiver, renewer
                while not self._stopping.is_set():
                    try:
                        got = receiver.receive_messages(1, max_wait_time=RECEIVE_WAIT_SECONDS)
                        failures = 0
                    except Exception as error:  # reported, then the worker backs off and goes on
                        self._report(error, "receive")
                        failures += 1
                        self._stopping.wait(self._backoff(failures))
                        continue
                    for message in got:
                        self._handle(worker, receiver, message, peek_lock)
        except Exception as error:  # the receiver could not even be made (e.g. no such entity)
            self._report(error, "receive")
        finally:
            if renewer is not None:
                renewer.close()

    def _backoff(self, failures: int) -> float:
        factor = getattr(self._client, "retry_backoff_factor", 0.8)
        return float(min(factor * 2 ** (failures - 1), getattr(self._client, "retry_backoff_max", 120.0)))

    def _handle(self, worker: _Worker, receiver: ServiceBusReceiver, message: ServiceBusReceivedMessage,
                peek_lock: bool) -> None:
        context = ProcessMessageContext(message, receiver, self.entity_path, None if peek_lock else "deleted")
        with self._guard:
            worker.busy = True
            self.counts.received += 1
        log.debug("processing message %s of %s", message.message_id, self.entity_path)
        try:
            self._handler(context)
        except Exception as error:
            with self._guard:
                self.counts.failed += 1
            if not context.settled:
                self._settle(context, "abandon")
            self._report(error, "process_message", message)
        else:
            if not context.settled and self.auto_complete_messages:
                self._settle(context, "complete")
            else:
                self._count(context.settled_as)
        finally:
            with self._guard:
                worker.busy = False
                worker.idle_since = time.monotonic()

    def _settle(self, context: ProcessMessageContext, how: str) -> None:
        try:
            getattr(context, how)()
        except Exception as error:
            self._report(error, "settle", context.message)
            return
        self._count(context.settled_as)

    def _count(self, settled_as: Optional[str]) -> None:
        counter = {"complete": "completed", "abandon": "abandoned", "defer": "deferred",
                   "dead-letter": "dead_lettered"}.get(settled_as or "")
        if counter is not None:
            with self._guard:
                setattr(self.counts, counter, getattr(self.counts, counter) + 1)

    def _lock_lost(self, message: Any, error: Optional[BaseException]) -> None:
        with self._guard:
            self.counts.lock_renewal_failures += 1
        self._report(error or RuntimeError("the message's lock could not be renewed"), "renew_lock", message)

    def _report(self, error: BaseException, source: str, message: Optional[ServiceBusReceivedMessage] = None) -> None:
        """The error handler (default: a warning in the log); an error handler that raises is logged."""
        with self._guard:
            self.counts.errors += 1
        if self._on_error is None:
            log.warning("sparkbus processor of %s: %s in %s: %s", self.entity_path, type(error).__name__, source, error)
            return
        try:
            self._on_error(ProcessErrorContext(error, source, self.entity_path, message))
        except Exception:
            log.exception("the error handler of the processor of %s raised", self.entity_path)
