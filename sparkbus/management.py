"""ServiceBusAdministrationClient: create, get, update, delete and list queues, topics, subscriptions and rules.

The SDK's shape over the administration engine (sparkbus.engine.admin, which owns the catalog
transactions, the checks and the tables): this module reads the SDK's arguments (names given as strings or
properties objects, options as keywords), checks them, and runs each operation as a management request
(throttled and charged as the service charges them).
"""
from __future__ import annotations

import functools
import re
from datetime import datetime, timedelta
from types import EllipsisType
from typing import Any, Callable, Optional, TypeVar, Union, cast

from .core import entities
from .core.connection import parse_connection_string
from .core.entities import (QueueProperties, QueueRuntimeProperties, SubscriptionProperties,
                            SubscriptionRuntimeProperties, TopicProperties, TopicRuntimeProperties)
from .core.filters import (CorrelationRuleFilter, FalseRuleFilter, RuleFilter, RuleProperties, SqlRuleAction,
                           SqlRuleFilter, TrueRuleFilter, check_action, check_filter)
from .core.names import checked_name, subscription_path, validate_child_name, validate_entity_name
from .core.vocabulary import (AccessRights, ApiVersion, EntityAvailabilityStatus, EntityStatus, MessagingSku,
                              NamespaceType)
from .engine import admin, archive, metrics, replay
from .engine.availability import mark_partition
from .engine.catalog import Catalog
from .engine.metrics import Metrics
from .engine.namespace import NamespaceProperties, governor_of, open_namespace, update_namespace
from .engine.retry import RetryPolicy
from .engine.replay import ReplayResult
from .engine.sessions import SessionSummary
from .message import to_utc

F = TypeVar("F", bound=Callable[..., Any])


def _management(method: F) -> F:
    """A management operation: admitted by the namespace's throttling and charged 10 credits (seed),
    retried under the client's retry policy when throttled; counted on the namespace's metrics."""
    @functools.wraps(method)
    def charged(self: "ServiceBusAdministrationClient", *args: object, **kwargs: object) -> object:
        return admin.managed(self._catalog, self._retry, method.__name__, lambda: method(self, *args, **kwargs))
    return charged  # type: ignore[return-value]


