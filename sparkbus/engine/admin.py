"""Administration: creating, reading, updating and deleting queues, topics, subscriptions and rules in a
namespace's catalog, with the checks that guard them (quotas, tiers, forwarding loops, unavailable
partitions) and the properties and runtime counts the administration client returns.

Concurrency: every change is one catalog transaction (sparkbus.engine.catalog.Catalog.transact): its
decide function reads a snapshot, checks and returns the rows to write, and the commit is rejected if
another commit changed the catalog after that snapshot; decide then runs again on the new one. So a check
and the write it guards are one atomic step: two processes creating the same entity, or the last entity
a quota allows, cannot both succeed.

Creation: an entity's Delta tables (messages, locks, sessions) are created first under a fresh directory,
then the catalog row naming that directory is committed, so no reader ever sees an entity without
storage; the tables are removed again when the commit fails. Deletion removes the catalog rows first (the
entity and everything under it), then the data (sparkbus.engine.registry.remove_deleted).
"""
from __future__ import annotations

import functools
import os
import time
import uuid
from collections.abc import Collection
from typing import Any, Callable, Optional, TypeVar, Union

from .. import storage
from ..core import entities, forwarding, throttling, tiers
from ..core.entities import (DEFAULTS, EntityOptions, QueueProperties, QueueRuntimeProperties, SubscriptionProperties,
                             SubscriptionRuntimeProperties, TopicProperties, TopicRuntimeProperties)
from ..core.forwarding import fanout_app_id
from ..core.filters import (RuleFilter, RuleProperties, SqlRuleAction, TrueRuleFilter, action_to_json, check_filter, filter_quota_kind, filter_to_json)
from ..core.names import DEFAULT_RULE_NAME, checked_name, key, rule_path, split_subscription_path, subscription_path
from ..core.schemas import ENTITY_TABLES, TABLE_CONFIGURATION
from ..exceptions import (InvalidOperationError, MessagingEntityAlreadyExistsError, MessagingEntityNotFoundError,
                          ServiceBusQuotaExceededError, StorageError)
from . import archive, clock, fanout, metrics
from .availability import detected_faults, fault_of, require_available, unavailable_partitions
from .catalog import NAMESPACE_KEY, Catalog, Change, Row, Snapshot
from .namespace import NamespaceProperties, governor_of, namespace_properties
from .registry import remove_deleted, resolve, table_uris
from .retry import RetryPolicy
from .runtime import Counts, entity_counts
from .sessions import SessionSummary, summaries
from .throttle import Usage

T = TypeVar("T")
ENTITIES_DIR = "entities"
TOP_LEVEL = ("queue", "topic")
MANAGED = Usage(throttling.MANAGEMENT_COST)
ENTITY_POOL = "entities"  # the storage pool listings read their entities on, side by side
EntityProperties = Union[QueueProperties, TopicProperties, SubscriptionProperties]
RuntimeProperties = Union[QueueRuntimeProperties, TopicRuntimeProperties, SubscriptionRuntimeProperties]


def managed(catalog: Catalog, retry: RetryPolicy, what: str, operation: Callable[[], T]) -> T:
    """operation as a management request: admitted by the namespace's throttling and charged 10 credits
    (seed), retried under retry when throttled, counted on the namespace's metrics. StorageError when the
    storage refused (not a conflict: those are retried)."""
    try:
        return governor_of(catalog).call(metrics.NAMESPACE, operation, lambda _: MANAGED, retry)
    except (OSError, storage.DeltaError) as error:
        raise StorageError(f"{what}: the namespace's storage failed: {error}") from error


def namespace(catalog: Catalog, snap: Optional[Snapshot] = None) -> NamespaceProperties:
    """The namespace's properties as of snap (default: the catalog's current snapshot)."""
    snap = snap or catalog.snapshot()
    return namespace_properties(snap.rows[NAMESPACE_KEY], catalog.root)


# ---- finding entities ------------------------------------------------------------------------------------

