"""The jobs in jobs/, run end to end as a user runs them: `sparkbus submit JOB`, from a fresh shell; on a
Spark standalone cluster (a master and a worker on loopback, executors in their own JVMs) where the job
has Spark do its work."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import sparkbus
from sparkbus import ServiceBusMessage

from conftest import wait_until

pytestmark = pytest.mark.slow
JOBS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jobs")
SPARKBUS = os.path.join(os.path.dirname(sys.executable), "sparkbus")
# What a shell without the virtualenv activated lacks: `sparkbus submit` finds pyspark, its Python and the
# packaged Spark configuration on its own.
SET_UP_BY_HAND = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_CONF_DIR", "SPARK_HOME", "VIRTUAL_ENV")


def fresh_shell(env: dict | None = None, master: str = "local[2]") -> dict:
    """The environment of a fresh shell: none of SET_UP_BY_HAND, the virtualenv's bin/ not on PATH; for the
    loopback cluster, SPARK_LOCAL_IP (as its user would set it: the driver must bind where the cluster is)."""
    env = {k: v for k, v in (os.environ if env is None else env).items() if k not in SET_UP_BY_HAND}
    venv_bin = os.path.dirname(sys.executable)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    if master.startswith("spark://127.0.0.1:"):
        env["SPARK_LOCAL_IP"] = "127.0.0.1"
    return env


def job_command(job: str, *args: str, master: str = "local[2]") -> list[str]:
    """`sparkbus submit JOB ARGS` on master; a cluster's executors start with the JVM options of the suite's
    other JVMs (conftest's SPARK_SUBMIT_OPTS: the client compiler and the serial collector)."""
    return [SPARKBUS, "submit", "--master", master, "--conf", "spark.ui.enabled=false",
            "--conf", "spark.executor.memory=1g",
            "--conf", f"spark.executor.extraJavaOptions={os.environ['SPARK_SUBMIT_OPTS']}",
            os.path.join(JOBS, job) if job.endswith(".py") else job, *args]


def submit(job: str, *args: str, timeout: float = 300, env: dict | None = None,
           master: str = "local[2]") -> subprocess.CompletedProcess:
    """A job run as the documentation says, from a fresh shell in an empty directory; Spark logs nothing
    at INFO and no warnings (but the JVM's own notice about its incubator modules)."""
    cwd = tempfile.mkdtemp(prefix="sparkbus-job-")
    try:
        done = subprocess.run(job_command(job, *args, master=master), capture_output=True, text=True,
                              timeout=timeout, env=fresh_shell(env, master), cwd=cwd)
    finally:
        shutil.rmtree(cwd, ignore_errors=True)
    noise = [line for line in done.stderr.splitlines() if re.match(r"^\S+ \S+ (INFO|WARN) ", line)]
    assert not noise, "Spark logged:\n" + "\n".join(noise[:20])
    return done


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A Spark standalone cluster on loopback, from the installed pyspark: a master and a worker (2 cores),
    whose executors run in JVMs of their own; yields the master's URL. Stopped by process group."""
    import pyspark
    from conftest import _free_port, listening

    home, work = os.path.dirname(pyspark.__file__), tmp_path_factory.mktemp("standalone")
    # the daemons start with the client compiler and the serial collector, as the suite's other JVMs (conftest)
    env = {**os.environ, "SPARK_HOME": home, "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_DAEMON_JAVA_OPTS": os.environ.get("SPARK_DAEMON_JAVA_OPTS", os.environ["SPARK_SUBMIT_OPTS"])}
    port, ui = _free_port(), _free_port()
    master = [os.path.join(home, "bin", "spark-class"), "org.apache.spark.deploy.master.Master", "--host",
              "127.0.0.1", "--port", str(port), "--webui-port", str(ui)]
    worker = [os.path.join(home, "bin", "spark-class"), "org.apache.spark.deploy.worker.Worker",
              f"spark://127.0.0.1:{port}", "--host", "127.0.0.1", "--cores", "2", "--memory", "2g",
              "--webui-port", str(_free_port()), "--work-dir", str(work / "work")]
    started = []
    try:
        for name, command in (("master", master), ("worker", worker)):
            with open(work / f"{name}.log", "wb") as log:
                started.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                                start_new_session=True))
            if name == "master" and not listening(port, started[0], 120):
                pytest.fail(f"the master did not start: {(work / 'master.log').read_text()[-2000:]}")
        # the worker registers with the master (its UI's JSON says so; the logs need not: SPARK_CONF_DIR may
        # set warnings only)
        wait_until(lambda: _alive_workers(ui) >= 1 or started[1].poll() is not None, 120, every=0.2)
        if _alive_workers(ui) < 1:
            pytest.fail(f"the worker did not register: {(work / 'worker.log').read_text()[-2000:]}")
        yield f"spark://127.0.0.1:{port}"
    finally:
        for process in reversed(started):
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)


