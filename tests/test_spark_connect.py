"""Topic delivery, forwarding and the namespace service over Spark Connect, the way Databricks serverless and
shared compute (and Databricks Connect) run PySpark code: the client holds a remote session and functions
handed to Spark run in a Python process of the server.

The server is the one the installed pyspark ships (org.apache.spark.sql.connect.service.SparkConnectServer,
through spark-submit), started for this module on a free loopback port and stopped by its process id.
"""
from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest
from conftest import _free_port, listening

import sparkbus
from sparkbus import ServiceBusClient, ServiceBusMessage, streaming

pytestmark = pytest.mark.slow
SPARK_SUBMIT = os.path.join(os.path.dirname(sys.executable), "spark-submit")
CONNECT_MODE = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")  # what a remote session sets


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    """A Spark Connect session on a server of its own (local[2], UI off)."""
    port = _free_port()
    log = tmp_path_factory.mktemp("connect") / "server.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [SPARK_SUBMIT, "--class", "org.apache.spark.sql.connect.service.SparkConnectServer", "--master", "local[2]",
             "--conf", "spark.ui.enabled=false", "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
             "--conf", f"spark.connect.grpc.binding.port={port}", "--name", "sparkbus-tests-connect"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        if not listening(port, server, 120):
            pytest.fail(f"the Spark Connect server did not start: {log.read_text()[-2000:]}")
        from pyspark.sql import SparkSession

        before = {name: os.environ.get(name) for name in CONNECT_MODE}
        session = SparkSession.builder.remote(f"sc://127.0.0.1:{port}").getOrCreate()
        yield session
        session.stop()
        for name, value in before.items():  # else the classic builder of later tests looks for a server
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the JVM and the Python workers it started
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)


def queries_left() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "sparkbus-query-*")))


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


def test_fan_out_forwarding_and_the_service_run_over_spark_connect(remote, tmp_path):
    from sparkbus.spark.background import is_connect

    assert is_connect(remote)
    path = str(tmp_path / "ns")
    sparkbus.create_namespace(path, credits_per_second=None)
    admin = sparkbus.ServiceBusAdministrationClient(path)
    admin.create_queue("archive")
    admin.create_topic("orders")
    admin.create_subscription("orders", "all")
    admin.create_subscription("orders", "kept", forward_to="archive")
    sender = ServiceBusClient(path).get_topic_sender("orders")
    sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(5)])
    before = queries_left()

    streaming.fanout_once(remote, path)
    assert received(path, "orders", "all", count=5) == [f"m{i}" for i in range(5)]
    streaming.forward_once(remote, path)
    assert received(path, "archive", count=5) == [f"m{i}" for i in range(5)]

    service = streaming.serve(remote, path, trigger={"processingTime": "200 milliseconds"})
    try:
        sender.send_messages([ServiceBusMessage(f"n{i}") for i in range(3)])
        assert received(path, "archive", count=3) == ["n0", "n1", "n2"]
        assert received(path, "orders", "all", count=3) == ["n0", "n1", "n2"]
    finally:
        service.stop()
    assert queries_left() == before  # each query's checkpoint went with it
    counts = admin.get_queue_runtime_properties("archive")
    assert counts.total_message_count == 0


def test_a_start_that_fails_leaves_no_checkpoint_behind(remote, tmp_path):
    path = str(tmp_path / "ns")
    sparkbus.create_namespace(path, credits_per_second=None)
    sparkbus.ServiceBusAdministrationClient(path).create_topic("t")
    before = queries_left()
    with pytest.raises(TypeError):
        streaming.start_fanout(remote, path, "t", trigger={"every": "1 second"})
    assert queries_left() == before
