"""ServiceBusReceiver and ServiceBusSession of sparkbus.aio: the sync receiver's operations as coroutines
on the client's pool, and a receive that waits as an awaitable.

Waiting: receive_messages tries on the pool and pauses on the event loop (sparkbus.engine.delivery.apoll):
an idle receive holds no thread, looks at the entity's log directories every few tens of milliseconds, and
ends at once when its task is cancelled or the receiver is closed.

Cancellation: a task cancelled while a try is under way stops waiting at once; the try still ends on its
thread, and what it took goes back (ServiceBusReceiver._give_back of the sync receiver: locks released as if
never taken, or in RECEIVE_AND_DELETE mode kept for this receiver's next receive), so a cancelled receive
leaves nothing locked that its caller never got.

Several coroutines receiving from one receiver: their tries run one at a time, and each message goes to one
of them. They take turns on the loop (an asyncio lock: a coroutine waiting for its turn holds no thread),
and each try holds a thread lock on the pool too, since a try whose task was cancelled runs on to its end
after its turn was given up (the give-back of what it took holds that lock as well).
"""
from __future__ import annotations

import asyncio
import threading
from datetime import datetime
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Iterable, Optional, Protocol, Union

from ..engine.delivery import apoll
from ..engine.metrics import Counts
from ..receiver import ServiceBusReceivedMessage, ServiceBusReceiveMode
from ..receiver import ServiceBusReceiver as SyncReceiver
from ..receiver import ServiceBusSession as SyncSession
from ..receiver import ServiceBusSessionFilter, ServiceBusSubQueue
from .connection import Connection
from .runner import Lazy, Runner, on_pool

if TYPE_CHECKING:
    from ..client import ServiceBusClient as SyncClient


class LockRenewer(Protocol):
    """What a receiver's auto_lock_renewer is (sparkbus.aio.AutoLockRenewer): it registers what to keep
    locked."""

    def register(self, receiver: "ServiceBusReceiver",
                 renewable: Union[ServiceBusReceivedMessage, "ServiceBusSession"]) -> None: ...


class ServiceBusSession:
    """The session a session receiver holds (receiver.session inside `async with receiver`)."""

    def __init__(self, sync: SyncSession, runner: Runner) -> None:
        self._sync = sync
        self._runner = runner
        self.session_id: str = sync.session_id

    async def _handler(self) -> SyncSession:
        return self._sync

    @property
    def locked_until_utc(self) -> datetime:
        return self._sync.locked_until_utc

    get_state = on_pool(SyncSession.get_state)
    set_state = on_pool(SyncSession.set_state)
    renew_lock = on_pool(SyncSession.renew_lock)


