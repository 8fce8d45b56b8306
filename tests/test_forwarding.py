"""Auto-forwarding: chains across queues, topics and subscriptions with the destination's placement and
numbering, dead-letter forwarding, the hop limit, refused destinations, loops rejected, and exactly-once
transfers across a killed forwarder (real Delta tables and processes)."""
from __future__ import annotations

import os
import signal
import time
from datetime import timedelta

import pytest
from conftest import stored_messages

import sparkbus
from sparkbus.storage.location import normalize
from sparkbus import (InvalidOperationError, MessagingEntityNotFoundError, ServiceBusClient, ServiceBusMessage,
                      ServiceBusSubQueue)
from sparkbus.core import forwarding as rules
from sparkbus.core.partitioning import partition_of
from sparkbus.engine import fanout, forwarding
from sparkbus.engine.catalog import Catalog
from sparkbus.engine.registry import resolve


def forward(ns_path, source=None):
    """Forward everything pending (source given: one pass over that source only)."""
    catalog = Catalog(normalize(ns_path))
    if source is None:
        return forwarding.forward_all(catalog)
    snap = catalog.snapshot()
    return forwarding.forward_entity(catalog, snap, resolve(catalog.root, snap, source, ("queue", "subscription")))


def receive_all(client, queue, wait: float = 0, **kwargs):
    """Receive and complete what the queue holds (wait: how long to wait for a first message; forwarding
    done in this process has committed before, so by default none)."""
    with client.get_queue_receiver(queue, **kwargs) as receiver:
        got = receiver.receive_messages(500, max_wait_time=wait)
        for m in got:
            receiver.complete_message(m)
    return got


def placed(admin, path):
    """{message_id: (partition_id, transfer_hop_count)} of the messages stored in an entity."""
    rows = stored_messages(admin, path).to_pylist()
    return {r["message_id"]: (r["partition_id"], r["transfer_hop_count"]) for r in rows}


def test_chain_queue_queue_topic_subscription_queue(admin, client, ns_path):
    admin.create_queue("last", enable_partitioning=True, requires_duplicate_detection=True)
    admin.create_topic("t", enable_partitioning=True)
    admin.create_subscription("t", "s", forward_to="last")
    admin.create_queue("second", enable_partitioning=True, forward_to="t")
    admin.create_queue("first", forward_to="second")  # not partitioned
    keyed = [ServiceBusMessage(f"k{i}", message_id=f"id-k{i}", partition_key=f"key{i}", correlation_id=f"c{i}",
                               subject="keyed", content_type="text/plain", application_properties={"n": i},
                               time_to_live=timedelta(hours=1)) for i in range(12)]
    keyless = [ServiceBusMessage(f"u{i}", message_id=f"id-u{i}", application_properties={"n": 100 + i})
               for i in range(12)]
    client.get_queue_sender("first").send_messages(keyed + keyless)
    counts = admin.get_queue_runtime_properties("first")
    assert (counts.active_message_count, counts.transfer_message_count) == (0, 24)
    with pytest.raises(InvalidOperationError, match="forwards its messages to 'second'"):
        client.get_queue_receiver("first").receive_messages()
    assert len(client.get_queue_receiver("first").peek_messages(50)) == 24

    assert forward(ns_path, "first").forwarded == {"first": 24}
    at_second = placed(admin, "second")
    assert len(at_second) == 24
    for i in range(12):  # keyed: the destination's hash of the partition key
        assert at_second[f"id-k{i}"] == (partition_of(f"key{i}", 16), 1)
    assert {at_second[f"id-u{i}"][1] for i in range(12)} == {1}
    assert len({at_second[f"id-u{i}"][0] for i in range(12)}) == 1  # keyless: one send's stay together
    assert admin.get_queue_runtime_properties("first").total_message_count == 0

    assert forward(ns_path, "second").forwarded == {"second": 24}
    at_topic = placed(admin, "t")
    assert all(at_topic[f"id-k{i}"] == (partition_of(f"key{i}", 16), 2) for i in range(12))
    fanout.drain(Catalog(normalize(ns_path)), "t")
    assert forward(ns_path, "t/Subscriptions/s").forwarded == {"t/Subscriptions/s": 24}
    at_last = placed(admin, "last")  # duplicate detection on: keyless messages are placed by message id
    assert all(at_last[f"id-k{i}"] == (partition_of(f"key{i}", 16), 3) for i in range(12))
    assert all(at_last[f"id-u{i}"] == (partition_of(f"id-u{i}", 16), 3) for i in range(12))

    got = {m.message_id: m for m in receive_all(client, "last")}
    assert sorted(got) == sorted(m.message_id for m in keyed + keyless)
    k3 = got["id-k3"]
    assert (str(k3), k3.partition_key, k3.correlation_id, k3.subject, k3.content_type) == \
        ("k3", "key3", "c3", "keyed", "text/plain")
    assert k3.str_application_properties == {"n": 3} and k3.time_to_live == timedelta(hours=1)
    assert forward(ns_path).moved == 0
    for path in ("first", "second"):
        assert admin.get_queue_runtime_properties(path).transfer_message_count == 0


