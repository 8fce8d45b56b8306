"""The receive path: peek-lock and receive-and-delete, settlement, locks, dead-lettering, deferral, peek."""
from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest

from sparkbus import (InvalidOperationError, MessageAlreadySettled, MessageLockLostError, MessageNotFoundError,
                      MessagingEntityDisabledError, ServiceBusMessage, ServiceBusMessageState, ServiceBusReceiveMode,
                      ServiceBusSubQueue, storage)
from sparkbus.core import partitioning
from sparkbus.engine import retention
from sparkbus.engine.namespace import open_catalog
from sparkbus.engine.registry import resolve_current


def counts(admin, queue):
    rt = admin.get_queue_runtime_properties(queue)
    return rt.active_message_count, rt.dead_letter_message_count, rt.scheduled_message_count, rt.total_message_count


def send(client, queue, *messages):
    client.get_queue_sender(queue).send_messages(list(messages))


def test_peek_lock_settlements_keep_counts_exact(admin, client):
    admin.create_queue("q", enable_partitioning=True)
    send(client, "q", *(ServiceBusMessage(f"m{i}", application_properties={"i": i}, subject="s") for i in range(8)))
    receiver = client.get_queue_receiver("q")
    got = receiver.receive_messages(max_message_count=4)
    assert len(got) == 4 and len({m.sequence_number for m in got}) == 4
    first = got[0]
    assert first.delivery_count == 1 and first.lock_token and first.locked_until_utc > datetime.now(timezone.utc)
    assert first.subject == "s" and first.str_application_properties["i"] == int(str(first)[1:])
    assert first.state == ServiceBusMessageState.ACTIVE and first.enqueued_time_utc <= datetime.now(timezone.utc)
    assert counts(admin, "q") == (8, 0, 0, 8)  # locked messages are still active
    receiver.complete_message(got[0])
    receiver.dead_letter_message(got[1], reason="bad input", error_description="field x missing")
    receiver.defer_message(got[2])
    receiver.abandon_message(got[3])
    assert counts(admin, "q") == (6, 1, 0, 7)
    with pytest.raises(MessageAlreadySettled):
        receiver.complete_message(got[0])
    rest = receiver.receive_messages(max_message_count=20)
    assert len(rest) == 5  # 8 - completed - dead-lettered - deferred
    again = [m for m in rest if m.sequence_number == got[3].sequence_number]
    assert again and again[0].delivery_count == 2  # the abandoned one, redelivered
    for m in rest:
        receiver.complete_message(m)
    assert receiver.receive_messages(max_message_count=5, max_wait_time=0) == []
    deferred = receiver.receive_deferred_messages([got[2].sequence_number])
    assert [m.sequence_number for m in deferred] == [got[2].sequence_number]
    assert deferred[0].state == ServiceBusMessageState.DEFERRED
    receiver.complete_message(deferred[0])
    dead = client.get_queue_receiver("q", sub_queue=ServiceBusSubQueue.DEAD_LETTER).receive_messages(5)
    assert [(m.sequence_number, m.dead_letter_reason, m.dead_letter_error_description) for m in dead] == [
        (got[1].sequence_number, "bad input", "field x missing")]
    assert counts(admin, "q") == (0, 1, 0, 1)


def test_receive_and_delete(admin, client):
    admin.create_queue("q")
    send(client, "q", ServiceBusMessage("a"), ServiceBusMessage("b"))
    receiver = client.get_queue_receiver("q", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE)
    got = receiver.receive_messages(max_message_count=5)
    assert [str(m) for m in got] == ["a", "b"] and got[0].lock_token is None
    assert counts(admin, "q") == (0, 0, 0, 0)
    with pytest.raises(InvalidOperationError, match="RECEIVE_AND_DELETE"):
        receiver.complete_message(got[0])


def test_max_delivery_count_dead_letters(admin, client):
    admin.create_queue("q", max_delivery_count=2)
    send(client, "q", ServiceBusMessage("poison"))
    receiver = client.get_queue_receiver("q")
    for expected in (1, 2):
        (m,) = receiver.receive_messages()
        assert m.delivery_count == expected
        receiver.abandon_message(m)
    assert receiver.receive_messages(max_wait_time=0) == []
    assert counts(admin, "q") == (0, 1, 0, 1)
    (dead,) = client.get_queue_receiver("q", sub_queue=ServiceBusSubQueue.DEAD_LETTER).receive_messages()
    assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
    assert dead.delivery_count == 3  # two deliveries, then this lock: every lock counts


