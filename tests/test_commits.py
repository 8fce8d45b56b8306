"""Direct Delta commits (sparkbus.storage.commits) on real local tables, interleaved with delta-rs' own."""
from __future__ import annotations

import json
import math
import os
import threading
import time

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError

from sparkbus import PartitionUnavailableError, storage
from sparkbus.storage import commits, spares
from sparkbus.storage.reader import PartitionReader
from sparkbus.core.schemas import LOCKS, TABLE_CONFIGURATION

FILE_SCHEMA = pa.schema([f for f in LOCKS if f.name != storage.PARTITION_COLUMN])


def _rows(numbers: list[int], state: str = "locked") -> pa.Table:
    """Locks rows without the partition column (as a data file holds them)."""
    now = pa.scalar(time.time_ns() // 1000, pa.int64()).cast(LOCKS.field("updated_at_utc").type)
    n = len(numbers)
    return pa.table({"sequence_number": pa.array(numbers, pa.int64()), "state": [state] * n,
                     "delivery_count": pa.array([1] * n, pa.int32()), "lock_token": ["t"] * n,
                     "locked_until_utc": pa.array([now] * n), "dead_letter_reason": pa.nulls(n, pa.string()),
                     "dead_letter_error_description": pa.nulls(n, pa.string()),
                     "dead_letter_source": pa.nulls(n, pa.string()), "updated_at_utc": pa.array([now] * n)},
                    schema=FILE_SCHEMA)


@pytest.fixture
def table(tmp_path) -> DeltaTable:
    return storage.create_table(str(tmp_path / "locks"), LOCKS, configuration=TABLE_CONFIGURATION["locks"])


def _append(table: DeltaTable, partition: int, numbers: list[int]) -> commits.Committed:
    log = commits.TableLog.of(table)
    added = commits.write_file(log, partition, _rows(numbers))
    done = commits.commit(log, commits.position_of(table), [added], [], commits.Claim({partition: (min(numbers), math.inf)}))
    return done


def _read(table: DeltaTable) -> pa.Table:
    return storage.query("SELECT partition_id, sequence_number, state FROM locks ORDER BY partition_id, sequence_number",
                         locks=storage.open_table(table.table_uri))


def test_a_direct_commit_is_a_delta_version_delta_rs_reads_with_statistics(table):
    done = _append(table, 3, [7, 8, 9])
    assert done.version == 1 and done.skipped == []
    assert _read(table).to_pylist() == [{"partition_id": 3, "sequence_number": n, "state": "locked"} for n in (7, 8, 9)]
    actions = pa.table(storage.open_table(table.table_uri).get_add_actions(flatten=True))
    assert actions["min.sequence_number"].to_pylist() == [7] and actions["max.sequence_number"].to_pylist() == [9]
    assert actions["num_records"].to_pylist() == [3]
    history = storage.open_table(table.table_uri).history(1)[0]
    assert history["operation"] == "WRITE" and history["engineInfo"] == "sparkbus"


def _parquet(table: DeltaTable, added: commits.AddedFile):
    import pyarrow.parquet as pq
    from urllib.parse import unquote
    return pq.ParquetFile(os.path.join(table.table_uri.removeprefix("file://"), unquote(added.path)))


def test_a_hot_path_file_is_written_for_speed_and_reads_back_as_the_table_schema(table):
    log = commits.TableLog.of(table)
    rows, more = _rows([1, 2, 3]), _rows([4, 5])
    added = commits.write_file(log, 2, rows)
    meta = _parquet(table, added).metadata
    columns = [meta.row_group(0).column(i) for i in range(meta.num_columns)]
    assert {c.compression for c in columns} == {"UNCOMPRESSED"}
    assert not any("DICTIONARY" in c.encodings for c in columns if c.path_in_schema == "state")
    assert {c.path_in_schema for c in columns if c.is_stats_set} == set(log.stats_columns) == \
        {"sequence_number", "locked_until_utc"}
    assert b"ARROW:schema" not in (meta.metadata or {})
    # the columns null in every row are left out of the file; the rest read back as the table declares them
    empty = ["dead_letter_reason", "dead_letter_error_description", "dead_letter_source"]
    assert _parquet(table, added).read().equals(rows.drop_columns(empty))
    commits.commit(log, commits.position_of(table), [added], [], commits.Claim({2: (1, math.inf)}))
    view = commits.LogView(storage.open_table(table.table_uri))
    assert PartitionReader(LOCKS).named(view, [added.path])[0].equals(rows)
    assert storage.query("SELECT dead_letter_reason FROM locks", locks=storage.open_table(table.table_uri))[
        "dead_letter_reason"].to_pylist() == [None] * 3  # delta-rs reads them as null
    compressed = commits.write_file(log, 2, more, compress=True)
    meta = _parquet(table, compressed).metadata
    assert {meta.row_group(0).column(i).compression for i in range(meta.num_columns)} == {"SNAPPY"}
    assert _parquet(table, compressed).read().equals(more.drop_columns(empty))


def test_a_commit_skips_other_writers_versions_that_do_not_touch_its_claim(table):
    stale = storage.open_table(table.table_uri)                      # at version 0
    write_deltalake(table, pa.table({"partition_id": pa.array([1], pa.int32()), **_rows([5]).to_pydict()},
                                    schema=LOCKS), mode="append")    # delta-rs writes version 1, partition 1
    log = commits.TableLog.of(stale)
    added = commits.write_file(log, 2, _rows([5]))
    done = commits.commit(log, commits.position_of(stale), [added], [], commits.Claim({2: (5, 5)}))
    assert done.version == 2 and [e.version for e in done.skipped] == [1]
    assert done.skipped[0].added[0].partition == 1 and done.skipped[0].added[0].high["sequence_number"] == 5
    assert _read(table)["partition_id"].to_pylist() == [1, 2]


@pytest.mark.parametrize("unnamed", [True, False], ids=["unnamed-entry", "temporary-name"])
def test_a_staged_entry_taken_at_one_version_is_linked_at_the_next_and_leaves_nothing(table, unnamed):
    """Where the file system has unnamed files (O_TMPFILE: this machine's ext4) an entry is staged as one and
    linked by descriptor, elsewhere under a temporary name: either way one staged entry, written once, is
    linked at the next version after finding one taken, and neither leaves a file or a descriptor behind."""
    assert spares.UNNAMED == getattr(os, "O_TMPFILE", -1)  # this machine has them: both ways are run
    log_dir = os.path.join(table.table_uri.removeprefix("file://"), "_delta_log")
    other = commits._Staged.written(log_dir, b'{"commitInfo":{}}\n')
    assert other.link(os.path.join(log_dir, f"{1:020d}.json"))     # another writer takes version 1
    other.close()
    staged = commits._Staged.written(log_dir, b'{"commitInfo":{}}\n', unnamed=unnamed)
    assert (staged.descriptor is not None) == unnamed and bool(staged.path) != unnamed
    assert staged.file == (staged.descriptor if unnamed else staged.path)
    descriptors = [d for d in (staged.descriptor, staged.directory) if d is not None]
    assert not staged.link(os.path.join(log_dir, f"{1:020d}.json"))  # taken: nothing changed
    assert staged.link(os.path.join(log_dir, f"{2:020d}.json"))
    staged.close()
    for descriptor in descriptors:
        with pytest.raises(OSError):
            os.fstat(descriptor)  # closed
    assert sorted(os.listdir(log_dir)) == [f"{v:020d}.json" for v in range(3)]  # no staged file left
    assert storage.open_table(table.table_uri).version() == 2 and log_dir not in commits._named_only


def test_a_commit_that_loses_a_version_links_its_entry_at_the_next_and_leaves_nothing(table):
    stale = storage.open_table(table.table_uri)                      # at version 0
    _append(table, 1, [5])                                           # another writer takes version 1
    log = commits.TableLog.of(stale)
    added = commits.write_file(log, 2, _rows([6]))
    done = commits.commit(log, commits.position_of(stale), [added], [], commits.Claim({2: (6, 6)}))
    assert done.version == 2 and [e.version for e in done.skipped] == [1]
    assert commits.outcomes(log.uri) == commits.Outcomes(committed=2, versions_lost=1, refused=0)
    assert _read(table)["sequence_number"].to_pylist() == [5, 6]
    log_dir = os.path.join(table.table_uri.removeprefix("file://"), "_delta_log")
    assert sorted(os.listdir(log_dir)) == [f"{v:020d}.json" for v in range(3)]


def test_a_commit_conflicting_with_a_winner_writes_nothing(table):
    stale = storage.open_table(table.table_uri)
    _append(table, 2, [10, 11])                                      # the winner: partition 2, rows 10-11
    log = commits.TableLog.of(stale)
    added = commits.write_file(log, 2, _rows([11]))
    with pytest.raises(CommitFailedError, match="rows of partition 2 it read were written"):
        commits.commit(log, commits.position_of(stale), [added], [], commits.Claim({2: (11, 11)}))
    assert commits.outcomes(log.uri) == commits.Outcomes(committed=1, versions_lost=1, refused=1)
    commits.discard(log, [added])
    assert not os.path.exists(os.path.join(log.uri, added.path))
    assert storage.open_table(table.table_uri).version() == 1
    assert _read(table)["sequence_number"].to_pylist() == [10, 11]


def test_rewritten_files_and_application_transactions_conflict(table):
    first = _append(table, 0, [1, 2])
    base = storage.open_table(table.table_uri)
    view = commits.LogView(base)
    [path] = [f.path for f in view.files(0)]
    # another writer rewrites that file (as a settlement or a compaction would), with an application id
    log = commits.TableLog.of(base)
    theirs = commits.write_file(log, 0, _rows([1, 2], "completed"))
    commits.commit(log, commits.position_of(base), [theirs], [path], commits.Claim({0: (1, 2)}, frozenset([path])),
                   {"claim-0": 1})
    mine = commits.write_file(log, 0, _rows([1, 2], "deferred"))
    with pytest.raises(CommitFailedError, match="files this commit rewrites were rewritten"):
        commits.commit(log, view.position, [mine], [path], commits.Claim({0: (100, 100)}, frozenset([path])))
    with pytest.raises(CommitFailedError, match="same application transaction"):
        commits.commit(log, view.position, [mine], [], commits.Claim({0: (100, 100)}, app_ids=frozenset(["claim-0"])))
    assert first.version == 1 and storage.open_table(table.table_uri).version() == 2
    assert set(_read(table)["state"].to_pylist()) == {"completed"}
    assert storage.open_table(table.table_uri).transaction_version("claim-0") == 1


def test_a_stale_position_is_refused_instead_of_writing_over_a_cleaned_up_version(table):
    log = commits.TableLog.of(table)
    assert log.safe_seconds == 5.0                                   # half of the 10-second log retention
    added = commits.write_file(log, 0, _rows([1]))
    old = commits.Position(table.version(), time.monotonic() - 6)
    with pytest.raises(CommitFailedError, match="stale snapshot"):
        commits.commit(log, old, [added], [], commits.Claim({0: (1, math.inf)}))
    assert storage.open_table(table.table_uri).version() == 0
    unknown = DeltaTable(table.table_uri)                            # not opened through sparkbus.storage
    with pytest.raises(CommitFailedError, match="stale snapshot"):
        commits.commit(log, commits.position_of(unknown), [added], [], commits.Claim({0: (1, math.inf)}))
    assert commits.outcomes(log.uri) == commits.Outcomes(committed=0, versions_lost=0, refused=2)


def test_a_log_view_follows_adds_and_removes_and_reseeds_when_stale(table):
    view = commits.LogView(storage.open_table(table.table_uri))
    _append(table, 0, [1])
    _append(table, 0, [2])
    _append(table, 1, [1])
    assert view.advance().version == 3
    assert [f.sequence_range() for f in view.files(0)] == [(1, 1), (2, 2)]
    assert [f.partition for f in view.files(1)] == [1]
    assert [f.sequence_range() for f in view.files(0, 2, 5)] == [(2, 2)]
    storage.open_table(table.table_uri).optimize.compact()           # delta-rs: removes 2 files, adds 1
    assert [f.sequence_range() for f in view.advance().files(0)] == [(1, 2)]
    view.position = commits.Position(view.version - 1, time.monotonic() - 60)  # pretend it is old and behind
    assert view.advance().version == storage.open_table(table.table_uri).version()
    assert [f.sequence_range() for f in view.files(0)] == [(1, 2)]


def test_entries_written_directly_are_standard_delta_actions(table):
    _append(table, 4, [40])
    with open(os.path.join(commits.TableLog.of(table).log_dir, f"{1:020d}.json")) as entry:
        actions = [json.loads(line) for line in entry]
    assert [next(iter(a)) for a in actions] == ["commitInfo", "add"]
    add = actions[1]["add"]
    assert add["partitionValues"] == {"partition_id": "4"} and add["dataChange"] is True
    assert add["path"].startswith("partition_id=4/") and add["size"] == os.path.getsize(
        os.path.join(commits.TableLog.of(table).uri, add["path"]))
    stats = json.loads(add["stats"])
    assert stats["numRecords"] == 1 and stats["minValues"]["sequence_number"] == 40
    assert stats["minValues"]["locked_until_utc"].endswith("Z")


def test_a_log_listing_that_misses_an_entry_being_created_is_read_again(table):
    for n in (1, 2, 3):
        _append(storage.open_table(table.table_uri), 0, [n])
    entry = os.path.join(commits.TableLog.of(table).log_dir, f"{2:020d}.json")
    os.rename(entry, entry + ".away")                    # as a listing sees it while version 2 is being linked
    with pytest.raises(DeltaError) as gap:
        DeltaTable(table.table_uri)
    assert "Expected contiguous commit files" in str(gap.value) and storage.is_expired_version(gap.value)
    threading.Timer(0.02, os.rename, (entry + ".away", entry)).start()
    assert storage.open_table(table.table_uri).version() == 3


def test_a_lock_commit_leaves_its_file_in_the_readers_as_stored(table):
    """locks.commit hands the file it wrote to the readers (theirs and the caller's) instead of letting
    them read it back: what they hold is what a reader of the stored file gets, rewrites included."""
    from sparkbus.engine import locks

    def state(numbers: list[int], kind: str) -> pa.Table:
        rows = _rows(numbers, kind)
        return rows.add_column(0, LOCKS.field(storage.PARTITION_COLUMN), pa.array([2] * len(numbers), pa.int32()))

    mine = PartitionReader(LOCKS)
    view = commits.LogView(storage.open_table(table.table_uri))
    locks.commit(view, 2, state([5, 6, 7], "locked"), reader=mine)
    locks.commit(view, 2, state([6], "completed"), reader=mine)  # rewrites the first file without 6
    stored = PartitionReader(LOCKS).rows(commits.LogView(storage.open_table(table.table_uri)), 2)
    held = mine.rows(view, 2)
    assert held.equals(stored) and held.schema.equals(stored.schema)
    assert sorted(zip(held["sequence_number"].to_pylist(), held["state"].to_pylist())) == \
        [(5, "locked"), (6, "completed"), (7, "locked")]
    directory = os.path.join(storage.local_root(table.table_uri), f"{storage.PARTITION_COLUMN}=2")
    for name in os.listdir(directory):
        os.remove(os.path.join(directory, name))
    assert mine.rows(view, 2).equals(held)  # never read back from storage
    with pytest.raises(PartitionUnavailableError):
        PartitionReader(LOCKS).rows(commits.LogView(storage.open_table(table.table_uri)), 2)


def test_a_whole_reader_takes_a_narrow_readers_columns_and_decodes_only_the_others(table):
    """A reader given a narrow reader of the same table takes the columns that one decoded of a file (the
    same Arrow buffers, not a second decode) and reads only the others from the file; a narrow read holds
    the columns it was made for and no others."""
    log = commits.TableLog.of(table)
    rows = _rows([5, 6, 7])
    added = commits.write_file(log, 2, rows)
    commits.commit(log, commits.position_of(table), [added], [], commits.Claim({2: (5, 7)}))
    view = commits.LogView(storage.open_table(table.table_uri))
    narrow = PartitionReader(LOCKS, columns=("sequence_number", "state"))
    whole = PartitionReader(LOCKS, narrow=narrow)
    chosen = narrow.rows(view, 2)
    assert chosen.column_names == ["partition_id", "sequence_number", "state"]
    assert chosen["sequence_number"].to_pylist() == [5, 6, 7] and chosen["state"].to_pylist() == ["locked"] * 3
    held = whole.rows(view, 2)
    assert held.column_names == LOCKS.names and held.drop_columns([storage.PARTITION_COLUMN]).equals(rows)

    def buffers(table: pa.Table, name: str) -> list[int]:
        return [b.address for chunk in table[name].chunks for b in chunk.buffers() if b is not None]
    for name in ("sequence_number", "state"):  # taken from the narrow read, not decoded again
        assert buffers(held, name) == buffers(chosen, name)
    alone = PartitionReader(LOCKS).rows(view, 2)  # without a narrow reader: its own decode
    assert buffers(alone, "state") != buffers(chosen, "state")


def test_local_files_read_at_once_and_by_path_give_the_rows_written(table):
    """Local data files are read with one call and parsed from memory up to SMALL_FILE_BYTES, and by a
    reader of a few columns up to NARROW_FILE_BYTES; larger ones by path. Files of the three sizes read
    back as written through a whole and a narrow reader, and a file cut short is the partition's fault
    whichever way it is read."""
    from sparkbus.storage import reader as reading
    log = commits.TableLog.of(table)
    sizes = {1: (300, 0), 2: (300, 2048), 3: (1100, 4096)}  # partition: rows, bytes of reason text a row
    written: dict[int, tuple[pa.Table, str, int]] = {}
    for partition, (count, reason) in sizes.items():
        first = partition * 10_000
        rows = _rows(list(range(first, first + count)))
        rows = rows.set_column(rows.schema.get_field_index("dead_letter_reason"), "dead_letter_reason",
                               pa.array([os.urandom(reason // 2).hex() if reason else None for _ in range(count)],
                                        pa.string()))
        added = commits.write_file(log, partition, rows)
        commits.commit(log, commits.position_of(table), [added], [],
                       commits.Claim({partition: (first, first + count - 1)}))
        written[partition] = (rows, reading.data_file(log.uri, added.path), added.size)
    small, medium, large = (written[p][2] for p in (1, 2, 3))
    assert small <= reading.NARROW_FILE_BYTES < medium <= reading.SMALL_FILE_BYTES < large
    view = commits.LogView(storage.open_table(table.table_uri))
    for partition, (rows, path, size) in written.items():
        with open(path, "rb") as file:
            assert reading._small_local_file(path, size) == file.read()
        assert reading._small_local_file(path, size - 1) is None
        whole = PartitionReader(LOCKS).rows(view, partition)
        narrow = PartitionReader(LOCKS, columns=("sequence_number", "dead_letter_reason")).rows(view, partition)
        assert whole.drop_columns([storage.PARTITION_COLUMN]).equals(rows)
        assert narrow["sequence_number"].equals(rows["sequence_number"])
        assert narrow["dead_letter_reason"].equals(rows["dead_letter_reason"])
    for partition in (1, 3):  # read at once, and by path
        rows, path, size = written[partition]
        with open(path, "r+b") as file:
            file.truncate(size // 2)
        for reader in (PartitionReader(LOCKS), PartitionReader(LOCKS, columns=("sequence_number",))):
            with pytest.raises(PartitionUnavailableError, match=f"partition {partition}"):
                reader.rows(view, partition)


def test_application_transaction_versions_are_read_from_the_checkpoint_and_the_entries_after_it(table):
    """app_versions gives what delta-rs' transaction_version gives, for many app ids from one read of the
    log, at the table object's version: before any checkpoint, from a checkpoint alone, from a checkpoint
    and the entries after it, and for an object left behind by later commits."""
    log = commits.TableLog.of(table)

    def commit_ids(ids: dict[str, int]) -> None:
        base = storage.open_table(table.table_uri)
        added = commits.write_file(log, 0, _rows([base.version() + 1]))
        commits.commit(log, commits.position_of(base), [added], [], commits.Claim({0: (0, math.inf)}), ids)

    asked = [f"p-{i}" for i in range(6)] + ["never"]

    def agrees(at: DeltaTable) -> dict:
        read = commits.app_versions(at, asked)
        assert read == {app: at.transaction_version(app) for app in asked}
        return read

    commit_ids({"p-0": 1, "p-1": 1})
    assert agrees(storage.open_table(table.table_uri)) == {"p-0": 1, "p-1": 1, **{a: None for a in asked[2:]}}
    for i in range(2, 6):
        commit_ids({f"p-{i}": i, "p-0": i})
    old = storage.open_table(table.table_uri)
    storage.open_table(table.table_uri).create_checkpoint()
    assert agrees(storage.open_table(table.table_uri))["p-0"] == 5
    commit_ids({"p-1": 7})
    commit_ids({"p-5": 8})
    latest = agrees(storage.open_table(table.table_uri))
    assert (latest["p-0"], latest["p-1"], latest["p-5"], latest["never"]) == (5, 7, 8, None)
    assert agrees(old)["p-1"] == 1  # an object behind the log: entries after it are left out
    storage.open_table(table.table_uri).create_checkpoint()
    assert agrees(old)["p-1"] == 1  # and behind the latest checkpoint: asked of delta-rs


def test_a_put_retried_after_it_landed_finds_its_own_entry_and_succeeds(table, monkeypatch):
    """A store client that retries a conditional PUT whose first attempt landed sees the entry existing:
    the commit recognises its own entry (commitInfo.txnId) instead of taking it for a lost race, whose
    files would then be discarded under a committed entry."""
    original = commits._Staged.link

    def landed_then_retried(staged: commits._Staged, target: str) -> bool:
        assert original(staged, target)  # the first attempt landed...
        return False                     # ...and the retry found the entry there
    monkeypatch.setattr(commits._Staged, "link", landed_then_retried)
    done = _append(table, 1, [5, 6])
    monkeypatch.undo()
    assert done.version == 1 and done.skipped == []
    assert storage.open_table(table.table_uri).version() == 1
    assert _read(table)["sequence_number"].to_pylist() == [5, 6]


@pytest.mark.parametrize("store", ["azurite", "s3"])
def test_on_a_contended_log_a_lost_race_costs_its_put_alone(request, store):
    """A commit losing version N to another writer: it reads N and then tries N+1, three requests one after
    another; on a log where it lost lately, N is read beside the PUT, and the same loss costs two."""
    import uuid

    from sparkbus.storage import requests

    root = f"{request.getfixturevalue(store)}/{uuid.uuid4().hex[:12]}/locks"
    created = storage.create_table(root, LOCKS, configuration=TABLE_CONFIGURATION["locks"])
    rounds = {}
    for contended in (False, True):
        stale = storage.open_table(created.table_uri)
        _append(stale, 1, [100 + stale.version()])  # the winner of the next version
        log = commits.TableLog.of(stale)
        added = commits.write_file(log, 2, _rows([7]))
        commits._lost_at.pop(log.uri, None)
        if contended:
            commits._lost_at[log.uri] = time.monotonic()
        with requests.counting() as tally:
            done = commits.commit(log, commits.position_of(stale), [added], [], commits.Claim({2: (7, 7)}))
        assert [e.version for e in done.skipped] == [stale.version() + 1]  # lost N, committed N+1
        rounds[contended] = tally.sequential
    assert rounds == {False: 3, True: 2}, rounds


@pytest.mark.parametrize("store", ["azurite", "s3"])
def test_on_a_contended_log_a_commit_reads_the_tail_beside_its_data_file_and_loses_no_put(request, store):
    """A writer whose view is three versions behind, on a log it lost a race on lately: the entries after
    its view are read while its data file is written, checked against its claim, and its one entry PUT
    aims past them: three requests one after another (the tail's two rounds of reads beside the data
    file's PUT, then the entry), where PUTs into each taken version in turn wait for five. An entry in
    the tail that conflicts fails the commit before any entry PUT."""
    import uuid

    from sparkbus.storage import requests

    root = f"{request.getfixturevalue(store)}/{uuid.uuid4().hex[:12]}/locks"
    created = storage.create_table(root, LOCKS, configuration=TABLE_CONFIGURATION["locks"])
    stale = storage.open_table(created.table_uri)
    for n in range(3):
        _append(storage.open_table(created.table_uri), 1, [100 + n])  # three winners in partition 1
    log = commits.TableLog.of(stale)
    commits._lost_at[log.uri] = time.monotonic()
    with requests.counting() as tally:
        ahead = commits.tail_ahead(log, commits.position_of(stale))
        added = commits.write_file(log, 2, _rows([7]))
        done = commits.commit(log, commits.position_of(stale), [added], [], commits.Claim({2: (7, 7)}), ahead=ahead)
    assert done.version == stale.version() + 4 and [e.version for e in done.skipped] == [1, 2, 3]
    # the tail (windows of 2, then 4), the data file and the entry: no PUT lost; the read of the entry's
    # version beside its PUT is sent while the log still counts as contended (CONTENDED_SECONDS after the
    # loss noted above, which a slow machine can outlast)
    assert tally.kinds["PUT"] == 2 and tally.kinds["GET"] in (6, 7) and tally.sequential == 3, \
        (tally.kinds, tally.sequential)
    assert _read(created)["partition_id"].to_pylist() == [1, 1, 1, 2]

    behind = storage.open_table(created.table_uri)
    _append(storage.open_table(created.table_uri), 2, [8])  # a winner in the range the next claim reads
    ahead = commits.tail_ahead(log, commits.position_of(behind))
    added = commits.write_file(log, 2, _rows([8]))
    with requests.counting() as tally, pytest.raises(storage.CommitFailedError, match="concurrent commit at version 5"):
        commits.commit(log, commits.position_of(behind), [added], [], commits.Claim({2: (8, 8)}), ahead=ahead)
    assert "PUT" not in tally.kinds  # no entry was tried
    assert storage.open_table(created.table_uri).version() == 5


def test_on_local_disk_or_an_uncontended_log_no_tail_is_read_ahead(table):
    log = commits.TableLog.of(table)
    commits._lost_at[log.uri] = time.monotonic()
    assert commits.tail_ahead(log, commits.position_of(table)) is None  # a local read costs microseconds


def test_statistics_of_a_few_rows_and_of_many_are_the_same_bounds():
    """A file's statistics are computed from a few rows as Python values and from many with numpy: the same
    minimum, maximum and null count either way (timestamps at millisecond precision, widened to stay
    bounds; nulls left out)."""
    base = 1_764_331_200_123_456  # microseconds
    for count in (3, 40):
        numbers = list(range(100, 100 + count))[::-1]
        until = [None if n % 3 == 0 else base + n * 1_000_001 for n in range(count)]
        data = pa.table({"sequence_number": pa.array(numbers, pa.int64()),
                         "locked_until_utc": pa.array(until, pa.int64()).view(LOCKS.field("locked_until_utc").type)})
        low, high, text = commits._statistics(data, ("sequence_number", "locked_until_utc"))
        present = [u for u in until if u is not None]
        assert low["sequence_number"] == 100 and high["sequence_number"] == 100 + count - 1
        assert low["locked_until_utc"] == commits._iso_millis(min(present) // 1000)
        assert high["locked_until_utc"] == commits._iso_millis(-(-max(present) // 1000))
        assert json.loads(text)["nullCount"] == {"sequence_number": 0, "locked_until_utc": until.count(None)}
    assert commits._iso_millis(1_764_331_200_123) == "2025-11-28T12:00:00.123Z"


def test_a_view_notes_the_partitions_other_writers_committed_in_and_not_its_own(table):
    from sparkbus.engine.delivery import CALM_SECONDS, _apart

    view = commits.LogView(storage.open_table(table.table_uri))
    _append(table, 3, [1])                                           # another writer, read by advance
    view.advance()
    log = view.log
    added = commits.write_file(log, 5, _rows([1]))
    stale_other = commits.write_file(log, 7, _rows([1]))
    commits.commit(log, view.position, [stale_other], [], commits.Claim({7: (1, 1)}))  # another, skipped over
    done = commits.commit(log, view.position, [added], [], commits.Claim({5: (1, 1)}))
    view.committed(done, [added], [])                                # the view's own commit, in partition 5
    assert set(view.others_at) == {3, 7}
    assert _apart([7, 5, 3, 1], view) == [5, 1, 7, 3]               # calm partitions first, each group in order
    view.others_at[7] -= CALM_SECONDS                                # long enough ago: calm again
    assert _apart([7, 5, 3, 1], view) == [7, 5, 1, 3]
    assert _apart([7, 5, 3, 1], None) == [7, 5, 3, 1]
    twin = view.copy()                                               # another receiver's, from the process's
    twin.others_at[1] = time.monotonic()
    assert 1 not in view.others_at                                   # each view notes its own others
