"""Partition availability: the seam through which partitions (messaging stores) are marked unavailable.

A fault names one partition of one entity, or of every entity ('*', a whole messaging store). Faults
live in the catalog, so they are seen atomically with the entities. Management operations run on all
partitions of an entity and fail while any is unavailable; get_* then reports availability "Limited".

Storage faults are found, not declared: a partition whose files cannot be read (missing, corrupt,
unreadable) or written (its directory gone or not a directory, a permission or quota error) is reported
here by the operation that met it (report_fault) and avoided by this process for DETECTED_SECONDS, as an
operator-marked partition is: keyless sends go to other partitions, keyed sends raise
PartitionUnavailableError, receives serve the other partitions, get_* say "Limited". Then it is tried
again, so a repaired partition is back within seconds; one still broken is found again by the next
operation that needs it. Detection is per process: each meets the fault itself.
"""
from __future__ import annotations

import re
from typing import Optional

from ..core import tiers
from ..core.names import key
from ..exceptions import MessagingEntityNotFoundError, PartitionUnavailableError
from .catalog import Catalog, Change, Row, Snapshot
from .namespace import open_catalog
from . import clock, context

FAULT_KIND = "partition_fault"
ALL_ENTITIES = "*"
DETECTED_SECONDS = 5.0  # a partition found faulty is avoided this long by this process, then tried again
_PARTITION_IN_PATH = re.compile(r"partition_id=(\d+)")


def report_fault(root: str, entity_path: str, partition: int) -> None:
    """A partition of the entity failed a read or write of its files: avoid it for DETECTED_SECONDS."""
    found = context.of(root)
    with found.lock:
        found.faults[(key(entity_path), partition)] = clock.monotonic() + DETECTED_SECONDS


def detected_faults(root: str, entity_path: str) -> frozenset[int]:
    """The entity's partitions this process found faulty within the last DETECTED_SECONDS."""
    found, now, mine = context.known(root), clock.monotonic(), key(entity_path)
    if found is None:
        return frozenset()
    with found.lock:
        return frozenset(p for (entity, p), until in found.faults.items() if entity == mine and until > now)


def down(root: str, entity_path: str, declared: frozenset[int]) -> set[int]:
    """Partitions to avoid: declared unavailable (the catalog's faults) or found faulty by this process."""
    return set(declared) | detected_faults(root, entity_path)


def fault_of(root: str, entity_path: str, partition_count: int, error: BaseException) -> Optional[int]:
    """The partition of the entity whose storage fault error is (then reported), or None."""
    partition = partition_named(error)
    if partition is not None and 0 <= partition < partition_count:
        report_fault(root, entity_path, partition)
        return partition
    return None


def partition_named(error: BaseException) -> Optional[int]:
    """The partition a storage error names (delta-rs and object_store errors carry the file's path, whose
    directory is partition_id=N), or None: then the error is not a partition's fault."""
    found: Optional[int] = getattr(error, "partition_id", None)
    if found is not None:
        return found
    match = _PARTITION_IN_PATH.search(str(error))
    return int(match.group(1)) if match else None


def _fault_key(entity_key: str, partition_id: int) -> str:
    return f"$fault/{entity_key}/{partition_id}"


def unavailable_partitions(snap: Snapshot, entity_key: Optional[str], partition_count: int) -> list[int]:
    """Sorted unavailable partition ids of an entity (entity_key None: a store fault of any entity)."""
    ids = set()
    for row in snap.of_kind(FAULT_KIND):
        target = row.properties["entity"]
        if target == ALL_ENTITIES or (entity_key is not None and target == entity_key):
            if row.properties["partition_id"] < partition_count:
                ids.add(row.properties["partition_id"])
    return sorted(ids)


def require_available(snap: Snapshot, entity_key: Optional[str], partition_count: int, operation: str) -> None:
    """Management operations run on every partition: raise PartitionUnavailableError if any is down."""
    down = unavailable_partitions(snap, entity_key, partition_count)
    if down:
        raise PartitionUnavailableError(
            f"cannot {operation}: partition(s) {down} unavailable; create, update and delete run on all "
            "partitions of an entity"
        )


def set_partition_availability(namespace_path: str, partition_id: int, available: bool, *,
                               entity_path: Optional[str] = None, reason: str = "") -> None:
    """Operator control: mark a partition of one entity (or of every entity) unavailable or available again
    (ServiceBusAdministrationClient.set_partition_availability on an open namespace)."""
    mark_partition(open_catalog(namespace_path), partition_id, available, entity_path=entity_path, reason=reason)


def mark_partition(catalog: Catalog, partition_id: int, available: bool, *, entity_path: Optional[str] = None,
                   reason: str = "") -> None:
    """Record a partition of one entity (or of every entity: entity_path None) as unavailable, or remove
    that record. Arguments are checked before anything is written: TypeError, ValueError (a partition the
    entity does not have), MessagingEntityNotFoundError."""
    if isinstance(partition_id, bool) or not isinstance(partition_id, int) or partition_id < 0:
        raise ValueError(f"partition_id must be an int >= 0, got {partition_id!r}")
    if not isinstance(available, bool):
        raise TypeError(f"available must be a bool (True: available again, False: unavailable), got "
                        f"{type(available).__name__} {available!r}")
    if entity_path is not None and not isinstance(entity_path, str):
        raise TypeError(f"entity_path must be a queue, topic or subscription path (str) or None, got "
                        f"{type(entity_path).__name__}")
    if not isinstance(reason, str):
        raise TypeError(f"reason must be a str, got {type(reason).__name__}")
    target = ALL_ENTITIES if entity_path is None else key(entity_path)

    def decide(snap: Snapshot) -> Change[None]:
        if entity_path is not None:
            entity = snap.get(target)
            if entity is None or entity.kind not in ("queue", "topic", "subscription"):
                raise MessagingEntityNotFoundError(f"no queue, topic or subscription {entity_path!r}")
            count = entity.partition_count
        else:
            count = max(tiers.STANDARD_PARTITION_COUNT, *tiers.PREMIUM_PARTITION_COUNTS)
        if partition_id >= count:
            raise ValueError(f"{entity_path or 'an entity'!r} has partitions 0..{count - 1}, got {partition_id}")
        fault = _fault_key(target, partition_id)
        if available:
            return Change(deletes=[fault] if snap.get(fault) else [])
        return Change(upserts=[Row(key=fault, kind=FAULT_KIND, path=fault, properties={
            "entity": target, "partition_id": partition_id, "reason": reason})])

    catalog.transact(decide)