@pytest.mark.slow
def test_lock_expiry_redelivers_and_loses_the_lock(admin, client, clock):
    admin.create_queue("q", lock_duration="PT5S")
    send(client, "q", ServiceBusMessage("slow job"))
    first = client.get_queue_receiver("q")
    (m,) = first.receive_messages()
    assert first.renew_message_lock(m) > m.enqueued_time_utc
    clock.past(m.locked_until_utc)
    second = client.get_queue_receiver("q")
    (again,) = second.receive_messages()
    assert again.sequence_number == m.sequence_number and again.delivery_count == 2
    with pytest.raises(MessageLockLostError):
        first.complete_message(m)
    second.complete_message(again)
    assert counts(admin, "q") == (0, 0, 0, 0)


def test_renew_extends_the_lock(admin, client, clock):
    admin.create_queue("q", lock_duration="PT30S")
    send(client, "q", ServiceBusMessage("x"))
    receiver = client.get_queue_receiver("q")
    (m,) = receiver.receive_messages()
    before = m.locked_until_utc
    clock.advance(0.05)
    after = receiver.renew_message_lock(m)
    assert after > before and m.locked_until_utc == after
    receiver.complete_message(m)


def test_expired_messages_are_never_delivered(admin, client, clock):
    admin.create_queue("keep", dead_lettering_on_message_expiration=True)
    admin.create_queue("drop")
    for queue in ("keep", "drop"):
        send(client, queue, ServiceBusMessage("old", time_to_live=timedelta(milliseconds=200)), ServiceBusMessage("fresh"))
    clock.advance(0.4)
    for queue in ("keep", "drop"):
        got = client.get_queue_receiver(queue).receive_messages(max_message_count=5)
        assert [str(m) for m in got] == ["fresh"]
    (dead,) = client.get_queue_receiver("keep", sub_queue=ServiceBusSubQueue.DEAD_LETTER).receive_messages()
    assert dead.dead_letter_reason == "TTLExpiredException"
    assert counts(admin, "keep") == (1, 1, 0, 2) and counts(admin, "drop") == (1, 0, 0, 1)


def test_scheduled_and_cancelled_messages(admin, client):
    admin.create_queue("q")
    sender = client.get_queue_sender("q")
    soon = datetime.now(timezone.utc) + timedelta(seconds=1)
    (kept,) = sender.schedule_messages(ServiceBusMessage("later"), soon)
    (cancelled,) = sender.schedule_messages(ServiceBusMessage("never"), soon)
    sender.cancel_scheduled_messages(cancelled)
    receiver = client.get_queue_receiver("q")
    assert receiver.receive_messages(max_wait_time=0) == []
    assert [m.state for m in receiver.peek_messages(5)] == [ServiceBusMessageState.SCHEDULED]
    got = receiver.receive_messages(max_message_count=5, max_wait_time=3)
    assert [m.sequence_number for m in got] == [kept]


def test_settling_wrongly(admin, client):
    admin.create_queue("q")
    send(client, "q", ServiceBusMessage("x"))
    receiver = client.get_queue_receiver("q")
    (peeked,) = receiver.peek_messages()
    with pytest.raises(InvalidOperationError, match="peeked messages"):
        receiver.complete_message(peeked)
    with pytest.raises(TypeError):
        receiver.complete_message("x")
    with pytest.raises(MessageNotFoundError):
        receiver.receive_deferred_messages([12345])
    dlq = client.get_queue_receiver("q", sub_queue=ServiceBusSubQueue.DEAD_LETTER)
    with pytest.raises(InvalidOperationError, match="cannot be dead-lettered again"):
        dlq.dead_letter_message(peeked)