class ServiceBusReceiver:
    """Receiver of a queue or subscription (client.get_queue_receiver / get_subscription_receiver)."""

    def __init__(self, client: Connection, make: Callable[["SyncClient"], SyncReceiver], entity_path: str,
                 receive_mode: Union[ServiceBusReceiveMode, str], max_wait_time: Optional[float], *,
                 owns_client: bool = False, renewer: Optional[LockRenewer] = None) -> None:
        self._client = client
        self._owns_client = owns_client  # made by _from_connection_string: closed with this receiver
        self._runner = client._runner
        self._make = make
        self._sync: Lazy[SyncReceiver] = Lazy(self._open)
        self._session: Optional[ServiceBusSession] = None
        if renewer is not None and not callable(getattr(renewer, "register", None)):
            raise TypeError(f"auto_lock_renewer must be an AutoLockRenewer, got {type(renewer).__name__}")
        self._renewer = renewer  # registers every message received in PEEK_LOCK mode, and the session
        self._session_unregistered = False
        self._turn = asyncio.Lock()  # one try at a time (module docstring) ...
        self._trying = threading.Lock()  # ... also after a cancelled one
        self._closing = asyncio.Event()
        self.entity_path = entity_path
        self.receive_mode = ServiceBusReceiveMode(receive_mode)
        self.max_wait_time = max_wait_time

    @classmethod
    def _from_connection_string(cls, conn_str: str, *, queue_name: Optional[str] = None,
                                topic_name: Optional[str] = None, subscription_name: Optional[str] = None,
                                **kwargs: Any) -> "ServiceBusReceiver":
        """A receiver straight from a connection string, as the SDK's (underscored, but used by its samples),
        with a client of its own, closed with it; receiver keywords as get_queue_receiver's."""
        retry = {k: kwargs.pop(k) for k in list(kwargs) if k.startswith("retry_")}  # the client's keywords
        if queue_name is not None and topic_name is None and subscription_name is None:
            return queue_receiver(Connection.from_connection_string(conn_str, **retry), queue_name,
                                  owns_client=True, **kwargs)
        if queue_name is None and topic_name is not None and subscription_name is not None:
            return subscription_receiver(Connection.from_connection_string(conn_str, **retry), topic_name,
                                         subscription_name, owns_client=True, **kwargs)
        raise TypeError("give queue_name, or topic_name and subscription_name")

    async def _open(self) -> SyncReceiver:
        """The sync receiver, made on the pool (it looks the entity up and locks its session)."""
        receiver = await self._runner.call(self._make, await self._client._handler())
        if receiver.session is not None:
            self._session = ServiceBusSession(receiver.session, self._runner)
            self._session_unregistered = self._renewer is not None
        return receiver

    async def _handler(self) -> SyncReceiver:
        receiver = await self._sync.get()
        if self._session_unregistered:  # once connected (the renewer needs the sync receiver)
            self._session_unregistered = False
            if self._renewer is not None and self._session is not None:  # both are, when _open set the flag
                self._renewer.register(self, self._session)
        return receiver

    def _record(self, counts: Counts) -> None:
        """As the sync receiver's _record (nothing before the receiver connected)."""
        if self._sync.value is not None:
            self._sync.value._record(counts)

    def _renewed(self, messages: list[ServiceBusReceivedMessage]) -> list[ServiceBusReceivedMessage]:
        """messages, registered with the receiver's auto_lock_renewer (PEEK_LOCK mode), as the SDK does; under a
        session the renewer keeps the session lock, which holds its messages' locks too."""
        if (self._renewer is not None and self.receive_mode is ServiceBusReceiveMode.PEEK_LOCK
                and self._session is None):
            for message in messages:
                self._renewer.register(self, message)
        return messages

    @property
    def session(self) -> Optional[ServiceBusSession]:
        """The session of a session receiver, once it connected (`async with receiver` or an operation)."""
        return self._session

    async def __aenter__(self) -> "ServiceBusReceiver":
        await self._handler()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """As the sync receiver's close; a receive waiting in another task returns what it has (nothing)."""
        self._closing.set()
        if self._sync.value is not None:
            await self._runner.call(self._sync.value.close)
        if self._owns_client:
            await self._client.close()

    async def receive_messages(self, max_message_count: Optional[int] = 1,
                               max_wait_time: Optional[float] = None) -> list[ServiceBusReceivedMessage]:
        """Up to max_message_count messages, waiting for the first up to max_wait_time seconds (default: the
        receiver's; neither set: until one arrives, the receiver is closed or the task cancelled)."""
        receiver = await self._handler()
        count, wait = receiver._receive_arguments(max_message_count, max_wait_time)

        def attempt() -> list[ServiceBusReceivedMessage]:
            with self._trying:
                return receiver._attempt(count)

        def give_back(messages: list[ServiceBusReceivedMessage]) -> None:
            with self._trying:  # the receiver's cache is changed by one thread at a time
                receiver._give_back(messages)

        async def tried() -> list[ServiceBusReceivedMessage]:
            async with self._turn:
                return await self._runner.call(attempt, undo=give_back)
        changed = None if wait == 0 else receiver._delivery.watch()
        return self._renewed(await apoll(tried, wait, changed=changed, stop=self._closing) or [])

    def __aiter__(self) -> AsyncIterator[ServiceBusReceivedMessage]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[ServiceBusReceivedMessage]:
        """Messages as they arrive; ends once the receiver's max_wait_time passes without one (never when it
        is None, as the SDK's) or the receiver is closed."""
        while not self._closing.is_set():
            got = await self.receive_messages(max_message_count=1)
            if not got:
                return
            yield got[0]

    async def receive_deferred_messages(self, sequence_numbers: Union[int, Iterable[int]]
                                        ) -> list[ServiceBusReceivedMessage]:
        """As the sync receiver's: the deferred messages with these sequence numbers, locked, or none."""
        receiver = await self._handler()
        return self._renewed(await self._runner.call(receiver.receive_deferred_messages, sequence_numbers))

    async def receive_messages_by_sequence_number(self, sequence_numbers: Union[int, Iterable[int]]
                                                  ) -> list[ServiceBusReceivedMessage]:
        """As the sync receiver's: these messages of the receiver's queue (active, or its dead-letter
        sub-queue's), locked, or none."""
        receiver = await self._handler()
        return self._renewed(await self._runner.call(receiver.receive_messages_by_sequence_number, sequence_numbers))

    peek_messages = on_pool(SyncReceiver.peek_messages)
    complete_message = on_pool(SyncReceiver.complete_message)
    complete_messages = on_pool(SyncReceiver.complete_messages)
    abandon_message = on_pool(SyncReceiver.abandon_message)
    defer_message = on_pool(SyncReceiver.defer_message)
    dead_letter_message = on_pool(SyncReceiver.dead_letter_message)
    renew_message_lock = on_pool(SyncReceiver.renew_message_lock)
    delete_messages = on_pool(SyncReceiver.delete_messages)
    purge_messages = on_pool(SyncReceiver.purge_messages)
    receive_dataframe = on_pool(SyncReceiver.receive_dataframe)
    complete_dataframe = on_pool(SyncReceiver.complete_dataframe)


