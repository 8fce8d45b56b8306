"""Namespaces: a directory holding the catalog table and one directory of Delta tables per entity.

Creating a namespace is claiming version 0 of its catalog (Catalog.create, put-if-absent): of processes or
threads creating the same path at once exactly one succeeds, and the others get
MessagingEntityAlreadyExistsError, whatever tier each asked for. A creator writes nothing outside the
catalog directory before its claim succeeded, so another creator that finds files there knows a namespace
was claimed.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from types import EllipsisType
from typing import Optional, Union

from ..core import throttling, tiers
from ..core.connection import namespace_location, parse_connection_string
from ..exceptions import MessagingEntityAlreadyExistsError, MessagingEntityNotFoundError
from .. import storage
from ..storage import location
from ..core.schemas import ENTITY_TABLES
from .catalog import CATALOG_DIR, NAMESPACE_KEY, Catalog, Change, Row, Snapshot
from . import context
from .throttle import Governor, set_budget

# 2: messages tables carry the forwarding columns (core.schemas.TRANSFER_COLUMNS); 3: and body_type
# (AMQP sequence and value bodies); 4: and the born_dead_letter columns of fan-out's dead-letter copies.
# Namespaces of older versions are upgraded in place when first opened (see _upgrade).
FORMAT_VERSION = 4


@dataclass(frozen=True)
class NamespaceProperties:
    """What create_namespace fixed: tier, partitioning, throttling credits and quotas."""

    path: str
    tier: str
    partition_count: int
    messaging_units: int
    credits_per_second: Optional[int]
    limits: tiers.NamespaceLimits
    created_at_utc: datetime

    @property
    def name(self) -> str:
        return os.path.basename(self.path.rstrip("/"))

    @property
    def budget(self) -> throttling.Budget:
        """Credits per second (basic, standard) or the governor's limits (premium)."""
        return throttling.budget(self.tier, self.credits_per_second, self.messaging_units)


# The largest credit budget: far above what any machine serves (a credit is one message), and within the
# signed 64-bit fields of the throttle ledger (sparkbus.engine.throttle) with room for its balance.
MAX_CREDITS_PER_SECOND = 1_000_000_000


def _check_credits(credits_per_second: object, tier: str) -> Optional[int]:
    """credits_per_second as stored: None (no credit throttling) or an int in 1..MAX_CREDITS_PER_SECOND;
    TypeError or ValueError otherwise, raised before anything is written."""
    if credits_per_second is None:
        return None
    if isinstance(credits_per_second, bool) or not isinstance(credits_per_second, int):
        raise TypeError(f"credits_per_second must be an int or None, got {type(credits_per_second).__name__}")
    if not 1 <= credits_per_second <= MAX_CREDITS_PER_SECOND:
        raise ValueError(f"credits_per_second must be between 1 and {MAX_CREDITS_PER_SECOND} (or None to switch "
                         f"credit throttling off), got {credits_per_second}")
    return credits_per_second if tier != "premium" else None


def create_namespace(path: str, *, tier: str = "standard", partition_count: Optional[int] = None,
                     messaging_units: int = 1, credits_per_second: Optional[int] = 1000,
                     storage_options: Optional[dict[str, str]] = None, **overrides: int) -> NamespaceProperties:
    """Create a namespace: its catalog, limits and throttling budget.

    Args:
        path: A local directory or file:// URI, or an object-store prefix (az://, abfs(s)://, s3://).
        tier: "basic", "standard" or "premium".
        partition_count: Premium: 1, 2 or 4 partitions for every entity (basic and standard choose
            partitioning per entity).
        messaging_units: Premium: 1, 2, 4, 8 or 16.
        credits_per_second: The basic/standard throttling budget; None turns credit throttling off
            (premium is not credit-throttled).
        storage_options: An object-store namespace's credentials (default: the environment's; see
            storage.location).
        **overrides: Lower quotas (see tiers.NamespaceLimits), for tests.

    Returns:
        The namespace's properties.

    Raises:
        MessagingEntityAlreadyExistsError: a namespace exists there, or another caller created one first
            while this call ran (nothing of this call stays behind).
        ValueError: a tier, partition count, messaging units or budget that is not allowed.
    """
    root = namespace_root(path, storage_options)
    count = tiers.validate_tier(tier, partition_count, messaging_units)
    credits = _check_credits(credits_per_second, tier)
    limits = tiers.apply_overrides(tiers.default_limits(tier, count, messaging_units), overrides)
    location.check_creatable(root)
    catalog = Catalog(root)
    if catalog.exists():
        raise MessagingEntityAlreadyExistsError(f"a namespace already exists at {root}")
    if _holds_more_than_a_catalog(root):
        if catalog.exists():  # claimed meanwhile: its creator writes beside the catalog after its claim
            raise MessagingEntityAlreadyExistsError(f"a namespace already exists at {root}")
        raise ValueError(f"{root} exists and is not an empty directory; a namespace needs a new or empty directory")
    if location.is_local(root):
        os.makedirs(root, exist_ok=True)
    row = Row(key=NAMESPACE_KEY, kind="namespace", path=root, partition_count=count, properties={
        "format_version": FORMAT_VERSION, "tier": tier, "messaging_units": messaging_units,
        "credits_per_second": credits, "limits": tiers.limits_to_dict(limits),
    })
    try:
        catalog.create(row)
    except FileExistsError:
        raise MessagingEntityAlreadyExistsError(f"a namespace already exists at {root}") from None
    props = namespace_properties(row, root)
    set_budget(root, props.budget)
    return props