def test_destination_duplicate_detection_and_sequence_numbers(admin, client, ns_path):
    admin.create_queue("dest", requires_duplicate_detection=True)
    admin.create_queue("src", forward_to="dest")
    client.get_queue_sender("dest").send_messages(ServiceBusMessage("direct", message_id="d0"))
    client.get_queue_sender("src").send_messages([ServiceBusMessage("a", message_id="same"),
                                                  ServiceBusMessage("b", message_id="same"),
                                                  ServiceBusMessage("c", message_id="other")])
    assert forward(ns_path).forwarded == {"src": 3}
    got = receive_all(client, "dest")
    assert [(str(m), m.sequence_number) for m in got] == [("direct", 1), ("a", 2), ("c", 3)]


def test_session_destination_needs_a_session_id(admin, client, ns_path):
    admin.create_queue("sessions", requires_session=True)
    admin.create_queue("src", forward_to="sessions")
    client.get_queue_sender("src").send_messages([ServiceBusMessage("with", session_id="s1"),
                                                  ServiceBusMessage("without", message_id="lonely")])
    result = forward(ns_path)
    assert (result.forwarded, result.dead_lettered) == ({"src": 1}, {"src": 1})
    with client.get_queue_receiver("sessions", session_id="s1") as receiver:
        assert [str(m) for m in receiver.receive_messages(5, max_wait_time=0.5)] == ["with"]
    [dead] = receive_all(client, "src", sub_queue=ServiceBusSubQueue.TRANSFER_DEAD_LETTER)
    assert dead.message_id == "lonely"
    assert dead.dead_letter_reason == "Session id is null." and "'sessions'" in dead.dead_letter_error_description


def test_dead_lettered_messages_are_forwarded(admin, client, ns_path):
    admin.create_queue("graveyard")
    admin.create_queue("work", forward_dead_lettered_messages_to="graveyard", max_delivery_count=1)
    client.get_queue_sender("work").send_messages([ServiceBusMessage("bad", application_properties={"k": "v"}),
                                                   ServiceBusMessage("tired")])
    with client.get_queue_receiver("work") as receiver:
        bad, tired = receiver.receive_messages(2, max_wait_time=0.5)
        receiver.dead_letter_message(bad, reason="Poison", error_description="cannot parse")
        receiver.abandon_message(tired)  # max_delivery_count 1: dead-lettered on the next receive
        assert receiver.receive_messages(1, max_wait_time=0.2) == []
    counts = admin.get_queue_runtime_properties("work")
    assert (counts.dead_letter_message_count, counts.transfer_message_count) == (0, 2)
    with pytest.raises(InvalidOperationError, match="dead-letter sub-queue cannot be received from"):
        client.get_queue_receiver("work", sub_queue=ServiceBusSubQueue.DEAD_LETTER).receive_messages()
    assert forward(ns_path).forwarded == {"work": 2}
    got = {str(m): m for m in receive_all(client, "graveyard")}
    assert (got["bad"].dead_letter_source, got["bad"].dead_letter_reason,
            got["bad"].dead_letter_error_description) == ("work", "Poison", "cannot parse")
    assert got["bad"].str_application_properties["k"] == "v"
    assert (got["tired"].dead_letter_source, got["tired"].dead_letter_reason) == ("work", "MaxDeliveryCountExceeded")
    assert admin.get_queue_runtime_properties("work").total_message_count == 0


