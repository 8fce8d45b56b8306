"""The archive: every message that leaves an entity with archive_retention is kept once, with how and when
it left, for that long; the setting is checked, stored and switched like the SDK's properties."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

import sparkbus
from sparkbus import ServiceBusMessage, ServiceBusReceiveMode, ServiceBusSubQueue, storage
from sparkbus.core.schemas import ARCHIVE
from sparkbus.definitions import apply_definition
from sparkbus.engine import archive, forwarding, housekeeping, retention
from sparkbus.engine.catalog import Catalog
from sparkbus.engine.namespace import open_catalog
from sparkbus.engine.registry import resolve_current
from sparkbus.storage import commits
from sparkbus.storage.location import normalize
from sparkbus.storage.reader import PartitionReader
from sparkbus.core.schemas import LOCKS, MESSAGES

WEEK = timedelta(days=7)


def _info(ns_path, path, kinds=("queue",)):
    return resolve_current(open_catalog(ns_path), path, kinds)


def _archived(ns_path, path, kinds=("queue",)):
    """The archive's rows, in sequence-number order (none when it has no table)."""
    uri = archive.table_uri(_info(ns_path, path, kinds).tables)
    if not storage.table_exists(uri):
        return []
    options = storage.location.options_for(uri) or None
    rows = DeltaTable(uri, storage_options=options).to_pyarrow_table()
    return sorted(rows.to_pylist(), key=lambda row: row["sequence_number"])


def test_every_way_of_leaving_is_archived_once_with_how_it_left(admin, client, ns_path, clock):
    """Completed, received and deleted, expired, dead-lettered then completed from the dead-letter queue,
    purged, cancelled and forwarded messages each leave one archive row saying how, with the message as
    sent (body, properties, enqueue time), its delivery count and dead-letter reason; a second run archives
    nothing more, and the archive counts in the runtime properties but not in the entity's size."""
    admin.create_queue("elsewhere")
    admin.create_queue("q", archive_retention=WEEK)
    admin.create_queue("fwd", archive_retention="P1D", forward_to="elsewhere")
    sender = client.get_queue_sender("q")
    sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"m{i}", subject="s",
                                            application_properties={"i": i}) for i in range(8)])
    sender.send_messages(ServiceBusMessage("ttl", message_id="ttl", time_to_live=timedelta(minutes=1)))
    scheduled = sender.schedule_messages(ServiceBusMessage("later", message_id="later"),
                                         clock.now() + timedelta(hours=1))
    sender.cancel_scheduled_messages(scheduled)
    sender.send_messages(ServiceBusMessage("tail", message_id="tail"))  # the highest number stays: see retention
    client.get_queue_sender("fwd").send_messages([ServiceBusMessage(n, message_id=n) for n in ("moved", "next")])
    receiver = client.get_queue_receiver("q")
    receiver.complete_messages(receiver.receive_messages(max_message_count=2))  # m0 m1
    deleting = client.get_queue_receiver("q", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE)
    assert [m.message_id for m in deleting.receive_messages(max_message_count=2)] == ["m2", "m3"]
    [bad] = receiver.receive_messages(max_message_count=1)  # m4
    receiver.dead_letter_message(bad, reason="bad", error_description="it was bad")
    dead = client.get_queue_receiver("q", sub_queue=ServiceBusSubQueue.DEAD_LETTER)
    dead.complete_messages(dead.receive_messages(max_message_count=1))
    assert receiver.delete_messages(max_message_count=2) == 2  # m5 m6 purged
    clock.advance(120)  # ttl expires; the receive that meets it lets it go
    assert [m.message_id for m in receiver.receive_messages(max_message_count=2)] == ["m7", "tail"]
    assert [m.message_id for m in receiver.peek_messages(10, sequence_number=1)] == ["m7", "tail"]
    assert forwarding.forward_all(Catalog(normalize(ns_path))).forwarded == {"fwd": 2}

    assert retention.run_entity(_info(ns_path, "q"), eager=True) == 9
    retention.run_entity(_info(ns_path, "fwd"), eager=True)
    rows = {row["message_id"]: row for row in _archived(ns_path, "q")}
    assert {k: v["left_as"] for k, v in rows.items()} == {
        "m0": "completed", "m1": "completed", "m2": "received_and_deleted", "m3": "received_and_deleted",
        "m4": "dead_letter_completed", "m5": "purged", "m6": "purged", "ttl": "expired", "later": "cancelled"}
    assert [(row["message_id"], row["left_as"]) for row in _archived(ns_path, "fwd")] == [("moved", "forwarded")]
    m0, m4 = rows["m0"], rows["m4"]
    assert bytes(m0["body"]) == b"m0" and m0["subject"] == "s" and json.loads(m0["application_properties"])
    assert m0["delivery_count"] == 1 and m0["dead_letter_reason"] is None
    assert m4["dead_letter_reason"] == "bad" and m4["dead_letter_error_description"] == "it was bad"
    assert m4["delivery_count"] == 2  # received, then received again from the dead-letter queue
    for row in rows.values():
        assert row["enqueued_date"] == row["enqueued_time_utc"].strftime("%Y-%m-%d")
        assert row["enqueued_time_utc"] <= row["left_time"] <= clock.now()
    assert rows["ttl"]["left_time"] > rows["m0"]["left_time"] + timedelta(seconds=100)  # when it left: moved clock

    assert retention.run_entity(_info(ns_path, "q"), eager=True) == 0
    assert len(_archived(ns_path, "q")) == 9
    runtime = admin.get_queue_runtime_properties("q")
    assert runtime.archive_message_count == 9 and runtime.archive_size_in_bytes > 0
    assert runtime.active_message_count == 2 and runtime.size_in_bytes == _stored_size(admin, "q")
    assert admin.get_queue_runtime_properties("elsewhere").archive_message_count == 0