def find(catalog: Catalog, snap: Snapshot, kind: Optional[str], path: str) -> Row:
    """The entity at path ('<topic>/Subscriptions/<name>' for a subscription), of `kind` unless None;
    MessagingEntityNotFoundError when there is none."""
    kinds = (kind,) if kind else ("queue", "topic", "subscription")
    row = snap.get(key(path, kind or "entity"))
    if row is None or row.kind not in kinds:
        what = f"{kind} {path!r} does not exist" if kind else f"no queue, topic or subscription {path!r}"
        raise MessagingEntityNotFoundError(f"{what} in namespace {catalog.root}")
    return row


def find_subscription(catalog: Catalog, snap: Snapshot, topic_name: str, subscription_name: str) -> Row:
    topic = find(catalog, snap, "topic", topic_name)
    row = snap.get(key(subscription_path(topic.path, checked_name(subscription_name, "subscription"))))
    if row is None:
        raise MessagingEntityNotFoundError(f"subscription {subscription_name!r} of topic {topic.path!r} does not exist")
    return row


def find_rule(catalog: Catalog, snap: Snapshot, topic_name: str, subscription_name: str, rule_name: str) -> Row:
    sub = find_subscription(catalog, snap, topic_name, subscription_name)
    row = snap.get(key(rule_path(topic_name, subscription_name, checked_name(rule_name, "rule"))))
    if row is None:
        raise MessagingEntityNotFoundError(f"rule {rule_name!r} of {sub.path!r} does not exist")
    return row


def entity_path(catalog: Catalog, path: str) -> str:
    """The stored path of the queue, topic or subscription at path (MessagingEntityNotFoundError if none)."""
    return find(catalog, catalog.snapshot(), None, path).path


def entity_tables(catalog: Catalog, path: str) -> dict[str, str]:
    """Role -> Delta table location of a queue, topic or subscription."""
    return table_uris(catalog.root, find(catalog, catalog.snapshot(), None, path))


# ---- reading properties ----------------------------------------------------------------------------------

def get_entity(catalog: Catalog, kind: str, path: str) -> EntityProperties:
    snap = catalog.snapshot()
    return properties(catalog, snap, find(catalog, snap, kind, path))


def get_subscription(catalog: Catalog, topic_name: str, subscription_name: str) -> SubscriptionProperties:
    snap = catalog.snapshot()
    found = properties(catalog, snap, find_subscription(catalog, snap, topic_name, subscription_name))
    assert isinstance(found, SubscriptionProperties)
    return found


def list_entities(catalog: Catalog, kind: str, topic_name: Optional[str] = None) -> list[EntityProperties]:
    """Every queue or topic (kind), or every subscription of topic_name."""
    snap = catalog.snapshot()
    return storage.concurrently([functools.partial(properties, catalog, snap, row)
                              for row in _listed(catalog, snap, kind, topic_name)], ENTITY_POOL)


def get_runtime(catalog: Catalog, kind: str, path: str) -> RuntimeProperties:
    snap = catalog.snapshot()
    return runtime(catalog, snap, find(catalog, snap, kind, path))


def get_subscription_runtime(catalog: Catalog, topic_name: str,
                             subscription_name: str) -> SubscriptionRuntimeProperties:
    snap = catalog.snapshot()
    found = runtime(catalog, snap, find_subscription(catalog, snap, topic_name, subscription_name))
    assert isinstance(found, SubscriptionRuntimeProperties)
    return found


def list_runtime(catalog: Catalog, kind: str, topic_name: Optional[str] = None) -> list[RuntimeProperties]:
    """The runtime properties of every queue or topic (kind), or every subscription of topic_name, read
    concurrently (a listing of many costs the storage round trips of one)."""
    snap = catalog.snapshot()
    return storage.concurrently([functools.partial(runtime, catalog, snap, row)
                              for row in _listed(catalog, snap, kind, topic_name)], ENTITY_POOL)


def _listed(catalog: Catalog, snap: Snapshot, kind: str, topic_name: Optional[str]) -> list[Row]:
    if kind != "subscription":
        return snap.of_kind(kind)
    assert topic_name is not None  # subscriptions are listed by topic
    return snap.children(find(catalog, snap, "topic", topic_name).key, "subscription")