class ServiceBusAdministrationClient:
    """Management plane of a namespace, constructed as azure-servicebus':
    ServiceBusAdministrationClient(fully_qualified_namespace, credential, **kwargs), or
    from_connection_string(conn_str).

    Args:
        fully_qualified_namespace: The namespace's location: a directory or file:// URI, optionally written
            'sparkbus://<location>'.
        credential: An azure-core credential; accepted and ignored by local namespaces.
        retry_total: azure-core's retry settings: a throttled management call is retried under them.
        retry_backoff_factor: As retry_total.
        retry_backoff_max: As retry_total.
        retry_mode: "exponential" or "fixed".
        storage_options: An object-store namespace's options (account_key, sas_token, ...); default: the
            environment's credentials.
        **kwargs: Other azure-core keyword arguments (api_version, logging_enable, ...), accepted and ignored.
    """

    def __init__(self, fully_qualified_namespace: str, credential: Optional[object] = None, *,
                 retry_total: int = 10, retry_backoff_factor: float = 0.8, retry_backoff_max: float = 120,
                 retry_mode: str = "exponential", storage_options: Optional[dict[str, str]] = None,
                 **kwargs: object) -> None:
        self._retry = RetryPolicy(retry_total, retry_backoff_factor, retry_backoff_max, retry_mode)
        self._catalog: Catalog = open_namespace(fully_qualified_namespace, credential, storage_options)
        self.credential = credential
        self._governor = governor_of(self._catalog)

    @classmethod
    def from_connection_string(cls, conn_str: str, **kwargs: Any) -> "ServiceBusAdministrationClient":
        """A client of the namespace a connection string names.

        Args:
            conn_str: 'Endpoint=sparkbus://<namespace path or URI>;...' (EntityPath is ignored, as in the SDK).
            **kwargs: The constructor's keyword arguments (retry settings, storage_options, ...).

        Returns:
            The client.
        """
        return cls(parse_connection_string(conn_str).fully_qualified_namespace, **kwargs)

    def __enter__(self) -> "ServiceBusAdministrationClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Persists the process's metrics of the namespace (every call opens the tables it needs)."""
        self._governor.recorder.flush()

    # ---- namespace -------------------------------------------------------------------------------------

    def get_namespace_properties(self) -> NamespaceProperties:
        return admin.namespace(self._catalog)

    def set_partition_availability(self, entity_path: Optional[str], partition_id: int, available: bool, *,
                                   reason: str = "") -> None:
        """Operator control: mark a partition of an entity unavailable or available again. While it is
        unavailable, keyless sends go to other partitions, keyed sends raise PartitionUnavailableError,
        receives serve the other partitions and management operations on the entity fail; get_* report
        availability_status "Limited".

        Args:
            entity_path: A queue's or topic's name or '<topic>/Subscriptions/<name>'; None: every entity.
            partition_id: The partition, from 0.
            available: False marks it unavailable, True available again.
            reason: Why, recorded with an unavailable partition.

        Raises:
            TypeError: an argument of the wrong type.
            ValueError: a partition the entity does not have.
            MessagingEntityNotFoundError: there is no such entity.
        """
        mark_partition(self._catalog, partition_id, available, entity_path=entity_path, reason=reason)

    def update_namespace(self, *, messaging_units: Optional[int] = None,
                         credits_per_second: Union[int, None, EllipsisType] = ...) -> NamespaceProperties:
        """Scale a premium namespace, or set a basic/standard one's credit budget. Running clients follow at
        their next operation.

        Args:
            messaging_units: A premium namespace's messaging units: 1, 2, 4, 8 or 16 (None: unchanged).
            credits_per_second: A basic/standard namespace's credits per second; None: no credit throttling
                (not given: unchanged).

        Returns:
            The namespace's properties, updated.

        Raises:
            TypeError: neither argument is given.
            ValueError: an argument does not apply to the namespace's tier (nothing changes).
        """
        return update_namespace(self._catalog, messaging_units=messaging_units, credits_per_second=credits_per_second)

    # ---- metrics ---------------------------------------------------------------------------------------

    def get_namespace_metrics(self, *, start_time: Optional[datetime] = None, end_time: Optional[datetime] = None,
                              period: timedelta = metrics.MINUTE) -> Metrics:
        """Request and message counts of the whole namespace, per period and in total: what every process
        persisted to the metrics table, plus this process's counts not yet persisted.

        Args:
            start_time: Only counts from this time on (default: from the first).
            end_time: Only counts before this time (default: up to the last).
            period: A minute, or 10 seconds or any multiple of it.

        Returns:
            The counts, per period and in total.

        Raises:
            ValueError: period is not 10 seconds or a multiple of it.
        """
        return metrics.read(self._catalog.root, self._governor.recorder, start=start_time, end=end_time,
                            period=period)

    def get_entity_metrics(self, entity_path: str, *, start_time: Optional[datetime] = None,
                           end_time: Optional[datetime] = None, period: timedelta = metrics.MINUTE) -> Metrics:
        """The data-plane counts of one queue, topic or subscription; management operations are the
        namespace's.

        Args:
            entity_path: A queue's or topic's name or '<topic>/Subscriptions/<name>'.
            start_time: Only counts from this time on (default: from the first).
            end_time: Only counts before this time (default: up to the last).
            period: As get_namespace_metrics'.

        Returns:
            The counts, per period and in total.

        Raises:
            MessagingEntityNotFoundError: there is no such entity.
            ValueError: period is not 10 seconds or a multiple of it.
        """
        return metrics.read(self._catalog.root, self._governor.recorder,
                            entity=admin.entity_path(self._catalog, entity_path), start=start_time, end=end_time,
                            period=period)

    # ---- queues and topics -----------------------------------------------------------------------------

    @_management
    def create_queue(self, queue_name: str, **kwargs: object) -> QueueProperties:
        """Create a queue.

        Args:
            queue_name: The queue's name.
            **kwargs: Its settings, as azure-servicebus' (max_delivery_count, lock_duration, requires_session,
                enable_partitioning, forward_to, ...); the others take their defaults.

        Returns:
            The queue's properties.

        Raises:
            MessagingEntityAlreadyExistsError: a queue or topic of that name exists.
            TypeError: an unknown setting.
        """
        validate_entity_name(queue_name, "queue")
        return cast(QueueProperties,
                    admin.create_entity(self._catalog, "queue", queue_name, entities.check_options("queue", kwargs)))

    @_management
    def create_topic(self, topic_name: str, **kwargs: object) -> TopicProperties:
        """Create a topic.

        Args:
            topic_name: The topic's name.
            **kwargs: Its settings, as azure-servicebus' (max_size_in_megabytes, enable_partitioning,
                requires_duplicate_detection, ...); the others take their defaults.

        Returns:
            The topic's properties.

        Raises:
            MessagingEntityAlreadyExistsError: a queue or topic of that name exists.
            TypeError: an unknown setting.
        """
        validate_entity_name(topic_name, "topic")
        return cast(TopicProperties,
                    admin.create_entity(self._catalog, "topic", topic_name, entities.check_options("topic", kwargs)))

    @_management
    def get_queue(self, queue_name: str) -> QueueProperties:
        """A queue's settings.

        Args:
            queue_name: The queue's name, or its properties.

        Returns:
            The queue's properties.

        Raises:
            MessagingEntityNotFoundError: there is no such queue.
        """
        return cast(QueueProperties, admin.get_entity(self._catalog, "queue", _name_of(queue_name, "queue")))

    @_management
    def get_topic(self, topic_name: str) -> TopicProperties:
        """A topic's settings.

        Args:
            topic_name: The topic's name, or its properties.

        Returns:
            The topic's properties.

        Raises:
            MessagingEntityNotFoundError: there is no such topic.
        """
        return cast(TopicProperties, admin.get_entity(self._catalog, "topic", _name_of(topic_name, "topic")))

    @_management
    def list_queues(self) -> list[QueueProperties]:
        return cast(list[QueueProperties], admin.list_entities(self._catalog, "queue"))

    @_management
    def list_topics(self) -> list[TopicProperties]:
        return cast(list[TopicProperties], admin.list_entities(self._catalog, "topic"))

    @_management
    def update_queue(self, queue: Union[QueueProperties, dict[str, Any], str], **kwargs: object) -> None:
        """Change a queue's settings.

        Args:
            queue: The queue's properties (as get_queue returns them, changed), a dict of them, or its name.
            **kwargs: Settings to change, over those queue carries; needed when queue is a name.

        Raises:
            MessagingEntityNotFoundError: there is no such queue.
            InvalidOperationError: a setting that is fixed at creation would change.
            TypeError: an unknown setting, or a name without settings to change.
        """
        self._update("queue", _name_of(queue, "queue"), entities.settable_values("queue", queue, kwargs))

    @_management
    def update_topic(self, topic: Union[TopicProperties, dict[str, Any], str], **kwargs: object) -> None:
        """Change a topic's settings.

        Args:
            topic: The topic's properties (as get_topic returns them, changed), a dict of them, or its name.
            **kwargs: Settings to change, over those topic carries; needed when topic is a name.

        Raises:
            MessagingEntityNotFoundError: there is no such topic.
            InvalidOperationError: a setting that is fixed at creation would change.
            TypeError: an unknown setting, or a name without settings to change.
        """
        self._update("topic", _name_of(topic, "topic"), entities.settable_values("topic", topic, kwargs))

    @_management
    def delete_queue(self, queue: Union[str, QueueProperties]) -> None:
        """Delete a queue with all its data.

        Args:
            queue: The queue's name, or its properties.

        Raises:
            MessagingEntityNotFoundError: there is no such queue.
        """
        admin.delete_entity(self._catalog, "queue", _name_of(queue, "queue"))

    @_management
    def delete_topic(self, topic: Union[str, TopicProperties]) -> None:
        """Deletes the topic with its subscriptions, their rules, and all their data.

        Args:
            topic: The topic's name, or its properties.

        Raises:
            MessagingEntityNotFoundError: there is no such topic.
        """
        admin.delete_entity(self._catalog, "topic", _name_of(topic, "topic"))

    @_management
    def get_queue_runtime_properties(self, queue_name: str) -> QueueRuntimeProperties:
        """A queue's message counts and size.

        Args:
            queue_name: The queue's name, or its properties.

        Returns:
            The queue's runtime properties.

        Raises:
            MessagingEntityNotFoundError: there is no such queue.
        """
        return cast(QueueRuntimeProperties, admin.get_runtime(self._catalog, "queue", _name_of(queue_name, "queue")))

    @_management
    def get_topic_runtime_properties(self, topic_name: str) -> TopicRuntimeProperties:
        """A topic's message counts and size.

        Args:
            topic_name: The topic's name, or its properties.

        Returns:
            The topic's runtime properties.

        Raises:
            MessagingEntityNotFoundError: there is no such topic.
        """
        return cast(TopicRuntimeProperties, admin.get_runtime(self._catalog, "topic", _name_of(topic_name, "topic")))

    @_management
    def get_topic_awaiting_fanout(self, topic_name: str) -> int:
        """sparkbus: how many of the topic's messages no fan-out has delivered to its subscriptions yet (those
        scheduled for later not counted). The namespace service or fanout_once delivers them.

        Args:
            topic_name: The topic's name, or its properties.

        Returns:
            The number of messages.

        Raises:
            MessagingEntityNotFoundError: there is no such topic.
        """
        return admin.awaiting_fanout(self._catalog, _name_of(topic_name, "topic"))

    @_management
    def list_queues_runtime_properties(self) -> list[QueueRuntimeProperties]:
        return cast(list[QueueRuntimeProperties], admin.list_runtime(self._catalog, "queue"))

    @_management
    def list_topics_runtime_properties(self) -> list[TopicRuntimeProperties]:
        return cast(list[TopicRuntimeProperties], admin.list_runtime(self._catalog, "topic"))

    # ---- subscriptions ---------------------------------------------------------------------------------

    @_management
    def create_subscription(self, topic_name: str, subscription_name: str, **kwargs: object) -> SubscriptionProperties:
        """Creates the subscription with the rule '$Default' (TrueRuleFilter); it has its topic's partitions.

        Args:
            topic_name: The topic's name, or its properties.
            subscription_name: The subscription's name.
            **kwargs: Its settings, as azure-servicebus' (max_delivery_count, lock_duration, requires_session,
                forward_to, ...); the others take their defaults.

        Returns:
            The subscription's properties.

        Raises:
            MessagingEntityNotFoundError: there is no such topic.
            MessagingEntityAlreadyExistsError: the topic has a subscription of that name.
            ServiceBusQuotaExceededError: the topic has the most subscriptions allowed.
            TypeError: an unknown setting.
        """
        topic_name = _name_of(topic_name, "topic")
        validate_child_name(subscription_name, "subscription")
        return admin.create_subscription(self._catalog, topic_name, subscription_name,
                                         entities.check_options("subscription", kwargs))

    @_management
    def get_subscription(self, topic_name: str, subscription_name: str) -> SubscriptionProperties:
        """A subscription's settings.

        Args:
            topic_name: The topic's name, or its properties.
            subscription_name: The subscription's name, or its properties.

        Returns:
            The subscription's properties.

        Raises:
            MessagingEntityNotFoundError: there is no such topic or subscription.
        """
        return admin.get_subscription(self._catalog, _name_of(topic_name, "topic"),
                                      _name_of(subscription_name, "subscription"))

    @_management
    def list_subscriptions(self, topic_name: str) -> list[SubscriptionProperties]:
        """The settings of every subscription of a topic.

        Args:
            topic_name: The topic's name, or its properties.

        Returns:
            The subscriptions' properties.

        Raises:
            MessagingEntityNotFoundError: there is no such topic.
        """
        return cast(list[SubscriptionProperties],
                    admin.list_entities(self._catalog, "subscription", _name_of(topic_name, "topic")))

    @_management
    def update_subscription(self, topic_name: str, subscription: Union[SubscriptionProperties, dict[str, Any], str],
                            **kwargs: object) -> None:
        """Change a subscription's settings.

        Args:
            topic_name: The topic's name, or its properties.
            subscription: The subscription's properties (as get_subscription returns them, changed), a dict of
                them, or its name.
            **kwargs: Settings to change, over those subscription carries; needed when subscription is a name.

        Raises:
            MessagingEntityNotFoundError: there is no such topic or subscription.
            InvalidOperationError: a setting that is fixed at creation would change.
            TypeError: an unknown setting, or a name without settings to change.
        """
        path = subscription_path(_name_of(topic_name, "topic"), _name_of(subscription, "subscription"))
        self._update("subscription", path, entities.settable_values("subscription", subscription, kwargs))

    @_management
    def delete_subscription(self, topic_name: str, subscription: Union[str, SubscriptionProperties]) -> None:
        """Delete a subscription with its rules and all its data.

        Args:
            topic_name: The topic's name, or its properties.
            subscription: The subscription's name, or its properties.

        Raises:
            MessagingEntityNotFoundError: there is no such subscription.
        """
        path = subscription_path(_name_of(topic_name, "topic"), _name_of(subscription, "subscription"))
        admin.delete_entity(self._catalog, "subscription", path)

    @_management
    def get_subscription_runtime_properties(self, topic_name: str,
                                            subscription_name: str) -> SubscriptionRuntimeProperties:
        """A subscription's message counts.

        Args:
            topic_name: The topic's name, or its properties.
            subscription_name: The subscription's name, or its properties.

        Returns:
            The subscription's runtime properties.

        Raises:
            MessagingEntityNotFoundError: there is no such topic or subscription.
        """
        return admin.get_subscription_runtime(self._catalog, _name_of(topic_name, "topic"),
                                              _name_of(subscription_name, "subscription"))

    @_management
    def list_subscriptions_runtime_properties(self, topic_name: str) -> list[SubscriptionRuntimeProperties]:
        """The message counts of every subscription of a topic.

        Args:
            topic_name: The topic's name, or its properties.

        Returns:
            The subscriptions' runtime properties.

        Raises:
            MessagingEntityNotFoundError: there is no such topic.
        """
        return cast(list[SubscriptionRuntimeProperties],
                    admin.list_runtime(self._catalog, "subscription", _name_of(topic_name, "topic")))

    # ---- rules -----------------------------------------------------------------------------------------

    @_management
    def create_rule(self, topic_name: str, subscription_name: str, rule_name: str, *,
                    filter: Optional[RuleFilter] = None, action: Optional[SqlRuleAction] = None,
                    **kwargs: object) -> RuleProperties:
        """Add a rule to a subscription.

        Args:
            topic_name: The topic's name, or its properties.
            subscription_name: The subscription's name, or its properties.
            rule_name: The rule's name.
            filter: A SqlRuleFilter, CorrelationRuleFilter, TrueRuleFilter or FalseRuleFilter; default:
                TrueRuleFilter.
            action: A SqlRuleAction run on the messages the filter takes; default: none.

        Returns:
            The rule's properties.

        Raises:
            MessagingEntityNotFoundError: there is no such topic or subscription.
            MessagingEntityAlreadyExistsError: the subscription has a rule of that name.
            TypeError: another keyword argument, or a filter or action of another type.
            ValueError: the filter's or action's SQL does not parse.
        """
        if kwargs:
            raise TypeError(f"unknown rule option(s) {sorted(kwargs)}; allowed: filter, action")
        validate_child_name(rule_name, "rule")
        rule_filter, rule_action = check_filter(filter), check_action(action)
        return admin.create_rule(self._catalog, _name_of(topic_name, "topic"),
                                 _name_of(subscription_name, "subscription"), rule_name, rule_filter, rule_action)

    @_management
    def get_rule(self, topic_name: str, subscription_name: str, rule_name: str) -> RuleProperties:
        """A rule of a subscription.

        Args:
            topic_name: The topic's name, or its properties.
            subscription_name: The subscription's name, or its properties.
            rule_name: The rule's name.

        Returns:
            The rule's properties.

        Raises:
            MessagingEntityNotFoundError: there is no such topic, subscription or rule.
        """
        return admin.get_rule(self._catalog, _name_of(topic_name, "topic"), _name_of(subscription_name, "subscription"),
                              rule_name)

    @_management
    def list_rules(self, topic_name: str, subscription_name: str) -> list[RuleProperties]:
        """The rules of a subscription.

        Args:
            topic_name: The topic's name, or its properties.
            subscription_name: The subscription's name, or its properties.

        Returns:
            The rules' properties.

        Raises:
            MessagingEntityNotFoundError: there is no such topic or subscription.
        """
        return admin.list_rules(self._catalog, _name_of(topic_name, "topic"),
                                _name_of(subscription_name, "subscription"))

    @_management
    def update_rule(self, topic_name: str, subscription_name: str, rule: Union[RuleProperties, dict[str, Any], str],
                    **kwargs: object) -> None:
        """Replace a rule's filter and/or action; what is not given keeps its stored value.

        Args:
            topic_name: The topic's name, or its properties.
            subscription_name: The subscription's name, or its properties.
            rule: The rule's properties (as get_rule returns them, changed), a dict of them, or its name.
            **kwargs: filter and/or action, over those rule carries.

        Raises:
            MessagingEntityNotFoundError: there is no such topic, subscription or rule.
            TypeError: an option other than filter and action, or a filter or action of another type.
            ValueError: the filter's or action's SQL does not parse.
        """
        given: dict[str, object]
        if isinstance(rule, RuleProperties):
            given = {"filter": rule.filter, "action": rule.action}
        elif isinstance(rule, dict):
            given = {k: v for k, v in rule.items() if k not in ("name", "created_at_utc")}
        else:
            given = {}
        given.update(kwargs)
        unknown = sorted(set(given) - {"filter", "action"})
        if unknown:
            raise TypeError(f"unknown rule option(s) {unknown}; allowed: filter, action")
        rule_name = _name_of(rule, "rule")
        if "filter" in given:
            given["filter"] = check_filter(given["filter"])
        if "action" in given:
            given["action"] = check_action(given["action"])
        admin.update_rule(self._catalog, _name_of(topic_name, "topic"), _name_of(subscription_name, "subscription"),
                          rule_name, given)

    @_management
    def delete_rule(self, topic_name: str, subscription_name: str, rule: Union[str, RuleProperties]) -> None:
        """Delete a rule of a subscription.

        Args:
            topic_name: The topic's name, or its properties.
            subscription_name: The subscription's name, or its properties.
            rule: The rule's name, or its properties.

        Raises:
            MessagingEntityNotFoundError: there is no such topic, subscription or rule.
        """
        admin.delete_rule(self._catalog, _name_of(topic_name, "topic"), _name_of(subscription_name, "subscription"),
                          _name_of(rule, "rule"))

    # ---- storage ---------------------------------------------------------------------------------------

    def get_entity_tables(self, entity_path: str) -> dict[str, str]:
        """Role -> Delta table location of a queue, topic or subscription.

        Args:
            entity_path: A queue's or topic's name or '<topic>/Subscriptions/<name>'.

        Returns:
            Each table's location, by its role.

        Raises:
            MessagingEntityNotFoundError: there is no such entity.
        """
        return admin.entity_tables(self._catalog, entity_path)

    @_management
    def get_partition_message_counts(self, entity_path: str) -> dict[int, int]:
        """sparkbus: the messages in each partition of a queue, topic (those not yet fanned out) or
        subscription: how evenly partition keys, session ids and message ids spread the load.

        Args:
            entity_path: A queue's or topic's name or '<topic>/Subscriptions/<name>'.

        Returns:
            The message count by partition id, every partition named (0 when empty); a partition that cannot
            be read is left out.

        Raises:
            MessagingEntityNotFoundError: there is no such entity.
        """
        return admin.partition_message_counts(self._catalog, entity_path)

    def list_sessions(self, entity_path: str) -> list[SessionSummary]:
        """sparkbus: the sessions of a queue or subscription that hold messages or a stored lock or state
        (what Service Bus Explorer shows of sessions).

        Args:
            entity_path: A queue's name or '<topic>/Subscriptions/<name>'.

        Returns:
            The sessions, by session id, with their message count, lock and state size.

        Raises:
            MessagingEntityNotFoundError: there is no such entity.
        """
        return admin.sessions(self._catalog, entity_path)

    # ---- archive and replay ------------------------------------------------------------------------------

    def get_archive_table(self, entity_path: str) -> str:
        """sparkbus: the location of the Delta table holding the archive of a queue, topic or subscription
        (sparkbus.engine.archive), for any Delta reader; it exists once a message was archived.

        Raises:
            MessagingEntityNotFoundError: there is no such entity.
        """
        return archive.table_uri(admin.entity_tables(self._catalog, checked_name(entity_path)))

    def replay_messages(self, entity_path: str, *, start_time: datetime, end_time: Optional[datetime] = None,
                        to: Optional[str] = None, rule_filter: Union[SqlRuleFilter, CorrelationRuleFilter, None] = None,
                        replay_id: Optional[str] = None,
                        progress: Optional[Callable[[int], None]] = None) -> ReplayResult:
        """sparkbus: send again every archived message of a queue, topic or subscription enqueued in
        [start_time, end_time), as new messages (properties, session id and partition key kept; annotated
        with the application properties x-opt-replayed-from, x-opt-original-sequence-number and
        x-opt-original-enqueued-time), in enqueue order per partition. Exactly once per replay_id: a replay
        interrupted and run again with the same id continues and sends nothing twice. Charged to throttling
        as sends into `to`, batch by batch (each waits for credits; no management request is held open
        meanwhile).

        Args:
            entity_path: The entity whose archive is replayed (it has archive_retention set).
            start_time: The earliest enqueue time replayed (a naive datetime is UTC).
            end_time: Enqueue times before this are replayed (default: everything archived).
            to: The queue, topic or '<topic>/Subscriptions/<name>' to send to (default: the entity itself).
            rule_filter: A SqlRuleFilter or CorrelationRuleFilter: only the messages it matches.
            replay_id: Names the replay, to continue it (default: a new id, in the result).
            progress: Called with the number of messages of each batch sent (a progress bar).

        Returns:
            What was replayed, with the replay's id.

        Raises:
            MessagingEntityNotFoundError: the entity or `to` does not exist.
            InvalidOperationError: the entity keeps no archive.
            TypeError, ValueError: a time is not a datetime, end_time is not after start_time, or
                rule_filter is not a filter or does not parse.
        """
        start, end = self._time_range(start_time, end_time)
        if replay_id is not None and (not isinstance(replay_id, str) or not re.fullmatch(r"[A-Za-z0-9._-]{1,128}",
                                                                                           replay_id)):
            raise ValueError(f"replay_id must be 1 to 128 letters, digits, '.', '_' or '-', got {replay_id!r}")
        return replay.replay(self._catalog, checked_name(entity_path), start=start, end=end,
                             to=None if to is None else checked_name(to), rule_filter=rule_filter,
                             replay_id=replay_id, progress=progress)

    def seek_subscription(self, topic_name: str, subscription_name: str, time: datetime) -> ReplayResult:
        """sparkbus: make every message the subscription received since `time` (by enqueue time) and that
        has left it available to it again, as Pub/Sub's seek does: its archive replayed into it.

        Args:
            topic_name: The topic.
            subscription_name: The subscription (it has archive_retention set).
            time: Messages enqueued at or after this time come back (a naive datetime is UTC).

        Returns:
            What was replayed.

        Raises:
            MessagingEntityNotFoundError: there is no such subscription.
            InvalidOperationError: the subscription keeps no archive.
        """
        path = subscription_path(checked_name(topic_name, "topic"), checked_name(subscription_name, "subscription"))
        start, _ = self._time_range(time, None, "time")
        return replay.replay(self._catalog, path, start=start, end=None, to=path, rule_filter=None, replay_id=None)

    @staticmethod
    def _time_range(start: object, end: object, name: str = "start_time") -> tuple[datetime, Optional[datetime]]:
        first, last = to_utc(start, name), to_utc(end, "end_time")
        if first is None:
            raise TypeError(f"{name} must be a datetime, got None")
        if last is not None and last <= first:
            raise ValueError(f"end_time must be after {name}, got {last.isoformat()} <= {first.isoformat()}")
        return first, last

    def _update(self, kind: str, path: str, values: dict[str, Any]) -> None:
        admin.update_entity(self._catalog, kind, path, entities.check_options(kind, values))