def test_hop_limit(admin, client, ns_path):
    for i in range(5, -1, -1):
        admin.create_queue(f"q{i}", **({"forward_to": f"q{i + 1}"} if i < 5 else {}))
    client.get_queue_sender("q0").send_messages(ServiceBusMessage("far", message_id="far"))
    result = forward(ns_path)
    assert result.forwarded == {f"q{i}": 1 for i in range(4)} and result.dead_lettered == {"q4": 1}
    assert receive_all(client, "q5") == []
    counts = admin.get_queue_runtime_properties("q4")
    assert (counts.transfer_message_count, counts.transfer_dead_letter_message_count) == (0, 1)
    [dead] = receive_all(client, "q4", sub_queue=ServiceBusSubQueue.TRANSFER_DEAD_LETTER)
    assert dead.dead_letter_reason == rules.HOP_LIMIT_REASON and "4 times" in dead.dead_letter_error_description
    assert admin.get_queue_runtime_properties("q4").transfer_dead_letter_message_count == 0


def test_loops_and_bad_targets_are_rejected(admin, client):
    admin.create_queue("a")
    admin.create_queue("b", forward_to="a")
    with pytest.raises(InvalidOperationError, match="itself"):
        admin.create_queue("c", forward_to="c")
    with pytest.raises(MessagingEntityNotFoundError, match="'nowhere'"):
        admin.create_queue("c", forward_to="nowhere")
    a = admin.get_queue("a")
    a.forward_to = "b"
    with pytest.raises(InvalidOperationError, match="loop: a -> b -> a"):
        admin.update_queue(a)
    assert admin.get_queue("a").forward_to is None
    # through a topic: a -> t, t's subscription s -> b -> a
    admin.create_topic("t")
    admin.create_subscription("t", "s", forward_to="b")
    a.forward_to = "t"
    with pytest.raises(InvalidOperationError, match="loop"):
        admin.update_queue(a)
    admin.create_queue("d", forward_to="t")
    with pytest.raises(InvalidOperationError, match="loop"):
        admin.create_subscription("t", "back", forward_to="d")
    assert [s.name for s in admin.list_subscriptions("t")] == ["s"]
    a.forward_to, a.forward_dead_lettered_messages_to = None, "b"  # dead-letters may go anywhere else
    admin.update_queue(a)
    assert admin.get_queue("a").forward_dead_lettered_messages_to == "b"


def test_refused_destinations_go_to_the_transfer_dead_letter_queue(ns_path):
    sparkbus.create_namespace(ns_path, max_partition_size_in_kilobytes=10)
    admin = sparkbus.ServiceBusAdministrationClient(ns_path)
    client = ServiceBusClient(ns_path)
    admin.create_queue("small")
    admin.create_queue("off")
    admin.create_queue("to-small", forward_to="small")
    admin.create_queue("to-off", forward_to="off")
    off = admin.get_queue("off")
    off.status = "Disabled"
    admin.update_queue(off)
    client.get_queue_sender("small").send_messages(ServiceBusMessage(b"x" * 8000))
    client.get_queue_sender("to-small").send_messages(ServiceBusMessage(b"y" * 4000, message_id="big"))
    client.get_queue_sender("to-off").send_messages(ServiceBusMessage("z", message_id="z"))
    result = forward(ns_path)
    assert result.forwarded == {} and result.dead_lettered == {"to-small": 1, "to-off": 1}
    [full] = receive_all(client, "to-small", sub_queue=ServiceBusSubQueue.TRANSFER_DEAD_LETTER)
    assert full.message_id == "big" and full.dead_letter_reason == \
        "Forwarding to 'small' failed: ServiceBusQuotaExceededError" and "size limit" in full.dead_letter_error_description
    [disabled] = receive_all(client, "to-off", sub_queue=ServiceBusSubQueue.TRANSFER_DEAD_LETTER)
    assert "'off'" in disabled.dead_letter_reason and "Disabled" in disabled.dead_letter_error_description
    assert admin.get_queue_runtime_properties("small").active_message_count == 1


def test_copy_made_before_a_crash_is_released_even_if_the_destination_is_disabled_since(admin, client, ns_path,
                                                                                       monkeypatch):
    admin.create_queue("dest")
    admin.create_queue("src", forward_to="dest")
    client.get_queue_sender("src").send_messages(ServiceBusMessage("once", message_id="once"))

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("the forwarder stops between the copy and the release")

    with monkeypatch.context() as patch:
        patch.setattr(forwarding, "_release", crash)
        with pytest.raises(KeyboardInterrupt):
            forward(ns_path)
    assert stored_messages(admin, "dest")["message_id"].to_pylist() == ["once"]
    dest = admin.get_queue("dest")
    dest.status = "Disabled"
    admin.update_queue(dest)
    assert forward(ns_path).forwarded == {"src": 1}
    counts = admin.get_queue_runtime_properties("src")
    assert (counts.total_message_count, counts.transfer_dead_letter_message_count) == (0, 0)
    assert stored_messages(admin, "dest")["message_id"].to_pylist() == ["once"]


