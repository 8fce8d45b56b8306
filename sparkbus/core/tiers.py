"""Tier rules and namespace quotas from the seeds (one place for every number).

basic/standard: entities are partitioned or not, chosen at creation, and a partitioned entity has 16
partitions; at most 100 partitioned queues+topics and 10,000 queues+topics per namespace.
premium: the partition count (1, 2 or 4) is fixed at namespace creation and every entity has it.
"""
from __future__ import annotations

from typing import Any

from dataclasses import asdict, dataclass, fields, replace

TIERS = ("basic", "standard", "premium")
STANDARD_PARTITION_COUNT = 16
PREMIUM_PARTITION_COUNTS = (1, 2, 4)
PREMIUM_MESSAGING_UNITS = (1, 2, 4, 8, 16)
STANDARD_SIZES_MB = (1024, 2048, 3072, 4096, 5120)
PREMIUM_SIZES_MB = STANDARD_SIZES_MB + (10240, 20480, 40960, 81920)
PREMIUM_ENTITIES_PER_MESSAGING_UNIT = 1000
PREMIUM_LARGE_MESSAGE_KB = 102_400  # premium entities with 1 partition take messages of up to 100 MB
KB = 1024


@dataclass(frozen=True)
class NamespaceLimits:
    """Quotas of one namespace; seed values are the defaults, tests may lower them."""

    max_entities: int = 10_000
    max_partitioned_entities: int = 100
    max_subscriptions_per_topic: int = 2_000
    max_sql_filters_per_topic: int = 2_000
    max_correlation_filters_per_topic: int = 100_000
    max_message_size_in_kilobytes: int = 256
    max_header_size_in_kilobytes: int = 64
    max_batch_size_in_kilobytes: int = 256
    # Caps what one partition of any entity may hold; the default is the largest entity size, so only a
    # test override (to fill a partition quickly) makes it bind before max_size_in_megabytes does.
    max_partition_size_in_kilobytes: int = 81920 * 1024


def default_limits(tier: str, partition_count: int, messaging_units: int) -> NamespaceLimits:
    """The seed quotas of a tier."""
    if tier != "premium":
        return NamespaceLimits()
    message_kb = 1024
    return NamespaceLimits(
        max_entities=PREMIUM_ENTITIES_PER_MESSAGING_UNIT * messaging_units,
        max_partitioned_entities=PREMIUM_ENTITIES_PER_MESSAGING_UNIT * messaging_units,
        max_message_size_in_kilobytes=message_kb,
        max_batch_size_in_kilobytes=message_kb,
    )


def apply_overrides(limits: NamespaceLimits, overrides: dict[str, Any]) -> NamespaceLimits:
    """Lower quotas by name; only lowering is allowed so tests stay within what Service Bus permits."""
    known = {f.name for f in fields(NamespaceLimits)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise TypeError(f"unknown namespace override(s) {unknown}; allowed: {sorted(known)}")
    for name, value in overrides.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"override {name} must be an int, got {type(value).__name__}")
        ceiling = getattr(limits, name)
        if not 1 <= value <= ceiling:
            raise ValueError(f"override {name}={value} must be between 1 and the tier's quota {ceiling}")
    return replace(limits, **overrides)


def limits_to_dict(limits: NamespaceLimits) -> dict[str, Any]:
    return asdict(limits)


def limits_from_dict(data: dict[str, Any]) -> NamespaceLimits:
    return NamespaceLimits(**data)


def validate_tier(tier: object, partition_count: object, messaging_units: object) -> int:
    """Check the namespace tier arguments; returns the namespace partition count (1 for basic/standard)."""
    if tier not in TIERS:
        raise ValueError(f"tier must be one of {list(TIERS)}, got {tier!r}")
    if isinstance(messaging_units, bool) or not isinstance(messaging_units, int):
        raise TypeError(f"messaging_units must be an int, got {type(messaging_units).__name__}")
    if tier != "premium":
        if partition_count is not None:
            raise ValueError(
                f"partition_count is set at namespace creation only in the premium tier; in {tier} "
                "choose enable_partitioning per entity (16 partitions)"
            )
        if messaging_units != 1:
            raise ValueError(f"messaging_units applies to the premium tier only; {tier} takes 1")
        return 1
    if messaging_units not in PREMIUM_MESSAGING_UNITS:
        raise ValueError(f"premium messaging_units must be one of {list(PREMIUM_MESSAGING_UNITS)}, got {messaging_units!r}")
    count = 1 if partition_count is None else partition_count
    if isinstance(count, bool) or not isinstance(count, int):
        raise TypeError(f"partition_count must be an int, got {type(count).__name__}")
    if count not in PREMIUM_PARTITION_COUNTS:
        raise ValueError(f"premium partition_count must be one of {list(PREMIUM_PARTITION_COUNTS)}, got {count}")
    return count


def largest_message_kb(tier: str, partition_count: int) -> int:
    """The largest message size an entity of the tier can be configured to take."""
    if tier == "premium" and partition_count == 1:
        return PREMIUM_LARGE_MESSAGE_KB
    return default_limits(tier, partition_count, 1).max_message_size_in_kilobytes


def allowed_sizes_mb(tier: str) -> tuple[int, ...]:
    return PREMIUM_SIZES_MB if tier == "premium" else STANDARD_SIZES_MB


def entity_partition_count(tier: str, namespace_partition_count: int, enable_partitioning: bool) -> int:
    """Partitions of a new entity: 16 when partitioned in basic/standard, the namespace's in premium."""
    if tier == "premium":
        return namespace_partition_count
    return STANDARD_PARTITION_COUNT if enable_partitioning else 1


def size_per_partition_mb(tier: str, max_size_in_megabytes: int, partition_count: int) -> float:
    """basic/standard: each partition holds the configured size; premium: the entity total is spread."""
    if tier == "premium":
        return max_size_in_megabytes / partition_count
    return float(max_size_in_megabytes)


def total_size_mb(tier: str, max_size_in_megabytes: int, partition_count: int) -> int:
    if tier == "premium":
        return max_size_in_megabytes
    return max_size_in_megabytes * partition_count
