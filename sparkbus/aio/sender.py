"""ServiceBusSender of sparkbus.aio: the sync sender's operations as coroutines on the client's pool.

Sends of many coroutines at once run on the pool's threads at once, where the sync sender's group commit
joins them into shared commits (sparkbus.aio.runner)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional

from ..sender import ServiceBusSender as SyncSender
from .connection import Connection
from .runner import Lazy, on_pool

if TYPE_CHECKING:
    from ..client import ServiceBusClient as SyncClient


class ServiceBusSender:
    """Sender of a queue or topic (client.get_queue_sender / get_topic_sender)."""

    def __init__(self, client: Connection, make: Callable[["SyncClient"], SyncSender], entity_name: str,
                 *, owns_client: bool = False) -> None:
        self._client = client
        self._owns_client = owns_client  # made by _from_connection_string: closed with this sender
        self._runner = client._runner
        self._make = make
        self._sync: Lazy[SyncSender] = Lazy(self._open)
        self.entity_name = entity_name

    @classmethod
    def _from_connection_string(cls, conn_str: str, *, queue_name: Optional[str] = None,
                                topic_name: Optional[str] = None, **kwargs: object) -> "ServiceBusSender":
        """A sender straight from a connection string, as the SDK's (underscored, but used by its samples):
        it has a client of its own, closed with it."""
        if (queue_name is None) == (topic_name is None):
            raise TypeError("give exactly one of queue_name and topic_name")
        name = queue_name if queue_name is not None else topic_name
        assert name is not None  # exactly one of them is given (checked above)
        client = Connection.from_connection_string(conn_str, **kwargs)
        if queue_name is not None:
            return cls(client, lambda sync: sync.get_queue_sender(name), name, owns_client=True)
        return cls(client, lambda sync: sync.get_topic_sender(name), name, owns_client=True)

    async def _open(self) -> SyncSender:
        return self._make(await self._client._handler())  # it looks the entity up at the first send

    async def _handler(self) -> SyncSender:
        return await self._sync.get()

    async def __aenter__(self) -> "ServiceBusSender":
        await self._handler()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._sync.value is not None:
            self._sync.value.close()
        if self._owns_client:
            await self._client.close()

    entity_info = on_pool(SyncSender.entity_info)
    send_messages = on_pool(SyncSender.send_messages)
    schedule_messages = on_pool(SyncSender.schedule_messages)
    cancel_scheduled_messages = on_pool(SyncSender.cancel_scheduled_messages)
    send_dataframe = on_pool(SyncSender.send_dataframe)
    create_message_batch = on_pool(SyncSender.create_message_batch)
