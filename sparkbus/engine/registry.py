"""Runtime view of one entity for the data plane: its settings, tables, limits and available partitions."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

from ..storage import location
from ..core import entities, tiers
from ..core.entities import EntityOptions
from ..core.names import key
from ..exceptions import InvalidOperationError, MessagingEntityNotFoundError
from ..storage.schemas import ENTITY_TABLES
from . import availability
from .availability import unavailable_partitions
from .catalog import NAMESPACE_KEY, Catalog, Row, Snapshot
from .namespace import NamespaceProperties, namespace_properties

KB = 1024
MB = 1024 * 1024


def table_uris(root: str, row: Row) -> dict[str, str]:
    return {role: location.join(root, row.storage, role) for role in ENTITY_TABLES}


@dataclass(frozen=True)
class EntityInfo:
    """What senders and receivers need to know about an entity, read from one catalog snapshot."""

    kind: str
    path: str
    partition_count: int
    options: EntityOptions
    tables: dict[str, str]  # role (messages, locks, sessions) -> table uri
    namespace: NamespaceProperties
    unavailable: frozenset
    subscription_count: int

    def avoided(self) -> set[int]:
        """Partitions to avoid now: declared unavailable, or found faulty by this process (availability)."""
        return availability.down(self.namespace.path, self.path, self.unavailable)

    def fault_in(self, error: BaseException) -> Optional[int]:
        """The partition of this entity whose storage fault error is (reported to availability), or None."""
        return availability.fault_of(self.namespace.path, self.path, self.partition_count, error)

    @property
    def max_message_bytes(self) -> int:
        kilobytes = self.options.max_message_size_in_kilobytes or self.namespace.limits.max_message_size_in_kilobytes
        return kilobytes * KB

    @property
    def max_header_bytes(self) -> int:
        return self.namespace.limits.max_header_size_in_kilobytes * KB

    @property
    def max_batch_bytes(self) -> int:
        return max(self.namespace.limits.max_batch_size_in_kilobytes * KB, self.max_message_bytes)

    @property
    def max_partition_bytes(self) -> int:
        """What one partition may hold: the tier's per-partition share of max_size_in_megabytes."""
        per_partition = tiers.size_per_partition_mb(self.namespace.tier, self.options.max_size_in_megabytes,
                                                    self.partition_count)
        return min(int(per_partition * MB), self.namespace.limits.max_partition_size_in_kilobytes * KB)

    @property
    def header_copies(self) -> int:
        """A topic stores header bytes once per subscription: N x (body + header x subscriptions)."""
        return self.subscription_count if self.kind == "topic" else 1


def resolve(root: str, snap: Snapshot, path: str, kinds: tuple[str, ...]) -> EntityInfo:
    """The entity at `path` ('<topic>/Subscriptions/<name>' for a subscription) if its kind is in kinds."""
    if not isinstance(path, str):
        raise TypeError(f"entity name must be a str, got {type(path).__name__}")
    row = snap.get(key(path))
    if row is None or row.kind not in ("queue", "topic", "subscription"):
        raise MessagingEntityNotFoundError(f"no queue, topic or subscription {path!r} in namespace {root}")
    if row.kind not in kinds:
        raise InvalidOperationError(f"{path!r} is a {row.kind}; this operation needs a {' or '.join(kinds)}")
    subs = len(snap.children(row.key, "subscription")) if row.kind == "topic" else 0
    return EntityInfo(kind=row.kind, path=row.path, partition_count=row.partition_count,
                      options=entities.EntityOptions.from_stored(row.properties), tables=table_uris(root, row),
                      namespace=namespace_properties(snap.rows[NAMESPACE_KEY], root),
                      unavailable=frozenset(unavailable_partitions(snap, row.key, row.partition_count)),
                      subscription_count=subs)


def resolve_current(catalog: Catalog, path: str, kinds: tuple[str, ...]) -> EntityInfo:
    return resolve(catalog.root, catalog.snapshot(), path, kinds)


# Entity settings are re-read at most this often by senders and receivers, so a status change or a
# partition fault reaches clients that already exist within a second; new clients start from the catalog.
SETTINGS_REFRESH_SECONDS = 1.0


class CachedEntity:
    """An entity's settings for a long-lived sender or receiver, refreshed at most once a second."""

    def __init__(self, catalog: Catalog, path: str, kinds: tuple[str, ...]) -> None:
        self._catalog, self.path, self._kinds = catalog, path, kinds
        self._info: Optional[EntityInfo] = None
        self._read_at = 0.0

    def get(self) -> EntityInfo:
        if self._info is None or time.monotonic() - self._read_at > SETTINGS_REFRESH_SECONDS:
            self._info = resolve_current(self._catalog, self.path, self._kinds)
            self._read_at = time.monotonic()
        return self._info