def awaiting_fanout(catalog: Catalog, topic_name: str) -> int:
    """How many of the topic's messages no fan-out has delivered yet (scheduled ones not counted)."""
    snap = catalog.snapshot()
    row = find(catalog, snap, "topic", topic_name)
    return fanout.awaiting(resolve(catalog.root, snap, row.path, ("topic",)))


def partition_message_counts(catalog: Catalog, path: str) -> dict[int, int]:
    """The messages in each partition of the entity, every partition named (0 when empty); a partition
    that cannot be read is left out."""
    snap = catalog.snapshot()
    row = find(catalog, snap, None, path)
    counts, skipped = _counts(catalog, snap, row)
    return {p: counts.by_partition.get(p, 0) for p in range(row.partition_count) if p not in skipped}


def sessions(catalog: Catalog, path: str) -> list[SessionSummary]:
    """The sessions of a queue or subscription (sessions.summaries); a topic keeps none."""
    snap = catalog.snapshot()
    row = find(catalog, snap, None, path)
    return [] if row.kind == "topic" else summaries(table_uris(catalog.root, row), clock.now())


def properties(catalog: Catalog, snap: Snapshot, row: Row) -> EntityProperties:
    """The SDK's properties object of the entity's row."""
    ns = namespace(catalog, snap)
    options = row.options
    extra: dict[str, Any]  # the keywords of the properties class that the options do not give
    if row.kind in TOP_LEVEL:
        size = options.max_size_in_megabytes
        extra = {"max_size_in_megabytes_per_partition": tiers.size_per_partition_mb(ns.tier, size, row.partition_count),
                 "total_max_size_in_megabytes": tiers.total_size_mb(ns.tier, size, row.partition_count)}
        if row.kind == "topic":  # the SDK's TopicProperties carries the topic's size too
            extra["size_in_bytes"] = runtime(catalog, snap, row).size_in_bytes
    else:
        assert row.parent is not None  # a subscription's topic
        extra = {"topic_name": snap.rows[row.parent].path}
    down = (set(unavailable_partitions(snap, row.key, row.partition_count))
            | detected_faults(catalog.root, row.path))
    return entities.PROPERTIES_CLASS[row.kind](
        name=_display_name(row), partition_count=row.partition_count, availability_status=_status(down),
        created_at_utc=row.created_at_utc, updated_at_utc=row.updated_at_utc, **options.of_kind(row.kind), **extra)


def runtime(catalog: Catalog, snap: Snapshot, row: Row) -> RuntimeProperties:
    """The SDK's runtime properties object of the entity's row: its message counts now."""
    counts, skipped = _counts(catalog, snap, row)
    subscriptions = snap.children(row.key, "subscription") if row.kind == "topic" else []
    extra: dict[str, Any] = ({"subscription_count": len(subscriptions), **_filter_counts(snap, subscriptions)}
                             if row.kind == "topic" else {})
    if row.kind == "subscription":
        assert row.parent is not None  # a subscription's topic
        extra = {"topic_name": snap.rows[row.parent].path}
    # Messages an entity forwards are pending transfer, not active (or dead-lettered) there.
    active, deferred, dead, transfer = counts.active, counts.deferred, counts.dead_letter, 0
    options = row.options
    if options.forward_to:
        active, deferred, transfer = 0, 0, transfer + active
    if options.forward_dead_lettered_messages_to:
        dead, transfer = 0, transfer + dead
    if row.kind != "topic":
        extra.update(transfer_message_count=transfer,
                     transfer_dead_letter_message_count=counts.transfer_dead_letter)
    if options.archive_retention is not None:
        held = archive.held(table_uris(catalog.root, row))
        extra.update(archive_message_count=held.messages, archive_size_in_bytes=held.size_in_bytes)
    return entities.RUNTIME_CLASS[row.kind](
        name=_display_name(row), size_in_bytes=counts.size_in_bytes, active_message_count=active,
        deferred_message_count=deferred, dead_letter_message_count=dead, scheduled_message_count=counts.scheduled,
        total_message_count=counts.total, created_at_utc=row.created_at_utc,
        updated_at_utc=row.updated_at_utc, accessed_at_utc=counts.accessed_at_utc or row.created_at_utc,
        partition_count=row.partition_count,
        availability_status=_status(set(unavailable_partitions(snap, row.key, row.partition_count)) | skipped),
        **extra)


