"""Shared fixtures: namespaces on real disk, one SparkSession per test run, spawned subprocess helpers."""
from __future__ import annotations

import multiprocessing
import os
import sys

import pytest

import sparkbus

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


@pytest.fixture
def ns_path(tmp_path):
    return str(tmp_path / "ns")


@pytest.fixture
def admin(ns_path):
    """A standard-tier namespace with seed quotas and credit throttling off: tests of other behaviour
    send bulk data and must not wait for credits (tests/test_throttling.py covers the default budget)."""
    sparkbus.create_namespace(ns_path, credits_per_second=None)
    return sparkbus.ServiceBusAdministrationClient(ns_path)


@pytest.fixture(scope="session")
def spark():
    """The one SparkSession of the test run (UI off, two local cores)."""
    from sparkbus.spark import get_spark

    session = get_spark("sparkbus-tests", master="local[2]",
                        settings={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"})
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spawn():
    """A 'spawn' multiprocessing context: forking after deltalake started its runtime hangs."""
    return multiprocessing.get_context("spawn")


def stored_messages(admin, entity_path: str):
    """Every row of an entity's messages table, ordered by sequence number (read through delta-rs)."""
    from sparkbus import storage

    table = storage.open_table(admin.get_entity_tables(entity_path)["messages"])
    return storage.query("SELECT * FROM messages ORDER BY sequence_number", messages=table)


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
    outcomes = [results.get(timeout=timeout) for _ in procs]
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
