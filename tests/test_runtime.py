"""Runtime properties aggregate over every partition of an entity's Delta tables."""
from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pyarrow as pa
from deltalake import write_deltalake

from sparkbus import ServiceBusMessage
from sparkbus.core import schemas


def _messages(partitions_and_sizes, scheduled_in=None):
    now = datetime.now(timezone.utc)
    rows = []
    for n, (pid, body, header) in enumerate(partitions_and_sizes, 1):
        row = {f.name: None for f in schemas.MESSAGES}
        row.update(partition_id=pid, sequence_number=(pid << 48) | n, message_id=f"m{n}", body=b"x" * body,
                   enqueued_time_utc=now, body_size=body, header_size=header)
        if scheduled_in and n in scheduled_in:
            row["scheduled_enqueue_time_utc"] = now + timedelta(hours=1)
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=schemas.MESSAGES)


def _lock(pid, seq, state):
    return {"partition_id": pid, "sequence_number": seq, "state": state, "delivery_count": 1, "lock_token": None,
            "locked_until_utc": None, "dead_letter_reason": None, "dead_letter_error_description": None,
            "dead_letter_source": None, "updated_at_utc": datetime.now(timezone.utc)}


def test_empty_entity_counts_zero(admin):
    admin.create_queue("q", enable_partitioning=True)
    rt = admin.get_queue_runtime_properties("q")
    assert (rt.active_message_count, rt.total_message_count, rt.size_in_bytes, rt.partition_count) == (0, 0, 0, 16)


def _to_ms(t: datetime) -> datetime:
    return t.replace(microsecond=t.microsecond // 1000 * 1000)  # Delta commit times are in milliseconds


def test_accessed_at_moves_forward_with_sends_receives_and_settlements(admin, client):
    """accessed_at_utc: when the entity last took a send, receive or settlement (its tables' latest commit);
    a new entity reports its creation."""
    created = admin.create_queue("q").created_at_utc
    stamps = [admin.get_queue_runtime_properties("q").accessed_at_utc]
    assert stamps[0].tzinfo is not None and abs(stamps[0] - created) < timedelta(seconds=5)
    sender, receiver = client.get_queue_sender("q"), client.get_queue_receiver("q")
    received = []

    def access(action) -> None:
        time.sleep(0.01)  # a later millisecond than the previous access
        before = _to_ms(datetime.now(timezone.utc))
        action()
        after = datetime.now(timezone.utc)
        accessed = admin.get_queue_runtime_properties("q").accessed_at_utc
        assert before <= accessed <= after and accessed > stamps[-1]
        stamps.append(accessed)

    access(lambda: sender.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")]))
    access(lambda: received.extend(receiver.receive_messages(max_message_count=2)))
    access(lambda: receiver.complete_message(received[0]))
    access(lambda: receiver.abandon_message(received[1]))
    time.sleep(0.01)
    assert admin.get_queue_runtime_properties("q").accessed_at_utc == stamps[-1]  # reading counts is no access


def test_counts_and_sizes_over_all_partitions(admin):
    admin.create_queue("q", enable_partitioning=True)
    tables = admin.get_entity_tables("q")
    msgs = _messages([(0, 10, 5), (3, 20, 5), (3, 30, 5), (7, 40, 5), (15, 50, 5)], scheduled_in={5})
    write_deltalake(tables["messages"], msgs, mode="append")
    locks = pa.Table.from_pylist([_lock(3, (3 << 48) | 2, schemas.DEAD_LETTERED),
                                  _lock(7, (7 << 48) | 4, schemas.COMPLETED)], schema=schemas.LOCKS)
    write_deltalake(tables["locks"], locks, mode="append")
    rt = admin.get_queue_runtime_properties("q")
    assert rt.total_message_count == 4  # the completed message left the entity
    assert (rt.active_message_count, rt.dead_letter_message_count, rt.scheduled_message_count) == (2, 1, 1)
    assert rt.size_in_bytes == (10 + 5) + (20 + 5) + (30 + 5) + (50 + 5)


def test_topic_counts_headers_once_per_subscription(admin):
    admin.create_topic("t")
    for name in ("a", "b", "c"):
        admin.create_subscription("t", name)
    write_deltalake(admin.get_entity_tables("t")["messages"], _messages([(0, 100, 10), (0, 200, 20)]), mode="append")
    rt = admin.get_topic_runtime_properties("t")
    assert rt.subscription_count == 3 and rt.total_message_count == 2
    assert rt.size_in_bytes == (100 + 10 * 3) + (200 + 20 * 3)
    sub = admin.get_subscription_runtime_properties("t", "a")
    assert (sub.topic_name, sub.total_message_count) == ("t", 0)
    assert [r.name for r in admin.list_subscriptions_runtime_properties("t")] == ["a", "b", "c"]
    admin.create_queue("q")
    assert [(r.name, r.total_message_count) for r in admin.list_topics_runtime_properties()] == [("t", 2)]
    assert [(r.name, r.total_message_count) for r in admin.list_queues_runtime_properties()] == [("q", 0)]


def test_deferred_messages_are_counted_and_sessions_listed_with_their_locks_and_state(admin, ns_path):
    from sparkbus import ServiceBusClient

    admin.create_queue("q")
    admin.create_queue("carts", requires_session=True)
    with ServiceBusClient(ns_path) as client:
        client.get_queue_sender("q").send_messages([ServiceBusMessage(str(n)) for n in range(4)])
        with client.get_queue_receiver("q") as receiver:
            first, second = receiver.receive_messages(2, max_wait_time=5)
            receiver.defer_message(first)
            receiver.dead_letter_message(second)
        client.get_queue_sender("carts").send_messages([ServiceBusMessage(s, session_id=s) for s in "aabc"])
        with client.get_queue_receiver("carts", session_id="c") as receiver:
            [c] = receiver.receive_messages(1, max_wait_time=5)
            receiver.dead_letter_message(c)
            receiver.session.set_state(b"12345")
        with client.get_queue_receiver("carts", session_id="a") as held:
            listed = {s.session_id: s for s in admin.list_sessions("carts")}
            assert listed["a"].locked_until_utc == held.session.locked_until_utc
    runtime = admin.get_queue_runtime_properties("q")
    assert (runtime.active_message_count, runtime.deferred_message_count, runtime.dead_letter_message_count) == (3, 1, 1)
    assert [(s.message_count, s.state_size) for s in listed.values()] == [(2, 0), (1, 0), (0, 5)]  # c: dead-lettered
    assert [s.locked_until_utc is None for s in admin.list_sessions("carts")] == [True, True, True]
    assert admin.list_sessions("q") == []
