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


def _send_under_policy(path, worker, count, retry_total, barrier, results):
    import sparkbus
    from sparkbus.exceptions import ServiceBusServerBusyError

    sender = sparkbus.ServiceBusClient(path, retry_total=retry_total, retry_backoff_factor=0.02).get_queue_sender("one")
    barrier.wait()
    acknowledged, refused = [], 0
    for i in range(count):
        try:
            sender.send_messages(sparkbus.ServiceBusMessage(b"x", message_id=f"{worker}-{i}"))
            acknowledged.append(f"{worker}-{i}")
        except ServiceBusServerBusyError as error:        # never a delta-rs CommitFailedError
            assert type(error).__name__ == "CommitConflictError" and "retry_total=0" in str(error)
            refused += 1
    results.put((acknowledged, refused))


@pytest.mark.slow
@pytest.mark.parametrize("retry_total", [0, 6])
def test_retry_policy_under_six_writers_of_one_partition(spawn, admin, ns_path, retry_total):
    """retry_total=0: a send that loses every immediate re-plan raises at once, and wrote nothing; a bounded
    retry gets every send through. Either way each acknowledged message is stored exactly once."""
    admin.create_queue("one")
    outcomes = run_spawned(spawn, _send_under_policy, [(ns_path, w, 100, retry_total) for w in range(6)])
    acknowledged = sorted(mid for ids, _ in outcomes for mid in ids)
    refused = sum(count for _, count in outcomes)
    assert sorted(stored_messages(admin, "one")["message_id"].to_pylist()) == acknowledged
    assert len(acknowledged) + refused == 600
    if retry_total == 0:
        assert refused > 0
    else:
        assert refused == 0
