"""Retention: completed and cancelled messages leave the tables; nothing live is lost or redelivered."""
from __future__ import annotations

import pytest
from conftest import drain, run_spawned

from sparkbus import ServiceBusMessage, storage
from sparkbus.engine import retention
from sparkbus.engine.namespace import open_catalog
from sparkbus.engine.registry import resolve_current
from sparkbus.storage.schemas import GONE_STATES


def _tables(admin, ns_path, queue):
    info = resolve_current(open_catalog(ns_path), queue, ("queue",))
    uris = admin.get_entity_tables(queue)
    return info, storage.open_table(uris["messages"]), storage.open_table(uris["locks"])


def _run(admin, ns_path, queue, partition=0, minimum=1):
    info, messages, locks = _tables(admin, ns_path, queue)
    return retention.run(info, messages, locks, partition, minimum=minimum)


def _count(admin, queue, role, where="TRUE"):
    table = storage.open_table(admin.get_entity_tables(queue)[role])
    return storage.query(f"SELECT COUNT(*) AS n FROM t WHERE {where}", t=table)["n"][0].as_py()


def test_completed_messages_leave_and_numbering_continues(admin, client, ns_path):
    admin.create_queue("q")
    sender = client.get_queue_sender("q")
    sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(40)])
    receiver = client.get_queue_receiver("q")
    batch = receiver.receive_messages(max_message_count=30)
    assert receiver.complete_messages(batch) == 30
    deferred = receiver.receive_messages(max_message_count=1)[0]
    receiver.defer_message(deferred)
    before = admin.get_queue_runtime_properties("q")

    assert _run(admin, ns_path, "q") == 30
    assert _count(admin, "q", "messages") == 10
    gone = ", ".join(f"'{s}'" for s in GONE_STATES)
    assert _count(admin, "q", "locks", f"state IN ({gone})") == 0
    assert _count(admin, "q", "locks") == 1  # the deferred message keeps its state row
    after = admin.get_queue_runtime_properties("q")
    assert (after.active_message_count, after.total_message_count, after.size_in_bytes) == \
           (before.active_message_count, before.total_message_count, before.size_in_bytes) == (10, 10, after.size_in_bytes)

    rest = receiver.receive_messages(max_message_count=50)
    assert [m.sequence_number for m in rest] == list(range(32, 41))  # nothing completed comes back
    receiver.complete_messages(rest)
    assert _run(admin, ns_path, "q") == 8  # the highest sequence number stays: it holds the high-water mark
    assert _count(admin, "q", "messages") == 2
    sender.send_messages(ServiceBusMessage("next"))
    assert [m.sequence_number for m in receiver.receive_messages(max_message_count=5)] == [41]
    assert [m.sequence_number for m in receiver.receive_deferred_messages([31])] == [31]


def test_duplicate_detection_history_stays_within_its_window(admin, client, ns_path):
    admin.create_queue("dd", requires_duplicate_detection=True, duplicate_detection_history_time_window="PT10M")
    sender = client.get_queue_sender("dd")
    sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"id-{i}") for i in range(10)])
    receiver = client.get_queue_receiver("dd")
    receiver.complete_messages(receiver.receive_messages(max_message_count=10))
    assert _run(admin, ns_path, "dd") == 0  # every row is inside the 10-minute window
    sender.send_messages(ServiceBusMessage("again", message_id="id-3"))
    assert _count(admin, "dd", "messages") == 10  # still detected as a duplicate


def test_cancelled_scheduled_messages_leave_too(admin, client, ns_path):
    from datetime import datetime, timedelta, timezone

    admin.create_queue("s")
    sender = client.get_queue_sender("s")
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    numbers = sender.schedule_messages([ServiceBusMessage(f"s{i}") for i in range(5)], later)
    sender.send_messages(ServiceBusMessage("top"))
    sender.cancel_scheduled_messages(numbers)
    assert _run(admin, ns_path, "s") == 5
    assert _count(admin, "s", "messages") == 1 and _count(admin, "s", "locks") == 0


def test_a_run_interrupted_between_its_deletes_is_finished_by_the_next(admin, client, ns_path):
    admin.create_queue("q")
    client.get_queue_sender("q").send_messages([ServiceBusMessage(f"m{i}") for i in range(20)])
    receiver = client.get_queue_receiver("q")
    receiver.complete_messages(receiver.receive_messages(max_message_count=15))
    info, messages, locks = _tables(admin, ns_path, "q")
    assert retention._remove_messages(info, messages, locks, 0, 1) == 15  # "crash" before the state rows go
    assert _count(admin, "q", "locks") == 15
    second = client.get_queue_receiver("q")
    rest = second.receive_messages(max_message_count=20)
    assert [m.sequence_number for m in rest] == list(range(16, 21))  # the completed ones stay gone
    second.complete_messages(rest[:3])
    assert _run(admin, ns_path, "q") == 3  # the next run that removes messages also removes the leftovers
    assert _count(admin, "q", "locks", "state = 'completed'") == 0


def test_small_partitions_are_left_alone(admin, client, ns_path):
    admin.create_queue("q")
    client.get_queue_sender("q").send_messages([ServiceBusMessage(f"m{i}") for i in range(20)])
    receiver = client.get_queue_receiver("q")
    receiver.complete_messages(receiver.receive_messages(max_message_count=4))
    assert _run(admin, ns_path, "q", minimum=retention.MIN_REMOVED) == 0
    assert _run(admin, ns_path, "q", minimum=1) == 0  # 4 of 20 is under a quarter of the partition
    assert _count(admin, "q", "messages") == 20


def _retain(path, queue, worker, barrier, results):
    from sparkbus import ServiceBusAdministrationClient, storage
    from sparkbus.engine import retention
    from sparkbus.engine.namespace import open_catalog
    from sparkbus.engine.registry import resolve_current

    info = resolve_current(open_catalog(path), queue, ("queue",))
    uris = ServiceBusAdministrationClient(path).get_entity_tables(queue)
    barrier.wait()
    removed = 0
    for _ in range(60):
        for partition in range(info.partition_count):
            locks = storage.open_table(uris["locks"])
            removed += retention.run(info, storage.open_table(uris["messages"]), locks, partition, minimum=1)
    results.put(("retention", removed))


@pytest.mark.slow
def test_retention_racing_receivers_loses_and_repeats_nothing(spawn, admin, client, ns_path):
    admin.create_queue("work", enable_partitioning=True, lock_duration="PT1M")
    sender = client.get_queue_sender("work")
    for chunk in range(6):
        sender.send_messages([ServiceBusMessage(f"{chunk}-{i}") for i in range(100)])
    outcomes = run_spawned(spawn, _dispatch, [(ns_path, "work", w) for w in range(3)])  # 2 receivers, 1 retention
    completed = [seq for who, done in outcomes if who != "retention" for seq in done]
    removed = next(done for who, done in outcomes if who == "retention")
    assert len(completed) == 600 and len(set(completed)) == 600
    assert removed > 0
    assert admin.get_queue_runtime_properties("work").total_message_count == 0


def _dispatch(path, queue, worker, barrier, results):
    if worker == 2:
        _retain(path, queue, worker, barrier, results)
    else:
        drain(path, queue, worker, barrier, results, batch_size=25, together=True)
