"""Queues and topics: properties, defaults, updates, immutability, tier rules, quotas and storage."""
from __future__ import annotations

import os
from datetime import timedelta

import pytest
from deltalake import DeltaTable

import sparkbus
from sparkbus import (InvalidOperationError, MessagingEntityAlreadyExistsError, MessagingEntityNotFoundError,
                      ServiceBusAdministrationClient, ServiceBusQuotaExceededError)
from sparkbus.core.durations import MAX_DURATION


def test_queue_defaults_match_service_bus(admin):
    q = admin.create_queue("orders")
    assert isinstance(q, sparkbus.QueueProperties)
    assert (q.name, q.enable_partitioning, q.partition_count, q.max_size_in_megabytes) == ("orders", False, 1, 1024)
    assert q.lock_duration == timedelta(minutes=1) and q.max_delivery_count == 10
    assert q.default_message_time_to_live == MAX_DURATION
    assert q.duplicate_detection_history_time_window == timedelta(minutes=10)
    assert (q.requires_session, q.requires_duplicate_detection, q.dead_lettering_on_message_expiration) == (False,) * 3
    assert (q.forward_to, q.status, q.availability_status, q.max_message_size_in_kilobytes) == (None, "Active", "Available", 256)
    assert q.created_at_utc is not None and q.created_at_utc == q.updated_at_utc
    assert admin.get_queue("orders") == q


def test_partitioned_queue_reports_per_partition_and_total_size(admin):
    q = admin.create_queue("big", enable_partitioning=True, max_size_in_megabytes=5120)
    assert q.partition_count == 16
    assert q.max_size_in_megabytes == 5120 and q.max_size_in_megabytes_per_partition == 5120
    assert q.total_max_size_in_megabytes == 81920


def test_all_queue_options_round_trip(admin):
    admin.create_queue("target")
    q = admin.create_queue("full", enable_partitioning=True, max_size_in_megabytes=2048,
                           requires_duplicate_detection=True, duplicate_detection_history_time_window="PT1H",
                           requires_session=True, lock_duration=timedelta(seconds=30), max_delivery_count=3,
                           default_message_time_to_live="P2D", dead_lettering_on_message_expiration=True,
                           forward_dead_lettered_messages_to="target", status="SendDisabled")
    got = admin.get_queue("full")
    assert got == q
    assert got.duplicate_detection_history_time_window == timedelta(hours=1)
    assert got.default_message_time_to_live == timedelta(days=2)
    assert (got.lock_duration, got.max_delivery_count, got.status) == (timedelta(seconds=30), 3, "SendDisabled")
    assert got.forward_dead_lettered_messages_to == "target"


@pytest.mark.parametrize("kwargs,error,text", [
    ({"lock_duration": timedelta(seconds=4)}, ValueError, "lock_duration must be between PT5S and PT5M"),
    ({"lock_duration": "PT6M"}, ValueError, "lock_duration must be between"),
    ({"max_delivery_count": 0}, ValueError, "max_delivery_count must be between 1"),
    ({"max_delivery_count": "3"}, TypeError, "max_delivery_count must be an int"),
    ({"max_size_in_megabytes": 1000}, ValueError, "max_size_in_megabytes must be one of [1024, 2048, 3072, 4096, 5120]"),
    ({"max_size_in_megabytes": 10240}, ValueError, "in the standard tier"),
    ({"duplicate_detection_history_time_window": "PT10S"}, ValueError, "between PT20S and P7D"),
    ({"enable_partitioning": "yes"}, TypeError, "enable_partitioning must be a bool"),
    ({"status": "Paused"}, ValueError, "status must be one of"),
    ({"max_message_size_in_kilobytes": 1024}, ValueError, "between 256 and 256"),
    ({"colour": "blue"}, TypeError, "unknown queue option"),
    ({"forward_to": "nowhere"}, MessagingEntityNotFoundError, "not a queue or topic"),
    ({"forward_to": "bad"}, InvalidOperationError, "cannot point at the entity itself"),
])
def test_invalid_queue_options_write_nothing(admin, ns_path, kwargs, error, text):
    with pytest.raises(error) as info:
        admin.create_queue("bad", **kwargs)
    assert text in str(info.value)
    assert admin.list_queues() == []
    assert not os.path.exists(os.path.join(ns_path, "entities")) or os.listdir(os.path.join(ns_path, "entities")) == []


