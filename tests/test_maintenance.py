"""Maintenance: compaction as one direct commit over every partition, concurrent compactions never doubling a
row, and the background thread taking jobs in the order first asked."""
from __future__ import annotations

import json
import os
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import run_spawned, stored_messages
from deltalake import DeltaTable, PostCommitHookProperties, write_deltalake

from sparkbus import ServiceBusMessage, storage
from sparkbus.storage import maintenance


def _entry(uri: str, version: int) -> list[dict]:
    with open(os.path.join(uri, "_delta_log", f"{version:020d}.json")) as handle:
        return [json.loads(line) for line in handle]


def _last_checkpoint(uri: str) -> int:
    with open(os.path.join(uri, "_delta_log", "_last_checkpoint")) as handle:
        return json.load(handle)["version"]


def test_a_compaction_merges_every_partition_in_one_commit_that_changes_no_row(admin, client):
    admin.create_queue("q", enable_partitioning=True)
    keys = [f"k{i}" for i in range(4)]
    with client.get_queue_sender("q") as sender:
        for i in range(maintenance.COMPACT_EVERY - 4):  # below the version that asks for a compaction
            sender.send_messages([ServiceBusMessage(f"m{i}-{k}", partition_key=k) for k in keys])
    assert maintenance.wait_idle(60)
    uri = admin.get_entity_tables("q")["messages"]
    before = storage.open_table(uri)
    rows_before = stored_messages(admin, "q").sort_by("sequence_number")
    partitions = set(rows_before["partition_id"].to_pylist())
    assert len(before.file_uris()) > len(partitions)
    assert maintenance.compact(uri)
    after = storage.open_table(uri)
    assert after.version() == before.version() + 1  # one commit for every partition
    actions = _entry(uri, after.version())
    assert next(a["commitInfo"]["operation"] for a in actions if "commitInfo" in a) == "OPTIMIZE"
    changes = [a.get("add") or a.get("remove") for a in actions if "add" in a or "remove" in a]
    assert changes and not any(change["dataChange"] for change in changes)  # streams skip a rewrite
    assert len(after.file_uris()) == len(partitions)  # each partition's files merged into one
    merged = [pq.ParquetFile(path.removeprefix("file://")).metadata for path in after.file_uris()]
    assert {m.row_group(0).column(i).compression for m in merged for i in range(m.num_columns)} == {"SNAPPY"}
    assert stored_messages(admin, "q").sort_by("sequence_number").equals(rows_before)
    with client.get_queue_receiver("q", max_wait_time=2) as receiver:
        got = receiver.receive_messages(200)
        assert sorted(str(m) for m in got) == sorted(f"m{i}-{k}" for i in range(maintenance.COMPACT_EVERY - 4)
                                                     for k in keys)


def _append_and_compact_unlocked(uri, worker, barrier, results):
    import pyarrow as pa
    from deltalake import write_deltalake

    from sparkbus.storage import maintenance

    barrier.wait()
    committed = 0
    for round_ in range(6):
        for i in range(4):
            row = pa.table({"partition_id": pa.array([i % 2], pa.int32()),
                            "sequence_number": [worker * 1000 + round_ * 10 + i]})
            write_deltalake(uri, row, mode="append")
        try:  # no lock between processes: the claim on the removed files is all that keeps them apart
            committed += maintenance._compact_partitions(*maintenance._followed(uri))
        except maintenance._RACES:
            pass
    results.put(committed)


@pytest.mark.slow
def test_direct_compactions_of_the_same_files_never_both_commit(spawn, tmp_path):
    uri = str(tmp_path / "entity" / "messages")
    DeltaTable.create(uri, schema=pa.schema([("partition_id", pa.int32()), ("sequence_number", pa.int64())]),
                      partition_by=["partition_id"])
    compacted = run_spawned(spawn, _append_and_compact_unlocked, [(uri, w) for w in range(3)])
    assert sum(compacted) > 0
    rows = storage.query("SELECT sequence_number AS n FROM t ORDER BY n", t=storage.open_table(uri))["n"].to_pylist()
    assert rows == sorted(w * 1000 + r * 10 + i for w in range(3) for r in range(6) for i in range(4))


