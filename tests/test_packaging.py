"""The wheel installs and works without the checkout: built as `make dist` builds it, installed with its spark
extra into a fresh virtual environment, and run from an empty directory (a queue's send, receive and complete,
a topic's fan-out through Spark, and `.format("sparkbus")` found without registration)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HELLO = textwrap.dedent('''
    import sparkbus
    from sparkbus import ServiceBusAdministrationClient, ServiceBusClient, ServiceBusMessage, streaming
    from sparkbus.spark import get_spark

    assert "site-packages" in sparkbus.__file__, sparkbus.__file__
    sparkbus.create_namespace("ns")
    admin = ServiceBusAdministrationClient("ns")
    admin.create_queue("orders")
    admin.create_topic("events")
    admin.create_subscription("events", "all")
    with ServiceBusClient("ns") as client:
        client.get_queue_sender("orders").send_messages(ServiceBusMessage("hello"))
        with client.get_queue_receiver("orders", max_wait_time=5) as receiver:
            for message in receiver.receive_messages():
                print("queue:", message)
                receiver.complete_message(message)
        client.get_topic_sender("events").send_messages(ServiceBusMessage("to every subscription"))
        spark = get_spark("hello", master="local[1]", settings={"spark.ui.enabled": "false"})
        spark.sparkContext.setLogLevel("ERROR")
        streaming.fanout_once(spark, "ns")  # what delivers topic messages to subscriptions
        with client.get_subscription_receiver("events", "all", max_wait_time=5) as receiver:
            for message in receiver.receive_messages():
                print("subscription:", message)
                receiver.complete_message(message)
        client.get_queue_sender("orders").send_messages(ServiceBusMessage("kept"))
        print("rows:", spark.read.format("sparkbus").option("namespace", "ns").option("entity", "orders").load().count())
        spark.stop()
''')


def test_the_built_wheel_installs_with_its_spark_extra_and_runs_from_an_empty_directory(tmp_path):
    dist, venv, work = tmp_path / "dist", tmp_path / "venv", tmp_path / "work"
    work.mkdir()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(dist), REPO],
                   check=True, capture_output=True)
    wheels = list(dist.glob("sparkbus-*.whl"))
    assert len(wheels) == 1, wheels
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "--quiet", f"{wheels[0]}[spark]"], check=True, capture_output=True)
    (work / "hello.py").write_text(HELLO)
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPARK_CONF_DIR")}
    environment.update(PYSPARK_PYTHON=python, PYSPARK_DRIVER_PYTHON=python, PATH=f"{venv / 'bin'}:{os.environ['PATH']}")
    done = subprocess.run([python, "hello.py"], cwd=work, env=environment, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["queue: hello", "subscription: to every subscription", "rows: 1"], done.stdout
    cli = subprocess.run([str(venv / "bin" / "sparkbus"), "show", "--namespace", "ns"], cwd=work, env=environment,
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0 and "orders" in cli.stdout, cli.stderr[-2000:]
