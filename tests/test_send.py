"""The send path: messages, senders, placement, numbering, times, limits, quotas, scheduling, topics."""
from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest
from conftest import stored_messages

import sparkbus
from sparkbus import (InvalidOperationError, MessageNotFoundError, MessageSizeExceededError,
                      MessagingEntityDisabledError, MessagingEntityNotFoundError, PartitionUnavailableError,
                      ServiceBusClient, ServiceBusMessage, ServiceBusQuotaExceededError, set_partition_availability)
from sparkbus.core.partitioning import partition_of
from sparkbus.core.values import decode_properties
from sparkbus.engine.enqueue import SizeBounds


def test_message_fields_and_validation():
    m = ServiceBusMessage("héllo", application_properties={"n": 1, "when": datetime(2026, 1, 1, tzinfo=timezone.utc)},
                          session_id="s", subject="greeting", time_to_live=timedelta(minutes=5))
    assert m.body == "héllo".encode() and str(m) == "héllo"
    assert uuid.UUID(m.message_id).hex == m.message_id and m.message_id != ServiceBusMessage(b"").message_id
    with pytest.raises(TypeError, match="body must be bytes, str, a list of them or None"):
        ServiceBusMessage(5)
    with pytest.raises(TypeError, match=r"application_properties\['x'\] has type dict"):
        ServiceBusMessage(b"", application_properties={"x": {}})
    with pytest.raises(TypeError, match="session_id must be a str"):
        ServiceBusMessage(b"", session_id=1)
    with pytest.raises(ValueError, match="message_id must be 1 to 128"):
        ServiceBusMessage(b"", message_id="x" * 129)
    with pytest.raises(ValueError, match="time_to_live must be positive"):
        ServiceBusMessage(b"", time_to_live=timedelta(0))


def test_send_one_list_and_batch(admin, client):
    admin.create_queue("q")
    with client.get_queue_sender("q") as sender:
        sender.send_messages(ServiceBusMessage("one", application_properties={"k": b"\x01", "f": 1.5}, subject="s1",
                                               correlation_id="c", content_type="text/plain", to="t", reply_to="r",
                                               reply_to_session_id="rs"))
        sender.send_messages([ServiceBusMessage("two"), ServiceBusMessage("three")])
        batch = sender.create_message_batch()
        batch.add_message(ServiceBusMessage("four"))
        sender.send_messages(batch)
        sender.send_messages([])
    rows = stored_messages(admin, "q").to_pylist()
    assert [r["body"] for r in rows] == [b"one", b"two", b"three", b"four"]
    assert [r["sequence_number"] for r in rows] == [1, 2, 3, 4]  # non-partitioned: partition 0
    first = rows[0]
    assert decode_properties(first["application_properties"]) == {"k": b"\x01", "f": 1.5}
    assert (first["subject"], first["correlation_id"], first["content_type"], first["to"], first["reply_to"],
            first["reply_to_session_id"]) == ("s1", "c", "text/plain", "t", "r", "rs")
    assert first["body_size"] == 3 and first["header_size"] > len(first["message_id"])


def test_sequence_numbers_per_partition_are_gap_free(admin, client):
    admin.create_queue("p", enable_partitioning=True)
    sender = client.get_queue_sender("p")
    for i in range(40):
        sender.send_messages([ServiceBusMessage(f"{i}-{j}", partition_key=f"k{i % 5}") for j in range(3)])
    rows = stored_messages(admin, "p").to_pylist()
    by_partition = {}
    for r in rows:
        assert r["partition_id"] == r["sequence_number"] >> 48
        by_partition.setdefault(r["partition_id"], []).append(r["sequence_number"] & ((1 << 48) - 1))
    for pid, numbers in by_partition.items():
        assert sorted(numbers) == list(range(1, len(numbers) + 1))
    expected = {partition_of(f"k{i}", 16) for i in range(5)}
    assert set(by_partition) == expected