def _forward_forever(path: str, barrier, results) -> None:
    """Spawned forwarder: small batches, until killed."""
    barrier.wait()
    catalog = Catalog(path)
    while True:
        forwarding.forward_all(catalog, batch=25)


@pytest.mark.slow
def test_killed_forwarder_neither_loses_nor_duplicates(admin, client, ns_path, spawn):
    admin.create_queue("dest", enable_partitioning=True)
    admin.create_queue("src", enable_partitioning=True, forward_to="dest")
    sent = [f"m{i}" for i in range(600)]
    client.get_queue_sender("src").send_messages([ServiceBusMessage(b, message_id=b) for b in sent])
    path = normalize(ns_path)
    src = resolve(path, Catalog(path).snapshot(), "src", ("queue",))
    progress, claims = [], []
    for delay in (1.0, 1.5, 2.0):
        barrier, results = spawn.Barrier(2), spawn.Queue()
        process = spawn.Process(target=_forward_forever, args=(path, barrier, results))
        process.start()
        barrier.wait(timeout=120)
        time.sleep(delay)
        os.kill(process.pid, signal.SIGKILL)
        process.join(timeout=30)
        progress.append(stored_messages(admin, "dest").num_rows)
        claims.append(sum(len(found) for found in forwarding._claimed(src, list(range(src.partition_count))).values()))
    assert any(0 < n < len(sent) for n in progress), progress  # killed while forwarding
    print(f"at the kills: {progress} forwarded, {claims} partitions with a claim outstanding")
    forward(ns_path)  # restart: finishes what the killed forwarders claimed
    ids = stored_messages(admin, "dest")["message_id"].to_pylist()
    assert sorted(ids) == sorted(sent)
    counts = admin.get_queue_runtime_properties("src")
    assert (counts.total_message_count, counts.transfer_message_count) == (0, 0)


# ---- as Structured Streaming queries and the namespace service --------------------------------------------

def wait_for(client, queue, count, timeout=90):
    deadline, got = time.monotonic() + timeout, []
    while time.monotonic() < deadline and len(got) < count:
        got += receive_all(client, queue, wait=0.5)
    return got


@pytest.mark.local_only  # Spark queries on az:// run in test_object_store and test_jobs
def test_forward_once_and_a_running_forwarding_query(spark, admin, client, ns_path):
    from sparkbus.streaming import forward_once, start_forwarding

    admin.create_queue("out", enable_partitioning=True)
    admin.create_queue("graves")
    admin.create_queue("in", forward_to="out")
    client.get_queue_sender("in").send_messages([ServiceBusMessage(f"a{i}") for i in range(5)])
    forward_once(spark, ns_path)
    assert sorted(str(m) for m in receive_all(client, "out")) == [f"a{i}" for i in range(5)]
    query = start_forwarding(spark, ns_path, trigger={"processingTime": "200 milliseconds"})
    try:
        admin.create_queue("later", forward_to="out", forward_dead_lettered_messages_to="graves")  # after the start
        client.get_queue_sender("later").send_messages(ServiceBusMessage("b"))
        assert [str(m) for m in wait_for(client, "out", 1)] == ["b"]
        admin.create_queue("tries", forward_dead_lettered_messages_to="graves", max_delivery_count=1)
        client.get_queue_sender("tries").send_messages(ServiceBusMessage("c"))
        with client.get_queue_receiver("tries") as receiver:
            receiver.abandon_message(receiver.receive_messages(1, max_wait_time=1)[0])
            assert receiver.receive_messages(1, max_wait_time=0.2) == []  # now dead-lettered
        [dead] = wait_for(client, "graves", 1)  # no new message: the dead-lettering itself started a batch
        assert (str(dead), dead.dead_letter_source, dead.dead_letter_reason) == ("c", "tries", "MaxDeliveryCountExceeded")
    finally:
        from sparkbus.spark.background import stop_query
        stop_query(query)


