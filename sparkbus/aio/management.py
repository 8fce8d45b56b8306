"""ServiceBusAdministrationClient of sparkbus.aio (azure.servicebus.aio.management's shape): every method of
the sync administration client as a coroutine on a pool of its own, and the list methods as async
iterables (`async for queue in admin.list_queues()`), as the SDK's AsyncItemPaged are."""
from __future__ import annotations

from typing import Any, Optional

from ..core.connection import parse_connection_string
from ..management import ServiceBusAdministrationClient as SyncAdmin
from .runner import AsyncList, Lazy, Runner, listed_on_pool, on_pool

__all__ = ["AsyncList", "ServiceBusAdministrationClient"]


class ServiceBusAdministrationClient:
    """Async administration client: ServiceBusAdministrationClient(fully_qualified_namespace, credential,
    **kwargs) or from_connection_string(conn_str), as the sync one; the namespace is opened at the first call."""

    def __init__(self, fully_qualified_namespace: str, credential: Optional[object] = None, **kwargs: Any) -> None:
        self._arguments = (fully_qualified_namespace, credential, kwargs)
        self._runner = Runner()
        self._sync: Lazy[SyncAdmin] = Lazy(self._open)
        self.fully_qualified_namespace = fully_qualified_namespace

    @classmethod
    def from_connection_string(cls, conn_str: str, **kwargs: object) -> "ServiceBusAdministrationClient":
        """Accepts 'Endpoint=sparkbus://<namespace path or URI>;...' (EntityPath is ignored, as in the SDK)."""
        return cls(parse_connection_string(conn_str).fully_qualified_namespace, **kwargs)

    async def _open(self) -> SyncAdmin:
        namespace, credential, kwargs = self._arguments
        return await self._runner.call(SyncAdmin, namespace, credential, **kwargs)

    async def _handler(self) -> SyncAdmin:
        return await self._sync.get()

    async def __aenter__(self) -> "ServiceBusAdministrationClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Persist the process's metrics of the namespace, then wait for calls under way to end."""
        if self._sync.value is not None:
            await self._runner.call(self._sync.value.close)
        await self._runner.close()

    # every public method of the sync client, in its async form (tests/test_aio.py checks none is missing)
    get_namespace_properties = on_pool(SyncAdmin.get_namespace_properties)
    set_partition_availability = on_pool(SyncAdmin.set_partition_availability)
    update_namespace = on_pool(SyncAdmin.update_namespace)
    get_namespace_metrics = on_pool(SyncAdmin.get_namespace_metrics)
    get_entity_metrics = on_pool(SyncAdmin.get_entity_metrics)
    create_queue = on_pool(SyncAdmin.create_queue)
    create_topic = on_pool(SyncAdmin.create_topic)
    get_queue = on_pool(SyncAdmin.get_queue)
    get_topic = on_pool(SyncAdmin.get_topic)
    list_queues = listed_on_pool(SyncAdmin.list_queues)
    list_topics = listed_on_pool(SyncAdmin.list_topics)
    update_queue = on_pool(SyncAdmin.update_queue)
    update_topic = on_pool(SyncAdmin.update_topic)
    delete_queue = on_pool(SyncAdmin.delete_queue)
    delete_topic = on_pool(SyncAdmin.delete_topic)
    get_queue_runtime_properties = on_pool(SyncAdmin.get_queue_runtime_properties)
    get_topic_runtime_properties = on_pool(SyncAdmin.get_topic_runtime_properties)
    get_topic_awaiting_fanout = on_pool(SyncAdmin.get_topic_awaiting_fanout)
    list_queues_runtime_properties = listed_on_pool(SyncAdmin.list_queues_runtime_properties)
    list_topics_runtime_properties = listed_on_pool(SyncAdmin.list_topics_runtime_properties)
    create_subscription = on_pool(SyncAdmin.create_subscription)
    get_subscription = on_pool(SyncAdmin.get_subscription)
    list_subscriptions = listed_on_pool(SyncAdmin.list_subscriptions)
    update_subscription = on_pool(SyncAdmin.update_subscription)
    delete_subscription = on_pool(SyncAdmin.delete_subscription)
    get_subscription_runtime_properties = on_pool(SyncAdmin.get_subscription_runtime_properties)
    list_subscriptions_runtime_properties = listed_on_pool(SyncAdmin.list_subscriptions_runtime_properties)
    create_rule = on_pool(SyncAdmin.create_rule)
    get_rule = on_pool(SyncAdmin.get_rule)
    list_rules = listed_on_pool(SyncAdmin.list_rules)
    update_rule = on_pool(SyncAdmin.update_rule)
    delete_rule = on_pool(SyncAdmin.delete_rule)
    get_entity_tables = on_pool(SyncAdmin.get_entity_tables)
    get_partition_message_counts = on_pool(SyncAdmin.get_partition_message_counts)
    list_sessions = listed_on_pool(SyncAdmin.list_sessions)
    get_archive_table = on_pool(SyncAdmin.get_archive_table)
    replay_messages = on_pool(SyncAdmin.replay_messages)
    seek_subscription = on_pool(SyncAdmin.seek_subscription)