def test_placement_precedence_in_storage(admin, client):
    admin.create_queue("dd", enable_partitioning=True, requires_duplicate_detection=True)
    sender = client.get_queue_sender("dd")
    sender.send_messages([ServiceBusMessage("a", session_id="S1", message_id="m1"),
                          ServiceBusMessage("b", partition_key="K1", message_id="m2"),
                          ServiceBusMessage("c", message_id="m3")])
    placed = {r["message_id"]: r["partition_id"] for r in stored_messages(admin, "dd").to_pylist()}
    assert placed == {"m1": partition_of("S1", 16), "m2": partition_of("K1", 16), "m3": partition_of("m3", 16)}
    with pytest.raises(InvalidOperationError, match="must be identical"):
        sender.send_messages([ServiceBusMessage("ok"), ServiceBusMessage("x", session_id="a", partition_key="b")])
    assert stored_messages(admin, "dd").num_rows == 3  # the whole call was rejected


def test_times_and_expiry(admin, client):
    admin.create_queue("ttl", default_message_time_to_live="PT1H")
    sender = client.get_queue_sender("ttl")
    before = datetime.now(timezone.utc)
    sender.send_messages([ServiceBusMessage("short", time_to_live=timedelta(minutes=5)),
                          ServiceBusMessage("long", time_to_live=timedelta(days=1)), ServiceBusMessage("none")])
    after = datetime.now(timezone.utc)
    rows = stored_messages(admin, "ttl").to_pylist()
    for r in rows:
        assert before <= r["enqueued_time_utc"] <= after
    assert [r["expires_at_utc"] - r["enqueued_time_utc"] for r in rows] == [
        timedelta(minutes=5), timedelta(hours=1), timedelta(hours=1)]
    assert rows[0]["time_to_live_ms"] == 300_000 and rows[2]["time_to_live_ms"] is None
    admin.create_queue("forever")
    client.get_queue_sender("forever").send_messages(ServiceBusMessage("x"))
    assert stored_messages(admin, "forever")["expires_at_utc"][0].as_py().year == 9999  # Service Bus' MaxValue


def test_keyless_messages_avoid_unavailable_partitions(admin, client, ns_path):
    admin.create_queue("p", enable_partitioning=True)
    pinned = next(f"key{i}" for i in range(100) if partition_of(f"key{i}", 16) == 4)
    set_partition_availability(ns_path, 4, False, entity_path="p")
    sender = client.get_queue_sender("p")
    sender.send_messages([ServiceBusMessage(f"batch {i}") for i in range(64)])  # a send's keyless messages: one run
    for i in range(15):
        sender.send_messages(ServiceBusMessage(f"single {i}"))
    with pytest.raises(PartitionUnavailableError, match=r"\[4\]"):
        sender.send_messages(ServiceBusMessage("pinned", partition_key=pinned))
    rows = stored_messages(admin, "p")
    placed = dict(zip((b.decode() for b in rows["body"].to_pylist()), rows["partition_id"].to_pylist()))
    assert rows.num_rows == 64 + 15 and 4 not in placed.values()
    assert len({placed[f"batch {i}"] for i in range(64)}) == 1
    assert sorted(placed[f"single {i}"] for i in range(15)) == [p for p in range(16) if p != 4]


@pytest.mark.slow
@pytest.mark.local_only  # placement by count, not storage: 800 single commits take minutes on the emulator
def test_keyless_single_sends_go_round_robin_over_all_16_partitions(admin, client):
    """Each sender places keyless messages round-robin from a random partition: 800 single sends put
    exactly 50 into each of the 16 partitions, each call's one message in its own commit."""
    admin.create_queue("rr", enable_partitioning=True)
    sender = client.get_queue_sender("rr")
    for i in range(800):
        sender.send_messages(ServiceBusMessage(b"x", message_id=f"m{i}"))
    rows = stored_messages(admin, "rr")
    counts = {}
    for pid in rows["partition_id"].to_pylist():
        counts[pid] = counts.get(pid, 0) + 1
    assert counts == {p: 50 for p in range(16)}
    by_id = dict(zip(rows["message_id"].to_pylist(), rows["partition_id"].to_pylist()))
    assert all((by_id[f"m{i + 1}"] - by_id[f"m{i}"]) % 16 == 1 for i in range(799))  # the next partition each time


