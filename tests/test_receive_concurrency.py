"""Competing consumers in spawned processes: every message completed exactly once, never double-locked."""
from __future__ import annotations

import pytest
from conftest import drain, run_spawned

from sparkbus import storage
from sparkbus.core import schemas


@pytest.mark.slow
def test_four_competing_receivers_complete_each_message_once(spawn, admin, client, ns_path, store):
    per_chunk = 25 if store != "local" else 100  # an emulator takes a minute for 400: 100 prove the same
    admin.create_queue("work", enable_partitioning=True, lock_duration="PT1M")
    sender = client.get_queue_sender("work")
    for chunk in range(4):
        sender.send_messages([sparkbus_message(f"{chunk}-{i}") for i in range(per_chunk)])
    outcomes = run_spawned(spawn, drain, [(ns_path, "work", w) for w in range(4)])
    completed = [seq for _, done in outcomes for seq in done]
    assert len(completed) == 4 * per_chunk and len(set(completed)) == 4 * per_chunk
    assert sum(1 for _, done in outcomes if done) >= 2  # the work was shared
    locks = storage.open_table(admin.get_entity_tables("work")["locks"])
    rows = storage.query("SELECT state, delivery_count FROM locks", locks=locks).to_pylist()
    assert len(rows) == 4 * per_chunk and all(r["state"] == schemas.COMPLETED and r["delivery_count"] == 1 for r in rows)
    assert admin.get_queue_runtime_properties("work").total_message_count == 0


def sparkbus_message(body):
    from sparkbus import ServiceBusMessage

    return ServiceBusMessage(body)