def test_peek_walks_every_partition_once(admin, client):
    admin.create_queue("q", enable_partitioning=True)
    send(client, "q", *(ServiceBusMessage(f"m{i}") for i in range(40)))
    receiver = client.get_queue_receiver("q")
    (locked,) = receiver.receive_messages()
    seen = []
    while True:
        batch = receiver.peek_messages(max_message_count=3)
        if not batch:
            break
        assert len({m.sequence_number >> 48 for m in batch}) == 1  # one partition per call
        seen += batch
    assert sorted(m.sequence_number for m in seen) == sorted(set(m.sequence_number for m in seen))
    assert len(seen) == 40 and all(m.lock_token is None for m in seen)
    assert next(m for m in seen if m.sequence_number == locked.sequence_number).delivery_count == 1
    start = sorted(m.sequence_number for m in seen)[-1]
    assert [m.sequence_number for m in receiver.peek_messages(5, sequence_number=start)] == [start]


def test_prefetch_serves_from_cache(admin, client):
    admin.create_queue("q")
    send(client, "q", *(ServiceBusMessage(f"m{i}") for i in range(6)))
    receiver = client.get_queue_receiver("q", prefetch_count=3)
    (first,) = receiver.receive_messages()
    other = client.get_queue_receiver("q")
    assert [str(m) for m in other.receive_messages(max_message_count=5)] == ["m4", "m5"]  # m1-m3 are prefetched
    second = receiver.receive_messages(max_message_count=2)
    assert [str(m) for m in second] == ["m1", "m2"]
    assert all(m.locked_until_utc == first.locked_until_utc for m in second)  # locked with m0, not since
    receiver.complete_messages([first, *second])



def test_closing_a_receiver_gives_its_prefetched_messages_back_at_once(admin, client):
    """Messages locked into the prefetch cache but never handed out are available to other receivers as soon
    as the receiver closes, with their delivery counts as before (not after the lock duration)."""
    admin.create_queue("q")
    send(client, "q", *(ServiceBusMessage(f"m{i}") for i in range(4)))
    receiver = client.get_queue_receiver("q", prefetch_count=3)
    (first,) = receiver.receive_messages()
    other = client.get_queue_receiver("q")
    assert other.receive_messages(max_message_count=5, max_wait_time=0.2) == []  # m1-m3 are prefetched
    receiver.complete_message(first)
    receiver.close()
    again = other.receive_messages(max_message_count=5)
    assert [(str(m), m.delivery_count) for m in again] == [("m1", 1), ("m2", 1), ("m3", 1)]
    other.complete_messages(again)

@pytest.mark.slow
@pytest.mark.local_only
def test_prefetched_messages_whose_lock_lapsed_are_not_handed_out(admin, client, clock):
    admin.create_queue("q", lock_duration="PT5S")
    send(client, "q", *(ServiceBusMessage(f"m{i}") for i in range(5)))
    receiver = client.get_queue_receiver("q", prefetch_count=3)
    (first,) = receiver.receive_messages()  # m0, with m1-m3 locked into the cache in the same commit
    other = client.get_queue_receiver("q")
    (last,) = other.receive_messages(max_message_count=5)
    assert str(last) == "m4"
    other.complete_message(last)
    clock.past(first.locked_until_utc)
    got = receiver.receive_messages(max_message_count=3)
    # the cached m1-m3 (delivery 1, locks lapsed) are dropped: these are fresh locks, delivered a second time
    assert [str(m) for m in got] == ["m0", "m1", "m2"]
    assert all(m.delivery_count == 2 and m.locked_until_utc > datetime.now(timezone.utc) for m in got)
    with pytest.raises(MessageLockLostError):
        receiver.complete_message(first)
    assert receiver.complete_messages(got) == 3
    (rest,) = receiver.receive_messages(max_message_count=5)  # m3, prefetched again with the fresh locks
    assert (str(rest), rest.delivery_count) == ("m3", 2)
    receiver.complete_message(rest)
    assert counts(admin, "q") == (0, 0, 0, 0)


def test_waiting_and_iteration(admin, client):
    admin.create_queue("q")
    receiver = client.get_queue_receiver("q", max_wait_time=0.3)
    started = time.monotonic()
    assert receiver.receive_messages() == []
    assert time.monotonic() - started >= 0.3
    send(client, "q", ServiceBusMessage("a"), ServiceBusMessage("b"))
    with receiver:
        bodies = []
        for message in receiver:
            bodies.append(str(message))
            receiver.complete_message(message)
    assert bodies == ["a", "b"]