def test_size_limits_write_nothing(admin, client, tmp_path):
    admin.create_queue("q")
    sender = client.get_queue_sender("q")
    with pytest.raises(MessageSizeExceededError, match=r"exceeds the 262144-byte message size limit"):
        sender.send_messages(ServiceBusMessage(b"x" * 262_144))
    with pytest.raises(MessageSizeExceededError, match="header of .* exceeds the 65536-byte limit"):
        sender.send_messages(ServiceBusMessage(b"", application_properties={"big": "y" * 70_000}))
    with pytest.raises(MessageSizeExceededError, match="the batch of 3 messages is .* the limit is 262144"):
        sender.send_messages([ServiceBusMessage(b"x" * 100_000) for _ in range(3)])
    sender.send_messages(ServiceBusMessage(b"x" * 200_000))
    assert stored_messages(admin, "q").num_rows == 1
    batch = sender.create_message_batch(max_size_in_bytes=1000)
    batch.add_message(ServiceBusMessage(b"x" * 500))
    with pytest.raises(MessageSizeExceededError, match="does not fit"):
        batch.add_message(ServiceBusMessage(b"x" * 500))
    assert len(batch) == 1
    with pytest.raises(ValueError, match="between 1 and the entity's batch limit 262144"):
        sender.create_message_batch(max_size_in_bytes=10**7)
    premium = str(tmp_path / "premium")
    sparkbus.create_namespace(premium, tier="premium", partition_count=2)
    sparkbus.ServiceBusAdministrationClient(premium).create_queue("big")
    ServiceBusClient(premium).get_queue_sender("big").send_messages(ServiceBusMessage(b"x" * 1_000_000))
    with pytest.raises(MessageSizeExceededError, match="1048576-byte"):
        ServiceBusClient(premium).get_queue_sender("big").send_messages(ServiceBusMessage(b"x" * 1_048_576))


def test_partition_quota(ns_path):
    sparkbus.create_namespace(ns_path, max_partition_size_in_kilobytes=10)
    sparkbus.ServiceBusAdministrationClient(ns_path).create_queue("small")
    admin = sparkbus.ServiceBusAdministrationClient(ns_path)
    sender = ServiceBusClient(ns_path).get_queue_sender("small")
    for _ in range(4):
        sender.send_messages(ServiceBusMessage(b"x" * 2000))
    with pytest.raises(ServiceBusQuotaExceededError, match="would exceed its 10240-byte size limit"):
        sender.send_messages([ServiceBusMessage(b"x" * 1000), ServiceBusMessage(b"x" * 2000)])
    assert admin.get_queue_runtime_properties("small").active_message_count == 4
    sender.send_messages(ServiceBusMessage(b"x" * 1000))  # what still fits is taken
    assert admin.get_queue_runtime_properties("small").active_message_count == 5
    assert stored_messages(admin, "small")["body"].to_pylist()[-1] == b"x" * 1000


def test_a_full_partition_takes_messages_again_once_another_client_settles_some(ns_path):
    """Refusals after the first are answered from the exact measure followed along the logs, so what another
    client settles must show at once."""
    sparkbus.create_namespace(ns_path, max_partition_size_in_kilobytes=10)
    admin = sparkbus.ServiceBusAdministrationClient(ns_path)
    admin.create_queue("small")
    sender = ServiceBusClient(ns_path).get_queue_sender("small")
    for _ in range(4):
        sender.send_messages(ServiceBusMessage(b"x" * 2000))
    for _ in range(3):
        with pytest.raises(ServiceBusQuotaExceededError, match="would exceed its 10240-byte size limit"):
            sender.send_messages(ServiceBusMessage(b"x" * 3000))
    with ServiceBusClient(ns_path).get_queue_receiver("small") as receiver:
        receiver.complete_message(receiver.receive_messages(max_message_count=1, max_wait_time=5)[0])
    sender.send_messages(ServiceBusMessage(b"x" * 3000))
    with pytest.raises(ServiceBusQuotaExceededError):
        sender.send_messages(ServiceBusMessage(b"x" * 3000))
    assert admin.get_queue_runtime_properties("small").active_message_count == 4


