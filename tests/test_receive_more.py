"""AutoLockRenewer, DataFrame receive/complete, and a receiver that crashes holding locks."""
from __future__ import annotations


import pytest
from chispa import assert_df_equality
from conftest import run_spawned, wait_until

from sparkbus import (AutoLockRenewer, MessageLockLostError, MessageNotFoundError, ServiceBusClient,
                      ServiceBusMessage, ServiceBusSubQueue)


def test_auto_lock_renewer_keeps_a_lock_past_its_duration(admin, client, clock):
    """Registered by hand, or by the receiver's auto_lock_renewer keyword (every message it receives, as
    the SDK's): both locks outlive their 5 s duration. The clock moves 7 s in two steps; after each, the
    renewer's thread (it looks every 0.2 s) renews both locks, which are due."""
    admin.create_queue("q", lock_duration="PT5S")
    client.get_queue_sender("q").send_messages([ServiceBusMessage("long job"), ServiceBusMessage("lost")])
    receiver = client.get_queue_receiver("q")
    kept, lost = receiver.receive_messages(max_message_count=2)
    failures = []
    with AutoLockRenewer(max_lock_renewal_duration=30, on_lock_renew_failure=lambda m, e: failures.append((m, e))) as renewer:
        renewer.register(receiver, kept)
        renewer.register(receiver, lost)
        receiver.complete_message(lost)  # settled: the renewer stops looking after it
        client.get_queue_sender("q").send_messages(ServiceBusMessage("renewed by keyword"))
        keyword = client.get_queue_receiver("q", auto_lock_renewer=renewer)
        [automatic] = keyword.receive_messages(max_wait_time=5)
        for step in (3.5, 3.5):
            before = (kept.locked_until_utc, automatic.locked_until_utc)
            clock.advance(step)
            assert wait_until(lambda: (kept.locked_until_utc > before[0]
                                       and automatic.locked_until_utc > before[1]), 10)
        other = client.get_queue_receiver("q")
        assert other.receive_messages(max_wait_time=0) == []  # still locked, 7 s into a 5 s lock
        receiver.complete_message(kept)
        keyword.complete_message(automatic)
    assert failures == []
    assert admin.get_queue_runtime_properties("q").total_message_count == 0


@pytest.mark.slow
def test_auto_lock_renewer_reports_locks_that_really_lapsed(admin, client, clock):
    admin.create_queue("q", lock_duration="PT5S")
    client.get_queue_sender("q").send_messages([ServiceBusMessage("taken"), ServiceBusMessage("lapsed")])
    receiver = client.get_queue_receiver("q")
    taken, lapsed = receiver.receive_messages(max_message_count=2)
    clock.past(max(taken.locked_until_utc, lapsed.locked_until_utc))
    thief = client.get_queue_receiver("q")
    (stolen,) = thief.receive_messages()  # the oldest message, its lock lapsed: delivered again
    assert (stolen.sequence_number, stolen.delivery_count) == (taken.sequence_number, 2)
    failures = []
    renewer = AutoLockRenewer(on_lock_renew_failure=lambda m, e: failures.append((m, e)))
    renewer.register(receiver, taken)   # lapsed and taken by another receiver
    renewer.register(receiver, lapsed)  # lapsed, nobody took it yet
    wait_until(lambda: len(failures) >= 2, 10, every=0.1)
    renewer.close()
    assert sorted(m.sequence_number for m, _ in failures) == sorted([taken.sequence_number, lapsed.sequence_number])
    assert all(isinstance(e, MessageLockLostError) for _, e in failures)
    with pytest.raises(MessageLockLostError):
        receiver.complete_message(lapsed)  # the renewer renewed nothing behind our back
    thief.complete_message(stolen)  # the other receiver's lock is untouched
    (again,) = thief.receive_messages()
    assert (again.sequence_number, again.delivery_count) == (lapsed.sequence_number, 2)
    thief.complete_message(again)
    assert admin.get_queue_runtime_properties("q").total_message_count == 0
    with pytest.raises(ValueError, match="closed"):
        renewer.register(receiver, again)


