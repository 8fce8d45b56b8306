"""Races between spawned processes on one namespace catalog."""
from __future__ import annotations


import pytest
from conftest import run_spawned

from sparkbus import ServiceBusAdministrationClient, create_namespace
from sparkbus.storage import location


def entity_dirs(ns_path: str) -> set[str]:
    """The entity directories stored in the namespace (local or object store)."""
    root = location.join(location.normalize(ns_path), "entities")
    return {uri[len(root) + 1:].split("/")[0] for uri in location.listing(root)}


def _create_queue(path, name, barrier, results):
    import sparkbus

    admin = sparkbus.ServiceBusAdministrationClient(path)
    barrier.wait()
    try:
        admin.create_queue(name, enable_partitioning=True)
        results.put("created")
    except sparkbus.MessagingEntityAlreadyExistsError:
        results.put("exists")


def _create_many(path, prefix, count, barrier, results):
    import sparkbus

    admin = sparkbus.ServiceBusAdministrationClient(path)
    barrier.wait()
    outcomes = []
    for i in range(count):
        try:
            admin.create_queue(f"{prefix}{i}", enable_partitioning=True)
            outcomes.append("created")
        except sparkbus.ServiceBusQuotaExceededError:
            outcomes.append("quota")
    results.put(outcomes)


@pytest.mark.slow
def test_concurrent_create_exactly_one_wins(spawn, ns_path):
    create_namespace(ns_path)
    for round_ in range(3):
        outcomes = run_spawned(spawn, _create_queue, [(ns_path, f"race{round_}")] * 2)
        assert sorted(outcomes) == ["created", "exists"]
    admin = ServiceBusAdministrationClient(ns_path)
    assert [q.name for q in admin.list_queues()] == ["race0", "race1", "race2"]
    assert set(admin.get_entity_tables("race0")) == {"messages", "locks", "sessions"}
    assert len(entity_dirs(ns_path)) == 3  # the losers removed their tables


@pytest.mark.slow
def test_concurrent_creates_respect_the_quota(spawn, ns_path):
    create_namespace(ns_path, max_partitioned_entities=5)
    outcomes = run_spawned(spawn, _create_many, [(ns_path, "a", 4), (ns_path, "b", 4)])
    flat = [o for per_process in outcomes for o in per_process]
    assert flat.count("created") == 5 and flat.count("quota") == 3
    assert len(ServiceBusAdministrationClient(ns_path).list_queues()) == 5
    assert len(entity_dirs(ns_path)) == 5


def _append_and_compact(uri, worker, barrier, results):
    import pyarrow as pa
    from deltalake import write_deltalake

    from sparkbus.storage import maintenance

    barrier.wait()
    compacted = 0
    for round_ in range(6):
        for i in range(4):
            row = pa.table({"partition_id": pa.array([0], pa.int32()), "n": [worker * 1000 + round_ * 10 + i]})
            write_deltalake(uri, row, mode="append")
        compacted += maintenance.compact(uri)
    results.put(compacted)


@pytest.mark.slow
def test_concurrent_compactions_never_duplicate_rows(spawn, tmp_path):
    """delta-rs lets two compactions of the same files both commit; sparkbus's maintenance lets only one
    process compact a table at a time, so rows are never doubled."""
    import pyarrow as pa
    from deltalake import DeltaTable

    from sparkbus import storage

    uri = str(tmp_path / "entity" / "messages")
    DeltaTable.create(uri, schema=pa.schema([("partition_id", pa.int32()), ("n", pa.int64())]),
                      partition_by=["partition_id"])
    compacted = run_spawned(spawn, _append_and_compact, [(uri, w) for w in range(3)])
    assert sum(compacted) > 0
    rows = storage.query("SELECT n FROM t ORDER BY n", t=storage.open_table(uri))["n"].to_pylist()
    assert rows == sorted(w * 1000 + r * 10 + i for w in range(3) for r in range(6) for i in range(4))
