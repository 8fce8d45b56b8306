"""Partition availability: the seam through which partitions (messaging stores) are marked unavailable.

A fault names one partition of one entity, or of every entity ('*', a whole messaging store). Faults
live in the catalog, so they are seen atomically with the entities. Management operations run on all
partitions of an entity and fail while any is unavailable; get_* then reports availability "Limited".
"""
from __future__ import annotations

from typing import Optional

from ..core.names import key
from ..exceptions import MessagingEntityNotFoundError, PartitionUnavailableError
from .catalog import Change, Row, Snapshot
from .namespace import open_catalog

FAULT_KIND = "partition_fault"
ALL_ENTITIES = "*"


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
    """Operator control: mark a partition of one entity (or of every entity) unavailable or available again."""
    if isinstance(partition_id, bool) or not isinstance(partition_id, int) or partition_id < 0:
        raise ValueError(f"partition_id must be an int >= 0, got {partition_id!r}")
    catalog = open_catalog(namespace_path)
    target = ALL_ENTITIES if entity_path is None else key(entity_path)

    def decide(snap: Snapshot) -> Change:
        if entity_path is not None:
            entity = snap.get(target)
            if entity is None or entity.kind not in ("queue", "topic", "subscription"):
                raise MessagingEntityNotFoundError(f"no queue, topic or subscription {entity_path!r}")
            if partition_id >= entity.partition_count:
                raise ValueError(f"{entity_path!r} has partitions 0..{entity.partition_count - 1}, got {partition_id}")
        fault = _fault_key(target, partition_id)
        if available:
            return Change(deletes=[fault] if snap.get(fault) else [])
        return Change(upserts=[Row(key=fault, kind=FAULT_KIND, path=fault, properties={
            "entity": target, "partition_id": partition_id, "reason": reason})])

    catalog.transact(decide)
