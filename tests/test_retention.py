"""Retention: completed and cancelled messages leave the tables; nothing live is lost or redelivered."""
from __future__ import annotations

import pytest
from conftest import drain, run_spawned, stored_messages

from sparkbus import ServiceBusMessage, storage
from sparkbus.engine import retention
from sparkbus.engine.namespace import open_catalog
from sparkbus.engine.registry import resolve_current
from sparkbus.storage import commits, maintenance
from sparkbus.core.schemas import GONE_STATES


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
    live = [r for r in stored_messages(admin, "q").to_pylist() if r["sequence_number"] > 30]
    live_bytes = sum(r["body_size"] + r["header_size"] for r in live)
    assert (before.active_message_count, before.total_message_count, before.size_in_bytes) == (10, 10, live_bytes)

    assert _run(admin, ns_path, "q") == 30
    assert _count(admin, "q", "messages") == 10
    gone = ", ".join(f"'{s}'" for s in GONE_STATES)
    assert _count(admin, "q", "locks", f"state IN ({gone})") == 0
    assert _count(admin, "q", "locks") == 1  # the deferred message keeps its state row
    after = admin.get_queue_runtime_properties("q")
    assert (after.active_message_count, after.total_message_count, after.size_in_bytes) == \
           (before.active_message_count, before.total_message_count, before.size_in_bytes)

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
    removed = retention._remove_messages(info, commits.LogView(messages), commits.LogView(locks), 0, 1)
    assert removed == 15  # "crash" before the state rows go
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


def _through(versions_reached, act, *targets) -> None:
    """act() until every table's version (versions_reached()) is at least its target."""
    for _ in range(200):
        if all(v >= t for v, t in zip(versions_reached(), targets)):
            return
        act()
    raise AssertionError(f"versions {versions_reached()} never reached {targets}")


@pytest.mark.slow
def test_sender_and_receiver_whose_table_version_was_cleaned_up_reopen(admin, client, ns_path):
    """A long-idle sender and receiver hold table objects at versions whose log entries another client's
    checkpoints let go (delta.logRetentionDuration, lowered here to 1 s on the entity's tables): their
    next operations must reopen the tables and decide on the current version."""
    import os
    import time

    from sparkbus.storage import maintenance

    admin.create_queue("q")
    uris = admin.get_entity_tables("q")
    for role in ("messages", "locks"):
        storage.open_table(uris[role]).alter.set_table_properties({"delta.logRetentionDuration": "interval 1 second"})
    idle_sender, idle_receiver = client.get_queue_sender("q"), client.get_queue_receiver("q")
    idle_sender.send_messages(ServiceBusMessage("first"))
    (first,) = idle_receiver.receive_messages()
    idle_receiver.complete_message(first)
    # the versions the idle sender's and receiver's table objects are at
    idle = {role: storage.open_table(uris[role]).version() for role in ("messages", "locks")}
    assert max(idle.values()) < maintenance.CHECKPOINT_EVERY

    busy_sender, busy_receiver = client.get_queue_sender("q"), client.get_queue_receiver("q")
    busy = []

    def work() -> None:  # one commit to messages, two to locks
        busy_sender.send_messages(ServiceBusMessage(f"busy {len(busy)}"))
        (m,) = busy_receiver.receive_messages()
        busy_receiver.complete_message(m)
        busy.append(m.sequence_number)

    def versions() -> list[int]:
        return [storage.open_table(uris[role]).version() for role in ("messages", "locks")]

    # Log cleanup only goes up to a checkpoint older than the retention: write one on each table, let it
    # (and the idle versions' successors) age past the 1 s retention, then reach the next checkpoint.
    _through(versions, work, maintenance.CHECKPOINT_EVERY, maintenance.CHECKPOINT_EVERY)
    time.sleep(2.5)
    _through(versions, work, 2 * maintenance.CHECKPOINT_EVERY + 1, 2 * maintenance.CHECKPOINT_EVERY + 1)
    assert maintenance.wait_idle(60)
    for role, version in idle.items():
        log = os.path.join(uris[role], "_delta_log")
        missing = [v for v in (version, version + 1) if not os.path.exists(os.path.join(log, f"{v:020d}.json"))]
        assert missing == [version, version + 1], f"{role}: the idle version's log was not cleaned up"

    idle_sender.send_messages(ServiceBusMessage("after"))  # numbered on the current version, not the stale one
    got = idle_receiver.receive_messages(max_message_count=5)
    assert [str(m) for m in got] == ["after"] and got[0].delivery_count == 1
    assert got[0].sequence_number == len(busy) + 2  # gap-free after "first" and every busy message
    assert idle_receiver.complete_messages(got) == 1
    assert busy == list(range(2, len(busy) + 2))
    assert admin.get_queue_runtime_properties("q").total_message_count == 0


