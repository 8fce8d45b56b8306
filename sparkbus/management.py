"""ServiceBusAdministrationClient: create, get, update, delete and list queues, topics, subscriptions and rules.

Each entity's catalog row and its Delta tables (messages, locks: partitioned by partition_id) are created
together: tables first under a fresh directory, then the catalog row in one atomic commit, so readers
never see an entity without storage. Deletion removes the catalog rows first, then the data.
"""
from __future__ import annotations

import functools
import os
import uuid
from datetime import datetime, timedelta
from typing import Callable, Collection, Optional, TypeVar, Union

from deltalake.exceptions import DeltaError

from . import storage
from .core import entities, forwarding, throttling, tiers
from .core.connection import parse_connection_string
from .core.entities import (QueueProperties, QueueRuntimeProperties, SubscriptionProperties,
                            SubscriptionRuntimeProperties, TopicProperties, TopicRuntimeProperties)
from .core.filters import (CorrelationRuleFilter, FalseRuleFilter, RuleProperties, SqlRuleAction, SqlRuleFilter,
                           TrueRuleFilter, action_from_json, action_to_json, check_action, check_filter,
                           filter_from_json, filter_quota_kind, filter_to_json)
from .core.names import (DEFAULT_RULE_NAME, checked_name, key, rule_path, split_subscription_path,
                         subscription_path, validate_child_name, validate_entity_name)
from .core.vocabulary import (AccessRights, ApiVersion, EntityAvailabilityStatus, EntityStatus, MessagingSku,
                              NamespaceType)
from .engine import fanout
from .engine.availability import (detected_faults, fault_of, mark_partition, require_available,
                                  unavailable_partitions)
from .engine.catalog import NAMESPACE_KEY, Catalog, Change, Row, Snapshot
from .engine import metrics
from .engine.metrics import Metrics
from .engine.namespace import NamespaceProperties, governor_of, namespace_properties, open_namespace, update_namespace
from .engine.retry import RetryPolicy
from .engine.throttle import Usage
from .engine.registry import remove_incarnation, resolve, table_uris
from .engine.runtime import Counts, entity_counts
from .exceptions import (InvalidOperationError, MessagingEntityAlreadyExistsError, MessagingEntityNotFoundError,
                         ServiceBusQuotaExceededError, StorageError)
from .storage.schemas import ENTITY_TABLES, TABLE_CONFIGURATION

ENTITIES_DIR = "entities"
TOP_LEVEL = ("queue", "topic")
MANAGED = Usage(throttling.MANAGEMENT_COST)
F = TypeVar("F", bound=Callable)


def _management(method: F) -> F:
    """A management operation: admitted by the namespace's throttling and charged 10 credits (seed),
    retried under the client's retry policy when throttled; counted on the namespace's metrics."""
    @functools.wraps(method)
    def charged(self: "ServiceBusAdministrationClient", *args: object, **kwargs: object) -> object:
        try:
            return self._governor.call(metrics.NAMESPACE, lambda: method(self, *args, **kwargs), lambda _: MANAGED,
                                       self._retry)
        except (OSError, DeltaError) as error:  # not a conflict (those are retried): the storage said no
            raise StorageError(f"{method.__name__}: the namespace's storage failed: {error}") from error
    return charged  # type: ignore[return-value]


