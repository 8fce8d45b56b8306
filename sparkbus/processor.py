"""ServiceBusProcessor: hand sparkbus a function and it runs it for every message of a queue or
subscription, as .NET's ServiceBusProcessor and Java's ServiceBusProcessorClient do.

Concurrency: one feeder thread with the processor's one receiver, and max_concurrent_calls worker threads.
The feeder locks as many messages as workers are free in one receive (one commit) and hands one to each;
a worker calls the handler and settles through that receiver, whose calls are serialised. Workers with a
receiver each raced for the oldest messages and lost commits to each other: 8 of them handled under a quarter
of what one receive-and-complete loop does (`make bench-processor`); fed, 8 handle 1.3 times that loop.
Other processes' receivers compete for messages as usual
(each message is locked by one receiver, by a conditional commit). The receiver registers what it receives
with an AutoLockRenewer, so a handler slower than the lock duration keeps its lock up to
max_auto_lock_renewal_duration.

Semantics as .NET documents them: a handler that returns completes its message when auto_complete_messages
(unless it settled the message itself); a handler that raises abandons it (so max_delivery_count moves a
poison message to the dead-letter sub-queue) and the error handler is called; a lost lock, a failed settle
or a failed receive goes to the error handler, never up the worker, and a failed receive backs off with the
client's retry settings before the worker goes on. stop() stops receiving, lets the handlers under way
finish and settle, then closes the receivers, which gives prefetched messages back: nothing stays locked by
a stopped processor. A processor killed outright leaves its locked messages to come back when their locks
lapse.

ServiceBusSessionProcessor: max_concurrent_sessions workers, each holding one session at a time (a session
receiver, the session locked by a conditional commit, so no two workers or processes hold one session). A
worker hands its session's messages to the handler in order, max_concurrent_calls_per_session at a time (1:
strictly in order), and lets the session go once none came for session_idle_timeout, the handler called
release_session(), or its lock was lost; then it takes the next session with messages (or the next of
session_ids). The session lock is renewed while the worker holds it, up to max_auto_lock_renewal_duration.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, Callable, Optional, Protocol, Union

from .autolock import AutoLockRenewer
from .core.names import split_subscription_path
from .core.wire import check_id
from .engine.metrics import Counts
from .exceptions import InvalidOperationError, OperationTimeoutError, SessionCannotBeLockedError
from .receiver import (NEXT_AVAILABLE_SESSION, ServiceBusReceivedMessage, ServiceBusReceiveMode, ServiceBusReceiver,
                       ServiceBusSession, ServiceBusSessionFilter)

log = logging.getLogger(__name__)


class Receivers(Protocol):
    """What a processor needs of its client (the client's getters; the client module imports this one)."""

    def get_queue_receiver(self, queue_name: str, **options: Any) -> ServiceBusReceiver: ...

    def get_subscription_receiver(self, topic_name: str, subscription_name: str, **options: Any) -> ServiceBusReceiver: ...


RECEIVE_WAIT_SECONDS = 0.5  # how long a worker's receive waits before it looks at stop() again
SESSION_IDLE_SECONDS = 1.0  # a session processor lets a session go after this long without a message


@dataclass
class ProcessMessageContext:
    """What a message handler gets: the message, and its settlement (each at most once)."""

    message: ServiceBusReceivedMessage
    receiver: ServiceBusReceiver
    entity_path: str
    settled_as: Optional[str] = None  # "complete", "abandon", "defer", "dead-letter"; "deleted" when received so
    release_requested: bool = False  # release_session() was called

    @property
    def settled(self) -> bool:
        return self.settled_as is not None

    @property
    def session(self) -> ServiceBusSession:
        """The session the message belongs to (a session processor's). InvalidOperationError otherwise."""
        if self.receiver.session is None:
            raise InvalidOperationError(f"{self.entity_path!r} is not processed by sessions: no session to use")
        return self.receiver.session

    @property
    def session_id(self) -> Optional[str]:
        return self.message.session_id

    def get_session_state(self) -> Optional[bytes]:
        """The session's state (bytes), or None. InvalidOperationError outside a session processor."""
        return self.session.get_state()

    def set_session_state(self, state: Union[str, bytes, bytearray, None]) -> None:
        """Replace the session's state (durable before this returns); see ServiceBusSession.set_state."""
        self.session.set_state(state)

    def release_session(self) -> None:
        """Let the session go once this handler returns (other sessions' turn), as .NET's ReleaseSession."""
        _ = self.session  # raises outside a session processor
        self.release_requested = True

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
        """Renew the message's lock (a session processor's: the session's lock, which holds the message's)."""
        if self.receiver.session is not None:
            self.receiver.session.renew_lock()
        else:
            self.receiver.renew_message_lock(self.message)


@dataclass(frozen=True)
class ProcessErrorContext:
    """What an error handler gets: the error, where it happened ("process_message": the handler raised;
    "settle", "renew_lock", "receive", "accept_session"), the entity and the message concerned (None for a
    receive or a session's acceptance)."""

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
    lock_renewals: int = 0  # message (or session) locks renewed while handlers ran
    lock_renewal_failures: int = 0
    sessions_accepted: int = 0  # a session processor's sessions taken


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


def handled(context: Any, raised: bool) -> Counts:
    """What one handler call adds to the namespace's metrics (a context of the sync or the async processor)."""
    return Counts(processed_messages=1, failed_messages=int(raised),
                  abandoned_messages=int(context.settled_as == "abandon"),
                  dead_lettered_messages=int(context.settled_as == "dead-letter"))


def checked_prefetch(prefetch_count: object) -> int:
    """prefetch_count checked (ValueError saying what is allowed)."""
    if isinstance(prefetch_count, bool) or not isinstance(prefetch_count, int) or prefetch_count < 0:
        raise ValueError(f"prefetch_count must be an int >= 0, got {prefetch_count!r}")
    return prefetch_count


def receiver_options(mode: ServiceBusReceiveMode, renewer: object, prefetch_count: int = 0,
                     session_id: Union[str, ServiceBusSessionFilter, None] = None) -> dict[str, Any]:
    """The keywords of a processor worker's receiver: waits short enough to see stop(); a session's, if any."""
    options = {"receive_mode": mode, "auto_lock_renewer": renewer, "max_wait_time": RECEIVE_WAIT_SECONDS,
               "prefetch_count": prefetch_count}
    return options if session_id is None else {**options, "session_id": session_id}


@dataclass(frozen=True)
class SessionOptions:
    """What a session processor does with sessions (checked by session_options)."""

    max_concurrent_sessions: int
    max_concurrent_calls_per_session: int
    session_ids: Optional[tuple[str, ...]]  # None: any session with messages
    session_idle_timeout: float  # seconds


def session_options(max_concurrent_sessions: object, max_concurrent_calls_per_session: object,
                    session_ids: object, session_idle_timeout: Union[timedelta, float, None]) -> SessionOptions:
    """A session processor's options checked (the sync and the async one's alike). ValueError or TypeError
    saying what is allowed."""
    for name, value in (("max_concurrent_sessions", max_concurrent_sessions),
                        ("max_concurrent_calls_per_session", max_concurrent_calls_per_session)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int of at least 1, got {value!r}")
    ids: Optional[tuple[str, ...]] = None
    if session_ids is not None:
        if isinstance(session_ids, (str, bytes)) or not hasattr(session_ids, "__iter__"):
            raise TypeError(f"session_ids must be a list of session ids or None, got {type(session_ids).__name__}")
        ids = tuple(dict.fromkeys(check_id("session_id", i) for i in session_ids))
        if not ids:
            raise ValueError("session_ids must name at least one session (None: any session)")
    idle = SESSION_IDLE_SECONDS if session_idle_timeout is None else (
        session_idle_timeout.total_seconds() if isinstance(session_idle_timeout, timedelta)
        else float(session_idle_timeout))
    if not idle > 0:
        raise ValueError(f"session_idle_timeout must be positive, got {session_idle_timeout!r}")
    assert isinstance(max_concurrent_sessions, int) and isinstance(max_concurrent_calls_per_session, int)
    return SessionOptions(max_concurrent_sessions, max_concurrent_calls_per_session, ids, idle)


def next_session(options: SessionOptions, held: set[str], turn: int) -> Union[str, ServiceBusSessionFilter, None]:
    """The session a worker should take next: any with messages, or the first of session_ids from turn on
    that no worker of this processor holds (None: all are held)."""
    if options.session_ids is None:
        return NEXT_AVAILABLE_SESSION
    count = len(options.session_ids)
    for step in range(count):
        candidate = options.session_ids[(turn + step) % count]
        if candidate not in held:
            return candidate
    return None


ErrorHandler = Callable[[ProcessErrorContext], Any]
COUNTERS = {"complete": "completed", "abandon": "abandoned", "defer": "deferred", "dead-letter": "dead_lettered"}


Job = tuple[ServiceBusReceiver, ServiceBusReceivedMessage]


@dataclass
class _Worker:
    thread: Optional[threading.Thread] = None
    renewer: Optional[AutoLockRenewer] = None
    busy: int = 0  # handlers running (a session worker may run several)
    idle_since: float = field(default_factory=time.monotonic)
    inbox: "queue.SimpleQueue[Optional[Job]]" = field(default_factory=queue.SimpleQueue)  # from the feeder
    assigned: bool = False  # the feeder handed it a message it has not finished with


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
        prefetch_count: Messages each worker locks ahead of its handler (0: none); given back at stop().

    Raises:
        ValueError: max_concurrent_calls below 1, a negative renewal duration or prefetch_count.
    """

    def __init__(self, client: Receivers, entity_path: str, process_message: MessageHandler, *,
                 process_error: Optional[ErrorHandler] = None, max_concurrent_calls: int = 1,
                 auto_complete_messages: bool = True,
                 max_auto_lock_renewal_duration: Union[timedelta, float] = timedelta(minutes=5),
                 receive_mode: ServiceBusReceiveMode = ServiceBusReceiveMode.PEEK_LOCK,
                 prefetch_count: int = 0) -> None:
        renewal = checked_options(process_message, max_concurrent_calls, max_auto_lock_renewal_duration)
        self._prefetch = checked_prefetch(prefetch_count)
        self._client, self.entity_path = client, entity_path
        self._handler, self._on_error = process_message, process_error
        self.max_concurrent_calls, self.auto_complete_messages = max_concurrent_calls, auto_complete_messages
        self._renewal, self._mode = renewal, receive_mode
        self._workers_wanted = max_concurrent_calls
        self._counts = ProcessorCounts()
        self._guard = threading.Lock()
        self._freed = threading.Condition(self._guard)  # notified when a worker finished a message
        self._stopping = threading.Event()
        self._workers: list[_Worker] = []
        self._feeder: Optional[_Worker] = None  # the thread that receives for the workers (not for sessions)

    @property
    def counts(self) -> ProcessorCounts:
        """What the processor did since it was made (a copy; lock renewals include those under way)."""
        with self._guard:
            live = sum(w.renewer.renewals for w in self._threads() if w.renewer is not None)
            return replace(self._counts, lock_renewals=self._counts.lock_renewals + live)

    # ---- lifecycle -----------------------------------------------------------------------------------

    def _threads(self) -> list[_Worker]:
        return self._workers + ([self._feeder] if self._feeder is not None else [])

    @property
    def is_running(self) -> bool:
        return any(w.thread is not None and w.thread.is_alive() for w in self._threads())

    def start(self) -> None:
        """Start the workers and return at once (a stopped processor may be started again)."""
        if self.is_running:
            return
        self._stopping.clear()
        self._workers = [_Worker() for _ in range(self._workers_wanted)]
        for n, worker in enumerate(self._workers):
            worker.thread = threading.Thread(target=self._work, args=(worker,), name=f"sparkbus-processor-{n}",
                                             daemon=True)
            worker.thread.start()
        self._feeder = self._launch()  # once the workers run: a feeder that fails at once ends them

    def _launch(self) -> Optional[_Worker]:
        """The feeder: one receiver locking as many messages as workers are free, in one receive."""
        feeder = _Worker()
        feeder.thread = threading.Thread(target=self._feed, args=(feeder,), name="sparkbus-processor-feeder",
                                         daemon=True)
        feeder.thread.start()
        return feeder

    def stop(self) -> None:
        """Stop receiving; the handlers under way finish and their messages are settled; then the receivers
        close. Returns when every worker has ended."""
        self._stopping.set()
        for worker in self._threads():
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

    def _receiver(self, renewer: Optional[AutoLockRenewer],
                  session_id: Union[str, ServiceBusSessionFilter, None] = None) -> ServiceBusReceiver:
        subscription = split_subscription_path(self.entity_path)
        options = receiver_options(self._mode, renewer, self._prefetch, session_id)
        if subscription is None:
            return self._client.get_queue_receiver(self.entity_path, **options)
        return self._client.get_subscription_receiver(*subscription, **options)

    def _renewer(self, worker: _Worker) -> Optional[AutoLockRenewer]:
        """The worker's lock renewer (none in RECEIVE_AND_DELETE mode or without renewal)."""
        if self._mode is not ServiceBusReceiveMode.PEEK_LOCK or not self._renewal:
            return None
        worker.renewer = AutoLockRenewer(max_lock_renewal_duration=self._renewal, on_lock_renew_failure=self._lock_lost)
        return worker.renewer

    def _retire(self, worker: _Worker) -> None:
        """A worker's end: its renewer closed, its renewals counted."""
        if worker.renewer is not None:
            worker.renewer.close()
            with self._guard:
                self._counts.lock_renewals += worker.renewer.renewals
                worker.renewer = None

    def _feed(self, feeder: _Worker) -> None:
        """Receive for the workers: as many messages as are free, in one receive (one commit), one to each;
        once stopping, let each worker finish and end, then close the receiver, which gives back what it
        prefetched. The workers settle through this receiver: its calls are serialised, so they never race
        each other for a commit as receivers of their own did."""
        renewer = self._renewer(feeder)
        try:
            receiver = self._receiver(renewer)
        except Exception as error:  # the receiver could not even be made (e.g. no such entity)
            self._report(error, "receive")
            self._end_workers()
            self._retire(feeder)
            return
        failures = 0
        try:
            with receiver:
                while not self._stopping.is_set():
                    with self._freed:
                        free = [w for w in self._workers if not w.assigned]
                        if not free:
                            self._freed.wait(RECEIVE_WAIT_SECONDS)
                            continue
                    try:
                        got = receiver.receive_messages(len(free), max_wait_time=RECEIVE_WAIT_SECONDS)
                        failures = 0
                    except Exception as error:  # reported, then the feeder backs off and goes on
                        self._report(error, "receive")
                        failures += 1
                        self._stopping.wait(self._backoff(failures))
                        continue
                    for worker, message in zip(free, got):
                        with self._guard:
                            worker.assigned = True
                        worker.inbox.put((receiver, message))
                self._end_workers()
        finally:
            self._retire(feeder)

    def _end_workers(self) -> None:
        """Tell every worker to end once its message is done, and wait for them."""
        for worker in self._workers:
            worker.inbox.put(None)
        for worker in self._workers:
            if worker.thread is not None and worker.thread is not threading.current_thread():
                worker.thread.join()

    def _work(self, worker: _Worker) -> None:
        """Handle what the feeder hands this worker until it hands None."""
        while (job := worker.inbox.get()) is not None:
            self._handle(worker, *job)
            with self._freed:
                worker.assigned = False
                self._freed.notify()

    def _backoff(self, failures: int) -> float:
        factor = getattr(self._client, "retry_backoff_factor", 0.8)
        return float(min(factor * 2 ** (failures - 1), getattr(self._client, "retry_backoff_max", 120.0)))

    def _handle(self, worker: _Worker, receiver: ServiceBusReceiver,
                message: ServiceBusReceivedMessage) -> ProcessMessageContext:
        peek_lock = self._mode is ServiceBusReceiveMode.PEEK_LOCK
        context = ProcessMessageContext(message, receiver, self.entity_path, None if peek_lock else "deleted")
        with self._guard:
            worker.busy += 1
            self._counts.received += 1
        log.debug("processing message %s of %s", message.message_id, self.entity_path)
        raised = False
        try:
            self._handler(context)
        except Exception as error:
            raised = True
            with self._guard:
                self._counts.failed += 1
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
                worker.busy -= 1
                worker.idle_since = time.monotonic()
        receiver._record(handled(context, raised))
        return context

    def _settle(self, context: ProcessMessageContext, how: str) -> None:
        try:
            getattr(context, how)()
        except Exception as error:
            self._report(error, "settle", context.message)
            return
        self._count(context.settled_as)

    def _count(self, settled_as: Optional[str]) -> None:
        counter = COUNTERS.get(settled_as or "")
        if counter is not None:
            with self._guard:
                setattr(self._counts, counter, getattr(self._counts, counter) + 1)

    def _lock_lost(self, message: Any, error: Optional[BaseException]) -> None:
        with self._guard:
            self._counts.lock_renewal_failures += 1
        self._report(error or RuntimeError("the message's lock could not be renewed"), "renew_lock", message)

    def _report(self, error: BaseException, source: str, message: Optional[ServiceBusReceivedMessage] = None) -> None:
        """The error handler (default: a warning in the log); an error handler that raises is logged."""
        with self._guard:
            self._counts.errors += 1
        if self._on_error is None:
            log.warning("sparkbus processor of %s: %s in %s: %s", self.entity_path, type(error).__name__, source, error)
            return
        try:
            self._on_error(ProcessErrorContext(error, source, self.entity_path, message))
        except Exception:
            log.exception("the error handler of the processor of %s raised", self.entity_path)


class ServiceBusSessionProcessor(ServiceBusProcessor):
    """Runs a handler for every message of a session-enabled queue or subscription, each session's messages
    in order and sessions in parallel (module docstring); what .NET's ServiceBusSessionProcessor does.

    Args:
        client: The ServiceBusClient of the namespace.
        entity_path: A queue's name or '<topic>/Subscriptions/<name>' that requires sessions.
        process_message: Called with a ProcessMessageContext for each message; its session, state and
            release_session() are on the context.
        process_error: Called with a ProcessErrorContext for each error (default: logged at warning).
        max_concurrent_sessions: Sessions held at once (worker threads), at least 1.
        max_concurrent_calls_per_session: Handlers running at once within a session (1: strictly in order).
        session_ids: Process only these sessions; None (the default): any session with messages.
        session_idle_timeout: How long a session is held without a message before the next is taken
            (default 1 second).
        auto_complete_messages: As ServiceBusProcessor's.
        max_auto_lock_renewal_duration: How long the session's lock is renewed while a worker holds it.
        receive_mode: As ServiceBusProcessor's.
        prefetch_count: As ServiceBusProcessor's (per session worker).

    Raises:
        ValueError: a count below 1, an empty session_ids or a bad session id, a non-positive idle timeout.
        TypeError: session_ids is not a list of ids.
    """

    def __init__(self, client: Receivers, entity_path: str, process_message: MessageHandler, *,
                 process_error: Optional[ErrorHandler] = None, max_concurrent_sessions: int = 8,
                 max_concurrent_calls_per_session: int = 1, session_ids: Optional[list[str]] = None,
                 session_idle_timeout: Union[timedelta, float, None] = None, auto_complete_messages: bool = True,
                 max_auto_lock_renewal_duration: Union[timedelta, float] = timedelta(minutes=5),
                 receive_mode: ServiceBusReceiveMode = ServiceBusReceiveMode.PEEK_LOCK,
                 prefetch_count: int = 0) -> None:
        self.sessions = session_options(max_concurrent_sessions, max_concurrent_calls_per_session, session_ids,
                                        session_idle_timeout)
        super().__init__(client, entity_path, process_message, process_error=process_error,
                         max_concurrent_calls=max_concurrent_sessions * max_concurrent_calls_per_session,
                         auto_complete_messages=auto_complete_messages,
                         max_auto_lock_renewal_duration=max_auto_lock_renewal_duration, receive_mode=receive_mode,
                         prefetch_count=prefetch_count)
        self._workers_wanted = max_concurrent_sessions
        self._held: set[str] = set()  # sessions this processor's workers hold
        self._turn = 0  # where the next worker starts in session_ids

    def _launch(self) -> Optional[_Worker]:
        return None  # each worker receives its session's messages itself

    def _work(self, worker: _Worker) -> None:
        renewer = self._renewer(worker)
        calls = self.sessions.max_concurrent_calls_per_session
        pool = ThreadPoolExecutor(calls, thread_name_prefix="sparkbus-session-call") if calls > 1 else None
        failures = 0
        try:
            while not self._stopping.is_set():
                with self._guard:
                    wanted = next_session(self.sessions, self._held, self._turn)
                    self._turn += 1
                if wanted is None:  # every named session is held by another worker
                    self._stopping.wait(RECEIVE_WAIT_SECONDS)
                    continue
                try:
                    receiver = self._receiver(renewer, wanted)
                    failures = 0
                except (OperationTimeoutError, SessionCannotBeLockedError):
                    continue  # no session free now (the acceptance waited): look again
                except Exception as error:  # reported, then the worker backs off and goes on
                    self._report(error, "accept_session")
                    failures += 1
                    self._stopping.wait(self._backoff(failures))
                    continue
                assert receiver.session is not None
                session_id = receiver.session.session_id
                with self._guard:
                    self._counts.sessions_accepted += 1
                    self._held.add(session_id)
                try:
                    with receiver:
                        self._drain(worker, receiver, pool)
                finally:
                    with self._guard:
                        self._held.discard(session_id)
        finally:
            if pool is not None:
                pool.shutdown()
            self._retire(worker)

    def _drain(self, worker: _Worker, receiver: ServiceBusReceiver, pool: Optional[ThreadPoolExecutor]) -> None:
        """Hand the session's messages to the handler until the session is idle, released or lost."""
        calls = self.sessions.max_concurrent_calls_per_session
        last = time.monotonic()
        while not self._stopping.is_set():
            try:
                got = receiver.receive_messages(calls, max_wait_time=RECEIVE_WAIT_SECONDS)
            except Exception as error:  # e.g. the session lock was lost: the session goes
                self._report(error, "receive")
                return
            if not got:
                if time.monotonic() - last >= self.sessions.session_idle_timeout:
                    return
                continue
            if pool is None:
                contexts = [self._handle(worker, receiver, message) for message in got]
            else:
                contexts = list(pool.map(lambda message: self._handle(worker, receiver, message), got))
            last = time.monotonic()
            if any(context.release_requested for context in contexts):
                return