@pytest.mark.slow
def test_receivers_trigger_retention_on_their_own(admin, client):
    """Completing through the public API alone lets completed rows leave: every RUN_EVERY-th locks-table
    version the receiver that committed it runs retention on that partition, which removes rows once
    MIN_REMOVED and a quarter of the partition are gone; live messages all stay receivable."""
    admin.create_queue("q")
    uris = admin.get_entity_tables("q")
    sent = 8_000
    sender = client.get_queue_sender("q")
    for start in range(0, sent, 1_000):
        sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(start, start + 1_000)])
    receiver = client.get_queue_receiver("q")
    (deferred,) = receiver.receive_messages()
    receiver.defer_message(deferred)

    def stored() -> set[int]:
        table = storage.open_table(uris["messages"])
        return set(storage.query("SELECT sequence_number FROM t", t=table)["sequence_number"].to_pylist())

    completed: set[int] = set()
    earlier: set[int] = set()
    for _ in range(70):  # 140 locks versions at most: past two retention points (RUN_EVERY apart)
        earlier = set(completed)
        batch = receiver.receive_messages(max_message_count=100)
        assert receiver.complete_messages(batch) == 100
        completed |= {m.sequence_number for m in batch}
        assert maintenance.wait_idle(60)  # the run a receiver asks for happens on its maintenance thread
        if len(stored()) < sent:
            break
    remaining = stored()
    assert len(remaining) < sent, "no automatic retention run within 7,000 completions"
    assert sent - len(remaining) >= retention.MIN_REMOVED
    assert not remaining & earlier  # everything completed before the run's commit left
    live = set(range(1, sent + 1)) - completed
    assert live <= remaining and deferred.sequence_number in live
    locks = storage.open_table(uris["locks"])
    states = set(storage.query("SELECT sequence_number FROM t", t=locks)["sequence_number"].to_pylist())
    assert not states & (earlier - remaining)  # their state rows left too
    assert admin.get_queue_runtime_properties("q").active_message_count == len(live)

    got = []
    while batch := receiver.receive_messages(max_message_count=1_000, max_wait_time=0):
        got += batch
        receiver.complete_messages(batch)
    assert sorted(m.sequence_number for m in got) == sorted(live - {deferred.sequence_number})
    assert {m.delivery_count for m in got} == {1}  # nothing completed came back, nothing was delivered twice
    (again,) = receiver.receive_deferred_messages([deferred.sequence_number])
    assert str(again) == str(deferred) and again.delivery_count == 2


def test_a_partition_too_small_for_a_run_is_not_run_unless_a_file_lacks_statistics():
    """may_remove decides from a view's file statistics whether a run could remove anything: not from a
    partition holding fewer rows than a run's minimum; always when a file's row count is unknown."""
    from sparkbus.storage.commits import AddedFile

    def file(rows, stats=True):
        return AddedFile(f"f{rows}", 0, 100, rows, {"sequence_number": 1} if stats else {},
                         {"sequence_number": rows} if stats else {})

    small = retention.MIN_REMOVED // 2
    assert not retention.may_remove([file(small), file(small - 1)])
    assert retention.may_remove([file(small), file(small)])
    assert retention.may_remove([file(1), file(1, stats=False)])
    assert not retention.may_remove([])