class ServiceBusAdministrationClient:
    """Management plane of a namespace, constructed as azure-servicebus':
    ServiceBusAdministrationClient(fully_qualified_namespace, credential, **kwargs) with the namespace's
    location (a directory or file:// URI, optionally written 'sparkbus://<location>'), or
    from_connection_string(conn_str). The credential is accepted and ignored by local namespaces.

    Retry settings are azure-core's (retry_total=10, retry_backoff_factor=0.8, retry_backoff_max=120,
    retry_mode="exponential"): a throttled management call is retried under them. Other azure-core
    keyword arguments (api_version, logging_enable, ...) are accepted and ignored.
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
    def from_connection_string(cls, conn_str: str, **kwargs: object) -> "ServiceBusAdministrationClient":
        """Accepts 'Endpoint=sparkbus://<namespace path or URI>;...' (EntityPath is ignored, as in the SDK)."""
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
        return self._namespace(self._catalog.snapshot())

    def set_partition_availability(self, entity_path: Optional[str], partition_id: int, available: bool, *,
                                   reason: str = "") -> None:
        """Operator control: mark partition_id of an entity (entity_path None: of every entity) unavailable
        (available False) or available again. While it is unavailable, keyless sends go to other
        partitions, keyed sends raise PartitionUnavailableError, receives serve the other partitions and
        management operations on the entity fail; get_* report availability_status "Limited"."""
        mark_partition(self._catalog, partition_id, available, entity_path=entity_path, reason=reason)

    def _namespace(self, snap: Snapshot) -> NamespaceProperties:
        return namespace_properties(snap.rows[NAMESPACE_KEY], self._catalog.root)

    def update_namespace(self, *, messaging_units: Optional[int] = None,
                         credits_per_second: object = ...) -> NamespaceProperties:
        """Scale a premium namespace to messaging_units (1, 2, 4, 8 or 16), or set a basic/standard one's
        credits_per_second (None: no credit throttling). Running clients follow at their next operation."""
        return update_namespace(self._catalog, messaging_units=messaging_units, credits_per_second=credits_per_second)

    # ---- metrics ---------------------------------------------------------------------------------------

    def get_namespace_metrics(self, *, start_time: Optional[datetime] = None, end_time: Optional[datetime] = None,
                              period: timedelta = metrics.MINUTE) -> Metrics:
        """Request and message counts of the whole namespace, per period (a minute, or 10 seconds or any
        multiple of it; ValueError otherwise) and in total: what every process persisted to the metrics
        table, plus this process's counts not yet persisted."""
        return metrics.read(self._catalog.root, self._governor.recorder, start=start_time, end=end_time,
                            period=period)

    def get_entity_metrics(self, entity_path: str, *, start_time: Optional[datetime] = None,
                           end_time: Optional[datetime] = None, period: timedelta = metrics.MINUTE) -> Metrics:
        """The data-plane counts of one queue, topic or subscription ('<topic>/Subscriptions/<name>');
        management operations are the namespace's. period as get_namespace_metrics."""
        row = self._find(self._catalog.snapshot(), None, entity_path)
        return metrics.read(self._catalog.root, self._governor.recorder, entity=row.path, start=start_time,
                            end=end_time, period=period)

    # ---- queues and topics -----------------------------------------------------------------------------

    @_management
    def create_queue(self, queue_name: str, **kwargs: object) -> entities.QueueProperties:
        return self._create_top_level("queue", queue_name, kwargs)

    @_management
    def create_topic(self, topic_name: str, **kwargs: object) -> entities.TopicProperties:
        return self._create_top_level("topic", topic_name, kwargs)

    @_management
    def get_queue(self, queue_name: str) -> entities.QueueProperties:
        snap = self._catalog.snapshot()
        return self._properties(snap, self._find(snap, "queue", _name_of(queue_name, "queue")))

    @_management
    def get_topic(self, topic_name: str) -> entities.TopicProperties:
        snap = self._catalog.snapshot()
        return self._properties(snap, self._find(snap, "topic", _name_of(topic_name, "topic")))

    @_management
    def list_queues(self) -> list[entities.QueueProperties]:
        snap = self._catalog.snapshot()
        return [self._properties(snap, row) for row in snap.of_kind("queue")]

    @_management
    def list_topics(self) -> list[entities.TopicProperties]:
        snap = self._catalog.snapshot()
        return [self._properties(snap, row) for row in snap.of_kind("topic")]

    @_management
    def update_queue(self, queue: Union[entities.QueueProperties, dict], **kwargs: object) -> None:
        self._update("queue", _name_of(queue, "queue"), entities.settable_values("queue", queue, kwargs))

    @_management
    def update_topic(self, topic: Union[entities.TopicProperties, dict], **kwargs: object) -> None:
        self._update("topic", _name_of(topic, "topic"), entities.settable_values("topic", topic, kwargs))

    @_management
    def delete_queue(self, queue: Union[str, entities.QueueProperties]) -> None:
        self._delete("queue", _name_of(queue, "queue"))

    @_management
    def delete_topic(self, topic: Union[str, entities.TopicProperties]) -> None:
        """Deletes the topic with its subscriptions, their rules, and all their data."""
        self._delete("topic", _name_of(topic, "topic"))

    @_management
    def get_queue_runtime_properties(self, queue_name: str) -> entities.QueueRuntimeProperties:
        snap = self._catalog.snapshot()
        return self._runtime(snap, self._find(snap, "queue", _name_of(queue_name, "queue")))

    @_management
    def get_topic_runtime_properties(self, topic_name: str) -> entities.TopicRuntimeProperties:
        snap = self._catalog.snapshot()
        return self._runtime(snap, self._find(snap, "topic", _name_of(topic_name, "topic")))

    @_management
    def get_topic_awaiting_fanout(self, topic_name: str) -> int:
        """sparkbus: how many of the topic's messages no fan-out has delivered to its subscriptions yet (those
        scheduled for later not counted). The namespace service or fanout_once delivers them."""
        snap = self._catalog.snapshot()
        row = self._find(snap, "topic", _name_of(topic_name, "topic"))
        return fanout.awaiting(resolve(self._catalog.root, snap, row.path, ("topic",)))

    @_management
    def list_queues_runtime_properties(self) -> list[entities.QueueRuntimeProperties]:
        snap = self._catalog.snapshot()
        return [self._runtime(snap, row) for row in snap.of_kind("queue")]

    @_management
    def list_topics_runtime_properties(self) -> list[entities.TopicRuntimeProperties]:
        snap = self._catalog.snapshot()
        return [self._runtime(snap, row) for row in snap.of_kind("topic")]

    # ---- subscriptions ---------------------------------------------------------------------------------

    @_management
    def create_subscription(self, topic_name: str, subscription_name: str,
                            **kwargs: object) -> entities.SubscriptionProperties:
        """Creates the subscription with the rule '$Default' (TrueRuleFilter); it has its topic's partitions."""
        topic_name = _name_of(topic_name, "topic")
        validate_child_name(subscription_name, "subscription")
        options = {**entities.defaults("subscription"), **entities.check_options("subscription", kwargs)}
        path = subscription_path(topic_name, subscription_name)

        def decide(snap: Snapshot, storage_dir: Optional[str]) -> Change:
            ns = self._namespace(snap)
            topic = self._find(snap, "topic", topic_name)
            _check_tier_features(ns, "subscription", options)
            if snap.get(key(path)):
                raise MessagingEntityAlreadyExistsError(f"subscription {path!r} already exists")
            if len(snap.children(topic.key, "subscription")) >= ns.limits.max_subscriptions_per_topic:
                raise ServiceBusQuotaExceededError(
                    f"topic {topic.path!r} already has {ns.limits.max_subscriptions_per_topic} subscriptions, the most allowed")
            self._check_forwarding(snap, path, options, topic.key)
            require_available(snap, topic.key, topic.partition_count, f"create subscription {path!r}")
            row = Row(key=key(path), kind="subscription", path=path, parent=topic.key,
                      partition_count=topic.partition_count, storage=storage_dir,
                      properties=entities.options_to_json(options))
            default_rule = _rule_row(row, DEFAULT_RULE_NAME, TrueRuleFilter(), None)
            return Change(upserts=[row, default_rule], result=row)

        return self._create_with_storage(decide)

    @_management
    def get_subscription(self, topic_name: str, subscription_name: str) -> entities.SubscriptionProperties:
        snap = self._catalog.snapshot()
        row = self._find_subscription(snap, _name_of(topic_name, "topic"), _name_of(subscription_name, "subscription"))
        return self._properties(snap, row)

    @_management
    def list_subscriptions(self, topic_name: str) -> list[entities.SubscriptionProperties]:
        snap = self._catalog.snapshot()
        topic = self._find(snap, "topic", _name_of(topic_name, "topic"))
        return [self._properties(snap, row) for row in snap.children(topic.key, "subscription")]

    @_management
    def update_subscription(self, topic_name: str, subscription: Union[entities.SubscriptionProperties, dict],
                            **kwargs: object) -> None:
        path = subscription_path(_name_of(topic_name, "topic"), _name_of(subscription, "subscription"))
        self._update("subscription", path, entities.settable_values("subscription", subscription, kwargs))

    @_management
    def delete_subscription(self, topic_name: str, subscription: Union[str, entities.SubscriptionProperties]) -> None:
        path = subscription_path(_name_of(topic_name, "topic"), _name_of(subscription, "subscription"))
        self._delete("subscription", path)

    @_management
    def get_subscription_runtime_properties(self, topic_name: str,
                                            subscription_name: str) -> entities.SubscriptionRuntimeProperties:
        snap = self._catalog.snapshot()
        row = self._find_subscription(snap, _name_of(topic_name, "topic"), _name_of(subscription_name, "subscription"))
        return self._runtime(snap, row)

    @_management
    def list_subscriptions_runtime_properties(self, topic_name: str) -> list[entities.SubscriptionRuntimeProperties]:
        snap = self._catalog.snapshot()
        topic = self._find(snap, "topic", _name_of(topic_name, "topic"))
        return [self._runtime(snap, row) for row in snap.children(topic.key, "subscription")]

    # ---- rules -----------------------------------------------------------------------------------------

    @_management
    def create_rule(self, topic_name: str, subscription_name: str, rule_name: str, *, filter: object = None,
                    action: object = None, **kwargs: object) -> RuleProperties:
        if kwargs:
            raise TypeError(f"unknown rule option(s) {sorted(kwargs)}; allowed: filter, action")
        validate_child_name(rule_name, "rule")
        rule_filter, rule_action = check_filter(filter), check_action(action)
        topic_name, subscription_name = _name_of(topic_name, "topic"), _name_of(subscription_name, "subscription")

        def decide(snap: Snapshot) -> Change:
            sub = self._find_subscription(snap, topic_name, subscription_name)
            if snap.get(key(rule_path(topic_name, subscription_name, rule_name))):
                raise MessagingEntityAlreadyExistsError(f"rule {rule_name!r} already exists on {sub.path!r}")
            self._check_filter_quota(snap, sub.parent, rule_filter)
            require_available(snap, sub.key, sub.partition_count, f"create rule {rule_name!r}")
            row = _rule_row(sub, rule_name, rule_filter, rule_action)
            return Change(upserts=[row], result=row)

        return _rule_properties(self._catalog.transact(decide))

    @_management
    def get_rule(self, topic_name: str, subscription_name: str, rule_name: str) -> RuleProperties:
        snap = self._catalog.snapshot()
        return _rule_properties(self._find_rule(snap, _name_of(topic_name, "topic"),
                                                _name_of(subscription_name, "subscription"), rule_name))

    @_management
    def list_rules(self, topic_name: str, subscription_name: str) -> list[RuleProperties]:
        snap = self._catalog.snapshot()
        sub = self._find_subscription(snap, _name_of(topic_name, "topic"), _name_of(subscription_name, "subscription"))
        return [_rule_properties(row) for row in snap.children(sub.key, "rule")]

    @_management
    def update_rule(self, topic_name: str, subscription_name: str, rule: Union[RuleProperties, dict, str],
                    **kwargs: object) -> None:
        """Replace a rule's filter and/or action; what is not given keeps its stored value."""
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
        topic_name, subscription_name = _name_of(topic_name, "topic"), _name_of(subscription_name, "subscription")
        if "filter" in given:
            check_filter(given["filter"])
        if "action" in given:
            check_action(given["action"])

        def decide(snap: Snapshot) -> Change:
            row = self._find_rule(snap, topic_name, subscription_name, rule_name)
            sub = snap.rows[row.parent]
            stored = _rule_properties(row)
            rule_filter = check_filter(given.get("filter", stored.filter))
            rule_action = given.get("action", stored.action)
            if filter_quota_kind(rule_filter) != filter_quota_kind(stored.filter):
                self._check_filter_quota(snap, sub.parent, rule_filter)
            require_available(snap, sub.key, sub.partition_count, f"update rule {rule_name!r}")
            return Change(upserts=[row.updated(_rule_json(rule_filter, rule_action))])

        self._catalog.transact(decide)

    @_management
    def delete_rule(self, topic_name: str, subscription_name: str, rule: Union[str, RuleProperties]) -> None:
        topic_name, subscription_name = _name_of(topic_name, "topic"), _name_of(subscription_name, "subscription")
        rule_name = _name_of(rule, "rule")

        def decide(snap: Snapshot) -> Change:
            row = self._find_rule(snap, topic_name, subscription_name, rule_name)
            sub = snap.rows[row.parent]
            require_available(snap, sub.key, sub.partition_count, f"delete rule {rule_name!r}")
            return Change(deletes=[row.key])

        self._catalog.transact(decide)

    # ---- storage ---------------------------------------------------------------------------------------

    def get_entity_tables(self, entity_path: str) -> dict[str, str]:
        """Role -> Delta table location of a queue, topic or subscription ('<topic>/Subscriptions/<name>')."""
        snap = self._catalog.snapshot()
        row = self._find(snap, None, entity_path)
        return table_uris(self._catalog.root, row)

    # ---- internals -------------------------------------------------------------------------------------

    def _create_top_level(self, kind: str, name: str, kwargs: dict) -> object:
        validate_entity_name(name, kind)
        given = entities.check_options(kind, kwargs)

        def decide(snap: Snapshot, storage_dir: Optional[str]) -> Change:
            ns = self._namespace(snap)
            options = _complete_options(ns, kind, given)
            count = tiers.entity_partition_count(ns.tier, ns.partition_count, options["enable_partitioning"])
            existing = snap.get(key(name))
            if existing is not None:
                raise MessagingEntityAlreadyExistsError(f"{existing.kind} {existing.path!r} already exists")
            _check_quota(ns, snap, count)
            self._check_forwarding(snap, name, options)
            require_available(snap, None, count, f"create {kind} {name!r}")
            row = Row(key=key(name), kind=kind, path=name, partition_count=count, storage=storage_dir,
                      properties=entities.options_to_json(options))
            return Change(upserts=[row], result=row)

        return self._create_with_storage(decide)

    def _create_with_storage(self, decide: Callable[[Snapshot, Optional[str]], Change]) -> object:
        """Check first (nothing written on bad input), then create the tables, then commit the catalog row.

        Returns the new entity's properties, built from the snapshot the commit was based on.
        """
        first = self._catalog.snapshot()
        decide(first, None)
        storage_dir = os.path.join(ENTITIES_DIR, uuid.uuid4().hex)
        location = storage.location.join(self._catalog.root, storage_dir)

        def decide_with_storage(snap: Snapshot) -> Change:
            change = decide(snap, storage_dir)
            change.result = (snap, change.result)
            return change

        try:
            for role, schema in ENTITY_TABLES.items():
                storage.create_table(storage.location.join(location, role), schema, configuration=TABLE_CONFIGURATION[role])
            snap, row = self._catalog.transact(decide_with_storage, first)
            return self._properties(Snapshot(snap.version, {**snap.rows, row.key: row}), row)
        except BaseException:
            storage.remove_tree(location)
            raise

    def _update(self, kind: str, path: str, values: dict) -> None:
        given = entities.check_options(kind, values)

        def decide(snap: Snapshot) -> Change:
            row = self._find(snap, kind, path)
            ns = self._namespace(snap)
            current = entities.options_from_json(row.properties)
            for name, value in given.items():
                if entities.OPTIONS[name].immutable and value != current[name]:
                    raise InvalidOperationError(
                        f"{name} of {kind} {row.path!r} is fixed at creation ({current[name]}); it cannot change to {value}")
            options = {**current, **given}
            if kind in TOP_LEVEL:
                options = _complete_options(ns, kind, options)
            _check_tier_features(ns, kind, options)
            self._check_forwarding(snap, row.path, options, row.parent)
            require_available(snap, row.key, row.partition_count, f"update {kind} {row.path!r}")
            stored = entities.options_to_json(options)
            if stored == row.properties:  # nothing changes: no catalog version either
                return Change()
            return Change(upserts=[row.updated(stored)])

        self._catalog.transact(decide)

    def _delete(self, kind: str, path: str) -> None:
        def decide(snap: Snapshot) -> Change:
            row = self._find(snap, kind, path)
            require_available(snap, row.key, row.partition_count, f"delete {kind} {row.path!r}")
            doomed = [row] + _descendants(snap, row)
            return Change(deletes=[r.key for r in doomed], result=doomed)

        for gone in self._catalog.transact(decide):
            if gone.storage:  # now and after this process's maintenance of its tables (registry)
                remove_incarnation(self._catalog.root, gone.storage)

    def _find(self, snap: Snapshot, kind: Optional[str], path: str) -> Row:
        """The entity at path ('<topic>/Subscriptions/<name>' for a subscription), of `kind` unless None."""
        kinds = (kind,) if kind else ("queue", "topic", "subscription")
        row = snap.get(key(path, kind or "entity"))
        if row is None or row.kind not in kinds:
            what = f"{kind} {path!r} does not exist" if kind else f"no queue, topic or subscription {path!r}"
            raise MessagingEntityNotFoundError(f"{what} in namespace {self._catalog.root}")
        return row

    def _find_subscription(self, snap: Snapshot, topic_name: str, subscription_name: str) -> Row:
        topic = self._find(snap, "topic", topic_name)
        row = snap.get(key(subscription_path(topic.path, checked_name(subscription_name, "subscription"))))
        if row is None:
            raise MessagingEntityNotFoundError(f"subscription {subscription_name!r} of topic {topic.path!r} does not exist")
        return row

    def _find_rule(self, snap: Snapshot, topic_name: str, subscription_name: str, rule_name: str) -> Row:
        sub = self._find_subscription(snap, topic_name, subscription_name)
        row = snap.get(key(rule_path(topic_name, subscription_name, checked_name(rule_name, "rule"))))
        if row is None:
            raise MessagingEntityNotFoundError(f"rule {rule_name!r} of {sub.path!r} does not exist")
        return row

    def _check_forwarding(self, snap: Snapshot, path: str, options: dict, topic_key: Optional[str] = None) -> None:
        """Forwarding targets are existing queues or topics, never the entity itself, and forward_to must not
        close a loop (through other entities' forward_to and topics' subscriptions)."""
        for option in ("forward_to", "forward_dead_lettered_messages_to"):
            target = options.get(option)
            if target is None:
                continue
            if key(target, option) == key(path):
                raise InvalidOperationError(f"{option} of {path!r} cannot point at the entity itself")
            row = snap.get(key(target, option))
            if row is None or row.kind not in TOP_LEVEL:
                raise MessagingEntityNotFoundError(f"{option} target {target!r} is not a queue or topic in this namespace")
        if options.get("forward_to") is None:
            return
        forwards = {r.key: key(r.properties["forward_to"]) for r in snap.of_kind("queue", "subscription")
                    if r.properties.get("forward_to") and r.key != key(path)}
        delivers: dict[str, list[str]] = {}
        for sub in snap.of_kind("subscription"):
            delivers.setdefault(sub.parent, []).append(sub.key)
        if topic_key is not None and key(path) not in delivers.get(topic_key, []):
            delivers.setdefault(topic_key, []).append(key(path))
        loop = forwarding.cycle(key(path), key(options["forward_to"]), forwards, delivers)
        if loop is not None:
            names = " -> ".join(snap.rows[k].path if k in snap.rows else path for k in loop)
            raise InvalidOperationError(f"forward_to of {path!r} would close a forwarding loop: {names}")

    def _check_filter_quota(self, snap: Snapshot, topic_key: str, rule_filter: object) -> None:
        """Per topic: at most max_sql_filters_per_topic SQL and max_correlation_filters_per_topic correlation filters."""
        kind = filter_quota_kind(rule_filter)
        if kind is None:
            return
        ns = self._namespace(snap)
        most = ns.limits.max_sql_filters_per_topic if kind == "SQL" else ns.limits.max_correlation_filters_per_topic
        subs = {r.key for r in snap.children(topic_key, "subscription")}
        used = sum(1 for r in snap.of_kind("rule")
                   if r.parent in subs and filter_quota_kind(filter_from_json(r.properties["filter"])) == kind)
        if used >= most:
            raise ServiceBusQuotaExceededError(f"the topic already has {most} {kind} filters, the most allowed")

    def _properties(self, snap: Snapshot, row: Row) -> object:
        ns = self._namespace(snap)
        options = entities.options_from_json(row.properties)
        if row.kind in TOP_LEVEL:
            size = options["max_size_in_megabytes"]
            extra = {"max_size_in_megabytes_per_partition": tiers.size_per_partition_mb(ns.tier, size, row.partition_count),
                     "total_max_size_in_megabytes": tiers.total_size_mb(ns.tier, size, row.partition_count)}
            if row.kind == "topic":  # the SDK's TopicProperties carries the topic's size too
                extra["size_in_bytes"] = self._runtime(snap, row).size_in_bytes
        else:
            extra = {"topic_name": snap.rows[row.parent].path}
        down = (set(unavailable_partitions(snap, row.key, row.partition_count))
                | detected_faults(self._catalog.root, row.path))
        return entities.PROPERTIES_CLASS[row.kind](
            name=_display_name(row), partition_count=row.partition_count, availability_status=_status(down),
            created_at_utc=row.created_at_utc, updated_at_utc=row.updated_at_utc, **options, **extra)

    @_management
    def get_partition_message_counts(self, entity_path: str) -> dict[int, int]:
        """sparkbus: the messages in each partition of a queue, topic (those not yet fanned out) or subscription
        ('<topic>/Subscriptions/<name>'), every partition named (0 when empty): how evenly partition keys,
        session ids and message ids spread the load. A partition that cannot be read is left out."""
        snap = self._catalog.snapshot()
        row = self._find(snap, None, entity_path)
        counts, skipped = self._counts(snap, row)
        return {p: counts.by_partition.get(p, 0) for p in range(row.partition_count) if p not in skipped}

    def _counts(self, snap: Snapshot, row: Row) -> tuple[Counts, set[int]]:
        """The entity's engine counts and the partitions left out of them because their files cannot be read
        (reported as faults)."""
        uris = table_uris(self._catalog.root, row)
        subscriptions = snap.children(row.key, "subscription") if row.kind == "topic" else []
        cursors = None
        if row.kind == "topic":  # rows already fanned out to the subscriptions are not the topic's any more
            cursors = fanout.topic_cursors(storage.open_table(uris["messages"]), row.partition_count)
        skipped = set(detected_faults(self._catalog.root, row.path))
        while True:  # a partition whose files cannot be read is left out of the counts, and reported
            try:
                counts = entity_counts(uris["messages"], uris["locks"], fanned_out=cursors, skipped=skipped,
                                       header_copies=len(subscriptions) if row.kind == "topic" else 1)
                break
            except Exception as error:  # DataFusion's errors are plain Exceptions naming the file
                partition = fault_of(self._catalog.root, row.path, row.partition_count, error)
                if partition is None or partition in skipped:
                    raise
                skipped.add(partition)
        return counts, skipped

    def _runtime(self, snap: Snapshot, row: Row) -> object:
        counts, skipped = self._counts(snap, row)
        subscriptions = snap.children(row.key, "subscription") if row.kind == "topic" else []
        extra = {"subscription_count": len(subscriptions), **_filter_counts(snap, subscriptions)} if row.kind == "topic" else {}
        if row.kind == "subscription":
            extra = {"topic_name": snap.rows[row.parent].path}
        # Messages an entity forwards are pending transfer, not active (or dead-lettered) there.
        active, dead, transfer = counts.active, counts.dead_letter, 0
        options = entities.options_from_json(row.properties)
        if options.get("forward_to"):
            active, transfer = 0, transfer + active
        if options.get("forward_dead_lettered_messages_to"):
            dead, transfer = 0, transfer + dead
        if row.kind != "topic":
            extra.update(transfer_message_count=transfer,
                         transfer_dead_letter_message_count=counts.transfer_dead_letter)
        return entities.RUNTIME_CLASS[row.kind](
            name=_display_name(row), size_in_bytes=counts.size_in_bytes, active_message_count=active,
            dead_letter_message_count=dead, scheduled_message_count=counts.scheduled,
            total_message_count=counts.total, created_at_utc=row.created_at_utc,
            updated_at_utc=row.updated_at_utc, accessed_at_utc=counts.accessed_at_utc or row.created_at_utc,
            partition_count=row.partition_count,
            availability_status=_status(set(unavailable_partitions(snap, row.key, row.partition_count)) | skipped),
            **extra)