@pytest.mark.local_only  # Spark queries on az:// run in test_object_store and test_jobs
def test_serve_handle_runs_fanout_and_forwarding(spark, admin, client, ns_path):
    from sparkbus.streaming import serve

    admin.create_queue("sink", enable_partitioning=True)
    admin.create_topic("t", enable_partitioning=True)
    admin.create_subscription("t", "s", forward_to="sink")
    admin.create_queue("front", forward_to="t")
    service = serve(spark, ns_path, trigger={"processingTime": "200 milliseconds"}, maintenance_interval=1.0)
    try:
        client.get_queue_sender("front").send_messages([ServiceBusMessage(f"m{i}", partition_key=f"k{i}")
                                                        for i in range(20)])
        got = wait_for(client, "sink", 20)
        assert sorted(str(m) for m in got) == sorted(f"m{i}" for i in range(20))
        assert all(m.message_id and m.partition_key == f"k{str(m)[1:]}" for m in got)
        assert service.is_active and any(r.forwarding.moved for r in service.reports)
    finally:
        service.stop()
    assert not service.is_active and not service.query.isActive
    from sparkbus import storage
    persisted = storage.query("SELECT entity, sum(incoming_messages) AS n FROM metrics GROUP BY entity",
                              metrics=storage.open_table(os.path.join(ns_path, "_metrics")))
    assert dict(zip(*persisted.to_pydict().values()))["sink"] == 20  # the service persisted its metrics
    for path in ("front", "t/Subscriptions/s"):
        counts = (admin.get_queue_runtime_properties(path) if "/" not in path
                  else admin.get_subscription_runtime_properties("t", "s"))
        assert counts.transfer_message_count == 0 and counts.total_message_count == 0


@pytest.mark.local_only  # Spark queries on az:// run in test_object_store and test_jobs
def test_cli_forward_once(spark, admin, client, ns_path, capsys):
    from sparkbus.cli import main

    admin.create_queue("to")
    admin.create_queue("from", forward_to="to")
    client.get_queue_sender("from").send_messages(ServiceBusMessage("cli"))
    assert main(["forward", "--namespace", ns_path, "--once"]) == 0
    assert "forwarded everything forwardable: 1 message forwarded, 0 transfer-dead-lettered" in capsys.readouterr().out
    assert [str(m) for m in receive_all(client, "to")] == ["cli"]


@pytest.mark.slow
@pytest.mark.local_only  # signal handling, not storage
def test_sparkbus_serve_subprocess_stops_on_ctrl_c(admin, client, ns_path):
    """SIGINT, what Ctrl-C sends, stops `sparkbus serve` cleanly (tests/test_jobs.py stops serve.py with
    SIGTERM)."""
    import subprocess
    import sys

    admin.create_queue("sink")
    admin.create_topic("t")
    admin.create_subscription("t", "s", forward_to="sink")
    serve = subprocess.Popen([sys.executable, "-m", "sparkbus.cli", "serve", "--namespace", ns_path,
                              "--trigger-ms", "200"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        client.get_topic_sender("t").send_messages(ServiceBusMessage("through", message_id="x1"))
        [got] = wait_for(client, "sink", 1, timeout=180)
        assert (str(got), got.message_id) == ("through", "x1")
    finally:
        serve.send_signal(signal.SIGINT)
        output, _ = serve.communicate(timeout=120)
    assert serve.returncode == 0, output
    assert "forwarded 1 message," in output and "stopped serving namespace" in output


def test_housekeeping_sweep_removes_what_nobody_else_would(admin, client, ns_path):
    from sparkbus.engine import housekeeping

    admin.create_queue("q")
    client.get_queue_sender("q")._send([ServiceBusMessage(b"x") for _ in range(2100)], batch_limit=False)
    with client.get_queue_receiver("q") as receiver:
        for _ in range(3):
            receiver.complete_messages(receiver.receive_messages(700, max_wait_time=1))
    assert stored_messages(admin, "q").num_rows == 2100  # completed, still in the table
    stopped = housekeeping.sweep(Catalog(normalize(ns_path)), stopping=lambda: True)  # a stop came first
    assert (stopped.removed, stopped.tables, stored_messages(admin, "q").num_rows) == (0, 0, 2100)
    done = housekeeping.sweep(Catalog(normalize(ns_path)))
    assert done.removed == 2099 and done.tables == 3  # the highest row keeps the sequence numbering
    assert stored_messages(admin, "q").num_rows == 1
    assert admin.get_queue_runtime_properties("q").total_message_count == 0