def test_size_bounds_stay_upper_bounds_across_rewrites():
    bounds = SizeBounds()
    bounds.add("partition_id=0/a.parquet", 0, 500)
    bounds.add("partition_id=0/b.parquet", 0, 300)
    bounds.add("partition_id=1/c.parquet", 1, 100)
    assert (bounds.get(0), bounds.get(1), bounds.get(7)) == (800, 100, 0)
    bounds.remove("partition_id=0/a.parquet")  # a compaction: its rows come back in the file it adds
    bounds.remove("partition_id=0/b.parquet")
    bounds.add("partition_id%3D0/ab.parquet", 0, 800)
    assert bounds.get(0) == 800
    bounds.remove("partition_id=0/unknown.parquet")  # never counted: nothing to take back
    assert bounds.get(0) == 800
    bounds.measured({0: 200})  # settled rows left out: the files counted before must not be subtracted again
    bounds.remove("partition_id=0/ab.parquet")
    assert bounds.get(0) == 200
    bounds.add("partition_id=0/d.parquet", 0, 50)
    bounds.remove("partition_id=0/d.parquet")
    assert (bounds.get(0), bounds.get(1)) == (200, 100)


def test_sessions_required(admin, client):
    admin.create_queue("s", requires_session=True)
    sender = client.get_queue_sender("s")
    with pytest.raises(InvalidOperationError, match="requires sessions: the messages at positions \\[1\\]"):
        sender.send_messages([ServiceBusMessage("a", session_id="x"), ServiceBusMessage("b", message_id="mb")])
    sender.send_messages(ServiceBusMessage("a", session_id="x"))
    assert stored_messages(admin, "s").num_rows == 1


def test_entity_errors(admin, client, ns_path):
    admin.create_topic("t")
    admin.create_subscription("t", "s")
    with pytest.raises(MessagingEntityNotFoundError, match="nope"):
        client.get_queue_sender("nope").send_messages(ServiceBusMessage("x"))
    with pytest.raises(InvalidOperationError, match="is a subscription"):
        client.get_queue_sender("t/Subscriptions/s").send_messages(ServiceBusMessage("x"))
    admin.create_queue("off", status="SendDisabled")
    with pytest.raises(MessagingEntityDisabledError, match="SendDisabled"):
        client.get_queue_sender("off").send_messages(ServiceBusMessage("x"))
    bound = ServiceBusClient.from_connection_string(f"Endpoint=sparkbus://{ns_path};EntityPath=t")
    bound.get_topic_sender("t").send_messages(ServiceBusMessage("x"))
    with pytest.raises(ValueError, match="does not match the EntityPath"):
        bound.get_queue_sender("off")
    with pytest.raises(TypeError, match="ServiceBusMessage"):
        client.get_topic_sender("t").send_messages("not a message")


def test_schedule_and_cancel(admin, client):
    admin.create_queue("sched", enable_partitioning=True)
    sender = client.get_queue_sender("sched")
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    numbers = sender.schedule_messages([ServiceBusMessage("a"), ServiceBusMessage("b"), ServiceBusMessage("c")], later)
    sender.send_messages(ServiceBusMessage("now"))
    assert len(numbers) == 3
    rt = admin.get_queue_runtime_properties("sched")
    assert (rt.scheduled_message_count, rt.active_message_count, rt.total_message_count) == (3, 1, 4)
    sender.cancel_scheduled_messages(numbers[0])
    with pytest.raises(MessageNotFoundError, match="already delivered, settled or cancelled"):
        sender.cancel_scheduled_messages(numbers)  # all or nothing: the others stay scheduled
    with pytest.raises(MessageNotFoundError, match="12345"):
        sender.cancel_scheduled_messages([numbers[1], 12345])
    sender.cancel_scheduled_messages(numbers[1:])
    rt = admin.get_queue_runtime_properties("sched")
    assert (rt.scheduled_message_count, rt.total_message_count) == (0, 1)
    stored = {r["sequence_number"]: r for r in stored_messages(admin, "sched").to_pylist()}
    assert all(stored[n]["scheduled_enqueue_time_utc"] == later.replace(microsecond=later.microsecond) for n in numbers)