def _filter_counts(snap: Snapshot, subscriptions: list[Row]) -> dict[str, int]:
    """sql_filter_count and correlation_filter_count of a topic's subscriptions' rules."""
    kinds = [filter_quota_kind(filter_from_json(r.properties["filter"]))
             for sub in subscriptions for r in snap.children(sub.key, "rule")]
    return {"sql_filter_count": kinds.count("SQL"), "correlation_filter_count": kinds.count("correlation")}


def _name_of(entity: object, what: str) -> str:
    """The name of a `what` (queue, topic, subscription, rule) from a str or a properties object, as
    azure-servicebus accepts both, checked as written (names.checked_name: ValueError "invalid <what> name")."""
    if isinstance(entity, dict) and isinstance(entity.get("name"), str):
        entity = entity["name"]
    elif not isinstance(entity, str) and isinstance(getattr(entity, "name", None), str):
        entity = entity.name
    if not isinstance(entity, str):
        raise TypeError(f"expected a {what} name (str) or a properties object with a name, got {type(entity).__name__}")
    return checked_name(entity, what)


def _display_name(row: Row) -> str:
    """A subscription is named by its last path segment; queues and topics by their path."""
    return row.path.split("/")[-1] if row.kind == "subscription" else row.path


def _status(down: Collection[int]) -> str:
    return entities.LIMITED if down else entities.AVAILABLE