def _counts(catalog: Catalog, snap: Snapshot, row: Row) -> tuple[Counts, set[int]]:
    """The entity's engine counts and the partitions left out of them because their files cannot be read
    (reported as faults)."""
    uris = table_uris(catalog.root, row)
    subscriptions = snap.children(row.key, "subscription") if row.kind == "topic" else []
    cursors = None
    if row.kind == "topic":  # rows already fanned out to the subscriptions are not the topic's any more
        cursors = {p: fanout_app_id(p) for p in range(row.partition_count)}
    skipped = set(detected_faults(catalog.root, row.path))
    while True:  # a partition whose files cannot be read is left out of the counts, and reported
        try:
            counts = entity_counts(uris["messages"], uris["locks"], cursors=cursors, skipped=skipped,
                                   header_copies=len(subscriptions) if row.kind == "topic" else 1)
            break
        except Exception as error:  # DataFusion's errors are plain Exceptions naming the file
            partition = fault_of(catalog.root, row.path, row.partition_count, error)
            if partition is None or partition in skipped:
                raise
            skipped.add(partition)
    return counts, skipped


def _filter_counts(snap: Snapshot, subscriptions: list[Row]) -> dict[str, int]:
    """sql_filter_count and correlation_filter_count of a topic's subscriptions' rules."""
    kinds = [filter_quota_kind(r.rule_filter)
             for sub in subscriptions for r in snap.children(sub.key, "rule")]
    return {"sql_filter_count": kinds.count("SQL"), "correlation_filter_count": kinds.count("correlation")}


def _display_name(row: Row) -> str:
    """A subscription is named by its last path segment; queues and topics by their path."""
    return row.path.split("/")[-1] if row.kind == "subscription" else row.path


def _status(down: Collection[int]) -> str:
    return entities.LIMITED if down else entities.AVAILABLE


# ---- creating, updating, deleting entities --------------------------------------------------------------

def create_entity(catalog: Catalog, kind: str, name: str, given: dict[str, Any]) -> EntityProperties:
    """Create a queue or topic named name with the checked options given (the rest defaults)."""
    def decide(snap: Snapshot, storage_dir: Optional[str]) -> Change[Row]:
        ns = namespace(catalog, snap)
        options = _complete_options(ns, kind, given, DEFAULTS)
        count = tiers.entity_partition_count(ns.tier, ns.partition_count, options.enable_partitioning)
        existing = snap.get(key(name))
        if existing is not None:
            raise MessagingEntityAlreadyExistsError(f"{existing.kind} {existing.path!r} already exists")
        _check_quota(ns, snap, count)
        _check_forwarding(snap, name, options)
        require_available(snap, None, count, f"create {kind} {name!r}")
        row = Row(key=key(name), kind=kind, path=name, partition_count=count, storage=storage_dir,
                  properties=options.stored(kind))
        return Change(upserts=[row], result=row)

    return _create_with_storage(catalog, decide)


def create_subscription(catalog: Catalog, topic_name: str, subscription_name: str,
                        given: dict[str, Any]) -> SubscriptionProperties:
    """Create the subscription with the rule '$Default' (TrueRuleFilter); it has its topic's partitions."""
    options = DEFAULTS.changed(given)
    path = subscription_path(topic_name, subscription_name)

    def decide(snap: Snapshot, storage_dir: Optional[str]) -> Change[Row]:
        ns = namespace(catalog, snap)
        topic = find(catalog, snap, "topic", topic_name)
        _check_tier_features(ns, "subscription", options)
        if snap.get(key(path)):
            raise MessagingEntityAlreadyExistsError(f"subscription {path!r} already exists")
        if len(snap.children(topic.key, "subscription")) >= ns.limits.max_subscriptions_per_topic:
            raise ServiceBusQuotaExceededError(
                f"topic {topic.path!r} already has {ns.limits.max_subscriptions_per_topic} subscriptions, the most allowed")
        _check_forwarding(snap, path, options, topic.key)
        require_available(snap, topic.key, topic.partition_count, f"create subscription {path!r}")
        row = Row(key=key(path), kind="subscription", path=path, parent=topic.key,
                  partition_count=topic.partition_count, storage=storage_dir,
                  properties=options.stored("subscription"))
        default_rule = _rule_row(row, DEFAULT_RULE_NAME, TrueRuleFilter(), None)
        return Change(upserts=[row, default_rule], result=row)

    created = _create_with_storage(catalog, decide)
    assert isinstance(created, SubscriptionProperties)
    return created


