"""Partition outages from real storage faults (local namespaces): a partition whose files cannot be read or
written behaves like an unavailable one until it is repaired. The faults are made on the file system
(the suite runs as root here, so permissions would not stop it: a file where a partition's directory
was, a data file overwritten with garbage, a data file deleted); each test repairs what it broke."""
from __future__ import annotations

import glob
import os

import pytest

from sparkbus import PartitionUnavailableError, ServiceBusClient, ServiceBusMessage
from sparkbus.core import partitioning, sequencing
from sparkbus.engine.availability import DETECTED_SECONDS
from deltalake import DeltaTable

pytestmark = [pytest.mark.local_only, pytest.mark.slow]  # each waits out DETECTED_SECONDS


def key_for(partition: int) -> str:
    """A partition key that a 16-partition entity places in `partition`."""
    return next(k for k in (f"key{i}" for i in range(10_000))
                if partitioning.partition_codes([None], [k], [None], False, 16)[0] == partition)


def partition_dir(admin, entity: str, partition: int) -> str:
    return os.path.join(admin.get_entity_tables(entity)["messages"], f"partition_id={partition}")


def received_partitions(ns: str, entity: str) -> dict[int, int]:
    """Receive (and delete) everything a fresh client can: messages per partition."""
    got: dict[int, int] = {}
    with ServiceBusClient(ns).get_queue_receiver(entity, receive_mode="receiveanddelete", max_wait_time=0) as r:
        while batch := r.receive_messages(100):
            for m in batch:
                p = sequencing.partition_of_sequence(m.sequence_number)
                got[p] = got.get(p, 0) + 1
    return got


def filled(admin, ns: str) -> None:
    admin.create_queue("q", enable_partitioning=True)
    with ServiceBusClient(ns).get_queue_sender("q") as sender:
        for i in range(16):  # keyless sends go round robin: one file of two messages in each partition
            sender.send_messages([ServiceBusMessage(f"m{2 * i}"), ServiceBusMessage(f"m{2 * i + 1}")])


def test_a_partition_whose_directory_is_gone_serves_nothing_and_takes_nothing_until_repaired(admin, ns_path, clock):
    filled(admin, ns_path)
    broken = partition_dir(admin, "q", 3)
    os.rename(broken, broken + ".saved")
    with open(broken, "w") as f:  # a file where the directory was: its files can be neither read nor written
        f.write("not a directory")
    try:
        client = ServiceBusClient(ns_path)
        with client.get_queue_sender("q") as sender:
            with pytest.raises(PartitionUnavailableError, match="partition"):
                sender.send_messages(ServiceBusMessage("pinned", partition_key=key_for(3)))
            sender.send_messages([ServiceBusMessage(f"n{i}", message_id=f"n{i}") for i in range(32)])
        readable = DeltaTable(admin.get_entity_tables("q")["messages"]).to_pyarrow_table(
            filters=[("partition_id", "!=", 3)], columns=["message_id"])
        assert {f"n{i}" for i in range(32)} <= set(readable["message_id"].to_pylist())  # all placed elsewhere
        assert readable.num_rows == 30 + 32
        runtime = admin.get_queue_runtime_properties("q")
        assert runtime.availability_status == "Limited" and runtime.active_message_count == 62
        assert admin.get_queue("q").availability_status == "Limited"
        got = received_partitions(ns_path, "q")
        assert 3 not in got and sum(got.values()) == 62  # receives serve the other fifteen partitions
    finally:
        os.remove(broken)
        os.rename(broken + ".saved", broken)
    clock.advance(DETECTED_SECONDS + 0.5)  # found faulty partitions are tried again after this
    with ServiceBusClient(ns_path).get_queue_sender("q") as sender:
        sender.send_messages(ServiceBusMessage("pinned", partition_key=key_for(3)))
    assert admin.get_queue_runtime_properties("q").availability_status == "Available"
    assert admin.get_queue("q").availability_status == "Available"
    assert received_partitions(ns_path, "q") == {3: 3}  # its two and the keyed one: the refused one wrote nothing


@pytest.mark.parametrize("fault", ["corrupt", "missing"])
def test_a_partition_with_a_corrupt_or_missing_file_is_skipped_then_served_once_repaired(admin, ns_path, fault, clock):
    filled(admin, ns_path)
    victim = sorted(glob.glob(os.path.join(partition_dir(admin, "q", 5), "*.parquet")))[0]
    with open(victim, "rb") as f:
        original = f.read()
    if fault == "corrupt":
        with open(victim, "wb") as f:
            f.write(b"\0" * 64)
    else:
        os.remove(victim)
    try:
        runtime = admin.get_queue_runtime_properties("q")
        assert runtime.availability_status == "Limited" and runtime.active_message_count == 30
        with ServiceBusClient(ns_path).get_queue_receiver("q") as peeker:
            peeked = []
            while batch := peeker.peek_messages(100):
                peeked += batch
        assert len(peeked) == 30 and all(sequencing.partition_of_sequence(m.sequence_number) != 5 for m in peeked)
        with ServiceBusClient(ns_path).get_queue_sender("q") as sender:  # found by this process's read first
            sender.send_messages(ServiceBusMessage("keyless"))
        got = received_partitions(ns_path, "q")
        assert 5 not in got and sum(got.values()) == 31
    finally:
        with open(victim, "wb") as f:
            f.write(original)
    clock.advance(DETECTED_SECONDS + 0.5)
    assert admin.get_queue_runtime_properties("q").availability_status == "Available"
    assert received_partitions(ns_path, "q") == {5: 2}


def test_an_operation_that_needs_an_unreadable_partition_says_which(admin, ns_path):
    admin.create_queue("q", enable_partitioning=True)
    client = ServiceBusClient(ns_path)
    with client.get_queue_sender("q") as sender:
        sender.send_messages(ServiceBusMessage("later", partition_key=key_for(6)))
    with client.get_queue_receiver("q", max_wait_time=1) as receiver:
        message = receiver.receive_messages(1)[0]
        receiver.defer_message(message)
    victim = glob.glob(os.path.join(partition_dir(admin, "q", 6), "*.parquet"))[0]
    with open(victim, "rb") as f:
        original = f.read()
    with open(victim, "wb") as f:
        f.write(b"\0" * 64)
    try:
        with ServiceBusClient(ns_path).get_queue_receiver("q") as fresh:
            with pytest.raises(PartitionUnavailableError, match="partition 6 .* cannot be read"):
                fresh.receive_deferred_messages([message.sequence_number])
    finally:
        with open(victim, "wb") as f:
            f.write(original)
    with ServiceBusClient(ns_path).get_queue_receiver("q") as fresh:
        again = fresh.receive_deferred_messages([message.sequence_number])
        assert str(again[0]) == "later"
        fresh.complete_message(again[0])