def _descendants(snap: Snapshot, row: Row) -> list[Row]:
    found = []
    for child in snap.rows.values():
        if child.parent == row.key:
            found += [child] + _descendants(snap, child)
    return found


def _rule_json(rule_filter: object, action: object) -> dict:
    return {"filter": filter_to_json(rule_filter), "action": action_to_json(action)}


def _rule_row(sub: Row, rule_name: str, rule_filter: object, action: object) -> Row:
    topic, sub_name = split_subscription_path(sub.path)
    path = rule_path(topic, sub_name, rule_name)
    return Row(key=key(path), kind="rule", path=path, parent=sub.key, partition_count=sub.partition_count,
               properties=_rule_json(rule_filter, action))


def _rule_properties(row: Row) -> RuleProperties:
    return RuleProperties(name=row.path.split("/")[-1], filter=filter_from_json(row.properties["filter"]),
                          action=action_from_json(row.properties["action"]), created_at_utc=row.created_at_utc)


def _check_quota(ns: NamespaceProperties, snap: Snapshot, partition_count: int) -> None:
    top = snap.of_kind(*TOP_LEVEL)
    if len(top) >= ns.limits.max_entities:
        raise ServiceBusQuotaExceededError(
            f"the namespace already has {ns.limits.max_entities} queues and topics, the most allowed in the {ns.tier} tier")
    if partition_count > 1 and ns.tier != "premium":
        partitioned = sum(1 for r in top if r.partition_count > 1)
        if partitioned >= ns.limits.max_partitioned_entities:
            raise ServiceBusQuotaExceededError(
                f"the namespace already has {ns.limits.max_partitioned_entities} partitioned queues and topics, "
                f"the most allowed in the {ns.tier} tier")