def _append_version(uri: str, n: int) -> None:
    """One version more of a two-partition table (without delta-rs' own checkpoints)."""
    write_deltalake(uri, pa.table({"partition_id": pa.array([n % 2], pa.int32()), "sequence_number": [n]}),
                    mode="append", partition_by=["partition_id"],
                    post_commithook_properties=PostCommitHookProperties(create_checkpoint=False))


def _table_of_versions(uri: str, versions: int) -> None:
    for n in range(versions + 1):
        _append_version(uri, n)


def test_jobs_wait_in_the_order_first_asked_and_one_asked_again_keeps_its_place(tmp_path):
    """A busy table asking for checkpoint after checkpoint cannot starve another table's jobs, nor its own
    compaction: the line is kept in the order first asked."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    _table_of_versions(a, maintenance.COMPACT_EVERY)
    _table_of_versions(b, maintenance.COMPACT_EVERY)
    assert maintenance.wait_idle(60)
    with maintenance._changed:  # the thread cannot take a job while this is held
        maintenance.after_direct_commit(a, maintenance.CHECKPOINT_EVERY)
        maintenance.after_direct_commit(b, maintenance.COMPACT_EVERY)
        maintenance.after_direct_commit(a, maintenance.COMPACT_EVERY)  # a newer checkpoint of a, and a compaction
        assert list(maintenance._due) == [(a, maintenance.CHECKPOINT), (b, maintenance.CHECKPOINT),
                                          (b, maintenance.COMPACT), (a, maintenance.COMPACT)]
        assert maintenance._checkpoint_at == {a: maintenance.COMPACT_EVERY, b: maintenance.COMPACT_EVERY}
    assert maintenance.wait_idle(60)
    for uri in (a, b):
        assert _last_checkpoint(uri) == maintenance.COMPACT_EVERY
        table = storage.open_table(uri)
        assert len(table.file_uris()) == 2  # one file per partition
        assert sorted(storage.query("SELECT sequence_number AS n FROM t", t=table)["n"].to_pylist()) == \
            list(range(maintenance.COMPACT_EVERY + 1))


def test_a_checkpoint_soon_after_another_is_skipped_unless_the_log_grew_long(tmp_path):
    every = maintenance.CHECKPOINT_EVERY
    uri = str(tmp_path / "t")
    _table_of_versions(uri, 3 * every)
    maintenance.checkpoint(uri, every)
    assert _last_checkpoint(uri) == every
    maintenance.checkpoint(uri, 2 * every)  # the latest is under CHECKPOINT_SECONDS old: early
    assert _last_checkpoint(uri) == every
    maintenance.checkpoint(uri, every - 5)  # older than the latest: never written
    assert _last_checkpoint(uri) == every
    time.sleep(maintenance.CHECKPOINT_SECONDS)
    maintenance.checkpoint(uri, 2 * every)  # old enough: due
    assert _last_checkpoint(uri) == 2 * every
    for n in range(3 * every + 1, 2 * every + maintenance.CHECKPOINT_LAG + 1):  # the log grows long at once
        _append_version(uri, n)
    maintenance.checkpoint(uri, 2 * every + maintenance.CHECKPOINT_LAG)  # seconds old, but CHECKPOINT_LAG behind
    assert _last_checkpoint(uri) == 2 * every + maintenance.CHECKPOINT_LAG


def test_a_commit_waits_while_the_maintenance_of_its_process_is_behind():
    release = threading.Event()
    maintenance.run_later("hold the thread", release.wait)
    while ("hold the thread", maintenance.TASK) in maintenance._due:  # until the thread has taken it
        time.sleep(0.01)
    maintenance.run_later("wait in line", lambda: None)
    time.sleep(maintenance.BEHIND_SECONDS + 0.2)  # that job has now waited longer than BEHIND_SECONDS
    committed = threading.Event()
    committer = threading.Thread(target=lambda: (maintenance.after_direct_commit("any table", 1), committed.set()))
    committer.start()
    try:
        assert not committed.wait(maintenance.BEHIND_WAIT_SECONDS / 2)  # held
        assert committed.wait(60)  # for BEHIND_WAIT_SECONDS at most, then it goes on
    finally:
        release.set()
    committer.join()
    assert maintenance.wait_idle(60)


def _file(name: str, size: int) -> "maintenance.AddedFile":
    return maintenance.AddedFile(name, 0, size, 1, {}, {})


def test_compaction_merges_a_size_tier_once_it_gathered_fan_in_files():
    small = [_file(f"s{i}", 6_000) for i in range(maintenance.COMPACT_FAN_IN - 1)]
    big = _file("big", 2 << 20)
    target = 16 << 20
    assert maintenance.merged_together([big, *small], target) == []  # seven small files wait for an eighth
    eighth = _file("s7", 6_000)
    assert maintenance.merged_together([big, *small, eighth], target) == [*small, eighth]  # the big one stays
    tier1 = [_file(f"m{i}", 200_000) for i in range(maintenance.COMPACT_FAN_IN)]
    assert maintenance.merged_together([*tier1, *small], target) == tier1  # the smallest tier that is full
    at_target = [_file(f"t{i}", target) for i in range(maintenance.COMPACT_FAN_IN)]
    assert maintenance.merged_together(at_target, target) == []  # files at the target size are left alone
    many = [_file(f"x{i}", 100) for i in range(maintenance.COMPACT_MAX_FILES + 5)]
    assert len(maintenance.merged_together(many, target)) == maintenance.COMPACT_MAX_FILES


def test_a_partition_fed_one_small_file_at_a_time_rewrites_each_row_a_few_times_and_keeps_few_files():
    """Sends of one message each: with every compaction merging all small files, a partition's grown file
    was rewritten again with every few new rows (bytes written grew with the square of the rows). Tiered,
    each byte is written about once per tier, and the files a reader meets stay few."""
    target, row_file = 16 << 20, 6_000
    files: list = []
    written = 0
    for n in range(20_000):
        files.append(_file(f"f{n}", row_file))
        written += row_file
        chosen = maintenance.merged_together(files, target)
        if chosen:
            size = sum(f.size for f in chosen)
            files = [f for f in files if f not in chosen] + [_file(f"c{n}", size)]
            written += size
        assert len(files) <= maintenance.COMPACT_FAN_IN * 5
    tiers = maintenance.size_tier(target) + 1
    # its first write, once per tier, and once more in the first tier (eight one-row files still make a
    # file of that tier): 5.2 here; merging every small file every twenty files wrote it 70 times over
    assert written / (20_000 * row_file) <= tiers + 2, written / (20_000 * row_file)


def test_compaction_takes_the_rows_this_process_wrote_and_reads_the_others(admin, client):
    """The compaction reader merges files this process wrote from the rows it kept when writing them (each
    taken once), and reads the files others wrote: the same rows, per partition, as reading every file."""
    from urllib.parse import unquote

    from sparkbus.core.schemas import MESSAGES
    from sparkbus.storage import commits, fetched
    from sparkbus.storage.reader import PartitionReader

    admin.create_queue("q", enable_partitioning=True)
    uri = admin.get_entity_tables("q")["messages"]
    with client.get_queue_sender("q") as sender:
        for i in range(6):
            sender.send_messages([ServiceBusMessage(f"m{i}", partition_key="a", subject="s" if i % 2 else None),
                                  ServiceBusMessage(f"n{i}", partition_key="b", application_properties={"i": i})])
    view = commits.LogView(storage.open_table(uri))
    paths = {p: [f.path for f in view.files(p)] for p in view.partitions()}
    assert len(paths) == 2 and all(len(listed) == 6 for listed in paths.values())
    first = next(iter(paths))
    taken = fetched.rows_written(os.path.join(uri, unquote(paths[first][0])))  # as if another process wrote it
    assert taken is not None and taken.num_rows == 1
    merged = PartitionReader(MESSAGES, written=True).merged(view, paths)
    read = PartitionReader(MESSAGES).merged(view, paths)
    for p in paths:
        assert merged[p].schema.equals(read[p].schema) and merged[p].equals(read[p])
        assert merged[p].num_rows == 6
    assert all(fetched.rows_written(os.path.join(uri, unquote(path))) is None for listed in paths.values()
               for path in listed)  # each taken once


def test_the_thread_records_each_job_it_ran_with_its_times_failed_or_not():
    """maintenance.ran holds each job the thread ran (its kind, key, start and end), a failed one too: what
    a benchmark tells the operations that ran beside maintenance from those that did not."""
    seen: list[float] = []

    def task() -> None:
        seen.append(time.perf_counter())

    def broken() -> None:
        raise OSError("a broken table")

    maintenance.run_later("recorded", task)
    assert maintenance.wait_idle(30)
    maintenance.run_later("recorded-broken", broken)
    assert maintenance.wait_idle(30)
    done, failed = list(maintenance.ran)[-2:]
    assert (done.kind, done.key, failed.kind, failed.key) == (maintenance.TASK, "recorded", maintenance.TASK,
                                                              "recorded-broken")
    assert done.started <= seen[0] <= done.ended <= failed.started <= failed.ended
    assert maintenance.failures[-1][0] == "recorded-broken"


def test_maintenance_runs_below_the_callers_priority_on_pools_of_its_own():
    """The maintenance thread runs at BACKGROUND_NICENESS (Linux lowers a thread's priority alone) and the
    storage pools it uses are not the callers': a compaction's fsyncs never queue in front of a send's, and
    the pool threads it starts run in the background too."""
    seen: dict[str, object] = {}

    def task() -> None:
        thread = threading.get_native_id()
        seen["nice"] = os.getpriority(os.PRIO_PROCESS, thread)
        pool = storage.pool("fsync", 8)
        seen["pool"] = pool
        seen["pool_nice"] = pool.submit(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())).result()

    maintenance.run_later("priority", task)
    assert maintenance.wait_idle(30)
    caller = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert caller < storage.BACKGROUND_NICENESS
    assert seen["nice"] == seen["pool_nice"] == max(storage.BACKGROUND_NICENESS, caller)
    assert seen["pool"] is not storage.pool("fsync", 8)
    assert storage.pool("fsync", 8).submit(
        lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())).result() == caller


def test_the_thread_starts_from_the_process_view_of_a_table_a_receiver_follows(admin, client, ns_path):
    """A table this process's receivers follow is not opened again by the maintenance thread (an open
    replays the log from its checkpoint): its view of it starts from a copy of the process's view, moved to
    the latest version, with the same files; a table nothing follows yet is opened."""
    from sparkbus.storage import requests

    admin.create_queue("seeded", enable_partitioning=True)
    uris = admin.get_entity_tables("seeded")
    with client.get_queue_sender("seeded") as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(8)])
    with client.get_queue_receiver("seeded", max_wait_time=2) as receiver:
        receiver.complete_messages(receiver.receive_messages(3))
    with client.get_queue_sender("seeded") as sender:  # after the receiver's view was taken
        sender.send_messages([ServiceBusMessage("later")])
    seen: dict[str, tuple[int, int, set[str]]] = {}

    def task() -> None:
        for role in ("messages", "locks"):
            with requests.counting() as tally:
                view = maintenance.followed_view(uris[role])
            seen[role] = (tally.delta_calls, view.version, {f.path for p in view.partitions() for f in view.files(p)})

    maintenance.run_later("seeded views", task)
    assert maintenance.wait_idle(30)
    for role in ("messages", "locks"):
        table = storage.open_table(uris[role])
        expected = {action for action in table.get_add_actions(flatten=True).column("path").to_pylist()}
        assert seen[role] == (0, table.version(), expected), role
    with pytest.raises(ValueError, match="not a partitioned table"):
        maintenance.followed_view(os.path.join(ns_path, "_catalog"))
