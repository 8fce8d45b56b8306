"""The namespace catalog: one Delta table holding the namespace row, entities, rules and partition faults.

Every management change is one MERGE on this unpartitioned table. delta-rs rejects a MERGE when any
other commit added or removed data after the snapshot it read, so catalog changes are serializable:
quota checks, "already exists" checks and the write they guard happen as one atomic step, and a
conflicting change is re-run against the new snapshot. Readers always see a whole committed version.

Creation is the claim of a namespace: version 0, holding the namespace row, is created by exactly one
creator (Catalog.create). delta-rs' write_deltalake(mode="error") is no such claim: of two creators
racing, the second found version 0 taken and committed its row as version 1, so both succeeded and the
catalog held two namespace rows.

A change whose commit request failed for want of the store (a connection reset, an answer that never came)
may or may not be in the log: the store may have carried it out. Each MERGE names itself in its
commitInfo (txnId), so the failed one reads the log after its snapshot: found, the change is made; not
found, it changed nothing and the retry policy tries it again (retry.Unchanged), deciding afresh.
"""
from __future__ import annotations

import json
import os
import tempfile
import threading
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import cached_property
from typing import Any, Callable, Generic, Iterable, Optional, TypeVar
from urllib.parse import unquote

import pyarrow as pa

from ..storage import CommitFailedError, DeltaTable, location
from .. import storage
from ..storage import commits, maintenance
from ..core.entities import EntityOptions
from ..core.filters import RuleFilter, SqlRuleAction, action_from_json, filter_from_json
from ..core.schemas import TS
from ..exceptions import ServiceBusCommunicationError
from . import retry
from . import clock

T = TypeVar("T")
CATALOG_DIR = "_catalog"
NAMESPACE_KEY = "$namespace"
CONFIGURATION = {"delta.checkpointInterval": "10", "delta.logRetentionDuration": "interval 1 day"}

SCHEMA = pa.schema([
    pa.field("key", pa.string(), nullable=False),
    pa.field("kind", pa.string(), nullable=False),
    pa.field("path", pa.string(), nullable=False),
    pa.field("parent", pa.string()),
    pa.field("partition_count", pa.int32(), nullable=False),
    pa.field("storage", pa.string()),
    pa.field("properties", pa.string(), nullable=False),
    pa.field("created_at_utc", TS, nullable=False),
    pa.field("updated_at_utc", TS, nullable=False),
])
_COLUMNS = [f.name for f in SCHEMA]


def utc_now() -> datetime:
    return clock.now()


@dataclass(frozen=True)
class Row:
    """One catalog entry. `properties` is a JSON-able dict; `storage` is a directory under the namespace."""

    key: str
    kind: str
    path: str
    properties: dict[str, Any]
    parent: Optional[str] = None
    partition_count: int = 1
    storage: Optional[str] = None
    created_at_utc: datetime = field(default_factory=utc_now)
    updated_at_utc: Optional[datetime] = None  # None: the creation time

    def __post_init__(self) -> None:
        if self.updated_at_utc is None:
            object.__setattr__(self, "updated_at_utc", self.created_at_utc)

    def updated(self, properties: dict[str, Any]) -> "Row":
        return replace(self, properties=properties, updated_at_utc=utc_now())

    @cached_property
    def options(self) -> EntityOptions:
        """A queue's, topic's or subscription's settings, typed (options it has not stored: defaults); read
        once per row (rows are never changed: `updated` makes a new one)."""
        return EntityOptions.from_stored(self.properties)

    @property
    def rule_filter(self) -> RuleFilter:
        """A rule's filter."""
        return filter_from_json(self.properties["filter"])

    @property
    def rule_action(self) -> Optional[SqlRuleAction]:
        """A rule's action (None: it has none)."""
        return action_from_json(self.properties["action"])


@dataclass(frozen=True)
class Snapshot:
    """All catalog rows at one Delta version."""

    version: int
    rows: dict[str, Row]

    def get(self, key: str) -> Optional[Row]:
        return self.rows.get(key)

    def of_kind(self, *kinds: str) -> list[Row]:
        return sorted((r for r in self.rows.values() if r.kind in kinds), key=lambda r: r.key)

    def children(self, parent_key: str, kind: str) -> list[Row]:
        return [r for r in self.of_kind(kind) if r.parent == parent_key]


@dataclass
class Change(Generic[T]):
    """What a transaction writes: rows to insert or replace, keys to delete, and the caller's result."""

    upserts: list[Row] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)
    result: Optional[T] = None


def _to_arrow(rows: Iterable[Row], op: str) -> pa.Table:
    rows = list(rows)
    data = {c: [getattr(r, c) for r in rows] for c in _COLUMNS}
    data["properties"] = [json.dumps(r.properties, sort_keys=True) for r in rows]
    table = pa.table(data, schema=SCHEMA)
    return table.append_column("_op", pa.array([op] * len(rows), pa.string()))


def _from_arrow(table: pa.Table) -> dict[str, Row]:
    rows = {}
    for rec in table.to_pylist():
        rec["properties"] = json.loads(rec["properties"])
        rows[rec["key"]] = Row(**rec)
    return rows


class _StaleSnapshot(CommitFailedError):
    """The table moved past the snapshot a decision was based on; decide again."""