def test_names_are_case_insensitive_and_shared_by_queues_and_topics(admin):
    admin.create_queue("Orders")
    with pytest.raises(MessagingEntityAlreadyExistsError, match="queue 'Orders' already exists"):
        admin.create_queue("orders")
    with pytest.raises(MessagingEntityAlreadyExistsError):
        admin.create_topic("ORDERS")
    assert admin.get_queue("oRdErS").name == "Orders"


def test_invalid_names(admin):
    for name in ("../x", "a//b", "a/Subscriptions/b", "x" * 261):
        with pytest.raises(ValueError, match="queue name"):
            admin.create_queue(name)
    with pytest.raises(ValueError, match="topic name"):
        admin.create_topic("-bad")


def test_update_queue_with_properties_and_kwargs(admin):
    admin.create_queue("q", lock_duration="PT30S")
    q = admin.get_queue("q")
    q.max_delivery_count = 7
    q.lock_duration = timedelta(minutes=2)
    admin.update_queue(q, default_message_time_to_live="PT1H")
    got = admin.get_queue("q")
    assert (got.max_delivery_count, got.lock_duration) == (7, timedelta(minutes=2))
    assert got.default_message_time_to_live == timedelta(hours=1)
    assert got.updated_at_utc > got.created_at_utc and got.created_at_utc == q.created_at_utc
    admin.update_queue({"name": "q", "status": "Disabled"})
    assert admin.get_queue("q").status == "Disabled"


@pytest.mark.parametrize("option", ["enable_partitioning", "requires_session", "requires_duplicate_detection"])
def test_fixed_at_creation(admin, option):
    admin.create_queue("q")
    q = admin.get_queue("q")
    setattr(q, option, True)
    with pytest.raises(InvalidOperationError, match=f"{option} of queue 'q' is fixed at creation"):
        admin.update_queue(q)
    assert getattr(admin.get_queue("q"), option) is False


def test_update_validates_and_writes_nothing(admin):
    admin.create_queue("q")
    before = admin.get_queue("q")
    with pytest.raises(ValueError, match="lock_duration"):
        admin.update_queue("q", lock_duration="PT1S")
    with pytest.raises(MessagingEntityNotFoundError, match="queue 'nope' does not exist"):
        admin.update_queue("nope", max_delivery_count=2)
    assert admin.get_queue("q") == before


def test_topics(admin):
    t = admin.create_topic("events", enable_partitioning=True, requires_duplicate_detection=True,
                           default_message_time_to_live="P1D")
    assert isinstance(t, sparkbus.TopicProperties) and t.partition_count == 16
    assert admin.get_topic("events") == t and [x.name for x in admin.list_topics()] == ["events"]
    with pytest.raises(TypeError, match="unknown topic option"):
        admin.create_topic("t2", requires_session=True)
    admin.update_topic("events", max_size_in_megabytes=4096)
    assert admin.get_topic("events").total_max_size_in_megabytes == 4096 * 16
    with pytest.raises(InvalidOperationError, match="fixed at creation"):
        admin.update_topic("events", enable_partitioning=False)
    with pytest.raises(MessagingEntityNotFoundError):
        admin.get_queue("events")