def _create_with_storage(catalog: Catalog,
                         decide: Callable[[Snapshot, Optional[str]], Change[Row]]) -> EntityProperties:
    """Check first (nothing written on bad input), then create the tables, then commit the catalog row
    (module docstring). Returns the new entity's properties, built from the snapshot the commit was based on."""
    first = catalog.snapshot()
    decide(first, None)
    storage_dir = os.path.join(ENTITIES_DIR, uuid.uuid4().hex)
    location = storage.location.join(catalog.root, storage_dir)

    def decide_with_storage(snap: Snapshot) -> Change[tuple[Snapshot, Row]]:
        change = decide(snap, storage_dir)
        assert change.result is not None  # the new entity's row
        return Change(change.upserts, change.deletes, (snap, change.result))

    try:  # the tables side by side: each creation waits for several requests on an object store
        storage.concurrently([functools.partial(storage.create_table, storage.location.join(location, role), schema,
                                                configuration=TABLE_CONFIGURATION[role])
                              for role, schema in ENTITY_TABLES.items()], "create")
        created = catalog.transact(decide_with_storage, first)
        assert created is not None
        snap, row = created
        return properties(catalog, Snapshot(snap.version, {**snap.rows, row.key: row}), row)
    except BaseException:
        storage.remove_tree(location)
        raise


def update_entity(catalog: Catalog, kind: str, path: str, values: dict[str, Any]) -> None:
    """Set the checked options in values on the entity; InvalidOperationError for one fixed at creation.
    Switching its archive off removes the archive (sparkbus.engine.archive)."""
    def decide(snap: Snapshot) -> Change[Optional[Row]]:
        row = find(catalog, snap, kind, path)
        ns = namespace(catalog, snap)
        current = row.options
        for name, value in values.items():
            was = getattr(current, name)
            if entities.OPTIONS[name].immutable and value != was:
                raise InvalidOperationError(
                    f"{name} of {kind} {row.path!r} is fixed at creation ({was}); it cannot change to {value}")
        options = _complete_options(ns, kind, values, current) if kind in TOP_LEVEL else current.changed(values)
        _check_tier_features(ns, kind, options)
        _check_forwarding(snap, row.path, options, row.parent)
        require_available(snap, row.key, row.partition_count, f"update {kind} {row.path!r}")
        stored = options.stored(kind)
        if stored == row.properties:  # nothing changes: no catalog version either
            return Change()
        archive_off = current.archive_retention is not None and options.archive_retention is None
        return Change(upserts=[row.updated(stored)], result=row if archive_off else None)

    archive_off = catalog.transact(decide)
    if archive_off is not None and archive_off.storage is not None:
        storage.remove_tree(storage.location.join(catalog.root, archive_off.storage, archive.ROLE))


def delete_entity(catalog: Catalog, kind: str, path: str) -> None:
    """Delete the entity with everything under it (a topic's subscriptions, their rules) and their data."""
    def decide(snap: Snapshot) -> Change[list[Row]]:
        row = find(catalog, snap, kind, path)
        require_available(snap, row.key, row.partition_count, f"delete {kind} {row.path!r}")
        doomed = [row] + _descendants(snap, row)
        return Change(deletes=[r.key for r in doomed], result=doomed)

    doomed = catalog.transact(decide)
    deleted_at = time.monotonic()
    assert doomed is not None
    # a topic's subscriptions side by side; again later (registry: maintenance, writes vouched for ahead)
    remove_deleted(catalog.root, [gone.storage for gone in doomed if gone.storage], deleted_at)


def _descendants(snap: Snapshot, row: Row) -> list[Row]:
    found = []
    for child in snap.rows.values():
        if child.parent == row.key:
            found += [child] + _descendants(snap, child)
    return found


# ---- rules -------------------------------------------------------------------------------------------------