def test_receiver_errors(admin, client):
    admin.create_queue("sessions", requires_session=True)
    admin.create_queue("off", status="ReceiveDisabled")
    with pytest.raises(InvalidOperationError, match="requires sessions"):
        client.get_queue_receiver("sessions").receive_messages()
    with pytest.raises(MessagingEntityDisabledError, match="ReceiveDisabled"):
        client.get_queue_receiver("off")
    with pytest.raises(ValueError):
        client.get_queue_receiver("off", receive_mode="sometimes")
    admin.create_topic("t")
    admin.create_subscription("t", "s")
    assert client.get_subscription_receiver("t", "s").receive_messages(max_message_count=3, max_wait_time=0) == []


@pytest.mark.slow
def test_complete_messages_is_all_or_nothing_across_partitions(admin, client, clock):
    admin.create_queue("p", enable_partitioning=True, lock_duration="PT5S")
    send(client, "p", *[ServiceBusMessage(f"m{i}", partition_key=f"k{i % 3}") for i in range(9)])
    receiver = client.get_queue_receiver("p")
    first = receiver.receive_messages(max_message_count=9)
    assert len({m.sequence_number >> 48 for m in first}) == 3
    # the locks lapse; another receiver takes three messages of one partition
    clock.past(max(m.locked_until_utc for m in first))
    thief = client.get_queue_receiver("p")
    stolen = thief.receive_messages(max_message_count=3)
    with pytest.raises(MessageLockLostError, match="nothing completed"):
        receiver.complete_messages(first)
    assert counts(admin, "p")[3] == 9
    assert thief.complete_messages(stolen) == 3
    with pytest.raises(MessageAlreadySettled):
        thief.complete_messages(stolen[:1])
    rest = client.get_queue_receiver("p").receive_messages(max_message_count=9)
    assert len(rest) == 6 and client.get_queue_receiver("p").receive_messages(max_wait_time=0) == []
    assert {m.delivery_count for m in rest} == {2}


def test_a_commit_walking_past_a_retention_run_never_redelivers_a_completed_message(admin, client, ns_path):
    """A receiver's settlement in one partition walks past a retention run of another (the run's entries are
    other writers' commits to it), so its view of the locks table moves past that run while its view of the
    messages table has not: the completed message's row is still there, its state row gone, which reads as a
    message to deliver. The next receive, even one that first tries what its views hold (read within the
    last two seconds: on the emulators this test runs in well under that), takes nothing."""
    admin.create_queue("q", enable_partitioning=True)
    first, other = "k0", next(f"k{i}" for i in range(1, 100)
                              if partitioning.partition_of(f"k{i}", 16) != partitioning.partition_of("k0", 16))
    client.get_queue_sender("q").send_messages([ServiceBusMessage("done", partition_key=first),
                                                ServiceBusMessage("held", partition_key=first),
                                                ServiceBusMessage("settled later", partition_key=other)])
    receiver = client.get_queue_receiver("q", max_wait_time=5)
    got: dict[str, object] = {}
    while len(got) < 3:
        got.update((str(m), m) for m in receiver.receive_messages(3))
    receiver.complete_message(got["done"])
    info = resolve_current(open_catalog(ns_path), "q", ("queue",))
    tables = admin.get_entity_tables("q")
    removed = retention.run(info, storage.open_table(tables["messages"]), storage.open_table(tables["locks"]),
                            partitioning.partition_of(first, 16), minimum=1)
    assert removed == 1  # "done" left both tables; "held" (the partition's highest number) stays
    receiver.complete_message(got["settled later"])
    assert receiver.receive_messages(5, max_wait_time=0) == []  # "held" is locked, "done" is gone
    peeked = client.get_queue_receiver("q").peek_messages(10)
    assert [(str(m), m.state.name) for m in peeked] == [("held", "ACTIVE")]


