"""Topic delivery, forwarding, the namespace service, DataFrames and the streaming source and sink over Spark
Connect, the way Databricks serverless and shared compute (and Databricks Connect) run PySpark code: the
client holds a remote session and functions handed to Spark run in a Python process of the server.

The server is the one the installed pyspark ships (org.apache.spark.sql.connect.service.SparkConnectServer,
through spark-submit), started for this module on a free loopback port and stopped by its process id.
"""
from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import _free_port, listening

import sparkbus
from sparkbus import ServiceBusClient, ServiceBusMessage

pytestmark = pytest.mark.slow
SPARK_SUBMIT = os.path.join(os.path.dirname(sys.executable), "spark-submit")


# The client runs in a process of its own, as a notebook on Databricks would: a process that holds a classic
# SparkSession (this one does: the suite's) cannot open a remote one.
CLIENT = """
import sys
from pyspark.sql import SparkSession
from sparkbus import streaming
from sparkbus.spark.background import is_connect

port, path, step = sys.argv[1:4]
spark = SparkSession.builder.remote(f"sc://127.0.0.1:{port}").getOrCreate()
assert is_connect(spark)
if step == "once":
    streaming.fanout_once(spark, path)
    print("fanned out", flush=True)
    sys.stdin.readline()  # the test checks the subscription, then lets forwarding run
    streaming.forward_once(spark, path)
elif step == "serve":
    service = streaming.serve(spark, path, trigger={"processingTime": "200 milliseconds"})
    print("serving", flush=True)
    sys.stdin.readline()  # the test sends, receives, then says stop
    service.stop()
elif step == "dataframes":
    import tempfile
    from sparkbus import ServiceBusClient
    client = ServiceBusClient(path, spark=spark)
    frame = spark.createDataFrame([(f"d{i}", "s") for i in range(4)], "body string, subject string")
    print("sent", client.get_queue_sender("archive").send_dataframe(frame).message_count, flush=True)
    snapshot = spark.read.format("sparkbus").option("namespace", path).option("entity", "archive").load()
    print("rows", snapshot.where("subject = 's'").count(), flush=True)
    with client.get_queue_receiver("archive") as receiver:
        locked = receiver.receive_dataframe(2, max_wait_time=5)
        print("completed", receiver.complete_dataframe(locked), flush=True)
    query = (spark.readStream.format("sparkbus").option("namespace", path).option("entity", "archive").load()
             .selectExpr("body", "'copy' AS subject")
             .writeStream.format("sparkbus").option("namespace", path).option("entity", "copies")
             .option("checkpointLocation", tempfile.mkdtemp()).trigger(availableNow=True).start())
    query.awaitTermination()
    print("streamed", flush=True)
elif step == "bad start":
    try:
        streaming.start_fanout(spark, path, "orders", trigger={"every": "1 second"})
    except TypeError:
        print("TypeError", flush=True)
spark.stop()
print("done", flush=True)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The port of a Spark Connect server of its own (local[2], UI off), on loopback."""
    port = _free_port()
    log = tmp_path_factory.mktemp("connect") / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [SPARK_SUBMIT, "--class", "org.apache.spark.sql.connect.service.SparkConnectServer", "--master", "local[2]",
             "--conf", "spark.ui.enabled=false", "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
             "--conf", f"spark.connect.grpc.binding.port={port}", "--name", "sparkbus-tests-connect"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        if not listening(port, process, 120):
            pytest.fail(f"the Spark Connect server did not start: {log.read_text()[-2000:]}")
        yield port
    finally:
        os.killpg(process.pid, signal.SIGTERM)  # the JVM and the Python workers it started
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


def client(port: int, path: str, step: str, temp: os.PathLike[str]) -> subprocess.Popen:
    """The Connect client running `step`, its temporary files (the queries' checkpoints among them) in temp:
    another test's queries, on the other worker, make theirs elsewhere."""
    return subprocess.Popen([sys.executable, "-c", CLIENT, str(port), path, step], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(temp)})


def said(process: subprocess.Popen, line: str) -> None:
    """Wait for the client's next line, which must be `line` (else its error output fails the test)."""
    got = process.stdout.readline().strip()
    if got != line:
        process.kill()
        pytest.fail(f"the Connect client said {got!r}, not {line!r}: {process.stderr.read()[-3000:]}")