def _name_of(entity: object, what: str) -> str:
    """The name of a `what` (queue, topic, subscription, rule) from a str or a properties object, as
    azure-servicebus accepts both, checked as written (names.checked_name: ValueError "invalid <what> name")."""
    if isinstance(entity, dict) and isinstance(entity.get("name"), str):
        entity = entity["name"]
    elif not isinstance(entity, str) and isinstance(name := getattr(entity, "name", None), str):
        entity = name
    if not isinstance(entity, str):
        raise TypeError(f"expected a {what} name (str) or a properties object with a name, got {type(entity).__name__}")
    return checked_name(entity, what)


# What ported code imports from azure.servicebus.management.
__all__ = ["ServiceBusAdministrationClient", "NamespaceProperties", "QueueProperties", "QueueRuntimeProperties",
           "TopicProperties", "TopicRuntimeProperties", "SubscriptionProperties", "SubscriptionRuntimeProperties",
           "RuleProperties", "SqlRuleFilter", "CorrelationRuleFilter", "TrueRuleFilter", "FalseRuleFilter",
           "SqlRuleAction", "AccessRights", "ApiVersion", "EntityAvailabilityStatus", "EntityStatus", "MessagingSku",
           "NamespaceType", "Metrics"]


def archive_table(namespace: str, entity_path: str) -> str:
    """The location of the Delta table holding an entity's archive (ServiceBusAdministrationClient's
    get_archive_table), e.g. for spark.read.format("delta").load(...) or deltalake.DeltaTable(...)."""
    return ServiceBusAdministrationClient(namespace).get_archive_table(entity_path)