def _stored_size(admin, queue):
    """The body and header bytes of the messages table's rows (its messages not yet removed, archived
    ones being gone from it)."""
    table = storage.open_table(admin.get_entity_tables(queue)["messages"])
    return storage.query("SELECT SUM(body_size + header_size) AS n FROM t", t=table)["n"][0].as_py()


@pytest.mark.local_only
def test_an_archive_commit_whose_removal_did_not_follow_is_not_archived_again(admin, client, ns_path):
    """The archive commit and the removal are two commits. Interrupted between them (a crash, or a removal
    that lost a race), the next run archives only what is not archived yet and removes all of it; two runs
    archiving on the same count cannot both commit."""
    admin.create_queue("q", archive_retention=WEEK)
    client.get_queue_sender("q").send_messages([ServiceBusMessage(f"m{i}") for i in range(10)])
    receiver = client.get_queue_receiver("q")
    receiver.complete_messages(receiver.receive_messages(max_message_count=4))
    info = _info(ns_path, "q")
    messages = commits.LogView(storage.open_table(info.tables["messages"]))
    locks = commits.LogView(storage.open_table(info.tables["locks"]))
    archived = archive.open_view(info)
    counts = archive.pending(archived, messages, 0)
    assert (counts.archived, counts.removed, counts.behind) == (0, 0, False)
    leaving = PartitionReader(MESSAGES).rows_of(messages, 0, _numbers(1, 2, 3))
    states = PartitionReader(LOCKS).rows_of(locks, 0, _numbers(1, 2, 3))
    rival = archived.copy()
    assert archive.archive_leaving(archived, 0, counts, leaving, states) == {"archived-p0": 1}  # then "crash"
    with pytest.raises(CommitFailedError):  # a second run planned on the same count
        archive.archive_leaving(rival, 0, counts, leaving, states)
    assert [r["sequence_number"] for r in _archived(ns_path, "q")] == [1, 2, 3]
    assert archive.pending(archived, messages, 0).behind

    receiver.complete_messages(receiver.receive_messages(max_message_count=2))  # 5 and 6 leave as well
    assert retention.run_entity(info, eager=True) == 6
    assert [r["sequence_number"] for r in _archived(ns_path, "q")] == [1, 2, 3, 4, 5, 6]
    fresh = commits.LogView(storage.open_table(info.tables["messages"]))
    after = archive.pending(archive.open_view(info), fresh, 0)
    assert (after.archived, after.removed) == (2, 2)
    assert [m.sequence_number for m in receiver.peek_messages(10, sequence_number=1)] == [7, 8, 9, 10]


