"""ServiceBusClient of sparkbus.aio, as azure.servicebus.aio's: the sync client's constructors and keywords,
an async context manager, and senders and receivers whose operations are coroutines.

The sync client (sparkbus.ServiceBusClient) is made on first use, on the pool: constructing this one, or a
sender or receiver from it, touches no storage, as the SDK's connect lazily. Everything runs through one
Runner (sparkbus.aio.runner) per client, closed with the client.
"""
from __future__ import annotations

from contextlib import asynccontextmanager
from typing import AsyncIterator, Optional, Union

from ..client import ServiceBusClient as SyncClient
from ..core.connection import parse_connection_string
from ..receiver import ServiceBusReceiveMode, ServiceBusSessionFilter, ServiceBusSubQueue
from ..transactions import ServiceBusTransaction
from .autolock import AutoLockRenewer
from .receiver import ServiceBusReceiver
from .runner import Lazy, Runner, listed_on_pool
from .sender import ServiceBusSender


class ServiceBusClient:
    """Async client of a namespace: ServiceBusClient(fully_qualified_namespace, credential, **kwargs) or
    from_connection_string(conn_str), keywords as sparkbus.ServiceBusClient's (retry_*, spark,
    storage_options; the SDK's transport keywords accepted and ignored)."""

    def __init__(self, fully_qualified_namespace: str, credential: Optional[object] = None, **kwargs: object) -> None:
        self._arguments = (fully_qualified_namespace, credential, kwargs)
        self._entity_path: Optional[str] = None
        self._runner = Runner()
        self._sync: Lazy[SyncClient] = Lazy(self._open)
        self.fully_qualified_namespace = fully_qualified_namespace

    @classmethod
    def from_connection_string(cls, conn_str: str, **kwargs: object) -> "ServiceBusClient":
        """'Endpoint=sparkbus://<path>;...'; an EntityPath binds the client to that entity, as in the SDK."""
        info = parse_connection_string(conn_str)
        client = cls(info.fully_qualified_namespace, **kwargs)
        client._entity_path = info.entity_path
        return client

    async def _open(self) -> SyncClient:
        """The sync client (made on the pool: opening a namespace reads storage)."""
        namespace, credential, kwargs = self._arguments
        client = await self._runner.call(SyncClient, namespace, credential, **kwargs)
        client._entity_path = self._entity_path
        self.fully_qualified_namespace = client.fully_qualified_namespace
        return client

    async def _handler(self) -> SyncClient:
        return await self._sync.get()

    async def __aenter__(self) -> "ServiceBusClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Persist the process's metrics of the namespace, then wait for operations under way to end."""
        if self._sync.value is not None:
            await self._runner.call(self._sync.value.close)
        await self._runner.close()

    def get_queue_sender(self, queue_name: str, **kwargs: object) -> ServiceBusSender:
        return ServiceBusSender(self, lambda client: client.get_queue_sender(queue_name, **kwargs), queue_name)

    def get_topic_sender(self, topic_name: str, **kwargs: object) -> ServiceBusSender:
        return ServiceBusSender(self, lambda client: client.get_topic_sender(topic_name, **kwargs), topic_name)

    def get_queue_receiver(self, queue_name: str, *,
                           receive_mode: Union[ServiceBusReceiveMode, str] = ServiceBusReceiveMode.PEEK_LOCK,
                           sub_queue: Union[ServiceBusSubQueue, str, None] = None, prefetch_count: int = 0,
                           max_wait_time: Optional[float] = None,
                           session_id: Union[str, ServiceBusSessionFilter, None] = None,
                           auto_lock_renewer: Optional[AutoLockRenewer] = None, **kwargs: object) -> ServiceBusReceiver:
        """A receiver of a queue, as the sync client's; it connects (and locks its session, waiting up to
        max_wait_time for one) at `async with` or its first operation. auto_lock_renewer: a sparkbus.aio
        AutoLockRenewer every received message, and the session, is registered with."""
        return ServiceBusReceiver(self, lambda client: client.get_queue_receiver(
            queue_name, receive_mode=receive_mode, sub_queue=sub_queue, prefetch_count=prefetch_count,
            max_wait_time=max_wait_time, session_id=session_id, **kwargs), queue_name, receive_mode, max_wait_time,
            renewer=auto_lock_renewer)

    def get_subscription_receiver(self, topic_name: str, subscription_name: str, *,
                                  receive_mode: Union[ServiceBusReceiveMode, str] = ServiceBusReceiveMode.PEEK_LOCK,
                                  sub_queue: Union[ServiceBusSubQueue, str, None] = None, prefetch_count: int = 0,
                                  max_wait_time: Optional[float] = None,
                                  session_id: Union[str, ServiceBusSessionFilter, None] = None,
                                  auto_lock_renewer: Optional[AutoLockRenewer] = None,
                                  **kwargs: object) -> ServiceBusReceiver:
        return ServiceBusReceiver(self, lambda client: client.get_subscription_receiver(
            topic_name, subscription_name, receive_mode=receive_mode, sub_queue=sub_queue,
            prefetch_count=prefetch_count, max_wait_time=max_wait_time, session_id=session_id, **kwargs),
            f"{topic_name}/Subscriptions/{subscription_name}", receive_mode, max_wait_time, renewer=auto_lock_renewer)

    list_queue_sessions = listed_on_pool(SyncClient.list_queue_sessions)
    list_subscription_sessions = listed_on_pool(SyncClient.list_subscription_sessions)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[ServiceBusTransaction]:
        """`async with client.transaction() as txn:` sends with transaction=txn commit together when the
        block exits normally (on the pool), and are discarded when it raises."""
        client = await self._handler()
        context = client.transaction()
        txn = context.__enter__()
        try:
            yield txn
        except BaseException as error:
            await self._runner.call(context.__exit__, type(error), error, error.__traceback__)
            raise
        await self._runner.call(context.__exit__, None, None, None)