def finish(process: subprocess.Popen) -> None:
    process.stdin.write("\n")
    process.stdin.flush()
    said(process, "done")
    assert process.wait(60) == 0, process.stderr.read()[-3000:]


def queries_left(temp: os.PathLike[str]) -> set[str]:
    """The query checkpoints left in a client's temporary directory."""
    return set(glob.glob(os.path.join(temp, "sparkbus-query-*")))


def received(path: str, *entity: str, count: int) -> list[str]:
    """Bodies of up to count messages received and completed from a queue or subscription."""
    bodies: list[str] = []
    with ServiceBusClient(path).get_subscription_receiver(*entity) if len(entity) == 2 else \
            ServiceBusClient(path).get_queue_receiver(entity[0]) as receiver:
        deadline = time.monotonic() + 60
        while len(bodies) < count and time.monotonic() < deadline:
            got = receiver.receive_messages(count - len(bodies), max_wait_time=1)
            receiver.complete_messages(got)
            bodies += [str(m) for m in got]
    return sorted(bodies)


@pytest.fixture
def namespace(tmp_path) -> str:
    """A namespace with topic orders (subscription all; subscription kept, forwarding to queue archive) and
    queue copies."""
    path = str(tmp_path / "ns")
    sparkbus.create_namespace(path, credits_per_second=None)
    admin = sparkbus.ServiceBusAdministrationClient(path)
    admin.create_queue("archive")
    admin.create_topic("orders")
    admin.create_subscription("orders", "all")
    admin.create_subscription("orders", "kept", forward_to="archive")
    admin.create_queue("copies")
    return path


def test_fan_out_forwarding_and_the_service_run_over_spark_connect(server, namespace, tmp_path):
    sender = ServiceBusClient(namespace).get_topic_sender("orders")
    sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(5)])

    once = client(server, namespace, "once", tmp_path)
    said(once, "fanned out")
    assert received(namespace, "orders", "all", count=5) == [f"m{i}" for i in range(5)]
    finish(once)
    assert received(namespace, "archive", count=5) == [f"m{i}" for i in range(5)]

    serving = client(server, namespace, "serve", tmp_path)
    said(serving, "serving")
    sender.send_messages([ServiceBusMessage(f"n{i}") for i in range(3)])
    assert received(namespace, "archive", count=3) == ["n0", "n1", "n2"]
    assert received(namespace, "orders", "all", count=3) == ["n0", "n1", "n2"]
    finish(serving)
    assert queries_left(tmp_path) == set()  # each query's checkpoint went with it
    admin = sparkbus.ServiceBusAdministrationClient(namespace)
    assert admin.get_queue_runtime_properties("archive").total_message_count == 0
    assert admin.get_topic_awaiting_fanout("orders") == 0


def test_a_start_that_fails_leaves_no_checkpoint_behind(server, namespace, tmp_path):
    failing = client(server, namespace, "bad start", tmp_path)
    said(failing, "TypeError")
    said(failing, "done")
    assert failing.wait(60) == 0
    assert queries_left(tmp_path) == set()


def test_dataframes_and_the_streaming_source_and_sink_run_over_spark_connect(server, namespace, tmp_path):
    """send_dataframe, spark.read and SQL over the messages, receive_dataframe and complete_dataframe, and a
    readStream -> writeStream query from queue to queue, all from a remote session."""
    remote = client(server, namespace, "dataframes", tmp_path)
    for line in ("sent 4", "rows 4", "completed 2", "streamed", "done"):
        said(remote, line)
    assert remote.wait(60) == 0, remote.stderr.read()[-3000:]
    admin = sparkbus.ServiceBusAdministrationClient(namespace)
    assert admin.get_queue_runtime_properties("archive").active_message_count == 2
    with ServiceBusClient(namespace).get_queue_receiver("copies") as receiver:
        copies = receiver.receive_messages(10, max_wait_time=5)
    assert sorted(str(m) for m in copies) == ["d2", "d3"] and {m.subject for m in copies} == {"copy"}