def _numbers(*values):
    import pyarrow as pa

    return pa.array(values, pa.int64())


@pytest.mark.local_only
def test_the_sweep_archives_every_gone_message_and_retention_drops_what_is_past_it(admin, client, ns_path, clock):
    """The namespace's sweep moves every gone message of an archived entity (a few as well: the archive lags
    a sweep), while one without an archive keeps its rows until enough have gone; archive files whose rows
    all left before the retention are removed (moved clock), and runtime counts follow."""
    admin.create_queue("q", archive_retention="PT1H")
    admin.create_queue("plain")
    for name in ("q", "plain"):
        client.get_queue_sender(name).send_messages([ServiceBusMessage(f"{name}{i}") for i in range(5)])
        receiver = client.get_queue_receiver(name)
        receiver.complete_messages(receiver.receive_messages(max_message_count=3))
    catalog = Catalog(normalize(ns_path))
    assert housekeeping.sweep(catalog).removed == 3
    assert len(_archived(ns_path, "q")) == 3 and _rows(admin, "plain") == 5
    assert admin.get_queue_runtime_properties("q").archive_message_count == 3
    clock.advance(40 * 60)
    receiver = client.get_queue_receiver("q")
    receiver.complete_messages(receiver.receive_messages(max_message_count=1))
    housekeeping.sweep(catalog)
    assert len(_archived(ns_path, "q")) == 4
    clock.advance(30 * 60)  # the first three left 70 minutes ago, the fourth 30
    housekeeping.sweep(catalog)
    assert [bytes(r["body"]) for r in _archived(ns_path, "q")] == [b"q3"]
    assert admin.get_queue_runtime_properties("q").archive_message_count == 1
    clock.advance(31 * 60)
    housekeeping.sweep(catalog)
    assert _archived(ns_path, "q") == [] and admin.get_queue_runtime_properties("q").archive_message_count == 0


def _rows(admin, queue):
    return storage.open_table(admin.get_entity_tables(queue)["messages"]).to_pyarrow_table().num_rows


@pytest.mark.local_only
def test_archive_retention_is_checked_stored_and_switched_off(admin, client, ns_path, tmp_path):
    """archive_retention: None by default, a timedelta or ISO 8601 duration up to 90 days on queues, topics
    and subscriptions, at creation, by update, in a namespace definition and with the CLI; a bad value is a
    typed error naming what is allowed and writes nothing; switched off, the archive is removed."""
    assert admin.create_queue("plain").archive_retention is None
    assert admin.create_queue("q", archive_retention="P90D").archive_retention == timedelta(days=90)
    assert admin.create_topic("t", archive_retention=timedelta(hours=2)).archive_retention == timedelta(hours=2)
    assert admin.create_subscription("t", "s", archive_retention="PT5M").archive_retention == timedelta(minutes=5)
    with pytest.raises(ValueError, match="archive_retention must be between PT1M and P90D"):
        admin.create_queue("long", archive_retention=timedelta(days=91))
    with pytest.raises(TypeError, match="archive_retention must be a datetime.timedelta or an ISO 8601"):
        admin.create_queue("typed", archive_retention=7)
    assert [q.name for q in admin.list_queues()] == ["plain", "q"]
    with pytest.raises(ValueError, match="archive_retention"):
        admin.update_queue("q", archive_retention="P100D")
    assert admin.get_queue("q").archive_retention == timedelta(days=90)

    props = admin.get_queue("plain")
    props.archive_retention = timedelta(days=3)
    admin.update_queue(props)
    assert admin.get_queue("plain").archive_retention == timedelta(days=3)

    apply_definition({"queues": [{"name": "defined", "archive_retention": "P2D"}]}, ns_path)
    assert admin.get_queue("defined").archive_retention == timedelta(days=2)
    from sparkbus.cli import main

    assert main(["queue", "create", "cli", "--set", "archive_retention=P1D", "--namespace", ns_path]) == 0
    assert admin.get_queue("cli").archive_retention == timedelta(days=1)
    assert main(["queue", "update", "cli", "--set", "archive_retention=none", "--namespace", ns_path]) == 0
    assert admin.get_queue("cli").archive_retention is None

    client.get_queue_sender("q").send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])
    receiver = client.get_queue_receiver("q")
    receiver.complete_messages(receiver.receive_messages(max_message_count=1))
    retention.run_entity(_info(ns_path, "q"), eager=True)
    uri = archive.table_uri(_info(ns_path, "q").tables)
    assert storage.table_exists(uri) and len(_archived(ns_path, "q")) == 1
    admin.update_queue("q", archive_retention=None)
    assert not storage.table_exists(uri)
    assert admin.get_queue_runtime_properties("q").archive_message_count == 0


