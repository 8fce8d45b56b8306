"""The async processors: sparkbus.processor's semantics with coroutine handlers and tasks.

A feeder task with the processor's one async receiver locks as many messages as worker tasks are free in
one receive and hands one to each (as the sync processor's feeder: receivers of their own raced each
other for commits); max_concurrent_calls worker tasks await the handler and settle through that
receiver; locks are renewed by a sparkbus.aio AutoLockRenewer while handlers run. stop() stops receiving,
lets the handlers under way finish and settle, then closes the receiver (prefetched messages given back).
A processor whose `run` is cancelled from outside cancels its workers first (a message whose handler was
cancelled is abandoned), then the feeder, which abandons what it handed out and no worker took, and
closes the receiver: nothing stays locked.

ServiceBusSessionProcessor: max_concurrent_sessions tasks, each holding one session at a time and awaiting
the handler for its messages in order (max_concurrent_calls_per_session at a time), as the sync one does.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, Awaitable, Callable, Optional, Protocol, Union

from ..core.names import split_subscription_path
from ..exceptions import InvalidOperationError, OperationTimeoutError, SessionCannotBeLockedError
from ..processor import (COUNTERS, RECEIVE_WAIT_SECONDS, ProcessErrorContext, ProcessorCounts, checked_options,
                         checked_prefetch, handled, next_session, receiver_options, session_options)
from ..receiver import ServiceBusReceivedMessage, ServiceBusReceiveMode, ServiceBusSessionFilter
from .autolock import AutoLockRenewer
from .receiver import ServiceBusReceiver, ServiceBusSession

log = logging.getLogger(__name__)


class Receivers(Protocol):
    """What a processor needs of its client (the client's getters; the client module imports this one)."""

    def get_queue_receiver(self, queue_name: str, **options: Any) -> ServiceBusReceiver: ...

    def get_subscription_receiver(self, topic_name: str, subscription_name: str, **options: Any) -> ServiceBusReceiver: ...


@dataclass
class ProcessMessageContext:
    """What an async message handler gets: the message, and its settlement as coroutines."""

    message: ServiceBusReceivedMessage
    receiver: ServiceBusReceiver
    entity_path: str
    settled_as: Optional[str] = None
    release_requested: bool = False  # release_session() was called

    @property
    def settled(self) -> bool:
        return self.settled_as is not None

    async def complete(self) -> None:
        await self.receiver.complete_message(self.message)
        self.settled_as = "complete"

    async def abandon(self) -> None:
        await self.receiver.abandon_message(self.message)
        self.settled_as = "abandon"

    async def defer(self) -> None:
        await self.receiver.defer_message(self.message)
        self.settled_as = "defer"

    async def dead_letter(self, reason: Optional[str] = None, error_description: Optional[str] = None) -> None:
        await self.receiver.dead_letter_message(self.message, reason=reason, error_description=error_description)
        self.settled_as = "dead-letter"

    async def renew_lock(self) -> None:
        """Renew the message's lock (a session processor's: the session's lock, which holds the message's)."""
        if self.receiver.session is not None:
            await self.receiver.session.renew_lock()
        else:
            await self.receiver.renew_message_lock(self.message)

    @property
    def session(self) -> ServiceBusSession:
        """The session the message belongs to (a session processor's). InvalidOperationError otherwise."""
        if self.receiver.session is None:
            raise InvalidOperationError(f"{self.entity_path!r} is not processed by sessions: no session to use")
        return self.receiver.session

    @property
    def session_id(self) -> Optional[str]:
        return self.message.session_id

    async def get_session_state(self) -> Optional[bytes]:
        """The session's state (bytes), or None. InvalidOperationError outside a session processor."""
        state: Optional[bytes] = await self.session.get_state()
        return state

    async def set_session_state(self, state: Union[str, bytes, bytearray, None]) -> None:
        """Replace the session's state (durable before this returns); see ServiceBusSession.set_state."""
        await self.session.set_state(state)

    def release_session(self) -> None:
        """Let the session go once this handler returns (other sessions' turn), as .NET's ReleaseSession."""
        _ = self.session  # raises outside a session processor
        self.release_requested = True


Job = tuple[ServiceBusReceiver, ServiceBusReceivedMessage]


@dataclass
class _Slot:
    """A worker task's inbox from the feeder, and whether it holds a message."""

    inbox: "asyncio.Queue[Optional[Job]]" = field(default_factory=asyncio.Queue)
    assigned: bool = False


MessageHandler = Callable[[ProcessMessageContext], Awaitable[Any]]
ErrorHandler = Callable[[ProcessErrorContext], Any]


class ServiceBusProcessor:
    """Runs a coroutine handler for every message of a queue or '<topic>/Subscriptions/<name>'; options as
    sparkbus.processor.ServiceBusProcessor's (process_error may be a plain function or a coroutine)."""

    def __init__(self, client: Receivers, entity_path: str, process_message: MessageHandler, *,
                 process_error: Optional[ErrorHandler] = None, max_concurrent_calls: int = 1,
                 auto_complete_messages: bool = True,
                 max_auto_lock_renewal_duration: Union[timedelta, float] = timedelta(minutes=5),
                 receive_mode: ServiceBusReceiveMode = ServiceBusReceiveMode.PEEK_LOCK,
                 prefetch_count: int = 0) -> None:
        self._renewal = checked_options(process_message, max_concurrent_calls, max_auto_lock_renewal_duration)
        self._prefetch = checked_prefetch(prefetch_count)
        self._client, self.entity_path = client, entity_path
        self._handler, self._on_error = process_message, process_error
        self.max_concurrent_calls, self.auto_complete_messages = max_concurrent_calls, auto_complete_messages
        self._mode = receive_mode
        self._tasks_wanted = max_concurrent_calls
        self._counts = ProcessorCounts()
        self._renewers: list[AutoLockRenewer] = []  # of the tasks under way
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._slots: list[_Slot] = []  # the workers the feeder hands messages to
        self._freed = asyncio.Event()  # set when a worker finished a message
        self._busy = 0
        self._idle_since = time.monotonic()

    @property
    def counts(self) -> ProcessorCounts:
        """What the processor did since it was made (a copy; lock renewals include those under way)."""
        live = sum(renewer.renewals for renewer in self._renewers)
        return replace(self._counts, lock_renewals=self._counts.lock_renewals + live)

    @property
    def is_running(self) -> bool:
        return any(not task.done() for task in self._tasks)

    async def start(self) -> None:
        """Start the tasks and return at once."""
        if self.is_running:
            return
        self._stopping, self._freed = asyncio.Event(), asyncio.Event()
        self._tasks = self._launch()

    def _launch(self) -> list[asyncio.Task[None]]:
        """The worker tasks, then the feeder's (sparkbus.processor: one receiver receives for all workers)."""
        self._slots = [_Slot() for _ in range(self._tasks_wanted)]
        workers = [asyncio.create_task(self._serve(slot), name=f"sparkbus-processor-{n}")
                   for n, slot in enumerate(self._slots)]
        return workers + [asyncio.create_task(self._feed(), name="sparkbus-processor-feeder")]

    async def stop(self) -> None:
        """Stop receiving; the handlers under way finish and settle; returns when every task has ended."""
        self._stopping.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def run(self, until_idle: Union[timedelta, float, None] = None) -> None:
        """Start, and wait until stop() or (until_idle) no task has had a message for that long; then stop.
        Cancelled, it stops too: the tasks are cancelled and close their receivers."""
        idle = until_idle.total_seconds() if isinstance(until_idle, timedelta) else until_idle
        await self.start()
        try:
            while self.is_running:
                await asyncio.sleep(0.1)
                if idle is not None and not self._busy and time.monotonic() - self._idle_since >= idle:
                    break
        except asyncio.CancelledError:
            for task in self._tasks:  # workers first: their abandons go through the feeder's receiver
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            raise
        await self.stop()

    async def __aenter__(self) -> "ServiceBusProcessor":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _receiver(self, renewer: Optional[AutoLockRenewer],
                  session_id: Union[str, ServiceBusSessionFilter, None] = None) -> ServiceBusReceiver:
        subscription = split_subscription_path(self.entity_path)
        options = receiver_options(self._mode, renewer, self._prefetch, session_id)
        if subscription is None:
            return self._client.get_queue_receiver(self.entity_path, **options)
        return self._client.get_subscription_receiver(*subscription, **options)

    def _renewer(self) -> Optional[AutoLockRenewer]:
        """A task's lock renewer (none in RECEIVE_AND_DELETE mode or without renewal)."""
        if self._mode is not ServiceBusReceiveMode.PEEK_LOCK or not self._renewal:
            return None
        renewer = AutoLockRenewer(max_lock_renewal_duration=self._renewal, on_lock_renew_failure=self._lock_lost)
        self._renewers.append(renewer)
        return renewer

    async def _retire(self, renewer: Optional[AutoLockRenewer]) -> None:
        """A task's end: its renewer closed, its renewals counted."""
        if renewer is not None:
            await renewer.close()
            self._renewers.remove(renewer)
            self._counts.lock_renewals += renewer.renewals

    @staticmethod
    def _backoff(failures: int) -> float:
        return float(min(0.8 * 2 ** (failures - 1), 120))

    async def _wait_stop(self, seconds: float) -> None:
        await self._wait_for(self._stopping, seconds)

    @staticmethod
    async def _wait_for(event: asyncio.Event, seconds: float) -> None:
        try:
            await asyncio.wait_for(event.wait(), seconds)
        except asyncio.TimeoutError:
            pass

    async def _feed(self) -> None:
        """Receive for the workers: as many messages as are free, in one receive, one to each; once
        stopping, let each worker finish and end, then close the receiver (prefetched messages given back)."""
        renewer = self._renewer()
        try:
            async with self._receiver(renewer) as receiver:
                try:
                    await self._hand_out(receiver)
                    await self._end_workers()
                finally:
                    await self._abandon_untaken(receiver)
        except Exception as error:  # the receiver could not even be made (e.g. no such entity)
            await self._report(error, "receive")
            await self._end_workers()
        finally:
            await self._retire(renewer)

    async def _hand_out(self, receiver: ServiceBusReceiver) -> None:
        failures = 0
        while not self._stopping.is_set():
            free = [slot for slot in self._slots if not slot.assigned]
            if not free:
                self._freed.clear()
                await self._wait_for(self._freed, RECEIVE_WAIT_SECONDS)
                continue
            try:
                got = await receiver.receive_messages(len(free), max_wait_time=RECEIVE_WAIT_SECONDS)
                failures = 0
            except Exception as error:  # reported, then the feeder backs off and goes on
                await self._report(error, "receive")
                failures += 1
                await self._wait_stop(self._backoff(failures))
                continue
            for slot, message in zip(free, got):
                slot.assigned = True
                slot.inbox.put_nowait((receiver, message))

    async def _abandon_untaken(self, receiver: ServiceBusReceiver) -> None:
        """Messages handed to a worker cancelled before it took them: abandoned (their locks would lapse)."""
        for slot in self._slots:
            while not slot.inbox.empty():
                job = slot.inbox.get_nowait()
                if job is not None:
                    try:
                        await asyncio.shield(receiver.abandon_message(job[1]))
                    except Exception:
                        log.debug("an untaken message of %s was left to its lock", self.entity_path, exc_info=True)

    async def _end_workers(self) -> None:
        for slot in self._slots:
            slot.inbox.put_nowait(None)
        await asyncio.gather(*(task for task in self._tasks if task is not asyncio.current_task()),
                             return_exceptions=True)

    async def _serve(self, slot: "_Slot") -> None:
        """Handle what the feeder hands this worker until it hands None."""
        while (job := await slot.inbox.get()) is not None:
            await self._handle(*job)
            slot.assigned = False
            self._freed.set()

    async def _handle(self, receiver: ServiceBusReceiver, message: ServiceBusReceivedMessage) -> ProcessMessageContext:
        peek_lock = self._mode is ServiceBusReceiveMode.PEEK_LOCK
        context = ProcessMessageContext(message, receiver, self.entity_path, None if peek_lock else "deleted")
        self._busy += 1
        self._counts.received += 1
        log.debug("processing message %s of %s", message.message_id, self.entity_path)
        raised = False
        try:
            await self._handler(context)
        except asyncio.CancelledError:
            if not context.settled:  # cancelled mid-handler: give the message back at once
                await asyncio.shield(self._settle(context, "abandon"))
            raise
        except Exception as error:
            raised = True
            self._counts.failed += 1
            if not context.settled:
                await self._settle(context, "abandon")
            await self._report(error, "process_message", message)
        else:
            if not context.settled and self.auto_complete_messages:
                await self._settle(context, "complete")
            else:
                self._count(context.settled_as)
        finally:
            self._busy -= 1
            self._idle_since = time.monotonic()
        receiver._record(handled(context, raised))
        return context

    async def _settle(self, context: ProcessMessageContext, how: str) -> None:
        try:
            await getattr(context, how)()
        except Exception as error:
            await self._report(error, "settle", context.message)
            return
        self._count(context.settled_as)

    def _count(self, settled_as: Optional[str]) -> None:
        counter = COUNTERS.get(settled_as or "")
        if counter is not None:
            setattr(self._counts, counter, getattr(self._counts, counter) + 1)

    async def _lock_lost(self, message: Any, error: Optional[BaseException]) -> None:
        self._counts.lock_renewal_failures += 1
        await self._report(error or RuntimeError("the message's lock could not be renewed"), "renew_lock", message)

    async def _report(self, error: BaseException, source: str,
                      message: Optional[ServiceBusReceivedMessage] = None) -> None:
        self._counts.errors += 1
        if self._on_error is None:
            log.warning("sparkbus processor of %s: %s in %s: %s", self.entity_path, type(error).__name__, source, error)
            return
        try:
            done = self._on_error(ProcessErrorContext(error, source, self.entity_path, message))
            if asyncio.iscoroutine(done):
                await done
        except Exception:
            log.exception("the error handler of the processor of %s raised", self.entity_path)


class ServiceBusSessionProcessor(ServiceBusProcessor):
    """Runs a coroutine handler for every message of a session-enabled queue or subscription, each
    session's in order and sessions in parallel; options as sparkbus.processor.ServiceBusSessionProcessor's."""

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
        self._tasks_wanted = max_concurrent_sessions
        self._held: set[str] = set()  # sessions this processor's tasks hold
        self._turn = 0  # where the next task starts in session_ids

    def _launch(self) -> list[asyncio.Task[None]]:
        """One task per session held at once; each receives its session's messages itself."""
        return [asyncio.create_task(self._work(), name=f"sparkbus-session-processor-{n}")
                for n in range(self._tasks_wanted)]

    async def _work(self) -> None:
        renewer = self._renewer()
        failures = 0
        try:
            while not self._stopping.is_set():
                wanted = next_session(self.sessions, self._held, self._turn)
                self._turn += 1
                if wanted is None:  # every named session is held by another task
                    await self._wait_stop(RECEIVE_WAIT_SECONDS)
                    continue
                receiver = self._receiver(renewer, wanted)
                try:
                    await receiver.__aenter__()  # locks the session
                    failures = 0
                except (OperationTimeoutError, SessionCannotBeLockedError):
                    await receiver.close()
                    continue  # no session free now (the acceptance waited): look again
                except Exception as error:  # reported, then the task backs off and goes on
                    await receiver.close()
                    await self._report(error, "accept_session")
                    failures += 1
                    await self._wait_stop(self._backoff(failures))
                    continue
                assert receiver.session is not None
                session_id = receiver.session.session_id
                self._counts.sessions_accepted += 1
                self._held.add(session_id)
                try:
                    await self._drain(receiver)
                finally:
                    self._held.discard(session_id)
                    await receiver.close()
        finally:
            await self._retire(renewer)

    async def _drain(self, receiver: ServiceBusReceiver) -> None:
        """Await the handler for the session's messages until the session is idle, released or lost."""
        calls = self.sessions.max_concurrent_calls_per_session
        last = time.monotonic()
        while not self._stopping.is_set():
            try:
                got = await receiver.receive_messages(calls, max_wait_time=RECEIVE_WAIT_SECONDS)
            except Exception as error:  # e.g. the session lock was lost: the session goes
                await self._report(error, "receive")
                return
            if not got:
                if time.monotonic() - last >= self.sessions.session_idle_timeout:
                    return
                continue
            contexts = await asyncio.gather(*(self._handle(receiver, message) for message in got))
            last = time.monotonic()
            if any(context.release_requested for context in contexts):
                return
