"""The connection under sparkbus.aio's client, senders and receivers: one Runner (sparkbus.aio.runner) and the
sync client (sparkbus.ServiceBusClient) it runs on.

The sync client is made on first use, on the pool: constructing an async client, or a sender or receiver
from it, touches no storage, as the SDK's connect lazily. The Runner is closed with the connection.
"""
from __future__ import annotations

from typing import Any, Optional, TypeVar

from ..client import ServiceBusClient as SyncClient
from ..core.connection import parse_connection_string
from .runner import Lazy, Runner

C = TypeVar("C", bound="Connection")


class Connection:
    """A namespace's address and keywords (those of sparkbus.ServiceBusClient), its Runner and, once used,
    its sync client."""

    def __init__(self, fully_qualified_namespace: str, credential: Optional[object] = None, **kwargs: Any) -> None:
        self._arguments = (fully_qualified_namespace, credential, kwargs)
        self._entity_path: Optional[str] = None
        self._runner = Runner()
        self._sync: Lazy[SyncClient] = Lazy(self._open)
        self.fully_qualified_namespace = fully_qualified_namespace

    @classmethod
    def from_connection_string(cls: type[C], conn_str: str, **kwargs: object) -> C:
        """'Endpoint=sparkbus://<path>;...'; an EntityPath binds the client to that entity, as in the SDK."""
        info = parse_connection_string(conn_str)
        connection = cls(info.fully_qualified_namespace, **kwargs)
        connection._entity_path = info.entity_path
        return connection

    async def _open(self) -> SyncClient:
        """The sync client (made on the pool: opening a namespace reads storage)."""
        namespace, credential, kwargs = self._arguments
        client: SyncClient = await self._runner.call(SyncClient, namespace, credential, **kwargs)
        client._entity_path = self._entity_path
        self.fully_qualified_namespace = client.fully_qualified_namespace
        return client

    async def _handler(self) -> SyncClient:
        return await self._sync.get()

    async def close(self) -> None:
        """Persist the process's metrics of the namespace, then wait for operations under way to end."""
        if self._sync.value is not None:
            await self._runner.call(self._sync.value.close)
        await self._runner.close()