def test_the_archive_schema_is_the_messages_and_how_they_left():
    """The archive table's columns: every messages column, the last state's delivery count and
    dead-letter fields, left_time, left_as and the date it is filed under."""
    assert ARCHIVE.names[:len(MESSAGES.names)] == MESSAGES.names
    assert ARCHIVE.names[len(MESSAGES.names):] == ["delivery_count", "dead_letter_reason",
                                                   "dead_letter_error_description", "dead_letter_source",
                                                   "left_time", "left_as", "enqueued_date"]


def test_archive_rows_and_dates_follow_from_the_message_and_its_state():
    """archiving.archive_rows: one row per message in sequence order, its state's fields, the date it was
    enqueued; a message without a state row is a KeyError; within_retention keeps rows that left since."""
    import pyarrow as pa

    from sparkbus.core import archiving
    from sparkbus.core.records import from_rows

    def made(rows, schema):
        return from_rows([{name: row.get(name) for name in schema.names} for row in rows], schema)

    base = datetime(2026, 11, 29, 23, 59, 59, tzinfo=timezone.utc)
    messages = made([{"partition_id": 0, "sequence_number": n, "body": b"x", "body_size": 1, "header_size": 0,
                      "enqueued_time_utc": base + timedelta(seconds=n)} for n in (3, 1)], MESSAGES)
    states = made([{"partition_id": 0, "sequence_number": n, "state": "completed", "delivery_count": n,
                    "updated_at_utc": base + timedelta(hours=n)} for n in (1, 3)], LOCKS)
    rows = archiving.archive_rows(messages, states)
    assert rows["sequence_number"].to_pylist() == [1, 3] and rows["delivery_count"].to_pylist() == [1, 3]
    assert rows["left_time"].to_pylist() == [base + timedelta(hours=1), base + timedelta(hours=3)]
    assert archiving.enqueued_dates(rows).to_pylist() == ["2026-11-30", "2026-11-30"]
    assert archiving.enqueued_dates(archiving.archive_rows(
        made([{**messages.to_pylist()[1], "enqueued_time_utc": base}], MESSAGES), states)).to_pylist() \
        == ["2026-11-29"]
    assert list(archiving.by_date(rows)) == ["2026-11-30"]
    assert archiving.within_retention(rows, base + timedelta(hours=2))["sequence_number"].to_pylist() == [3]
    with pytest.raises(KeyError, match="message 3 has no state row"):
        archiving.archive_rows(messages, states.slice(0, 1))
    latest = pa.chunked_array([pa.array([base, None, base + timedelta(hours=2)], pa.timestamp("us", tz="UTC"))])
    assert archiving.files_expired(latest, base + timedelta(hours=1)).to_pylist() == [True, False, False]