def _alive_workers(ui_port: int) -> int:
    """The workers registered with the standalone master whose web UI listens on ui_port (0 while it starts:
    refused connections, and an empty or partial page while the UI comes up)."""
    import json
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as answer:
            return int(json.load(answer).get("aliveworkers", 0))
    except (OSError, ValueError):
        return 0


ON_THE_CLUSTER = """
import sys, tempfile
from sparkbus import ServiceBusClient, streaming
from sparkbus.spark import get_spark

path = sys.argv[1]
spark = get_spark("sparkbus-cluster-test")
assert spark.sparkContext.master.startswith("spark://"), spark.sparkContext.master
client = ServiceBusClient(path, spark=spark)
rows = spark.range(30).selectExpr("CONCAT('r', CAST(id AS STRING)) AS body", "CAST(id % 4 AS STRING) AS partition_key")
print("sent", client.get_queue_sender("rows").send_dataframe(rows.repartition(3)).message_count)
with client.get_queue_receiver("rows") as receiver:
    locked = receiver.receive_dataframe(10, max_wait_time=5)
    print("completed", receiver.complete_dataframe(locked))
query = (spark.readStream.format("sparkbus").option("namespace", path).option("entity", "rows").load()
         .selectExpr("body", "'copy' AS subject")
         .writeStream.format("sparkbus").option("namespace", path).option("entity", "events")
         .option("checkpointLocation", tempfile.mkdtemp()).trigger(availableNow=True).start())
query.awaitTermination()
print("streamed", spark.read.format("sparkbus").option("namespace", path).option("entity", "events").load().count())
print("fanned out", streaming.fanout_once(spark, path).copies)
print("forwarded", sum(streaming.forward_once(spark, path).forwarded.values()))
import time
from sparkbus import ServiceBusAdministrationClient, ServiceBusMessage
service = streaming.serve(spark, path, trigger={"processingTime": "200 milliseconds"})
client.get_topic_sender("events").send_messages([ServiceBusMessage(f"live {i}") for i in range(5)])
admin, deadline = ServiceBusAdministrationClient(path), time.monotonic() + 90
while admin.get_queue_runtime_properties("archive").active_message_count < 25 and time.monotonic() < deadline:
    time.sleep(0.2)
service.stop()
print("served", admin.get_queue_runtime_properties("archive").active_message_count - 20)
"""


