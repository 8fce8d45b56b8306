"""Capacity planning: the formulas (pure), the CLI (subprocess), message sizes as stored, and plans checked
against entities filled until ServiceBusQuotaExceededError."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from conftest import stored_messages

import sparkbus
from sparkbus import (MessageSizeExceededError, ServiceBusAdministrationClient, ServiceBusClient, ServiceBusMessage,
                      ServiceBusQuotaExceededError)
from sparkbus.capacity import MEASURED_QUEUE_CAPACITY, format_plan, format_seed_table, plan, seed_table
from sparkbus.core.capacity import estimate_header_size

KB, MB, GB = 1024, 1024 * 1024, 1024 * 1024 * 1024
SPARKBUS = os.path.join(os.path.dirname(sys.executable), "sparkbus")


# ---- formulas ------------------------------------------------------------------------------------------------

def test_queue_holds_size_over_body_plus_header():
    p = plan(1000, header_size=24)
    assert (p.kind, p.partitions, p.bytes_per_message, p.message_size) == ("queue", 1, 1024, 1024)
    assert p.partition_bytes == p.entity_bytes == GB
    assert p.messages == p.messages_per_partition == GB // 1024
    big = plan(1000, header_size=24, max_size_in_megabytes=5120)
    assert big.messages == 5 * p.messages


def test_partitioned_standard_and_basic_hold_16_times_the_size():
    for tier in ("standard", "basic"):
        p = plan(1000, header_size=24, tier=tier, enable_partitioning=True, max_size_in_megabytes=2048)
        assert (p.partitions, p.partition_bytes, p.entity_bytes) == (16, 2 * GB, 32 * GB)
        assert p.messages == 16 * (2 * GB // 1024)


def test_premium_partitions_share_the_size():
    one = plan(1000, header_size=24, tier="premium", max_size_in_megabytes=4096)
    four = plan(1000, header_size=24, tier="premium", partition_count=4, max_size_in_megabytes=4096)
    assert (one.partitions, one.partition_bytes, one.messages) == (1, 4 * GB, 4 * GB // 1024)
    assert (four.partitions, four.partition_bytes, four.entity_bytes) == (4, GB, 4 * GB)
    assert four.messages == 4 * (GB // 1024)
    assert plan(1000, header_size=24, tier="premium", partition_count=2, enable_partitioning=True).partitions == 2


def test_topic_counts_the_header_once_per_subscription():
    p = plan(1000, header_size=100, subscriptions=3)
    assert (p.kind, p.subscriptions, p.message_size, p.bytes_per_message) == ("topic", 3, 1100, 1300)
    assert p.messages == GB // 1300
    assert p.messages * p.bytes_per_message <= p.entity_bytes < (p.messages + 1) * p.bytes_per_message
    # The guidance's examples: 200 subscriptions of a default 156-byte header come to "32 KB" of headers per
    # message, a 600-byte header to "120 KB".
    assert plan(0, header_size=156, subscriptions=200).bytes_per_message == 31_200
    assert plan(0, header_size=600, subscriptions=200).bytes_per_message == 120_000


def test_cap_per_partition_binds_below_the_share():
    p = plan(200, header_size=32, enable_partitioning=True, max_partition_size_in_bytes=256 * KB)
    assert (p.partition_bytes, p.messages_per_partition, p.messages) == (256 * KB, 1129, 16 * 1129)
    assert plan(200, header_size=32, max_partition_size_in_bytes=2 * GB).partition_bytes == GB


@pytest.mark.parametrize("properties", [
    None, {}, {"region": "eu"},
    {"n": 7, "ratio": 0.5, "ok": True, "none": None, "raw": b"\x00\x01", "id": uuid.UUID(int=5),
     "at": datetime(2024, 1, 2, tzinfo=timezone.utc), "text": "é€"},
])
def test_header_estimate_is_the_senders_accounting(properties):
    message = ServiceBusMessage(b"x" * 77, application_properties=properties)
    assert estimate_header_size(properties) == message.size_in_bytes - 77
    p = plan(77, application_properties=properties)
    assert p.message_size == p.bytes_per_message == message.size_in_bytes


def test_message_size_limits_of_the_tiers():
    assert plan(256 * KB - 32).message_size == 256 * KB
    with pytest.raises(MessageSizeExceededError, match="262145 bytes exceeds the 262144-byte"):
        plan(256 * KB - 31)
    with pytest.raises(MessageSizeExceededError, match="header of 65537 bytes exceeds the 65536-byte"):
        plan(0, header_size=64 * KB + 1)
    assert plan(MB - 100, header_size=100, tier="premium", partition_count=2).message_size == MB
    with pytest.raises(MessageSizeExceededError):
        plan(MB, header_size=100, tier="premium", partition_count=2)
    assert plan(100 * MB - 100, header_size=100, tier="premium", max_size_in_megabytes=81920).messages == 819


@pytest.mark.parametrize("kwargs, error, text", [
    ({"body_size": -1}, ValueError, "body_size must be >= 0"),
    ({"body_size": 1.5}, TypeError, "body_size must be an int"),
    ({"body_size": True}, TypeError, "body_size must be an int"),
    ({"header_size": -1}, ValueError, "header_size must be >= 0"),
    ({"subscriptions": -1}, ValueError, "subscriptions must be >= 0"),
    ({"subscriptions": 2.0}, TypeError, "subscriptions must be an int"),
    ({"max_size_in_megabytes": 1000}, ValueError, r"one of \[1024, 2048, 3072, 4096, 5120\] in the standard tier"),
    ({"max_size_in_megabytes": 10240}, ValueError, "in the standard tier"),
    ({"max_size_in_megabytes": "1024"}, TypeError, "max_size_in_megabytes must be an int"),
    ({"tier": "gold"}, ValueError, r"tier must be one of \['basic', 'standard', 'premium'\]"),
    ({"tier": "basic", "subscriptions": 2}, ValueError, "basic tier has queues only"),
    ({"partition_count": 4}, ValueError, "partition_count is set at namespace creation only in the premium tier"),
    ({"tier": "premium", "partition_count": 3}, ValueError, r"partition_count must be one of \[1, 2, 4\]"),
    ({"tier": "premium", "enable_partitioning": True}, ValueError, "premium partitioning is chosen with"),
    ({"enable_partitioning": 1}, TypeError, "enable_partitioning must be a bool"),
    ({"max_partition_size_in_bytes": 0}, ValueError, "max_partition_size_in_bytes must be >= 1"),
    ({"header_size": 10, "application_properties": {"a": "b"}}, ValueError, "not both"),
    ({"application_properties": {"a": [1]}}, TypeError, "allowed: str, int"),
    ({"body_size": 0, "header_size": 0}, ValueError, "unbounded"),
])
def test_bad_arguments_say_what_is_allowed(kwargs, error, text):
    kwargs = {"body_size": 1024, **kwargs}
    with pytest.raises(error, match=text):
        plan(kwargs.pop("body_size"), **kwargs)


def test_premium_sizes_are_allowed_in_premium_only():
    assert plan(1000, header_size=24, tier="premium", max_size_in_megabytes=81920).entity_bytes == 80 * GB


def test_seed_table_next_to_the_measurements():
    rows = seed_table()
    assert [(r.message_kilobytes, r.queue_gigabytes) for r in rows] == [
        (kb, gb) for kb in (1, 10, 50, 100, 250) for gb in (1, 2, 3, 4, 5)]
    for r in rows:
        assert r.measured == MEASURED_QUEUE_CAPACITY[r.message_kilobytes][r.queue_gigabytes - 1]
        assert r.planned == plan(r.message_kilobytes * KB, max_size_in_megabytes=r.queue_gigabytes * 1024)
        assert r.partitioned.messages == 16 * r.planned.messages and r.partitioned.partitions == 16
        # sparkbus counts the bytes themselves (a 32-byte message id is the whole header here); Service Bus's
        # serialisation differs by a few bytes per message: within 3% of every measurement.
        assert 0.97 <= r.ratio <= 1.02
    assert rows[0].planned.messages == GB // (1024 + 32) == 1_016_800
    text = format_seed_table(rows)
    lines = text.splitlines()
    assert len(lines) == 2 + 25 and "Service Bus measured" in lines[0]
    assert lines[2].split() == ["1", "KB", "1", "GB", "1,041,790", "1,016,800", "0.976", "16,268,800"]


def test_format_plan():
    text = format_plan(plan(1000, header_size=100, subscriptions=3, enable_partitioning=True))
    assert text.splitlines() == [
        "topic, standard tier, 16 partitions of 1,073,741,824 bytes = 17,179,869,184 bytes",
        "message: 1,000 body + 100 header bytes = 1,100 bytes",
        "stored per message: 1,000 + 100 x 3 subscriptions = 1,300 bytes",
        f"messages per partition: {GB // 1300:,}",
        f"messages: {16 * (GB // 1300):,}",
    ]


# ---- command line ----------------------------------------------------------------------------------------------

def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([SPARKBUS, "capacity", *args], capture_output=True, text=True, timeout=60)


def test_cli_plans_and_prints_the_table():
    out = run_cli("--body-size", "1024").stdout.splitlines()
    assert out[0] == "queue, standard tier, 1 partition of 1,073,741,824 bytes = 1,073,741,824 bytes"
    assert out[-1] == "messages: 1,016,800"
    done = run_cli("--body-size", "1024", "--property", "region=eu", "--property", "kind=order", "--subscriptions",
                   "3", "--partitioned", "--max-size-mb", "2048")
    expected = plan(1024, application_properties={"region": "eu", "kind": "order"}, subscriptions=3,
                    enable_partitioning=True, max_size_in_megabytes=2048)
    assert done.returncode == 0 and done.stdout.strip() == format_plan(expected)
    premium = run_cli("--body-size", "100", "--header-size", "28", "--tier", "premium", "--partition-count", "4",
                      "--max-size-mb", "81920").stdout
    assert f"messages: {4 * (20 * GB // 128):,}" in premium
    table = run_cli("--table")
    assert table.returncode == 0 and table.stdout.strip() == format_seed_table()


@pytest.mark.parametrize("args, code, text", [  # 2: a bad command line (sparkbus capacity: error: ...), 1: refused
    (["--body-size", "-5"], 2, "argument --body-size: takes a whole number from 0"),
    (["--body-size", "10", "--max-size-mb", "1000"], 1, "ValueError: max_size_in_megabytes must be one of"),
    (["--body-size", "300000"], 1, "MessageSizeExceededError: message of 300032 bytes"),
    (["--body-size", "10", "--tier", "gold"], 1, "ValueError: tier must be one of"),
    (["--body-size", "10", "--property", "novalue"], 2, "argument --property: takes KEY=VALUE"),
    (["--body-size", "10", "--header-size", "5", "--property", "a=b"], 1, "not both"),
    ([], 2, "capacity needs --body-size"),
    (["--table", "--body-size", "10"], 2, "--table takes no --body-size"),
])
def test_cli_bad_input_is_one_line_and_exit_1_or_2(args, code, text):
    done = run_cli(*args)
    assert done.returncode == code and done.stdout == ""
    start = "sparkbus capacity: error: " if code == 2 else "sparkbus: "
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(start) and text in done.stderr


# ---- against real entities --------------------------------------------------------------------------------------

def test_message_size_is_what_is_stored_and_received(ns_path):
    sparkbus.create_namespace(ns_path, credits_per_second=None)
    ServiceBusAdministrationClient(ns_path).create_queue("q", enable_partitioning=True)
    messages = [
        ServiceBusMessage(""),
        ServiceBusMessage("hello", application_properties={"region": "eu", "n": 3, "at": datetime.now(timezone.utc)}),
        ServiceBusMessage(b"\x00" * 1000, session_id="s", content_type="application/octet-stream", subject="é",
                          time_to_live=timedelta(hours=1), correlation_id="c", to="t", reply_to="r"),
        ServiceBusMessage("later", scheduled_enqueue_time_utc=datetime.now(timezone.utc) - timedelta(seconds=1)),
    ]
    expected = {m.message_id: m.size_in_bytes for m in messages}
    assert expected[messages[0].message_id] == 32 and len(set(expected.values())) == 4
    client = ServiceBusClient(ns_path)
    client.get_queue_sender("q").send_messages(messages)
    admin = ServiceBusAdministrationClient(ns_path)
    rows = stored_messages(admin, "q").to_pylist()
    assert {r["message_id"]: r["body_size"] + r["header_size"] for r in rows} == expected
    assert admin.get_queue_runtime_properties("q").size_in_bytes == sum(expected.values())
    receiver = client.get_queue_receiver("q")
    peeked, received = [], []
    for _ in range(16):  # a peek returns the messages of one partition
        peeked += receiver.peek_messages(10)
    assert {m.message_id: m.size_in_bytes for m in peeked} == expected
    for _ in range(5):
        received += receiver.receive_messages(max_message_count=10, max_wait_time=1)
        if len(received) == len(messages):
            break
    assert {m.message_id: m.size_in_bytes for m in received} == expected


def fill(sender, make, partitions: int, batch_bytes: int = 256 * KB) -> int:
    """Send messages from make() until the quota refuses a single message on every partition in a row (keyless
    messages go round robin, so consecutive refusals are distinct partitions); big batches first, halved on
    each refusal and doubled again after a send that fits (the partitions fill at different times). Returns
    how many messages were accepted."""
    largest = size = batch_bytes // make().size_in_bytes
    accepted = refusals = 0
    while refusals < partitions:
        try:
            sender.send_messages([make() for _ in range(size)])
        except ServiceBusQuotaExceededError:
            if size > 1:
                size //= 2
            else:
                refusals += 1
            continue
        accepted += size
        refusals = 0
        size = min(size * 2, largest)
    return accepted


@pytest.mark.parametrize("partitioned", [False, True])
def test_queue_plan_matches_a_filled_queue(ns_path, partitioned):
    sparkbus.create_namespace(ns_path, credits_per_second=None, max_partition_size_in_kilobytes=256)
    admin = ServiceBusAdministrationClient(ns_path)
    admin.create_queue("q", enable_partitioning=partitioned)
    p = plan(200, enable_partitioning=partitioned, max_partition_size_in_bytes=256 * KB)
    accepted = fill(ServiceBusClient(ns_path).get_queue_sender("q"), lambda: ServiceBusMessage(b"x" * 200),
                    p.partitions)
    stored = stored_messages(admin, "q").num_rows
    assert stored == accepted
    assert abs(p.messages - stored) <= 0.01 * stored, (p.messages, stored)
    assert admin.get_queue_runtime_properties("q").size_in_bytes == stored * p.bytes_per_message


@pytest.mark.parametrize("partitioned", [False, True])
def test_topic_plan_matches_a_filled_topic(ns_path, partitioned):
    sparkbus.create_namespace(ns_path, credits_per_second=None, max_partition_size_in_kilobytes=256)
    admin = ServiceBusAdministrationClient(ns_path)
    admin.create_topic("t", enable_partitioning=partitioned)
    for name in ("a", "b", "c"):
        admin.create_subscription("t", name)
    properties = {"region": "eu", "amount": 125, "priority": "high"}
    p = plan(150, application_properties=properties, subscriptions=3, enable_partitioning=partitioned,
             max_partition_size_in_bytes=256 * KB)
    assert p.bytes_per_message == 150 + 3 * p.header_size
    # No fan-out runs: every message stays in the topic, whose quota counts its header once per subscription.
    accepted = fill(ServiceBusClient(ns_path).get_topic_sender("t"),
                    lambda: ServiceBusMessage(b"y" * 150, application_properties=properties), p.partitions)
    stored = stored_messages(admin, "t").num_rows
    assert stored == accepted
    assert abs(p.messages - stored) <= 0.01 * stored, (p.messages, stored)
    assert admin.get_topic_runtime_properties("t").size_in_bytes == stored * p.bytes_per_message
