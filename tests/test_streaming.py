"""Spark: the fan-out streaming query, the sparkbus source (snapshot and tap) and the exactly-once sink,
on the shared SparkSession and real Delta tables."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from sparkbus import ServiceBusMessage, SqlRuleAction, SqlRuleFilter
from sparkbus.streaming import fanout_once, start_fanout

pytestmark = pytest.mark.spark


def copies(client, topic, sub):
    with client.get_subscription_receiver(topic, sub, max_wait_time=0.5) as receiver:
        found = receiver.receive_messages(500)
        receiver.complete_messages(found)
    return found


def test_dataframe_sent_to_a_topic_is_fanned_out_once(spark, admin, client, ns_path):
    admin.create_topic("events", enable_partitioning=True)
    admin.create_subscription("events", "big")
    admin.delete_rule("events", "big", "$Default")
    admin.create_rule("events", "big", "big", filter=SqlRuleFilter("sys.Label = 'big'"),
                      action=SqlRuleAction("SET seen = TRUE"))
    admin.create_subscription("events", "all")
    frame = spark.range(40).selectExpr("concat('m', id) AS body", "IF(id % 4 = 0, 'big', 'small') AS subject")
    with client.get_topic_sender("events") as sender:
        sender.send_dataframe(frame)
    done = fanout_once(spark, ns_path, "events")
    assert (done.messages, done.copies) == (40, {"events/Subscriptions/big": 10, "events/Subscriptions/all": 40})
    assert fanout_once(spark, ns_path).messages == 0              # every topic; nothing left to copy
    big = copies(client, "events", "big")
    assert sorted(str(m) for m in big) == sorted(f"m{i}" for i in range(0, 40, 4))
    assert all(m.str_application_properties == {"seen": True, "RuleName": "big"} for m in big)
    assert len(copies(client, "events", "all")) == 40


def test_running_fanout_serves_topics_created_later(spark, admin, client, ns_path):
    admin.create_topic("first")
    admin.create_subscription("first", "s")
    query = start_fanout(spark, ns_path, trigger={"processingTime": "200 milliseconds"})
    try:
        with client.get_topic_sender("first") as sender:
            sender.send_messages(ServiceBusMessage("one"))
        admin.create_topic("second", enable_partitioning=True)
        admin.create_subscription("second", "s")
        with client.get_topic_sender("second") as sender:
            sender.send_messages([ServiceBusMessage(f"two-{i}") for i in range(3)])
        deadline, got = time.monotonic() + 60, []
        while time.monotonic() < deadline and len(got) < 3:
            got += copies(client, "second", "s")
        assert sorted(str(m) for m in got) == ["two-0", "two-1", "two-2"]
        assert [str(m) for m in copies(client, "first", "s")] == ["one"]
    finally:
        query.stop()


def test_source_snapshot_and_tap(spark, admin, client, ns_path):
    admin.create_queue("q", enable_partitioning=True)
    empty = spark.read.format("sparkbus").option("namespace", ns_path).option("entity", "q").load()
    assert empty.count() == 0  # no slices: Spark reads a placeholder partition, which holds nothing
    with client.get_queue_sender("q") as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", application_properties={"n": i}) for i in range(10)])
    with client.get_queue_receiver("q") as receiver:
        receiver.complete_messages(receiver.receive_messages(3, max_wait_time=1))
    snapshot = spark.read.format("sparkbus").option("namespace", ns_path).option("entity", "q").load()
    assert snapshot.count() == 7                                  # completed messages are not there
    row = snapshot.orderBy("sequence_number").first()
    assert row.entity == "q" and isinstance(row.body, (bytes, bytearray)) and '"n":["int",' in row.application_properties
    seen = []

    def collect(df, batch_id):
        seen.extend(r.body.decode() for r in df.collect())

    def tap(**options):
        reader = spark.readStream.format("sparkbus").option("namespace", ns_path).option("entity", "q")
        for k, v in options.items():
            reader = reader.option(k, v)
        query = reader.load().writeStream.foreachBatch(collect).trigger(availableNow=True).start()
        query.awaitTermination()

    tap()
    assert len(seen) == 7
    seen.clear()
    tap(startingPosition="latest")
    assert seen == []
    with client.get_queue_receiver("q") as receiver:            # the tap took nothing: all still receivable
        assert len(receiver.receive_messages(20, max_wait_time=1)) == 7
    with pytest.raises(Exception, match="startingPosition"):
        spark.readStream.format("sparkbus").option("namespace", ns_path).option("entity", "q") \
            .option("startingPosition", "middle").load().writeStream.foreachBatch(collect).start().awaitTermination()


def test_source_ranges_content_names_each_partitions_new_sequence_numbers(spark, admin, client, ns_path):
    from sparkbus.core.sequencing import compose

    admin.create_queue("q", enable_partitioning=True)
    with client.get_queue_sender("q") as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", partition_key=f"k{i % 3}") for i in range(12)])
    stored = spark.read.format("sparkbus").option("namespace", ns_path).option("entity", "q").load() \
        .groupBy("partition_id").count().collect()
    ranges = spark.read.format("sparkbus").option("namespace", ns_path).option("entity", "q") \
        .option("content", "ranges").load().collect()
    assert sorted((r.partition_id, r.first_sequence_number, r.last_sequence_number) for r in ranges) == \
        sorted((s.partition_id, compose(s.partition_id, 1), compose(s.partition_id, s["count"])) for s in stored)
    assert {r.entity for r in ranges} == {"q"} and len(ranges) == 3
    with pytest.raises(Exception, match="content must be one of messages, ranges"):
        spark.read.format("sparkbus").option("namespace", ns_path).option("entity", "q") \
            .option("content", "bodies").load().collect()


def test_sink_sends_each_batch_once_even_when_replayed(spark, admin, client, ns_path, tmp_path):
    admin.create_queue("source")
    admin.create_queue("target", enable_partitioning=True)
    with client.get_queue_sender("source") as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(25)])
    checkpoint = str(tmp_path / "checkpoint")

    def run():
        query = (spark.readStream.format("sparkbus").option("namespace", ns_path).option("entity", "source").load()
                 .selectExpr("body", "concat('copy-', message_id) AS message_id", "'k' AS partition_key")
                 .writeStream.format("sparkbus").option("namespace", ns_path).option("entity", "target")
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        query.awaitTermination()

    run()
    assert admin.get_queue_runtime_properties("target").active_message_count == 25
    # A crash after the Delta commit but before Spark recorded the batch: Spark replays it on restart.
    commits = os.path.join(checkpoint, "commits")
    for marker in os.listdir(commits):                            # the batch files and their .crc files
        os.remove(os.path.join(commits, marker))
    run()
    assert admin.get_queue_runtime_properties("target").active_message_count == 25
    with client.get_queue_sender("source") as sender:
        sender.send_messages([ServiceBusMessage("late")])
    run()
    with client.get_queue_receiver("target") as receiver:
        bodies = sorted(str(m) for m in receiver.receive_messages(100, max_wait_time=1))
    assert bodies == sorted([f"m{i}" for i in range(25)] + ["late"])


def test_sink_refuses_bad_options(spark, admin, ns_path):
    admin.create_queue("target")
    stream = spark.readStream.format("rate").load().selectExpr("CAST(value AS STRING) AS body", "1 AS bad")
    with pytest.raises(Exception, match="unknown message column"):
        stream.writeStream.format("sparkbus").option("namespace", ns_path).option("entity", "target") \
            .option("checkpointLocation", ns_path + "/ck").start().awaitTermination(5)


STATIC_IMPORT = """
import sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
print(spark.read.format("sparkbus").option("namespace", sys.argv[1]).option("entity", "q").load().count())
"""


@pytest.mark.slow
def test_a_fresh_session_finds_the_source_without_registration(admin, client, ns_path):
    admin.create_queue("q")
    with client.get_queue_sender("q") as sender:
        sender.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    done = subprocess.run([sys.executable, "-c", STATIC_IMPORT, ns_path], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "2"


def test_cli_fanout_once(spark, admin, client, ns_path, capsys):
    from sparkbus.cli import main

    admin.create_topic("events")
    admin.create_subscription("events", "s")
    with client.get_topic_sender("events") as sender:
        sender.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])
    assert main(["fanout", "--namespace", ns_path, "--topic", "events", "--once"]) == 0
    assert "fanned out everything pending on events: 2 topic messages as 2 copies" in capsys.readouterr().out
    assert admin.get_subscription_runtime_properties("events", "s").active_message_count == 2
    assert main(["fanout", "--namespace", ns_path, "--topic", "nope", "--once"]) == 1


@pytest.mark.slow
def test_a_consuming_stream_empties_a_subscription_into_delta_once(spark, admin, client, ns_path, tmp_path):
    """settle 'complete' over a subscription, three waves of messages while the query runs: every message
    reaches the Delta table once, over several micro-batches, and the subscription ends empty; a message
    scheduled for later is read only once it is due."""
    from datetime import datetime, timedelta, timezone

    from conftest import wait_until
    from stream_consumer import delta_sink, written

    admin.create_topic("events")
    admin.create_subscription("events", "eu")
    table, batches, read_at = str(tmp_path / "delta"), [], {}
    sink = delta_sink(table)

    def write(df, batch_id):
        batches.append(batch_id)
        read_at.update((row.body.decode(), datetime.now(timezone.utc)) for row in df.select("body").collect())
        sink(df, batch_id)

    query = (spark.readStream.format("sparkbus").option("namespace", ns_path).option("entity", "events/Subscriptions/eu")
             .option("settle", "complete").load().writeStream.foreachBatch(write)
             .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(processingTime="0.5 seconds").start())
    try:
        expected: list[str] = []
        for wave in range(3):
            bodies = [f"w{wave}-{n}" for n in range(20)]
            with client.get_topic_sender("events") as sender:
                sender.send_messages([ServiceBusMessage(body) for body in bodies])
                if wave == 0:
                    due = datetime.now(timezone.utc) + timedelta(seconds=15)
                    sender.schedule_messages(ServiceBusMessage("later"), due)
            fanout_once(spark, ns_path, "events")
            expected += bodies
            assert wait_until(lambda: len(set(written(table)) & set(expected)) == len(expected), 120), wave
        expected.append("later")  # a topic's scheduled message reaches subscriptions when due (by a fan-out)
        def arrived() -> bool:
            fanout_once(spark, ns_path, "events")
            return len(written(table)) >= len(expected)
        assert wait_until(arrived, 120, every=2)
        assert wait_until(lambda: admin.get_subscription_runtime_properties("events", "eu").total_message_count == 0, 60)
    finally:
        query.stop()
    assert sorted(written(table)) == sorted(expected)  # each once
    assert len(batches) >= 4 and read_at["later"] >= due


def test_a_consuming_stream_moves_a_queue_into_another_through_the_sink_once(spark, admin, client, ns_path, tmp_path):
    """settle 'complete' into the sparkbus sink with trigger(availableNow=True), twice, a batch replayed in
    between: the target holds each message once and the source is empty (the last batch is completed
    before the run ends)."""
    admin.create_queue("source", enable_partitioning=True)
    admin.create_queue("target")
    checkpoint = str(tmp_path / "checkpoint")

    def run():
        (spark.readStream.format("sparkbus").option("namespace", ns_path).option("entity", "source")
         .option("settle", "complete").load().selectExpr("body", "message_id")
         .writeStream.format("sparkbus").option("namespace", ns_path).option("entity", "target")
         .option("checkpointLocation", checkpoint).trigger(availableNow=True).start().awaitTermination())

    with client.get_queue_sender("source") as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(25)])
    run()
    assert admin.get_queue_runtime_properties("source").total_message_count == 0
    with client.get_queue_sender("source") as sender:
        sender.send_messages([ServiceBusMessage(f"n{i}") for i in range(5)])
    commits = os.path.join(checkpoint, "commits")  # the last batch replayed by the next run: sent once still
    last = max((name for name in os.listdir(commits) if name.isdigit()), key=int)
    for name in (last, f".{last}.crc"):  # the batch's file and its checksum
        os.remove(os.path.join(commits, name))
    run()
    with client.get_queue_receiver("target", max_wait_time=1) as receiver:
        bodies = sorted(str(m) for m in receiver.receive_messages(100))
    assert bodies == sorted([f"m{i}" for i in range(25)] + [f"n{i}" for i in range(5)])
    assert admin.get_queue_runtime_properties("source").total_message_count == 0


def test_a_consuming_stream_refuses_what_it_cannot_consume(spark, admin, ns_path):
    admin.create_topic("events")
    admin.create_queue("sessions", requires_session=True)
    admin.create_queue("q")

    def start(entity, **options):
        reader = spark.readStream.format("sparkbus").option("namespace", ns_path).option("entity", entity)
        for k, v in options.items():
            reader = reader.option(k, v)
        reader.load().writeStream.foreachBatch(lambda df, n: None).trigger(availableNow=True).start().awaitTermination()

    for entity, options, words in (("q", {"settle": "delete"}, "settle must be one of none, complete"),
                                   ("events", {"settle": "complete"}, "is a topic"),
                                   ("sessions", {"settle": "complete"}, "requires sessions"),
                                   ("q", {"settle": "complete", "content": "ranges"}, "content 'ranges'"),
                                   ("q", {"settle": "complete", "startingPosition": "latest"}, "from the earliest")):
        with pytest.raises(Exception, match=words):
            start(entity, **options)
    with pytest.raises(Exception, match="applies to streams"):
        spark.read.format("sparkbus").option("namespace", ns_path).option("entity", "q") \
            .option("settle", "complete").load().collect()


@pytest.mark.slow
def test_a_consuming_streams_driver_killed_between_batches_restarts_from_its_checkpoint(admin, client, ns_path,
                                                                                         tmp_path):
    """The consuming query's driver process (and its JVM) killed with SIGKILL while it runs, more messages
    sent, the query started again from its checkpoint until nothing is left: every message reached the
    Delta table exactly once and the queue is empty."""
    import signal

    from conftest import wait_until
    from stream_consumer import written

    admin.create_queue("orders", enable_partitioning=True)
    table, checkpoint = str(tmp_path / "delta"), str(tmp_path / "checkpoint")
    script = os.path.join(os.path.dirname(__file__), "stream_consumer.py")

    def send(prefix: str, count: int) -> list[str]:
        bodies = [f"{prefix}{n}" for n in range(count)]
        with client.get_queue_sender("orders") as sender:
            for start in range(0, count, 10):  # several sends: several micro-batches
                sender.send_messages([ServiceBusMessage(body) for body in bodies[start:start + 10]])
                time.sleep(0.3)
        return bodies

    def consumer(mode: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, script, ns_path, "orders", table, checkpoint, mode],
                                start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    expected = send("a", 30)
    running = consumer("run")
    try:
        assert wait_until(lambda: len(written(table)) >= 10, 180), "the first batch never reached the table"
        expected += send("b", 30)
    finally:
        os.killpg(running.pid, signal.SIGKILL)  # the driver, its JVM and its Python workers
        running.wait()
    expected += send("c", 10)
    drain = consumer("drain")
    assert drain.wait(timeout=300) == 0
    assert sorted(written(table)) == sorted(expected)  # nothing lost, nothing written twice
    assert admin.get_queue_runtime_properties("orders").total_message_count == 0