def test_list_and_delete_remove_data(admin, ns_path):
    admin.create_queue("a")
    admin.create_queue("b", enable_partitioning=True)
    tables = admin.get_entity_tables("b")
    assert set(tables) == {"messages", "locks", "sessions"}
    for uri in tables.values():
        table = DeltaTable(uri)
        assert table.metadata().partition_columns == ["partition_id"]
    assert [q.name for q in admin.list_queues()] == ["a", "b"]
    admin.delete_queue("b")
    assert [q.name for q in admin.list_queues()] == ["a"]
    assert not any(os.path.exists(uri) for uri in tables.values())
    with pytest.raises(MessagingEntityNotFoundError):
        admin.delete_queue("b")
    admin.create_queue("b")  # the name is free again, with fresh storage
    assert admin.get_entity_tables("b") != tables


def test_entity_quota_with_override(ns_path):
    sparkbus.create_namespace(ns_path, max_entities=3, max_partitioned_entities=2)
    admin = ServiceBusAdministrationClient(ns_path)
    admin.create_queue("p1", enable_partitioning=True)
    admin.create_topic("p2", enable_partitioning=True)
    with pytest.raises(ServiceBusQuotaExceededError, match="2 partitioned queues and topics"):
        admin.create_queue("p3", enable_partitioning=True)
    admin.create_queue("plain")
    with pytest.raises(ServiceBusQuotaExceededError, match="3 queues and topics"):
        admin.create_topic("one-more")
    admin.delete_queue("plain")
    admin.create_topic("one-more")
    assert len(admin.list_queues()) + len(admin.list_topics()) == 3


@pytest.mark.slow
def test_seed_default_of_100_partitioned_entities(admin):
    for i in range(100):
        admin.create_queue(f"q{i}", enable_partitioning=True) if i % 2 else admin.create_topic(f"t{i}", enable_partitioning=True)
    with pytest.raises(ServiceBusQuotaExceededError, match="100 partitioned"):
        admin.create_queue("q-extra", enable_partitioning=True)
    admin.create_queue("not-partitioned")  # non-partitioned entities still fit within 10,000
    assert len(admin.list_queues()) == 51 and len(admin.list_topics()) == 50


def test_premium_partitioning_is_the_namespaces(tmp_path):
    path = str(tmp_path / "p4")
    sparkbus.create_namespace(path, tier="premium", partition_count=4)
    admin = ServiceBusAdministrationClient(path)
    q = admin.create_queue("q", max_size_in_megabytes=81920, max_message_size_in_kilobytes=1024)
    assert (q.partition_count, q.enable_partitioning, q.max_message_size_in_kilobytes) == (4, True, 1024)
    assert q.total_max_size_in_megabytes == 81920 and q.max_size_in_megabytes_per_partition == 20480
    with pytest.raises(InvalidOperationError, match="Non-partitioned entities are not allowed in partitioned namespace"):
        admin.create_queue("flat", enable_partitioning=False)
    with pytest.raises(ValueError, match="between 1024 and 1024"):
        admin.create_topic("big-messages", max_message_size_in_kilobytes=2048)
    one = str(tmp_path / "p1")
    sparkbus.create_namespace(one, tier="premium")
    admin1 = ServiceBusAdministrationClient(one)
    assert admin1.create_topic("t", max_message_size_in_kilobytes=102400).partition_count == 1
    with pytest.raises(InvalidOperationError, match="chosen at namespace creation"):
        admin1.create_queue("q", enable_partitioning=True)


def test_basic_tier_has_queues_only(tmp_path):
    path = str(tmp_path / "basic")
    sparkbus.create_namespace(path, tier="basic")
    admin = ServiceBusAdministrationClient(path)
    assert admin.create_queue("q", enable_partitioning=True).partition_count == 16
    with pytest.raises(InvalidOperationError, match="topics are not available in the basic tier"):
        admin.create_topic("t")
    with pytest.raises(InvalidOperationError, match="requires_session is not available in the basic tier"):
        admin.create_queue("s", requires_session=True)
    with pytest.raises(InvalidOperationError, match="forward_to"):
        admin.update_queue("q", forward_to="q2")