def test_topic_send_and_sizes(admin, client):
    admin.create_topic("t", enable_partitioning=True)
    admin.create_subscription("t", "a")
    admin.create_subscription("t", "b")
    client.get_topic_sender("t").send_messages([ServiceBusMessage(b"x" * 100, subject="hello") for _ in range(3)])
    rows = stored_messages(admin, "t").to_pylist()
    rt = admin.get_topic_runtime_properties("t")
    assert rt.total_message_count == 3
    assert rt.size_in_bytes == sum(r["body_size"] + 2 * r["header_size"] for r in rows)


def test_runtime_properties_reflect_sends(admin, client):
    admin.create_queue("q", enable_partitioning=True)
    client.get_queue_sender("q").send_messages([ServiceBusMessage(b"x" * 10) for _ in range(20)])
    rt = admin.get_queue_runtime_properties("q")
    rows = stored_messages(admin, "q").to_pylist()
    assert (rt.active_message_count, rt.total_message_count) == (20, 20)
    assert rt.size_in_bytes == sum(r["body_size"] + r["header_size"] for r in rows)


def test_interleaved_senders_never_overwrite_each_other(admin, client):
    """Regression: a sender's cached high-water marks must match the table version it commits against."""
    admin.create_queue("p", enable_partitioning=True)
    keys = {}
    for i in range(200):
        keys.setdefault(partition_of(f"k{i}", 16), f"k{i}")
    x, y = keys[0], keys[1]
    a, b = client.get_queue_sender("p"), client.get_queue_sender("p")
    a.send_messages([ServiceBusMessage("a-x1", partition_key=x), ServiceBusMessage("a-y1", partition_key=y)])
    b.send_messages(ServiceBusMessage("b-y2", partition_key=y))  # a's mark for y is now behind
    a.send_messages(ServiceBusMessage("a-x2", partition_key=x))  # rebased over b's commit to y
    a.send_messages(ServiceBusMessage("a-y3", partition_key=y))  # must number after b-y2, not replace it
    for i in range(45):  # compaction (every 20 versions) moves a's table past b's commits as well
        (a if i % 2 else b).send_messages(ServiceBusMessage(f"m{i}", partition_key=y if i % 3 else x))
    rows = stored_messages(admin, "p")
    assert rows.num_rows == 50
    for pid in (0, 1):
        numbers = sorted(n & ((1 << 48) - 1) for n, p in zip(rows["sequence_number"].to_pylist(),
                                                             rows["partition_id"].to_pylist()) if p == pid)
        assert numbers == list(range(1, len(numbers) + 1))
    assert {b"a-x1", b"a-y1", b"b-y2", b"a-x2", b"a-y3"} <= set(rows["body"].to_pylist())


def test_small_files_are_compacted_in_the_background_without_changing_a_message(admin, client):
    from sparkbus import storage
    from sparkbus.storage import maintenance

    admin.create_queue("q")
    with client.get_queue_sender("q") as sender:
        for i in range(2 * maintenance.COMPACT_EVERY + 5):              # one commit, one small file each
            sender.send_messages(ServiceBusMessage(f"m{i}"))
    assert maintenance.wait_idle(60)
    table = storage.open_table(admin.get_entity_tables("q")["messages"])
    assert len(table.file_uris()) < maintenance.COMPACT_EVERY        # compacted twice: at most 6 files left
    rows = stored_messages(admin, "q")
    assert [b.decode() for b in rows["body"].to_pylist()] == [f"m{i}" for i in range(2 * maintenance.COMPACT_EVERY + 5)]
    assert rows["sequence_number"].to_pylist() == list(range(1, 2 * maintenance.COMPACT_EVERY + 6))