def test_replay_sends_the_archived_range_once_per_id_in_partition_order(admin, client, ns_path, clock):
    """replay_messages of the last hour into a second queue sends exactly the messages enqueued in it that
    left, in sequence order per partition key, with their properties and where they came from; a filter
    replays a subset; the same replay id run again sends nothing; bad arguments are typed errors."""
    admin.create_queue("q", enable_partitioning=True, archive_retention="P1D")
    admin.create_queue("copy", enable_partitioning=True)
    admin.create_queue("evens")
    sender = client.get_queue_sender("q")
    sender.send_messages([ServiceBusMessage(f"old{i}") for i in range(5)])
    clock.advance(2 * 3600)
    start = clock.now() - timedelta(hours=1)
    sender.send_messages([ServiceBusMessage(f"new{i}", partition_key=f"k{i % 3}", subject="s",
                                            application_properties={"n": i}) for i in range(24)])
    _drain(client, "q")

    result = admin.replay_messages("q", start_time=start, to="copy", replay_id="hour")
    assert (result.replayed, result.already_replayed, result.to, result.replay_id) == (24, 0, "copy", "hour")
    copies = _drain(client, "copy")
    assert sorted(m.body for m in copies) == sorted(f"new{i}".encode() for i in range(24))
    for key in ("k0", "k1", "k2"):
        mine = [m for m in copies if m.partition_key == key]
        original = [m.application_properties[b"x-opt-original-sequence-number"] for m in mine]
        assert len(mine) == 8 and original == sorted(original)  # one key: one partition, its order kept
    first = next(m for m in copies if m.body == b"new4")
    assert first.subject == "s" and first.application_properties[b"n"] == 4
    assert first.application_properties[b"x-opt-replayed-from"] == b"q"
    enqueued = first.application_properties[b"x-opt-original-enqueued-time"]  # an AMQP timestamp: ms
    assert start <= datetime.fromtimestamp(enqueued / 1000, timezone.utc) <= clock.now()

    again = admin.replay_messages("q", start_time=start, to="copy", replay_id="hour")
    assert (again.replayed, again.already_replayed) == (0, 24) and _drain(client, "copy") == []
    evens = admin.replay_messages("q", start_time=start, to="evens",
                                  rule_filter=sparkbus.SqlRuleFilter("n % 2 = 0"))
    assert evens.replayed == 12 and sorted(m.application_properties[b"n"] for m in _drain(client, "evens")) \
        == list(range(0, 24, 2))
    everything = admin.replay_messages("q", start_time=start - timedelta(hours=2), end_time=start, to="evens")
    assert everything.replayed == 5

    admin.create_queue("plain")
    with pytest.raises(sparkbus.InvalidOperationError, match="'plain' keeps no archive"):
        admin.replay_messages("plain", start_time=start)
    with pytest.raises(sparkbus.MessagingEntityNotFoundError):
        admin.replay_messages("q", start_time=start, to="nowhere")
    with pytest.raises(TypeError, match="start_time"):
        admin.replay_messages("q", start_time="an hour ago")
    with pytest.raises(ValueError, match="end_time must be after start_time"):
        admin.replay_messages("q", start_time=start, end_time=start)
    with pytest.raises(ValueError, match="replay_id must be"):
        admin.replay_messages("q", start_time=start, replay_id="no spaces")
    with pytest.raises(ValueError, match="rule_filter"):
        admin.replay_messages("q", start_time=start, rule_filter=sparkbus.SqlRuleFilter("n ="))
    assert sorted(m.body for m in _drain(client, "evens")) == [f"old{i}".encode() for i in range(5)]  # no more


def _drain(client, queue):
    """Receive and complete everything a queue holds, in the order received."""
    got = []
    with client.get_queue_receiver(queue, max_wait_time=1) as receiver:
        while batch := receiver.receive_messages(max_message_count=100, max_wait_time=1):
            receiver.complete_messages(batch)
            got += batch
    return got


KILLED_REPLAY = """
import os, signal, sys
from datetime import datetime, timezone
import sparkbus
admin = sparkbus.ServiceBusAdministrationClient(sys.argv[1])
def killed(sent):
    os.kill(os.getpid(), signal.SIGKILL)
admin.replay_messages("q", start_time=datetime(2000, 1, 1, tzinfo=timezone.utc), to="copy", replay_id="killed",
                      progress=killed)
"""


