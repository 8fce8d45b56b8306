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
@pytest.mark.local_only  # the policy under contention, not storage: six writers take the emulator minutes
@pytest.mark.parametrize("retry_total", [0, 6])
def test_retry_policy_under_six_writers_of_one_partition(spawn, admin, ns_path, retry_total):
    """retry_total=0: a send that loses every immediate re-plan raises at once, and wrote nothing; a bounded
    retry gets every send through. Either way each acknowledged message is stored exactly once. (A refusal
    takes a send losing REPLANS + 1 races in a row: without retries, each writer sends 300 times so that some
    send does even when a loaded machine lets the six overlap less.)"""
    admin.create_queue("one")
    each = 300 if retry_total == 0 else 100
    outcomes = run_spawned(spawn, _send_under_policy, [(ns_path, w, each, retry_total) for w in range(6)])
    acknowledged = sorted(mid for ids, _ in outcomes for mid in ids)
    refused = sum(count for _, count in outcomes)
    assert sorted(stored_messages(admin, "one")["message_id"].to_pylist()) == acknowledged
    assert len(acknowledged) + refused == 6 * each
    if retry_total == 0:
        assert refused > 0
    else:
        assert refused == 0


# ---- group commit: threads of one process sharing a sender ----------------------------------------------

def _together(calls: list) -> list:
    """Run the calls on their own threads, released at once; returns each one's result or exception."""
    import threading

    start, outcomes = threading.Barrier(len(calls)), [None] * len(calls)

    def run(i: int) -> None:
        start.wait()
        try:
            outcomes[i] = calls[i]()
        except Exception as error:  # the outcome under test
            outcomes[i] = error
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def test_threads_sharing_a_sender_share_commits_and_each_gets_its_own_answer(admin, ns_path):
    import sparkbus
    from datetime import datetime, timedelta, timezone

    from sparkbus import MessageSizeExceededError, ServiceBusMessage, storage

    admin.create_queue("q", requires_duplicate_detection=True, enable_partitioning=True)
    sender = sparkbus.ServiceBusClient(ns_path).get_queue_sender("q")
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    too_big = ServiceBusMessage(b"x" * (300 * 1024))
    calls = ([lambda i=i: sender.send_messages(ServiceBusMessage(f"m{i}", message_id=f"id{i}")) for i in range(24)]
             + [lambda i=i: sender.schedule_messages(ServiceBusMessage(f"s{i}", message_id=f"s{i}"), later)
                for i in range(4)]
             + [lambda: sender.send_messages(ServiceBusMessage("again", message_id="id0"))]  # a duplicate
             + [lambda: sender.send_messages(too_big)]
             + [lambda: sender.send_messages([ServiceBusMessage(b"y" * (100 * 1024)) for _ in range(3)])])
    outcomes = _together(calls)
    assert isinstance(outcomes[-2], MessageSizeExceededError)  # a refused message: only its caller fails
    assert isinstance(outcomes[-1], MessageSizeExceededError) and "the batch of 3 messages" in str(outcomes[-1])
    assert all(o is None for o in outcomes[:24]) and outcomes[28] is None
    scheduled = outcomes[24:28]
    assert all(len(numbers) == 1 for numbers in scheduled)  # each caller gets its own sequence number
    rows = stored_messages(admin, "q")
    by_id = dict(zip(rows["message_id"].to_pylist(), rows["sequence_number"].to_pylist()))
    assert sorted(by_id) == sorted([f"id{i}" for i in range(24)] + [f"s{i}" for i in range(4)])
    assert rows.num_rows == 28  # the duplicate of id0 was discarded, whichever commit held it
    assert [by_id[f"s{i}"] for i in range(4)] == [numbers[0] for numbers in scheduled]
    table = storage.open_table(admin.get_entity_tables("q")["messages"])
    assert table.version() < 15  # 29 sends committed in a few shared commits (version 0 is the creation)