def test_messages_of_one_receive_completed_in_any_order_and_in_parts_each_complete_once(admin, client):
    """A receive's messages settled as they came (their state rows one slice of the receive's), in another
    order, and a part then the rest: every one completed once, the others untouched until settled."""
    admin.create_queue("q")
    with client.get_queue_sender("q") as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"m{i}") for i in range(12)])
    with client.get_queue_receiver("q", max_wait_time=1) as receiver:
        got = receiver.receive_messages(12)
        assert len(got) == 12
        receiver.complete_messages(got[2:5])  # consecutive, in order
        receiver.complete_messages([got[7], got[0], got[11]])  # out of order
        with pytest.raises(MessageAlreadySettled):
            receiver.complete_messages([got[3]])
        left = [m for i, m in enumerate(got) if i not in (0, 2, 3, 4, 7, 11)]
        assert admin.get_queue_runtime_properties("q").active_message_count == 6  # (locked ones count as active)
        receiver.complete_messages(left[::-1])
    assert admin.get_queue_runtime_properties("q").total_message_count == 0


def test_a_receive_reads_no_settled_file_and_skips_a_quiet_partition_only_while_it_is_quiet(admin, client, clock):
    """A receive chooses from the message files that may hold something to take: a file whose every
    message was completed is not read (a drained partition keeps its rows until retention removes them),
    and a partition where a receive found nothing is passed over by the next ones only until a lock
    lapses, a scheduled message falls due or either table changes there."""
    admin.create_queue("q", lock_duration="PT5S")
    sender = client.get_queue_sender("q")
    sender.send_messages([ServiceBusMessage(f"old {i}") for i in range(10)])
    first = client.get_queue_receiver("q")
    first.complete_messages(first.receive_messages(max_message_count=10))
    sender.send_messages(ServiceBusMessage("new"))
    receiver = client.get_queue_receiver("q")
    [new] = receiver.receive_messages(max_wait_time=5)
    assert str(new) == "new"
    choosing = receiver._delivery._readers["choosing"]
    assert [data.num_rows for data in choosing._files.values()] == [1]  # the settled file was never read
    assert receiver.receive_messages(max_wait_time=0) == []  # locked: the partition is quiet until 5 s
    clock.past(new.locked_until_utc)
    [again] = receiver.receive_messages(max_wait_time=0)  # its lock lapsed: no write, found all the same
    assert (str(again), again.delivery_count) == ("new", 2)
    assert receiver.receive_messages(max_wait_time=0) == []
    receiver.abandon_message(again)  # a write to the locks table: looked at again at once
    [third] = receiver.receive_messages(max_wait_time=0)
    assert third.delivery_count == 3
    receiver.complete_message(third)
    due = clock.now() + timedelta(minutes=1)
    sender.schedule_messages(ServiceBusMessage("later"), due)
    assert receiver.receive_messages(max_wait_time=0) == []  # not due: quiet until it is
    clock.past(due)
    assert [str(m) for m in receiver.receive_messages(max_wait_time=0)] == ["later"]


def test_receives_of_several_messages_keep_their_partition_and_receives_of_one_move_on(admin, client):
    """A receiver starts its receives of several messages at the same partition while each gets all it
    asked for (SAME_ORDER of them in a row: it stays with the files it has read); receives of one message
    start at another partition each time."""
    from sparkbus.receiver import SAME_ORDER

    admin.create_queue("q", enable_partitioning=True)
    keys = {}
    for n in range(10_000):  # a partition key for each of the 16 partitions
        keys.setdefault(partitioning.partition_of(f"k{n}", 16), f"k{n}")
        if len(keys) == 16:
            break
    per_partition = 2 * SAME_ORDER + 2
    send(client, "q", *(ServiceBusMessage("m", partition_key=key) for key in keys.values() for _ in range(per_partition)))
    batched = client.get_queue_receiver("q")
    firsts = [batched.receive_messages(max_message_count=2, max_wait_time=5)[0].sequence_number >> 48
              for _ in range(SAME_ORDER)]
    assert len(set(firsts)) == 1
    single = client.get_queue_receiver("q")
    ones = [single.receive_messages(max_message_count=1, max_wait_time=5)[0].sequence_number >> 48
            for _ in range(SAME_ORDER)]
    assert len(set(ones)) > 1
