"""Competing consumers in spawned processes: every message completed exactly once, never double-locked."""
from __future__ import annotations

import pytest
from conftest import run_spawned

from sparkbus import schemas, storage


def _consume(path, queue, worker, barrier, results):
    import sparkbus

    receiver = sparkbus.ServiceBusClient(path).get_queue_receiver(queue)
    barrier.wait()
    done, idle = [], 0
    while idle < 3:
        batch = receiver.receive_messages(max_message_count=7, max_wait_time=0.2)
        if not batch:
            idle += 1
            continue
        idle = 0
        for message in batch:
            receiver.complete_message(message)  # raises if the lock were not exclusively ours
            done.append(message.sequence_number)
    results.put((worker, done))


@pytest.mark.slow
def test_four_competing_receivers_complete_each_message_once(spawn, admin, client, ns_path):
    admin.create_queue("work", enable_partitioning=True, lock_duration="PT1M")
    sender = client.get_queue_sender("work")
    for chunk in range(4):
        sender.send_messages([sparkbus_message(f"{chunk}-{i}") for i in range(100)])
    outcomes = run_spawned(spawn, _consume, [(ns_path, "work", w) for w in range(4)])
    completed = [seq for _, done in outcomes for seq in done]
    assert len(completed) == 400 and len(set(completed)) == 400
    assert sum(1 for _, done in outcomes if done) >= 2  # the work was shared
    locks = storage.open_table(admin.get_entity_tables("work")["locks"])
    rows = storage.query("SELECT state, delivery_count FROM locks", locks=locks).to_pylist()
    assert len(rows) == 400 and all(r["state"] == schemas.COMPLETED and r["delivery_count"] == 1 for r in rows)
    assert admin.get_queue_runtime_properties("work").total_message_count == 0


def sparkbus_message(body):
    from sparkbus import ServiceBusMessage

    return ServiceBusMessage(body)