def _holds_more_than_a_catalog(root: str) -> bool:
    """Whether anything but the catalog directory is at root: that directory may hold the files of a
    creator racing this one (or of one that died before its claim), which do not make root taken."""
    if location.is_empty(root):
        return False
    if location.is_local(root):
        return not os.path.isdir(root) or any(name != CATALOG_DIR for name in os.listdir(root))
    inside = location.join(root, CATALOG_DIR) + "/"
    return any(not uri.startswith(inside) for uri in location.listing(root))


def update_namespace(catalog: Catalog, *, messaging_units: Optional[int] = None,
                     credits_per_second: Union[int, None, EllipsisType] = ...) -> NamespaceProperties:
    """Scale a premium namespace (messaging_units) or change a basic/standard one's credit budget
    (credits_per_second; None switches throttling off). Takes effect at every client's next operation.
    Arguments that do not apply to the tier -> ValueError, and nothing changes."""
    if messaging_units is None and credits_per_second is ...:
        raise TypeError("update_namespace takes messaging_units= (premium) or credits_per_second= (basic, standard)")

    def decide(snap: Snapshot) -> Change[Row]:
        row = snap.rows[NAMESPACE_KEY]
        p = row.properties
        units, credits = p["messaging_units"], p["credits_per_second"]
        if messaging_units is not None:
            tiers.validate_tier(p["tier"], row.partition_count if p["tier"] == "premium" else None, messaging_units)
            units = messaging_units
        if credits_per_second is not ...:
            if p["tier"] == "premium":
                raise ValueError("credits_per_second applies to basic and standard namespaces; premium is "
                                 "governed by its messaging units")
            credits = _check_credits(credits_per_second, p["tier"])
        return Change(upserts=[row.updated({**p, "messaging_units": units, "credits_per_second": credits})],
                      result=row)

    catalog.transact(decide)
    props = namespace_properties(catalog.snapshot().rows[NAMESPACE_KEY], catalog.root)
    set_budget(catalog.root, props.budget)
    return props


def governor_of(catalog: Catalog) -> Governor:
    """The process's governor of the catalog's namespace (sparkbus.engine.throttle), kept in its context
    (sparkbus.engine.context)."""
    def properties() -> NamespaceProperties:
        return namespace_properties(catalog.snapshot().rows[NAMESPACE_KEY], catalog.root)

    return context.governor(catalog.root, lambda: properties().budget)


def namespace_properties(row: Row, root: str) -> NamespaceProperties:
    p = row.properties
    return NamespaceProperties(path=root, tier=p["tier"], partition_count=row.partition_count,
                               messaging_units=p["messaging_units"], credits_per_second=p["credits_per_second"],
                               limits=tiers.limits_from_dict(p["limits"]), created_at_utc=row.created_at_utc)


def open_connection(conn_str: str) -> tuple[Catalog, Optional[str]]:
    """The catalog of the namespace a connection string names, and its EntityPath (or None)."""
    info = parse_connection_string(conn_str)
    return open_catalog(info.fully_qualified_namespace), info.entity_path


def namespace_root(path: object, storage_options: Optional[dict[str, str]]) -> str:
    """The normalized namespace location, its storage options registered for this process, refused if its
    store cannot commit safely (TypeError, ValueError)."""
    root = location.normalize(path)
    location.register_options(root, storage_options)
    location.check_safe(root)
    return root


def open_namespace(fully_qualified_namespace: str, credential: object = None,
                   storage_options: Optional[dict[str, str]] = None) -> Catalog:
    """What a client opens: the namespace at a location (also 'sparkbus://...' or 'sparkbus+az://...'), with
    a credential's storage options (storage.location.credential_options) under any given explicitly."""
    path = namespace_location(fully_qualified_namespace)
    root = location.normalize(path)
    return open_catalog(root, {**location.credential_options(root, credential), **(storage_options or {})})


def use_storage_options(fully_qualified_namespace: str, storage_options: dict[str, str]) -> None:
    """Storage options (account key, SAS token, ...) for every client of this process that opens the
    namespace at that location without options of its own (the command line's --storage-option)."""
    location.register_options(location.normalize(namespace_location(fully_qualified_namespace)), storage_options)


def open_catalog(path: str, storage_options: Optional[dict[str, str]] = None) -> Catalog:
    """The catalog of an existing namespace; MessagingEntityNotFoundError naming the path otherwise."""
    root = namespace_root(path, storage_options)
    catalog = Catalog(root)
    if not catalog.exists():
        raise MessagingEntityNotFoundError(f"no sparkbus namespace at {root} (create it with `sparkbus namespace create "
                                           f"--namespace {root}` or sparkbus.create_namespace)")
    _upgrade(catalog)
    return catalog


def _upgrade(catalog: Catalog) -> None:
    """Bring a namespace written by an older sparkbus to FORMAT_VERSION: add the columns its entities'
    tables lack, then record the version. Every step can be repeated, so processes opening the namespace
    at once, or one that dies half way, leave it consistent (the version is recorded last)."""
    snap = catalog.snapshot()
    if snap.rows[NAMESPACE_KEY].properties.get("format_version", 1) >= FORMAT_VERSION:
        return
    for entity in snap.of_kind("queue", "topic", "subscription"):
        assert entity.storage is not None  # an entity's row names its storage directory
        for role, schema in ENTITY_TABLES.items():
            storage.add_missing_columns(location.join(catalog.root, entity.storage, role), schema)

    def record(current: Snapshot) -> Change[None]:
        row = current.rows[NAMESPACE_KEY]
        return Change(upserts=[row.updated({**row.properties, "format_version": FORMAT_VERSION})])

    catalog.transact(record)