@pytest.mark.local_only
def test_a_replay_killed_half_way_continues_and_sends_each_message_once(admin, client, ns_path):
    """A replay process killed right after its first batch (SIGKILL), run again with the same id, sends the
    rest: every archived message reaches the target exactly once."""
    import subprocess
    import sys

    admin.create_queue("q", archive_retention="P1D")
    admin.create_queue("copy")
    client.get_queue_sender("q").send_messages([ServiceBusMessage(f"m{i}") for i in range(2_500)])
    with client.get_queue_receiver("q", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as receiver:
        while receiver.receive_messages(max_message_count=1_000, max_wait_time=1):
            pass
    done = subprocess.run([sys.executable, "-c", KILLED_REPLAY, ns_path], capture_output=True, timeout=300)
    assert done.returncode == -9, done.stderr.decode()[-2000:]
    assert admin.get_queue_runtime_properties("copy").active_message_count == 1_000
    result = admin.replay_messages("q", start_time=datetime(2000, 1, 1, tzinfo=timezone.utc), to="copy",
                                   replay_id="killed")
    assert (result.replayed, result.already_replayed) == (1_500, 1_000)
    numbers = [m.application_properties[b"x-opt-original-sequence-number"] for m in _drain(client, "copy")]
    assert sorted(numbers) == list(range(1, 2_501))


@pytest.mark.local_only
def test_seek_makes_what_a_subscription_received_since_a_time_available_again(admin, client, ns_path, clock):
    """seek_subscription replays the subscription's own archive into it: only what its rules let it
    receive, from the time given; other subscriptions are untouched."""
    admin.create_topic("t")
    admin.create_subscription("t", "eu", archive_retention="P7D")
    admin.create_rule("t", "eu", "eu", filter=sparkbus.SqlRuleFilter("region = 'eu'"))
    admin.delete_rule("t", "eu", "$Default")
    admin.create_subscription("t", "all")
    from sparkbus.engine import fanout

    sender = client.get_topic_sender("t")
    sender.send_messages([ServiceBusMessage(f"early{i}", application_properties={"region": "eu"}) for i in range(2)])
    clock.advance(600)
    since = clock.now()
    sender.send_messages([ServiceBusMessage(f"m{i}", application_properties={"region": "eu" if i % 2 else "us"})
                          for i in range(6)])
    sender.send_messages(ServiceBusMessage("tail", application_properties={"region": "us"}))
    fanout.drain(open_catalog(ns_path), "t")
    received = _drain_subscription(client, "t", "eu")
    assert [m.body for m in received] == [b"early0", b"early1", b"m1", b"m3", b"m5"]
    result = admin.seek_subscription("t", "eu", since)
    assert result.replayed == 3
    assert sorted(m.body for m in _drain_subscription(client, "t", "eu")) == [b"m1", b"m3", b"m5"]
    assert len(_drain_subscription(client, "t", "all")) == 9
    with pytest.raises(sparkbus.InvalidOperationError, match="keeps no archive"):
        admin.seek_subscription("t", "all", since)


def _drain_subscription(client, topic, subscription):
    got = []
    with client.get_subscription_receiver(topic, subscription, max_wait_time=1) as receiver:
        while batch := receiver.receive_messages(max_message_count=100, max_wait_time=1):
            receiver.complete_messages(batch)
            got += batch
    return got


@pytest.mark.local_only
def test_sparkbus_replay_on_the_command_line(admin, client, ns_path, capsys):
    """`sparkbus replay --entity E --since T [--until T] [--to E2] [--filter SQL] [--id ID]`: a time as ISO 8601
    or a duration ago; run again with its id it sends nothing; a bad time is a usage error that writes
    nothing."""
    from sparkbus.cli import main

    admin.create_queue("q", archive_retention="P1D")
    admin.create_queue("copy")
    client.get_queue_sender("q").send_messages([ServiceBusMessage(f"m{i}", application_properties={"n": i})
                                                for i in range(6)])
    _drain(client, "q")
    argv = ["replay", "--entity", "q", "--since", "PT1H", "--to", "copy", "--filter", "n >= 2", "--id", "cli",
            "--namespace", ns_path]
    assert main([*argv, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["replayed"], printed["already_replayed"], printed["replay_id"]) == (4, 0, "cli")
    assert main(argv) == 0
    assert "replayed 0 message(s) from q to copy (4 sent before under this id); replay id cli" in capsys.readouterr().out
    until = (datetime.now(timezone.utc) - timedelta(hours=1)).isoformat()
    assert main(["replay", "--entity", "q", "--since", "2026-01-01T00:00", "--until", until, "--json",
                 "--namespace", ns_path]) == 0
    assert json.loads(capsys.readouterr().out)["replayed"] == 0
    assert main(["replay", "--entity", "q", "--since", "yesterday", "--namespace", ns_path]) == 2
    assert "takes an ISO 8601 time" in capsys.readouterr().err
    assert sorted(m.application_properties[b"n"] for m in _drain(client, "copy")) == [2, 3, 4, 5]


@pytest.mark.local_only
def test_spark_reads_the_archive_reading_only_the_days_asked_for(admin, client, ns_path, clock, spark):
    """spark.read.format("sparkbus").option("archive", "true") gives the archived messages with left_time and
    left_as; startTime / endTime select by enqueue time and the reader names only the files filed under the
    dates in range; archive_table gives the Delta table for any Delta reader."""
    from sparkbus.spark.datasource import ArchiveReader

    admin.create_queue("q", archive_retention="P30D")
    day = timedelta(days=1)
    first = clock.now()
    for round_ in range(3):
        client.get_queue_sender("q").send_messages([ServiceBusMessage(f"d{round_}m{i}") for i in range(3)])
        clock.advance(2 * 86_400)
    _drain(client, "q")
    housekeeping.sweep(Catalog(normalize(ns_path)))
    options = {"namespace": ns_path, "entity": "q", "archive": "true"}
    since = (first + 1.5 * day).isoformat()
    [piece] = ArchiveReader({**options, "startTime": since}).partitions()
    every = ArchiveReader(options).partitions()[0].paths
    dates = {(first + k * 2 * day).strftime("%Y-%m-%d") for k in range(3)}
    assert {p.split("enqueued_date=")[1][:10] for p in every} == dates
    assert piece.paths and all("enqueued_date=" + first.strftime("%Y-%m-%d") not in p for p in piece.paths)
    assert len(piece.paths) < len(every)

    def read(**bounds):  # (a DataFrameReader keeps the options set on it: a new one each time)
        return spark.read.format("sparkbus").options(**options, **bounds).load()

    later = read(startTime=since)
    assert sorted(r.body.decode() for r in later.select("body").collect()) == \
        sorted(f"d{r}m{i}" for r in (1, 2) for i in range(3))
    assert {r.left_as for r in later.select("left_as").collect()} == {"completed"}
    assert later.columns[-5:] == ["delivery_count", "dead_letter_reason", "dead_letter_error_description",
                                  "left_time", "left_as"]
    middle = read(startTime=since, endTime=(first + 3 * day).isoformat())
    assert sorted(r.body.decode() for r in middle.select("body").collect()) == [f"d1m{i}" for i in range(3)]
    assert read().count() == 9
    assert DeltaTable(sparkbus.archive_table(ns_path, "q")).to_pyarrow_table().num_rows == 8  # one stays in q
    with pytest.raises(Exception, match="startTime must be an ISO 8601 time"):
        read(startTime="last week").count()
    admin.create_queue("plain")
    with pytest.raises(Exception, match="keeps no archive"):
        spark.read.format("sparkbus").option("namespace", ns_path).option("entity", "plain") \
            .option("archive", "true").load().count()


@pytest.mark.local_only
def test_a_topics_archive_replays_into_a_subscription_created_after_the_messages_were_sent(admin, client, ns_path):
    """A topic with an archive keeps every message sent to it once fanned out (left as forwarded); replayed
    into a subscription created later, that subscription gets them all, in order."""
    from sparkbus.engine import fanout

    admin.create_topic("t", archive_retention="P1D")
    admin.create_subscription("t", "early")
    client.get_topic_sender("t").send_messages([ServiceBusMessage(f"m{i}", application_properties={"i": i})
                                                for i in range(5)])
    fanout.drain(open_catalog(ns_path), "t")
    assert [r["left_as"] for r in _archived(ns_path, "t", ("topic",))] == ["forwarded"] * 4  # the highest stays
    admin.create_subscription("t", "late")
    result = admin.replay_messages("t", start_time=datetime(2000, 1, 1, tzinfo=timezone.utc),
                                   to="t/Subscriptions/late")
    assert result.replayed == 5
    assert [m.body for m in _drain_subscription(client, "t", "late")] == [f"m{i}".encode() for i in range(5)]
    assert len(_drain_subscription(client, "t", "early")) == 5  # untouched by the replay


def test_replayed_properties_are_each_rows_own_with_where_and_when_it_came_from():
    """archiving.replayed_properties builds the properties text over the whole column: it decodes to the
    row's own properties plus the three annotations, for rows without properties, with some, and with one
    of the annotation names already (a replay of a replay: replaced, not repeated)."""
    from sparkbus.core import archiving
    from sparkbus.core.records import from_rows
    from sparkbus.core.values import decode_properties, encode_properties

    at = datetime(2026, 11, 29, 8, 30, 1, 250, tzinfo=timezone.utc)
    own = [None, encode_properties({}), encode_properties({"n": 5, "when": at, "b": b"\x00"}),
           encode_properties({"X-Opt-Replayed-From": "older", "k": "v"}), encode_properties({"s": 'quote " é'})]
    rows = from_rows([{**{name: None for name in MESSAGES.names}, "partition_id": 0, "sequence_number": 10 + i,
                       "enqueued_time_utc": at + timedelta(seconds=i), "body": b"", "body_size": 0,
                       "header_size": 0, "application_properties": text} for i, text in enumerate(own)], MESSAGES)
    made = archiving.replayed_properties(rows, "orders/x").to_pylist()
    for i, text in enumerate(own):
        expected = {k: v for k, v in decode_properties(text).items() if k.lower() != "x-opt-replayed-from"}
        expected.update({"x-opt-replayed-from": "orders/x", "x-opt-original-sequence-number": 10 + i,
                         "x-opt-original-enqueued-time": at + timedelta(seconds=i)})
        assert decode_properties(made[i]) == expected, i


@pytest.mark.local_only
def test_compaction_merges_an_archives_small_files_within_each_date(admin, client, ns_path, clock):
    """Each sweep writes a small archive file per partition and date; compaction merges them date by date
    (never across dates), the rows and their dates unchanged."""
    from sparkbus.storage import maintenance

    admin.create_queue("q", archive_retention="P30D")
    catalog = Catalog(normalize(ns_path))
    for day in range(2):
        for round_ in range(9):
            client.get_queue_sender("q").send_messages([ServiceBusMessage(f"d{day}r{round_}") for _ in range(2)])
            _drain(client, "q")
            housekeeping.sweep(catalog)
        clock.advance(86_400)
    uri = archive.table_uri(_info(ns_path, "q").tables)
    before = _archived(ns_path, "q")
    files_before = len(DeltaTable(uri).file_uris())
    assert maintenance.compact(uri)
    after = _archived(ns_path, "q")
    assert [(r["sequence_number"], r["enqueued_date"], bytes(r["body"])) for r in after] == \
        [(r["sequence_number"], r["enqueued_date"], bytes(r["body"])) for r in before]
    paths = DeltaTable(uri).file_uris()
    assert len(paths) < files_before and len({r["enqueued_date"] for r in after}) == 2
    import pyarrow.parquet as pq

    for path in paths:  # every file holds one date's rows, in that date's directory
        date = path.split("enqueued_date=")[1][:10]
        times = pq.read_table(path.removeprefix("file://"), columns=["enqueued_time_utc"])["enqueued_time_utc"]
        assert {t.strftime("%Y-%m-%d") for t in times.to_pylist()} == {date}


@pytest.mark.local_only
def test_replay_keeps_session_ids_and_a_session_receiver_gets_them_in_order(admin, client, ns_path):
    """Session messages replayed into a session queue keep their session ids and, per session, their order."""
    admin.create_queue("sessions", requires_session=True, archive_retention="P1D")
    admin.create_queue("again", requires_session=True)
    client.get_queue_sender("sessions").send_messages(
        [ServiceBusMessage(f"{s}{i}", session_id=s) for i in range(4) for s in ("a", "b")])
    for session in ("a", "b"):
        with client.get_queue_receiver("sessions", session_id=session, max_wait_time=1) as receiver:
            receiver.complete_messages(receiver.receive_messages(max_message_count=10, max_wait_time=1))
    assert admin.replay_messages("sessions", start_time=datetime(2000, 1, 1, tzinfo=timezone.utc),
                                 to="again").replayed == 8
    for session in ("a", "b"):
        with client.get_queue_receiver("again", session_id=session, max_wait_time=1) as receiver:
            got = receiver.receive_messages(max_message_count=10, max_wait_time=1)
            assert [m.body for m in got] == [f"{session}{i}".encode() for i in range(4)]
            assert {m.session_id for m in got} == {session}