def _complete_options(ns: NamespaceProperties, kind: str, given: dict) -> dict:
    """Defaults filled in and the tier's rules for partitioning, sizes and features applied."""
    options = {**entities.defaults(kind), **given}
    if ns.tier == "premium":
        partitioned = ns.partition_count > 1
        if "enable_partitioning" in given and given["enable_partitioning"] != partitioned:
            if partitioned:
                raise InvalidOperationError("Non-partitioned entities are not allowed in partitioned namespace")
            raise InvalidOperationError(
                "premium partitioning is chosen at namespace creation; this namespace has 1 partition")
        options["enable_partitioning"] = partitioned
    sizes = tiers.allowed_sizes_mb(ns.tier)
    if options["max_size_in_megabytes"] not in sizes:
        raise ValueError(f"max_size_in_megabytes must be one of {list(sizes)} in the {ns.tier} tier, "
                         f"got {options['max_size_in_megabytes']!r}")
    options["max_message_size_in_kilobytes"] = _message_size_kb(ns, options["max_message_size_in_kilobytes"])
    _check_tier_features(ns, kind, options)
    return options


def _message_size_kb(ns: NamespaceProperties, value: object) -> int:
    limit = ns.limits.max_message_size_in_kilobytes
    if value is None:
        return limit
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_message_size_in_kilobytes must be an int, got {type(value).__name__}")
    if ns.tier == "premium" and ns.partition_count == 1:
        low, high = 1024, tiers.PREMIUM_LARGE_MESSAGE_KB
    else:
        low = high = limit
    if not low <= value <= high:
        raise ValueError(f"max_message_size_in_kilobytes must be between {low} and {high} in this {ns.tier} "
                         f"namespace, got {value}")
    return value


def _check_tier_features(ns: NamespaceProperties, kind: str, options: dict) -> None:
    """The basic tier has queues only, without sessions, duplicate detection or forwarding."""
    if ns.tier != "basic":
        return
    if kind != "queue":
        raise InvalidOperationError(f"{kind}s are not available in the basic tier; use standard or premium")
    for name in ("requires_session", "requires_duplicate_detection", "forward_to", "forward_dead_lettered_messages_to"):
        if options.get(name):
            raise InvalidOperationError(f"{name} is not available in the basic tier; use standard or premium")


# What ported code imports from azure.servicebus.management.
__all__ = ["ServiceBusAdministrationClient", "NamespaceProperties", "QueueProperties", "QueueRuntimeProperties",
           "TopicProperties", "TopicRuntimeProperties", "SubscriptionProperties", "SubscriptionRuntimeProperties",
           "RuleProperties", "SqlRuleFilter", "CorrelationRuleFilter", "TrueRuleFilter", "FalseRuleFilter",
           "SqlRuleAction", "AccessRights", "ApiVersion", "EntityAvailabilityStatus", "EntityStatus", "MessagingSku",
           "NamespaceType", "Metrics"]