def create_rule(catalog: Catalog, topic_name: str, subscription_name: str, rule_name: str,
                rule_filter: RuleFilter, action: Optional[SqlRuleAction]) -> RuleProperties:
    """Add a checked rule to the subscription (the topic's filter quota applies)."""
    def decide(snap: Snapshot) -> Change[Row]:
        sub = find_subscription(catalog, snap, topic_name, subscription_name)
        if snap.get(key(rule_path(topic_name, subscription_name, rule_name))):
            raise MessagingEntityAlreadyExistsError(f"rule {rule_name!r} already exists on {sub.path!r}")
        assert sub.parent is not None  # a subscription's topic
        _check_filter_quota(catalog, snap, sub.parent, rule_filter)
        require_available(snap, sub.key, sub.partition_count, f"create rule {rule_name!r}")
        row = _rule_row(sub, rule_name, rule_filter, action)
        return Change(upserts=[row], result=row)

    created = catalog.transact(decide)
    assert created is not None
    return _rule_properties(created)


def get_rule(catalog: Catalog, topic_name: str, subscription_name: str, rule_name: str) -> RuleProperties:
    return _rule_properties(find_rule(catalog, catalog.snapshot(), topic_name, subscription_name, rule_name))


def list_rules(catalog: Catalog, topic_name: str, subscription_name: str) -> list[RuleProperties]:
    snap = catalog.snapshot()
    sub = find_subscription(catalog, snap, topic_name, subscription_name)
    return [_rule_properties(row) for row in snap.children(sub.key, "rule")]


def update_rule(catalog: Catalog, topic_name: str, subscription_name: str, rule_name: str,
                given: dict[str, Any]) -> None:
    """Replace the rule's filter and/or action (given: 'filter', 'action', checked); what is not given keeps
    its stored value."""
    def decide(snap: Snapshot) -> Change[None]:
        row = find_rule(catalog, snap, topic_name, subscription_name, rule_name)
        assert row.parent is not None  # a rule's subscription
        sub = snap.rows[row.parent]
        stored = _rule_properties(row)
        rule_filter = check_filter(given.get("filter", stored.filter))
        rule_action = given.get("action", stored.action)
        if filter_quota_kind(rule_filter) != filter_quota_kind(stored.filter):
            assert sub.parent is not None  # a subscription's topic
            _check_filter_quota(catalog, snap, sub.parent, rule_filter)
        require_available(snap, sub.key, sub.partition_count, f"update rule {rule_name!r}")
        return Change(upserts=[row.updated(_rule_json(rule_filter, rule_action))])

    catalog.transact(decide)


def delete_rule(catalog: Catalog, topic_name: str, subscription_name: str, rule_name: str) -> None:
    def decide(snap: Snapshot) -> Change[None]:
        row = find_rule(catalog, snap, topic_name, subscription_name, rule_name)
        assert row.parent is not None  # a rule's subscription
        sub = snap.rows[row.parent]
        require_available(snap, sub.key, sub.partition_count, f"delete rule {rule_name!r}")
        return Change(deletes=[row.key])

    catalog.transact(decide)


def _rule_json(rule_filter: RuleFilter, action: Optional[SqlRuleAction]) -> dict[str, Any]:
    return {"filter": filter_to_json(rule_filter), "action": action_to_json(action)}


def _rule_row(sub: Row, rule_name: str, rule_filter: RuleFilter, action: Optional[SqlRuleAction]) -> Row:
    parts = split_subscription_path(sub.path)
    assert parts is not None  # sub is a subscription
    topic, sub_name = parts
    path = rule_path(topic, sub_name, rule_name)
    return Row(key=key(path), kind="rule", path=path, parent=sub.key, partition_count=sub.partition_count,
               properties=_rule_json(rule_filter, action))


def _rule_properties(row: Row) -> RuleProperties:
    return RuleProperties(name=row.path.split("/")[-1], filter=row.rule_filter, action=row.rule_action,
                          created_at_utc=row.created_at_utc)


# ---- the checks ----------------------------------------------------------------------------------------

