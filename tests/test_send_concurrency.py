"""Concurrent senders in spawned processes: gap-free numbering and exact duplicate detection."""
from __future__ import annotations

import pytest
from conftest import run_spawned, stored_messages

LOW = (1 << 48) - 1


def _send(path, queue, worker, batches, per_batch, key, barrier, results):
    import sparkbus

    sender = sparkbus.ServiceBusClient(path).get_queue_sender(queue)
    barrier.wait()
    for b in range(batches):
        sender.send_messages([sparkbus.ServiceBusMessage(f"{worker}-{b}-{i}", partition_key=key)
                              for i in range(per_batch)])
    results.put(worker)


def _send_ids(path, queue, worker, ids, barrier, results):
    import sparkbus

    sender = sparkbus.ServiceBusClient(path).get_queue_sender(queue)
    barrier.wait()
    for mid in ids:
        sender.send_messages(sparkbus.ServiceBusMessage(f"{worker}:{mid}", message_id=mid))
    results.put(worker)


@pytest.mark.slow
def test_four_processes_into_one_partition_are_gap_free(spawn, admin, ns_path):
    admin.create_queue("hot", enable_partitioning=True)
    run_spawned(spawn, _send, [(ns_path, "hot", w, 25, 4, "same-key") for w in range(4)])
    rows = stored_messages(admin, "hot")
    numbers = [n & LOW for n in rows["sequence_number"].to_pylist()]
    assert len(set(rows["partition_id"].to_pylist())) == 1
    assert sorted(numbers) == list(range(1, 401))
    bodies = rows["body"].to_pylist()
    assert len(set(bodies)) == 400
    for w in range(4):  # each process's messages keep their order
        mine = [b for b in bodies if b.startswith(f"{w}-".encode())]
        assert mine == sorted(mine, key=lambda b: tuple(int(x) for x in b.decode().split("-")[1:]))


@pytest.mark.slow
def test_concurrent_duplicates_are_discarded(spawn, admin, ns_path):
    admin.create_queue("dd", enable_partitioning=True, requires_duplicate_detection=True)
    ids = [f"id-{i}" for i in range(30)]
    run_spawned(spawn, _send_ids, [(ns_path, "dd", w, ids) for w in range(4)])
    rows = stored_messages(admin, "dd")
    assert sorted(rows["message_id"].to_pylist()) == sorted(ids)
