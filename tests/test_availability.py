"""The partition availability seam: faults fail management operations and report 'Limited'."""
from __future__ import annotations

import os

import pytest

from sparkbus import MessagingEntityNotFoundError, PartitionUnavailableError, set_partition_availability


def test_entity_partition_fault(admin, ns_path):
    admin.create_queue("q", enable_partitioning=True)
    admin.create_queue("other", enable_partitioning=True)
    set_partition_availability(ns_path, 3, False, entity_path="q", reason="disk")
    assert admin.get_queue("q").availability_status == "Limited"
    assert admin.get_queue_runtime_properties("q").availability_status == "Limited"
    assert admin.get_queue("other").availability_status == "Available"
    with pytest.raises(PartitionUnavailableError, match=r"cannot update queue 'q': partition\(s\) \[3\] unavailable"):
        admin.update_queue("q", max_delivery_count=3)
    with pytest.raises(PartitionUnavailableError):
        admin.delete_queue("q")
    assert admin.get_queue("q").max_delivery_count == 10
    set_partition_availability(ns_path, 3, True, entity_path="q")
    admin.update_queue("q", max_delivery_count=3)
    assert admin.get_queue("q").availability_status == "Available"
    assert admin.get_queue("q").max_delivery_count == 3
    tables = admin.get_entity_tables("q")
    admin.delete_queue("q")
    assert [q.name for q in admin.list_queues()] == ["other"]
    assert not any(os.path.exists(uri) for uri in tables.values())
    with pytest.raises(MessagingEntityNotFoundError):
        admin.get_queue("q")


def test_store_fault_affects_creates_of_partitioned_entities(admin, ns_path):
    set_partition_availability(ns_path, 5, False)
    with pytest.raises(PartitionUnavailableError, match="create topic 't'"):
        admin.create_topic("t", enable_partitioning=True)
    admin.create_queue("flat")  # one partition (0): not affected by a fault of partition 5
    assert admin.get_queue("flat").availability_status == "Available"
    assert admin.list_topics() == [] and [q.name for q in admin.list_queues()] == ["flat"]
    set_partition_availability(ns_path, 5, True)
    admin.create_topic("t", enable_partitioning=True)
    admin.create_subscription("t", "s")
    set_partition_availability(ns_path, 5, False, entity_path="t/Subscriptions/s")
    assert admin.get_subscription("t", "s").availability_status == "Limited"
    assert admin.get_topic("t").availability_status == "Available"  # only the subscription's partition is out
    with pytest.raises(PartitionUnavailableError, match="create rule"):
        admin.create_rule("t", "s", "r")
    assert [r.name for r in admin.list_rules("t", "s")] == ["$Default"]


def test_fault_arguments(admin, ns_path):
    admin.create_queue("q")
    with pytest.raises(ValueError, match="partitions 0..0"):
        set_partition_availability(ns_path, 1, False, entity_path="q")
    with pytest.raises(MessagingEntityNotFoundError):
        set_partition_availability(ns_path, 0, False, entity_path="nope")
    with pytest.raises(ValueError, match="partition_id must be an int"):
        set_partition_availability(ns_path, -1, False)
    assert admin.get_queue("q").availability_status == "Available"  # no refused call recorded a fault
    admin.update_queue("q", max_delivery_count=4)
    assert admin.get_queue("q").max_delivery_count == 4
