"""Promises the documentation (README.md, docs/) makes in so many words, each tested as it is worded
there (quoted per test)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest
from conftest import REPO

from sparkbus import (NEXT_AVAILABLE_SESSION, MessageLockLostError, MessageSizeExceededError,
                      MessagingEntityDisabledError, PartitionUnavailableError, ServiceBusMessage, ServiceBusSubQueue,
                      SessionCannotBeLockedError, set_partition_availability, storage)
from sparkbus.core import partitioning
from sparkbus.engine.registry import SETTINGS_REFRESH_SECONDS


def _messages_table(admin, entity: str):
    return storage.open_table(admin.get_entity_tables(entity)["messages"])


def _rows_at(admin, entity: str, version: int) -> list[dict]:
    table = _messages_table(admin, entity)
    table.load_as_version(version)
    return storage.query("SELECT partition_id, body FROM m ORDER BY body", m=table).to_pylist()


def _keys_for_every_partition(count: int) -> dict[int, str]:
    """A partition key landing in each of `count` partitions (the documented placement function)."""
    keys: dict[int, str] = {}
    i = 0
    while len(keys) < count:
        keys.setdefault(partitioning.partition_of(f"k{i}", count), f"k{i}")
        i += 1
    return keys


# "One `send_messages` call is atomic: all of its messages, across partitions, are in one Delta commit, or
# none is."
def test_one_send_messages_call_is_one_delta_commit_across_partitions(admin, client):
    admin.create_queue("q", enable_partitioning=True)
    keys = _keys_for_every_partition(16)
    sender = client.get_queue_sender("q")
    before = _messages_table(admin, "q").version()
    sender.send_messages([ServiceBusMessage(f"{p:02d}-{n}", partition_key=keys[p])
                          for p in range(16) for n in range(3)])
    assert _messages_table(admin, "q").version() == before + 1
    assert _rows_at(admin, "q", before) == []
    rows = _rows_at(admin, "q", before + 1)  # that one version holds every message, in every partition
    assert [r["body"] for r in rows] == [f"{p:02d}-{n}".encode() for p in range(16) for n in range(3)]
    assert {r["partition_id"] for r in rows} == set(range(16))

    batch = sender.create_message_batch()
    for p in range(16):
        batch.add_message(ServiceBusMessage(f"batch {p:02d}", partition_key=keys[p]))
    sender.send_messages(batch)
    assert _messages_table(admin, "q").version() == before + 2
    assert len(_rows_at(admin, "q", before + 2)) == 48 + 16


def test_a_send_messages_call_that_fails_writes_nothing(admin, client, ns_path):
    admin.create_queue("q", enable_partitioning=True)
    keys = _keys_for_every_partition(16)
    before = _messages_table(admin, "q").version()
    with pytest.raises(MessageSizeExceededError):
        client.get_queue_sender("q").send_messages(
            [ServiceBusMessage("fine", partition_key=keys[0]), ServiceBusMessage("x" * 300_000, partition_key=keys[1])])
    set_partition_availability(ns_path, 7, False, entity_path="q")
    with pytest.raises(PartitionUnavailableError):
        client.get_queue_sender("q").send_messages(
            [ServiceBusMessage(f"m{p}", partition_key=keys[p]) for p in range(16)])
    assert _messages_table(admin, "q").version() == before
    assert admin.get_queue_runtime_properties("q").total_message_count == 0


# "Senders re-read entity settings at most once a second, so a status change or partition fault reaches
# existing senders within a second; new senders start from the catalog."
def _refused_a_second_later(send, error: type, clock) -> int:
    """Send once right after a change (it may go through: the sender read its settings less than a second
    ago), then once more after SETTINGS_REFRESH_SECONDS (1 s) of the service clock, which must raise error.
    Returns how many sends went through (0 or 1)."""
    try:
        send()
        accepted = 1
    except error:
        accepted = 0
    clock.advance(SETTINGS_REFRESH_SECONDS + 0.01)
    with pytest.raises(error):
        send()
    return accepted


def test_existing_senders_see_a_status_change_within_a_second(admin, client, clock):
    admin.create_queue("q")
    sender = client.get_queue_sender("q")
    sender.send_messages(ServiceBusMessage("before"))  # the sender has read the settings
    admin.update_queue("q", status="SendDisabled")
    with pytest.raises(MessagingEntityDisabledError):
        client.get_queue_sender("q").send_messages(ServiceBusMessage("new sender"))  # from the catalog: at once
    accepted = _refused_a_second_later(lambda: sender.send_messages(ServiceBusMessage("during")),
                                       MessagingEntityDisabledError, clock)
    assert admin.get_queue_runtime_properties("q").total_message_count == 1 + accepted

    admin.update_queue("q", status="Active")
    clock.advance(SETTINGS_REFRESH_SECONDS + 0.01)
    sender.send_messages(ServiceBusMessage("after"))  # re-enabling reached the existing sender
    assert admin.get_queue_runtime_properties("q").total_message_count == 2 + accepted


def test_existing_senders_see_a_partition_fault_within_a_second(admin, client, ns_path, clock):
    admin.create_queue("q", enable_partitioning=True)
    key = _keys_for_every_partition(16)[5]
    sender = client.get_queue_sender("q")
    sender.send_messages(ServiceBusMessage("before", partition_key=key))
    set_partition_availability(ns_path, 5, False, entity_path="q", reason="test")
    accepted = _refused_a_second_later(lambda: sender.send_messages(ServiceBusMessage("k", partition_key=key)),
                                       PartitionUnavailableError, clock)
    sender.send_messages([ServiceBusMessage(f"keyless {i}") for i in range(30)])  # round robin skips partition 5
    rows = storage.query("SELECT partition_id FROM m", m=_messages_table(admin, "q"))["partition_id"].to_pylist()
    assert rows.count(5) == 1 + accepted and len(rows) == 31 + accepted


# "Closing a session receiver (or leaving its `with` block) releases the session at once: its unsettled
# messages become available again first, then the session lock is dropped."
def test_closing_a_session_receiver_frees_its_session_and_messages_at_once(admin, client):
    admin.create_queue("s", requires_session=True, lock_duration="PT1M")
    client.get_queue_sender("s").send_messages([ServiceBusMessage(f"m{i}", session_id="cart") for i in range(3)])
    first = client.get_queue_receiver("s", session_id="cart")
    held = first.receive_messages(max_message_count=2)
    assert [str(m) for m in held] == ["m0", "m1"]
    with pytest.raises(SessionCannotBeLockedError):
        client.get_queue_receiver("s", session_id="cart", max_wait_time=0)  # held for a minute
    started = time.monotonic()
    first.close()
    with client.get_queue_receiver("s", session_id="cart", max_wait_time=0) as second:
        got = second.receive_messages(max_message_count=3)
        assert [(str(m), m.delivery_count) for m in got] == [("m0", 2), ("m1", 2), ("m2", 1)]
        assert time.monotonic() - started < 5  # not a lapse of the one-minute locks
        with pytest.raises(ValueError, match="closed"):
            first.complete_message(held[0])
        second.complete_messages(got)
    assert admin.get_queue_runtime_properties("s").total_message_count == 0


def test_leaving_a_session_receivers_with_block_frees_it_for_next_available(admin, client):
    admin.create_queue("s", requires_session=True, lock_duration="PT1M")
    client.get_queue_sender("s").send_messages([ServiceBusMessage(f"m{i}", session_id="a") for i in range(2)])
    with client.get_queue_receiver("s", session_id=NEXT_AVAILABLE_SESSION) as first:
        assert first.session.session_id == "a"
        (held,) = first.receive_messages()
    with client.get_queue_receiver("s", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=0) as second:
        assert second.session.session_id == "a"
        got = second.receive_messages(max_message_count=2)
        assert [(m.sequence_number, m.delivery_count) for m in got] == [(held.sequence_number, 2), (2, 1)]


# "A message abandoned, or whose lock lapsed, at `max_delivery_count` moves to the dead-letter sub-queue with
# reason `MaxDeliveryCountExceeded`."
@pytest.mark.slow
def test_a_lock_lapsing_at_max_delivery_count_dead_letters_the_message(admin, client, clock):
    admin.create_queue("q", max_delivery_count=1, lock_duration="PT5S")
    sender = client.get_queue_sender("q")
    sender.send_messages(ServiceBusMessage("poison"))
    sender.send_messages(ServiceBusMessage("fine"))
    receiver = client.get_queue_receiver("q")
    (poison,) = receiver.receive_messages()
    assert (str(poison), poison.delivery_count) == ("poison", 1)
    clock.past(poison.locked_until_utc)
    got = client.get_queue_receiver("q").receive_messages(max_message_count=5)
    assert [str(m) for m in got] == ["fine"]  # the lapsed message at its limit is not delivered again
    with pytest.raises(MessageLockLostError):
        receiver.complete_message(poison)
    rt = admin.get_queue_runtime_properties("q")
    assert (rt.active_message_count, rt.dead_letter_message_count) == (1, 1)
    (dead,) = client.get_queue_receiver("q", sub_queue=ServiceBusSubQueue.DEAD_LETTER).receive_messages()
    assert (dead.sequence_number, str(dead), dead.dead_letter_reason) == (
        poison.sequence_number, "poison", "MaxDeliveryCountExceeded")


# "`session_id=NEXT_AVAILABLE_SESSION` locks any unlocked session that has deliverable messages, searching
# every partition, oldest waiting message first".
def test_next_available_session_takes_the_oldest_waiting_message_first(admin, client):
    admin.create_queue("s", requires_session=True, lock_duration="PT1M")
    sender = client.get_queue_sender("s")
    for session in ["e", "b", "d", "a", "c"]:  # neither alphabetical nor reversed
        sender.send_messages(ServiceBusMessage(f"{session}1", session_id=session))
    for session in ["c", "a", "d", "b", "e"]:
        sender.send_messages(ServiceBusMessage(f"{session}2", session_id=session))
    with client.get_queue_receiver("s", session_id="e") as e:  # e's oldest message leaves: e now waits with e2
        (e1,) = e.receive_messages()
        e.complete_message(e1)
    busy = client.get_queue_receiver("s", session_id="d")  # a locked session is skipped
    taken = []
    for _ in range(4):
        receiver = client.get_queue_receiver("s", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=0)
        taken.append(receiver.session.session_id)  # each keeps its session locked
    assert taken == ["b", "a", "c", "e"]
    busy.close()
    last = client.get_queue_receiver("s", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=0)
    assert last.session.session_id == "d"


def test_next_available_session_orders_sessions_of_every_partition_by_their_oldest_message(admin, client):
    admin.create_queue("p", requires_session=True, enable_partitioning=True, lock_duration="PT1M")
    sender = client.get_queue_sender("p")
    order = [f"s{i}" for i in range(12)]  # spread over several partitions, some sharing one
    assert len({partitioning.partition_of(s, 16) for s in order}) > 4
    for session in order:
        sender.send_messages(ServiceBusMessage(session, session_id=session))
    held = [client.get_queue_receiver("p", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=0) for _ in order]
    assert [r.session.session_id for r in held] == order


# "Each process counts in memory ... and appends its counts ... to the namespace's `_metrics` Delta table when
# a `ServiceBusClient` or administration client closes, at interpreter exit" and "Clean exit": no process
# aborts at exit after its work is done, and nothing is hidden with `os._exit`.
_CLIENT_SCRIPT = textwrap.dedent("""
    import sys, time
    import sparkbus
    from sparkbus import ServiceBusMessage

    client = sparkbus.ServiceBusClient(sys.argv[1])
    sender = client.get_queue_sender("q")
    for i in range(25):  # one commit each: checkpoints and a compaction are due on the maintenance thread
        sender.send_messages(ServiceBusMessage(f"m{i}"))
    receiver = client.get_queue_receiver("q")
    got = receiver.receive_messages(max_message_count=20)
    receiver.complete_messages(got[:15])
    peeked = receiver.peek_messages(5)
    counts = sparkbus.ServiceBusAdministrationClient(sys.argv[1]).get_queue_runtime_properties("q")
    print(len(got), len(peeked), counts.active_message_count, flush=True)
    print(time.time(), flush=True)  # then exit with the client, sender and receiver open
""")


@pytest.mark.slow
def test_a_process_exits_cleanly_and_persists_its_metrics_without_closing_anything(admin, ns_path):
    admin.create_queue("q")
    for run in range(3):
        done = subprocess.run([sys.executable, "-c", _CLIENT_SCRIPT, ns_path], cwd=REPO, capture_output=True,
                              text=True, timeout=120, check=False)
        exited = time.time()
        assert done.returncode == 0, done.stderr
        assert "terminate called" not in done.stderr
        summary, finished = done.stdout.split("\n")[:2]
        assert summary == f"20 5 {10 + 10 * run}"
        assert exited - float(finished) < 3  # the exit itself (metrics flush, maintenance thread) is prompt
        report = admin.get_entity_metrics("q")  # only the spawned processes used the queue
        assert (report.incoming_messages, report.outgoing_messages) == (25 * (run + 1), 20 * (run + 1))
        assert report.successful_requests >= 25 * (run + 1)