def _check_forwarding(snap: Snapshot, path: str, options: EntityOptions, topic_key: Optional[str] = None) -> None:
    """Forwarding targets are existing queues or topics, never the entity itself, and forward_to must not
    close a loop (through other entities' forward_to and topics' subscriptions)."""
    for option, target in (("forward_to", options.forward_to),
                           ("forward_dead_lettered_messages_to", options.forward_dead_lettered_messages_to)):
        if target is None:
            continue
        if key(target, option) == key(path):
            raise InvalidOperationError(f"{option} of {path!r} cannot point at the entity itself")
        row = snap.get(key(target, option))
        if row is None or row.kind not in TOP_LEVEL:
            raise MessagingEntityNotFoundError(f"{option} target {target!r} is not a queue or topic in this namespace")
    if options.forward_to is None:
        return
    forwards = {r.key: key(r.options.forward_to) for r in snap.of_kind("queue", "subscription")
                if r.options.forward_to and r.key != key(path)}
    delivers: dict[str, list[str]] = {}
    for sub in snap.of_kind("subscription"):
        assert sub.parent is not None  # a subscription's topic
        delivers.setdefault(sub.parent, []).append(sub.key)
    if topic_key is not None and key(path) not in delivers.get(topic_key, []):
        delivers.setdefault(topic_key, []).append(key(path))
    loop = forwarding.cycle(key(path), key(options.forward_to), forwards, delivers)
    if loop is not None:
        names = " -> ".join(snap.rows[k].path if k in snap.rows else path for k in loop)
        raise InvalidOperationError(f"forward_to of {path!r} would close a forwarding loop: {names}")


def _check_filter_quota(catalog: Catalog, snap: Snapshot, topic_key: str, rule_filter: RuleFilter) -> None:
    """Per topic: at most max_sql_filters_per_topic SQL and max_correlation_filters_per_topic correlation filters."""
    kind = filter_quota_kind(rule_filter)
    if kind is None:
        return
    ns = namespace(catalog, snap)
    most = ns.limits.max_sql_filters_per_topic if kind == "SQL" else ns.limits.max_correlation_filters_per_topic
    subs = {r.key for r in snap.children(topic_key, "subscription")}
    used = sum(1 for r in snap.of_kind("rule")
               if r.parent in subs and filter_quota_kind(r.rule_filter) == kind)
    if used >= most:
        raise ServiceBusQuotaExceededError(f"the topic already has {most} {kind} filters, the most allowed")


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


def _complete_options(ns: NamespaceProperties, kind: str, given: dict[str, Any], base: EntityOptions) -> EntityOptions:
    """A queue's or topic's options: base with the checked options given set, and the tier's rules for
    partitioning, sizes and features applied."""
    options = base.changed(given)
    if ns.tier == "premium":
        partitioned = ns.partition_count > 1
        if "enable_partitioning" in given and given["enable_partitioning"] != partitioned:
            if partitioned:
                raise InvalidOperationError("Non-partitioned entities are not allowed in partitioned namespace")
            raise InvalidOperationError(
                "premium partitioning is chosen at namespace creation; this namespace has 1 partition")
        options = options.changed({"enable_partitioning": partitioned})
    sizes = tiers.allowed_sizes_mb(ns.tier)
    if options.max_size_in_megabytes not in sizes:
        raise ValueError(f"max_size_in_megabytes must be one of {list(sizes)} in the {ns.tier} tier, "
                         f"got {options.max_size_in_megabytes!r}")
    options = options.changed({"max_message_size_in_kilobytes": _message_size_kb(ns, options.max_message_size_in_kilobytes)})
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


def _check_tier_features(ns: NamespaceProperties, kind: str, options: EntityOptions) -> None:
    """The basic tier has queues only, without sessions, duplicate detection or forwarding."""
    if ns.tier != "basic":
        return
    if kind != "queue":
        raise InvalidOperationError(f"{kind}s are not available in the basic tier; use standard or premium")
    for name, used in (("requires_session", options.requires_session),
                       ("requires_duplicate_detection", options.requires_duplicate_detection),
                       ("forward_to", options.forward_to),
                       ("forward_dead_lettered_messages_to", options.forward_dead_lettered_messages_to)):
        if used:
            raise InvalidOperationError(f"{name} is not available in the basic tier; use standard or premium")