class Catalog:
    """Reads and atomically changes the catalog table of the namespace at `root` (a local directory).

    One DeltaTable is kept and refreshed incrementally (only new log entries are read); rows are re-read
    only when the version moved. The lock makes refresh and commit atomic for threads sharing a client.
    """

    def __init__(self, root: str) -> None:
        self.root = root
        self.uri = location.join(root, CATALOG_DIR)
        self._lock = threading.RLock()
        self._table: Optional[DeltaTable] = None
        self._snapshot: Optional[Snapshot] = None

    def exists(self) -> bool:
        return storage.table_exists(self.uri)

    def create(self, namespace_row: Row) -> None:
        """Commit version 0 holding the namespace row, durable on return; FileExistsError when version 0
        exists (another creator claimed it, even at the same moment), and then this call has left nothing.

        delta-rs writes the table into a local temporary directory; its data file is copied beside the
        catalog under its own unique name, then its log entry is created as version 0 with put-if-absent
        (storage.commits.create_entry: a hard link on local disk, If-None-Match on an object store), so
        exactly one creator wins. A loser deletes the data file it copied (only a crash in between leaves
        it, unreferenced: no reader ever sees it).
        """
        log_dir = location.join(self.uri, "_delta_log")
        with tempfile.TemporaryDirectory(prefix="sparkbus-catalog-") as staging:
            storage.write(staging, _to_arrow([namespace_row], "upsert").drop_columns(["_op"]),
                          configuration=CONFIGURATION)
            with open(os.path.join(staging, "_delta_log", f"{0:020d}.json"), "rb") as staged:
                entry = staged.read()
            actions = [json.loads(line) for line in entry.splitlines() if line.strip()]
            names = [unquote(action["add"]["path"]) for action in actions if "add" in action]
            if location.is_local(log_dir):
                os.makedirs(log_dir, exist_ok=True)
            copied: list[str] = []
            claimed = False
            try:
                for name in names:
                    copied.append(location.join(self.uri, name))
                    _copy(os.path.join(staging, name), copied[-1])
                if location.is_local(log_dir) and storage.durable():
                    storage.fsync_directories((log_dir, self.uri))  # the data file's name before the entry
                claimed = commits.create_entry(location.join(log_dir, f"{0:020d}.json"), entry)
            finally:
                if not claimed:
                    for target in copied:
                        location.remove(target)
        if not claimed:
            raise FileExistsError(self.uri)

    def snapshot(self) -> Snapshot:
        with self._lock:
            if self._table is None:
                self._table = storage.open_table(self.uri)
            else:
                self._table = commits.refresh_if_moved(self._table)
            version = self._table.version()
            if self._snapshot is None or self._snapshot.version != version:
                rows = _from_arrow(storage.query("SELECT * FROM catalog", catalog=self._table))
                self._snapshot = Snapshot(version, rows)
            return self._snapshot

    def transact(self, decide: Callable[[Snapshot], Change[T]], first: Optional[Snapshot] = None) -> Optional[T]:
        """Apply decide(snapshot) atomically, re-deciding on a fresh snapshot after a conflict.

        first: a snapshot already read by the caller, used for the first attempt.
        """
        pending = [first] if first is not None else []

        def attempt() -> Optional[T]:
            snap = pending.pop() if pending else self.snapshot()
            change = decide(snap)
            if change.upserts or change.deletes:
                self._merge(snap, change)
            return change.result

        return retry.run(attempt, what="changing the namespace catalog")

    def _merge(self, snap: Snapshot, change: Change[T]) -> None:
        placeholders = [Row(key=k, kind="", path="", properties={}) for k in change.deletes]
        source = pa.concat_tables([_to_arrow(change.upserts, "upsert"), _to_arrow(placeholders, "delete")])
        assignments = {c: f"s.`{c}`" for c in _COLUMNS}
        with self._lock:
            table = self._table
            if table is None or table.version() != snap.version:
                raise _StaleSnapshot("catalog changed since the snapshot was read")
            txn_id = uuid.uuid4().hex
            try:
                storage.merge(table, source, "t.key = s.key", lambda merger: (
                    merger.when_matched_update(assignments, predicate="s._op = 'upsert'")
                    .when_matched_delete(predicate="s._op = 'delete'")
                    .when_not_matched_insert(assignments, predicate="s._op = 'upsert'")), txn_id=txn_id)
            except ServiceBusCommunicationError as error:
                if self._landed(snap.version, txn_id):
                    return
                raise retry.Unchanged(str(error)) from error
            maintenance.after_commit(table)

    def _landed(self, version: int, txn_id: str) -> bool:
        """Whether a log entry after version is the commit txn_id, whose store request failed: a request
        whose connection broke may have been carried out (its answer lost), and telling which is what makes
        trying the change again safe (not landed) or needless (landed). A change whose request the store
        carries out only after this read found it missing is found by the next try's conflict (its decide
        sees the change made)."""
        return commits.has_entry_by(self.uri, version, txn_id)


def _copy(source: str, target: str) -> None:
    """Copy a local file to target (a local path or an object-store URI), durable on return."""
    with open(source, "rb") as f:
        data = f.read()
    location.put(target, data)
    if location.is_local(target) and storage.durable():
        storage.fsync_file(target)
