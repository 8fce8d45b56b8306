"""AutoLockRenewer, DataFrame receive/complete, and a receiver that crashes holding locks."""
from __future__ import annotations

import time

import pytest
from chispa import assert_df_equality
from conftest import run_spawned

from sparkbus import AutoLockRenewer, MessageLockLostError, ServiceBusClient, ServiceBusMessage


@pytest.mark.slow
def test_auto_lock_renewer_keeps_a_lock_past_its_duration(admin, client):
    admin.create_queue("q", lock_duration="PT5S")
    client.get_queue_sender("q").send_messages([ServiceBusMessage("long job"), ServiceBusMessage("lost")])
    receiver = client.get_queue_receiver("q")
    kept, lost = receiver.receive_messages(max_message_count=2)
    failures = []
    with AutoLockRenewer(max_lock_renewal_duration=30, on_lock_renew_failure=lambda m, e: failures.append((m, e))) as renewer:
        renewer.register(receiver, kept)
        renewer.register(receiver, lost)
        receiver.complete_message(lost)  # settled: the renewer stops looking after it
        time.sleep(7)
        other = client.get_queue_receiver("q")
        assert other.receive_messages(max_wait_time=0) == []  # still locked, 7 s into a 5 s lock
        receiver.complete_message(kept)
    assert failures == []
    assert admin.get_queue_runtime_properties("q").total_message_count == 0


def test_auto_lock_renewer_reports_failures(admin, client):
    admin.create_queue("q")
    client.get_queue_sender("q").send_messages(ServiceBusMessage("x"))
    receiver = client.get_queue_receiver("q")
    (message,) = receiver.receive_messages()
    message.lock_token = "not-the-lock"  # as if another receiver had taken the message
    failures = []
    renewer = AutoLockRenewer(on_lock_renew_failure=lambda m, e: failures.append(e))
    renewer.register(receiver, message)
    message.locked_until_utc = message.enqueued_time_utc  # due for renewal now
    deadline = time.monotonic() + 10
    while not failures and time.monotonic() < deadline:
        time.sleep(0.1)
    renewer.close()
    assert len(failures) == 1 and isinstance(failures[0], MessageLockLostError)
    with pytest.raises(ValueError, match="closed"):
        renewer.register(receiver, message)


@pytest.mark.spark
def test_receive_and_complete_dataframes(spark, admin, ns_path):
    admin.create_queue("q", enable_partitioning=True)
    client = ServiceBusClient(ns_path, spark=spark)
    client.get_queue_sender("q").send_messages([ServiceBusMessage(f"m{i}", subject=f"s{i}") for i in range(30)])
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
def test_crashed_receivers_locks_expire_and_messages_come_back(spawn, admin, client, ns_path):
    admin.create_queue("q", lock_duration="PT5S")
    client.get_queue_sender("q").send_messages([ServiceBusMessage(f"m{i}") for i in range(3)])
    (taken,) = run_spawned(spawn, _crash_holding_locks, [(ns_path, "q")])
    assert len(taken) == 3
    receiver = client.get_queue_receiver("q")
    assert receiver.receive_messages(max_message_count=3, max_wait_time=0) == []
    again = receiver.receive_messages(max_message_count=3, max_wait_time=10)
    assert sorted(m.sequence_number for m in again) == sorted(taken)
    assert all(m.delivery_count == 2 for m in again)