@pytest.mark.spark
def test_receive_and_complete_dataframes(spark, admin, ns_path):
    admin.create_queue("q", enable_partitioning=True)
    client = ServiceBusClient(ns_path, spark=spark)
    client.get_queue_sender("q").send_messages([ServiceBusMessage(f"m{i}", subject=f"s{i}", partition_key=f"k{i}")
                                                for i in range(30)])  # keyed: over several partitions
    receiver = client.get_queue_receiver("q")
    df = receiver.receive_dataframe(max_message_count=20)
    assert df.count() == 20 and df.where("lock_token IS NULL").count() == 0
    got = df.selectExpr("CAST(body AS STRING) AS body", "subject")
    subjects = [row.subject for row in got.collect()]
    expected = spark.createDataFrame([(f"m{s[1:]}", s) for s in subjects], "body string, subject string")
    assert_df_equality(got, expected, ignore_nullable=True, ignore_row_order=True)
    assert receiver.complete_dataframe(df) == 20
    assert admin.get_queue_runtime_properties("q").total_message_count == 10
    with pytest.raises(MessageLockLostError, match="nothing completed"):
        receiver.complete_dataframe(df)  # already completed: those locks are gone
    assert admin.get_queue_runtime_properties("q").total_message_count == 10


def _crash_holding_locks(path, queue, barrier, results):
    import os

    import sparkbus

    receiver = sparkbus.ServiceBusClient(path).get_queue_receiver(queue)
    barrier.wait()
    got = receiver.receive_messages(max_message_count=3)
    results.put([m.sequence_number for m in got])
    results.close()
    results.join_thread()  # the result is on its way to the parent
    os._exit(0)  # dies without settling or releasing anything


@pytest.mark.slow
def test_crashed_receivers_locks_expire_and_messages_come_back(spawn, admin, client, ns_path, clock):
    admin.create_queue("q", lock_duration="PT5S")
    client.get_queue_sender("q").send_messages([ServiceBusMessage(f"m{i}") for i in range(3)])
    (taken,) = run_spawned(spawn, _crash_holding_locks, [(ns_path, "q")])
    assert len(taken) == 3
    receiver = client.get_queue_receiver("q")
    assert receiver.receive_messages(max_message_count=3, max_wait_time=0) == []
    clock.advance(6)  # past the 5 s locks the crashed process took
    again = receiver.receive_messages(max_message_count=3, max_wait_time=0)
    assert sorted(m.sequence_number for m in again) == sorted(taken)
    assert all(m.delivery_count == 2 for m in again)


def test_receive_messages_by_sequence_number_locks_exactly_those_or_none(admin, client):
    """A user picks messages from a peek and acts on them: the active ones by number, or a dead-lettered one
    from the dead-letter sub-queue; a number that is not such a message (settled, deferred, locked, or in
    the other queue) is refused naming it, with nothing locked."""
    admin.create_queue("q")
    client.get_queue_sender("q").send_messages([ServiceBusMessage(f"m{i}") for i in range(4)])
    numbers = {str(m): m.sequence_number for m in client.get_queue_receiver("q").peek_messages(4)}
    receiver = client.get_queue_receiver("q")
    second, first = receiver.receive_messages_by_sequence_number([numbers["m2"], numbers["m0"]])
    assert (str(second), str(first)) == ("m2", "m0") and second.locked_until_utc is not None
    with pytest.raises(MessageNotFoundError, match=rf"no active, unlocked message with sequence number\(s\) \[{numbers['m0']}\]"):
        receiver.receive_messages_by_sequence_number([numbers["m1"], numbers["m0"]])  # m0 is locked
    assert sorted(str(m) for m in client.get_queue_receiver("q").receive_messages(4, max_wait_time=1)) == ["m1", "m3"]
    receiver.complete_message(first)
    receiver.dead_letter_message(second, reason="picked")
    with pytest.raises(MessageNotFoundError):
        receiver.receive_messages_by_sequence_number(numbers["m2"])  # dead-lettered: not in the active queue
    dead = client.get_queue_receiver("q", sub_queue=ServiceBusSubQueue.DEAD_LETTER)
    with pytest.raises(MessageNotFoundError, match="no dead-lettered, unlocked message"):
        dead.receive_messages_by_sequence_number(numbers["m0"])  # completed
    [again] = dead.receive_messages_by_sequence_number(numbers["m2"])
    assert (str(again), again.dead_letter_reason) == ("m2", "picked")
    dead.complete_message(again)
    assert admin.get_queue_runtime_properties("q").dead_letter_message_count == 0
