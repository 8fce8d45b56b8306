"""ServiceBusClient of sparkbus.aio, as azure.servicebus.aio's: the sync client's constructors and keywords,
an async context manager, and senders and receivers whose operations are coroutines. Nothing is opened
until first use, and everything runs through the client's one Runner (sparkbus.aio.connection).
"""
from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Optional, Union

from ..client import ServiceBusClient as SyncClient
from ..receiver import ServiceBusReceiveMode, ServiceBusSessionFilter, ServiceBusSubQueue
from ..transactions import ServiceBusTransaction
from ..core.names import subscription_path
from .autolock import AutoLockRenewer
from .processor import MessageHandler, ServiceBusProcessor, ServiceBusSessionProcessor
from .connection import Connection
from .receiver import ServiceBusReceiver, queue_receiver, subscription_receiver
from .runner import listed_on_pool
from .sender import ServiceBusSender


class ServiceBusClient(Connection):
    """Async client of a namespace: ServiceBusClient(fully_qualified_namespace, credential, **kwargs) or
    from_connection_string(conn_str), keywords as sparkbus.ServiceBusClient's (retry_*, spark,
    storage_options; the SDK's transport keywords accepted and ignored)."""

    async def __aenter__(self) -> "ServiceBusClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def get_queue_sender(self, queue_name: str, **kwargs: object) -> ServiceBusSender:
        return ServiceBusSender(self, lambda client: client.get_queue_sender(queue_name, **kwargs), queue_name)

    def get_topic_sender(self, topic_name: str, **kwargs: object) -> ServiceBusSender:
        return ServiceBusSender(self, lambda client: client.get_topic_sender(topic_name, **kwargs), topic_name)

    def get_queue_receiver(self, queue_name: str, *,
                           receive_mode: Union[ServiceBusReceiveMode, str] = ServiceBusReceiveMode.PEEK_LOCK,
                           sub_queue: Union[ServiceBusSubQueue, str, None] = None, prefetch_count: int = 0,
                           max_wait_time: Optional[float] = None,
                           session_id: Union[str, ServiceBusSessionFilter, None] = None,
                           auto_lock_renewer: Optional[AutoLockRenewer] = None, **kwargs: Any) -> ServiceBusReceiver:
        """A receiver of a queue, as the sync client's; it connects (and locks its session, waiting up to
        max_wait_time for one) at `async with` or its first operation. auto_lock_renewer: a sparkbus.aio
        AutoLockRenewer every received message, and the session, is registered with."""
        return queue_receiver(self, queue_name, receive_mode=receive_mode, sub_queue=sub_queue,
                              prefetch_count=prefetch_count, max_wait_time=max_wait_time, session_id=session_id,
                              auto_lock_renewer=auto_lock_renewer, **kwargs)

    def get_subscription_receiver(self, topic_name: str, subscription_name: str, *,
                                  receive_mode: Union[ServiceBusReceiveMode, str] = ServiceBusReceiveMode.PEEK_LOCK,
                                  sub_queue: Union[ServiceBusSubQueue, str, None] = None, prefetch_count: int = 0,
                                  max_wait_time: Optional[float] = None,
                                  session_id: Union[str, ServiceBusSessionFilter, None] = None,
                                  auto_lock_renewer: Optional[AutoLockRenewer] = None,
                                  **kwargs: Any) -> ServiceBusReceiver:
        return subscription_receiver(self, topic_name, subscription_name, receive_mode=receive_mode,
                                     sub_queue=sub_queue, prefetch_count=prefetch_count, max_wait_time=max_wait_time,
                                     session_id=session_id, auto_lock_renewer=auto_lock_renewer, **kwargs)

    def get_queue_processor(self, queue_name: str, process_message: MessageHandler,
                            **options: Any) -> ServiceBusProcessor:
        """A processor awaiting process_message for every message of a queue (sparkbus.aio.processor)."""
        return ServiceBusProcessor(self, queue_name, process_message, **options)

    def get_subscription_processor(self, topic_name: str, subscription_name: str, process_message: MessageHandler,
                                   **options: Any) -> ServiceBusProcessor:
        """A processor of a subscription's messages, as get_queue_processor."""
        return ServiceBusProcessor(self, subscription_path(topic_name, subscription_name), process_message, **options)

    def get_queue_session_processor(self, queue_name: str, process_message: MessageHandler,
                                    **options: Any) -> ServiceBusSessionProcessor:
        """A processor of a session-enabled queue: each session's messages in order, sessions in parallel
        (sparkbus.aio.processor; options as the sync client's get_queue_session_processor)."""
        return ServiceBusSessionProcessor(self, queue_name, process_message, **options)

    def get_subscription_session_processor(self, topic_name: str, subscription_name: str,
                                           process_message: MessageHandler,
                                           **options: Any) -> ServiceBusSessionProcessor:
        """A processor of a session-enabled subscription, as get_queue_session_processor."""
        return ServiceBusSessionProcessor(self, subscription_path(topic_name, subscription_name), process_message,
                                          **options)

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