def queue_receiver(connection: Connection, queue_name: str, *,
                   receive_mode: Union[ServiceBusReceiveMode, str] = ServiceBusReceiveMode.PEEK_LOCK,
                   sub_queue: Union[ServiceBusSubQueue, str, None] = None, prefetch_count: int = 0,
                   max_wait_time: Optional[float] = None, session_id: Union[str, ServiceBusSessionFilter, None] = None,
                   auto_lock_renewer: Optional[LockRenewer] = None, owns_client: bool = False,
                   **kwargs: Any) -> ServiceBusReceiver:
    """A receiver of a queue on connection (ServiceBusClient.get_queue_receiver's keywords); owns_client:
    the connection is closed with the receiver."""
    return ServiceBusReceiver(connection, lambda client: client.get_queue_receiver(
        queue_name, receive_mode=receive_mode, sub_queue=sub_queue, prefetch_count=prefetch_count,
        max_wait_time=max_wait_time, session_id=session_id, **kwargs), queue_name, receive_mode, max_wait_time,
        owns_client=owns_client, renewer=auto_lock_renewer)


def subscription_receiver(connection: Connection, topic_name: str, subscription_name: str, *,
                          receive_mode: Union[ServiceBusReceiveMode, str] = ServiceBusReceiveMode.PEEK_LOCK,
                          sub_queue: Union[ServiceBusSubQueue, str, None] = None, prefetch_count: int = 0,
                          max_wait_time: Optional[float] = None,
                          session_id: Union[str, ServiceBusSessionFilter, None] = None,
                          auto_lock_renewer: Optional[LockRenewer] = None, owns_client: bool = False,
                          **kwargs: Any) -> ServiceBusReceiver:
    """A receiver of a subscription on connection (ServiceBusClient.get_subscription_receiver's keywords)."""
    return ServiceBusReceiver(connection, lambda client: client.get_subscription_receiver(
        topic_name, subscription_name, receive_mode=receive_mode, sub_queue=sub_queue,
        prefetch_count=prefetch_count, max_wait_time=max_wait_time, session_id=session_id, **kwargs),
        f"{topic_name}/Subscriptions/{subscription_name}", receive_mode, max_wait_time, owns_client=owns_client,
        renewer=auto_lock_renewer)
