"""The async ServiceBusProcessor: sparkbus.processor's semantics with coroutine handlers and tasks.

max_concurrent_calls tasks, each with an async receiver of its own, receive one message at a time, await
the handler and settle; locks are renewed by a sparkbus.aio AutoLockRenewer while handlers run. stop()
stops receiving, lets the handlers under way finish and settle, then closes the receivers. A processor
task that is cancelled (its `run` cancelled from outside) closes its receivers too: the message whose
handler was cancelled is abandoned, so nothing stays locked.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Awaitable, Callable, Optional, Protocol, Union

from ..core.names import split_subscription_path
from ..processor import RECEIVE_WAIT_SECONDS, ProcessErrorContext, ProcessorCounts, checked_options, receiver_options
from ..receiver import ServiceBusReceivedMessage, ServiceBusReceiveMode
from .autolock import AutoLockRenewer
from .receiver import ServiceBusReceiver

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
        await self.receiver.renew_message_lock(self.message)


MessageHandler = Callable[[ProcessMessageContext], Awaitable[Any]]
ErrorHandler = Callable[[ProcessErrorContext], Any]
COUNTERS = {"complete": "completed", "abandon": "abandoned", "defer": "deferred", "dead-letter": "dead_lettered"}


class ServiceBusProcessor:
    """Runs a coroutine handler for every message of a queue or '<topic>/Subscriptions/<name>'; options as
    sparkbus.processor.ServiceBusProcessor's (process_error may be a plain function or a coroutine)."""

    def __init__(self, client: Receivers, entity_path: str, process_message: MessageHandler, *,
                 process_error: Optional[ErrorHandler] = None, max_concurrent_calls: int = 1,
                 auto_complete_messages: bool = True,
                 max_auto_lock_renewal_duration: Union[timedelta, float] = timedelta(minutes=5),
                 receive_mode: ServiceBusReceiveMode = ServiceBusReceiveMode.PEEK_LOCK) -> None:
        self._renewal = checked_options(process_message, max_concurrent_calls, max_auto_lock_renewal_duration)
        self._client, self.entity_path = client, entity_path
        self._handler, self._on_error = process_message, process_error
        self.max_concurrent_calls, self.auto_complete_messages = max_concurrent_calls, auto_complete_messages
        self._mode = receive_mode
        self.counts = ProcessorCounts()
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._busy = 0
        self._idle_since = time.monotonic()

    @property
    def is_running(self) -> bool:
        return any(not task.done() for task in self._tasks)

    async def start(self) -> None:
        """Start the tasks and return at once."""
        if self.is_running:
            return
        self._stopping = asyncio.Event()
        self._tasks = [asyncio.create_task(self._work(), name=f"sparkbus-processor-{n}")
                       for n in range(self.max_concurrent_calls)]

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
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            raise
        await self.stop()

    async def __aenter__(self) -> "ServiceBusProcessor":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _receiver(self, renewer: Optional[AutoLockRenewer]) -> ServiceBusReceiver:
        subscription = split_subscription_path(self.entity_path)
        options = receiver_options(self._mode, renewer)
        if subscription is None:
            return self._client.get_queue_receiver(self.entity_path, **options)
        return self._client.get_subscription_receiver(*subscription, **options)

    async def _work(self) -> None:
        peek_lock = self._mode is ServiceBusReceiveMode.PEEK_LOCK
        renewer = AutoLockRenewer(max_lock_renewal_duration=self._renewal, on_lock_renew_failure=self._lock_lost) \
            if peek_lock and self._renewal else None
        failures = 0
        try:
            async with self._receiver(renewer) as receiver:
                while not self._stopping.is_set():
                    try:
                        got = await receiver.receive_messages(1, max_wait_time=RECEIVE_WAIT_SECONDS)
                        failures = 0
                    except Exception as error:  # reported, then the task backs off and goes on
                        await self._report(error, "receive")
                        failures += 1
                        try:
                            await asyncio.wait_for(self._stopping.wait(), min(0.8 * 2 ** (failures - 1), 120))
                        except asyncio.TimeoutError:
                            pass
                        continue
                    for message in got:
                        await self._handle(receiver, message, peek_lock)
        except Exception as error:  # the receiver could not even be made (e.g. no such entity)
            await self._report(error, "receive")
        finally:
            if renewer is not None:
                await renewer.close()

    async def _handle(self, receiver: ServiceBusReceiver, message: ServiceBusReceivedMessage, peek_lock: bool) -> None:
        context = ProcessMessageContext(message, receiver, self.entity_path, None if peek_lock else "deleted")
        self._busy += 1
        self.counts.received += 1
        log.debug("processing message %s of %s", message.message_id, self.entity_path)
        try:
            await self._handler(context)
        except asyncio.CancelledError:
            if not context.settled:  # cancelled mid-handler: give the message back at once
                await asyncio.shield(self._settle(context, "abandon"))
            raise
        except Exception as error:
            self.counts.failed += 1
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
            setattr(self.counts, counter, getattr(self.counts, counter) + 1)

    async def _lock_lost(self, message: Any, error: Optional[BaseException]) -> None:
        self.counts.lock_renewal_failures += 1
        await self._report(error or RuntimeError("the message's lock could not be renewed"), "renew_lock", message)

    async def _report(self, error: BaseException, source: str,
                      message: Optional[ServiceBusReceivedMessage] = None) -> None:
        self.counts.errors += 1
        if self._on_error is None:
            log.warning("sparkbus processor of %s: %s in %s: %s", self.entity_path, type(error).__name__, source, error)
            return
        try:
            done = self._on_error(ProcessErrorContext(error, source, self.entity_path, message))
            if asyncio.iscoroutine(done):
                await done
        except Exception:
            log.exception("the error handler of the processor of %s raised", self.entity_path)