def test_send_batch_and_maintain_through_spark_submit(tmp_path):
    ns = str(tmp_path / "ns")
    sparkbus.create_namespace(ns, credits_per_second=None)
    admin = sparkbus.ServiceBusAdministrationClient(ns)
    admin.create_queue("rows", enable_partitioning=True)
    data = str(tmp_path / "orders.parquet")
    pq.write_table(pa.table({"order": list(range(1000)), "subject": [f"s{i % 3}" for i in range(1000)]}), data)
    done = submit("send_batch.py", "--namespace", ns, "--entity", "rows", "--input", data, "--batch-rows", "400",
                  "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"sent": 1000}

    client = sparkbus.ServiceBusClient(ns)
    with client.get_queue_receiver("rows", receive_mode="receiveanddelete") as receiver:
        got = []
        while batch := receiver.receive_messages(1000, max_wait_time=1):
            got += batch
    assert sorted(json.loads(str(m))["order"] for m in got) == list(range(1000))
    assert all(m.subject == f"s{json.loads(str(m))['order'] % 3}" for m in got)

    bad = submit("send_batch.py", "--namespace", ns, "--entity", "rows", "--input", data, "--body-column", "nope")
    assert bad.returncode == 1 and "the dataset has no column(s) ['nope']" in bad.stdout, bad.stdout[-2000:]  # spark-submit: Python's stderr comes out on stdout
    swept = submit("maintain.py", "--namespace", ns, "--json")
    assert swept.returncode == 0, swept.stderr[-3000:]
    assert json.loads(swept.stdout.strip().splitlines()[-1]) == {"tables": 3, "removed": 0}


def test_fanout_forward_and_serve_through_spark_submit(tmp_path):
    ns = str(tmp_path / "ns")
    sparkbus.create_namespace(ns, credits_per_second=None)
    admin = sparkbus.ServiceBusAdministrationClient(ns)
    admin.create_queue("archive")
    admin.create_topic("events")
    admin.create_subscription("events", "all", forward_to="archive")
    client = sparkbus.ServiceBusClient(ns)
    with client.get_topic_sender("events") as sender:
        sender.send_messages([ServiceBusMessage(f"e{i}") for i in range(5)])
    # the service delivers these five and one sent while it runs (fanout.py --once runs in the Azurite test, fan-out
    # and forwarding once on the cluster)
    service = subprocess.Popen(job_command("serve.py", "--namespace", ns, "--trigger-ms", "200"),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=fresh_shell(),
                               start_new_session=True)
    try:
        with client.get_topic_sender("events") as sender:
            sender.send_messages(ServiceBusMessage("live"))
        forwarded = wait_until(lambda: service.poll() is not None or
                               admin.get_queue_runtime_properties("archive").active_message_count >= 6, 180, every=0.5)
        assert forwarded and service.poll() is None, "the service did not forward in time"
        # SIGTERM to the Python driver (spark-submit's child) stops the service cleanly; spark-submit, and
        # `sparkbus submit` with it, then exit with the driver's exit code
        # (the driver is the child running our Python: a child the JVM has forked and not yet exec'd to start
        # a worker still shows the JVM's own command line, serve.py included)
        driver = [pid for pid in _descendants(service.pid)
                  if _cmdline(pid).startswith(sys.executable + " ") and "serve.py" in _cmdline(pid)]
        assert len(driver) == 1, driver
        os.kill(driver[0], signal.SIGTERM)
        output, _ = service.communicate(timeout=120)
    finally:
        if service.poll() is None:
            os.killpg(service.pid, signal.SIGKILL)
    assert service.returncode == 0, output[-3000:]
    assert "stopped" in output.lower()


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _descendants(pid: int) -> list[int]:
    """Process ids below pid: its children, theirs, ... (from /proc)."""
    children = _children(pid)
    return children + [d for child in children for d in _descendants(child)]


def _children(pid: int) -> list[int]:
    """Process ids whose parent is pid (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    if int(stat.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return found


def test_cli_and_jobs_reach_an_azurite_namespace_through_storage_options_alone(azurite, tmp_path):
    """No credential in the environment (only the emulator's address): every command gets the account
    from --storage-option, and the Spark jobs ship it to their executors."""
    ns = f"{azurite}/{uuid.uuid4().hex[:12]}/ns"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AZURE_STORAGE_")}
    options = ["--storage-option", "use_emulator=true", "--storage-option",
               f"account_name={os.environ['AZURE_STORAGE_ACCOUNT_NAME']}",
               "--storage-option", f"account_key={os.environ['AZURE_STORAGE_ACCOUNT_KEY']}"]

    def cli(*args: str, with_options: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "sparkbus.cli", *args, "--namespace", ns,
                               *(options if with_options else [])], capture_output=True, text=True, env=env,
                              timeout=120)

    for command in (["namespace", "create", "--credits-per-second", "off"], ["topic", "create", "events"],
                    ["subscription", "create", "all", "--topic", "events"]):
        done = cli(*command)
        assert done.returncode == 0, done.stderr[-2000:]
    refused = cli("topic", "list", with_options=False)
    assert refused.returncode == 1 and refused.stderr.startswith("sparkbus: "), refused.stderr[-2000:]
    data = str(tmp_path / "rows.parquet")
    pq.write_table(pa.table({"n": list(range(300))}), data)
    sent = submit("send_batch.py", "--namespace", ns, "--entity", "events", "--input", data, "--json", *options,
                  env=env)
    assert sent.returncode == 0, sent.stdout[-3000:]
    assert json.loads(sent.stdout.strip().splitlines()[-1]) == {"sent": 300}
    fanned = submit("fanout.py", "--namespace", ns, "--once", *options, env=env)
    assert fanned.returncode == 0, fanned.stdout[-3000:]
    with sparkbus.ServiceBusClient(ns).get_subscription_receiver("events", "all",
                                                                  receive_mode="receiveanddelete") as receiver:
        got = []
        while batch := receiver.receive_messages(300, max_wait_time=2):
            got += batch
    assert sorted(json.loads(str(m))["n"] for m in got) == list(range(300))


def test_dataframes_streams_fanout_and_forwarding_on_a_standalone_cluster(tmp_path, cluster):
    """One job whose tasks run in the cluster's executors: send_dataframe of a DataFrame in 3 partitions,
    receive_dataframe / complete_dataframe, a readStream -> writeStream query from a queue to a topic,
    then fan-out to a subscription that forwards to a queue, once and then by the namespace service."""
    ns = str(tmp_path / "ns")
    sparkbus.create_namespace(ns, credits_per_second=None)
    admin = sparkbus.ServiceBusAdministrationClient(ns)
    admin.create_queue("rows", enable_partitioning=True)
    admin.create_queue("archive")
    admin.create_topic("events")
    admin.create_subscription("events", "all", forward_to="archive")
    script = tmp_path / "on_the_cluster.py"
    script.write_text(ON_THE_CLUSTER)
    done = submit(str(script), ns, master=cluster)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-6:] == ["sent 30", "completed 10", "streamed 20",
                                             "fanned out {'events/Subscriptions/all': 20}", "forwarded 20",
                                             "served 5"], done.stdout[-2000:]
    with sparkbus.ServiceBusClient(ns).get_queue_receiver("archive") as receiver:
        got = receiver.receive_messages(50, max_wait_time=5)
    assert len(got) == 25 and sorted(str(m) for m in got if m.subject != "copy") == [f"live {i}" for i in range(5)]


WITHOUT_PACKAGES = """
import sys
from pyspark.sql import SparkSession
import sparkbus
from sparkbus import ServiceBusClient
from sparkbus.spark import WorkerPythonError

ns = sys.argv[1]
sparkbus.create_namespace(ns)
sparkbus.ServiceBusAdministrationClient(ns).create_queue("q")
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
try:
    ServiceBusClient(ns).get_queue_sender("q").send_dataframe(spark.createDataFrame([("a",)], "body string"))
except WorkerPythonError as error:
    print(error)
print("stored", sparkbus.ServiceBusAdministrationClient(ns).get_queue_runtime_properties("q").total_message_count)
"""


def test_workers_without_sparkbus_are_explained_with_pyspark_python(tmp_path):
    """A script's own SparkSession whose Python workers run an interpreter without sparkbus's packages (as
    when a virtualenv's python runs a script without the virtualenv activated): send_dataframe raises
    WorkerPythonError naming the workers' Python and the PYSPARK_PYTHON to set, not a JVM traceback, and
    nothing is sent."""
    bare = tmp_path / "python-without-site-packages"
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    bare.chmod(0o755)
    script = tmp_path / "job.py"
    script.write_text(WITHOUT_PACKAGES)
    env = {**fresh_shell(), "PYSPARK_PYTHON": str(bare)}
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "ns")], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    said, stored = done.stdout.splitlines()
    # the first module the workers lack: sparkbus, or one it imports when the checkout is on PYTHONPATH
    assert re.fullmatch(
        rf"Spark's Python workers could not import '(sparkbus|azure|pyarrow|numpy)': they run {re.escape(str(bare))}, "
        rf"not this interpreter \({re.escape(sys.executable)}\), and it lacks sparkbus's packages\. Set "
        rf"PYSPARK_PYTHON={re.escape(sys.executable)} before the SparkSession starts \(activating the virtualenv does "
        r"it too; sparkbus\.spark\.get_spark sets it\)", said), said
    assert stored == "stored 0"
