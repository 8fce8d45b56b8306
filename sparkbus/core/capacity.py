"""Capacity planning: how many messages of one size an entity holds before sends exceed its size quota.

Service Bus's capacity-planning formulas: a queue holds N messages while N x (body + header) <= its size,
a topic while N x (body + header x subscriptions) <= its size. sparkbus applies them per partition, as
its sends do (sparkbus.engine.enqueue): a send is refused when a partition would hold more than its share
of max_size_in_megabytes (basic/standard: each of the 16 partitions of a partitioned entity holds the
configured size; premium: the partitions share it). Body and header bytes are counted by
sparkbus.core.encoding, the functions every send uses, so a plan matches what a filled entity stores.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import pyarrow as pa

from ..exceptions import MessageSizeExceededError
from . import tiers
from .encoding import OUTGOING, header_sizes, new_message_ids
from .values import check_properties, encode_properties

MB = 1024 * 1024


@dataclass(frozen=True)
class CapacityPlan:
    """How many messages of one size fit in a queue or topic, and the numbers that decide it.

    Keyless messages are spread evenly over the partitions (round robin), so every partition fills to
    messages_per_partition; messages with keys fill their own partitions at their own pace.
    """

    kind: str  # "queue" or "topic"
    tier: str
    body_size: int
    header_size: int
    subscriptions: int
    message_size: int  # body + header: what the message size limit checks
    bytes_per_message: int  # what one message adds to the entity: body + header x (1, or subscriptions)
    partitions: int
    partition_bytes: int  # what one partition may hold
    entity_bytes: int  # partitions x partition_bytes
    messages_per_partition: int
    messages: int  # messages_per_partition x partitions


def estimate_header_size(application_properties: Optional[dict[str, Any]] = None) -> int:
    """Header bytes of a message carrying these application properties and a default (uuid4 hex) message
    id, and no other system property; counted as sends count them. TypeError for unsupported values."""
    properties = check_properties(application_properties, "application_properties")
    row = pa.Table.from_pylist([{"message_id": new_message_ids(1)[0].as_py(),
                                 "application_properties": encode_properties(properties)}], schema=OUTGOING)
    return int(header_sizes(row)[0])


def _count(value: object, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _partitions(tier: str, enable_partitioning: object, partition_count: object) -> int:
    """basic/standard: 16 partitions when partitioned, else 1; premium: the namespace's partition_count."""
    if not isinstance(enable_partitioning, bool):
        raise TypeError(f"enable_partitioning must be a bool, got {type(enable_partitioning).__name__}")
    namespace_count = tiers.validate_tier(tier, partition_count, 1)
    if tier == "premium" and enable_partitioning and namespace_count == 1:
        raise ValueError("premium partitioning is chosen with the namespace's partition_count "
                         f"({', '.join(map(str, tiers.PREMIUM_PARTITION_COUNTS[1:]))}), not enable_partitioning")
    return tiers.entity_partition_count(tier, namespace_count, enable_partitioning)


def plan_capacity(body_size: int, header_size: int, *, max_size_in_megabytes: int = 1024, tier: str = "standard",
                  enable_partitioning: bool = False, subscriptions: int = 0, partition_count: Optional[int] = None,
                  max_partition_size_in_bytes: Optional[int] = None) -> CapacityPlan:
    """Plan a queue (subscriptions=0) or a topic with that many subscriptions.

    max_size_in_megabytes must be one of the tier's sizes; partition_count is the premium namespace's (1, 2
    or 4; None elsewhere); max_partition_size_in_bytes caps each partition below its share, as a namespace's
    max_partition_size_in_kilobytes override does. Invalid arguments raise TypeError/ValueError naming what
    is allowed; a message (or header) over the tier's largest size raises MessageSizeExceededError, as
    sending it would.
    """
    body_size = _count(body_size, "body_size", 0)
    header_size = _count(header_size, "header_size", 0)
    subscriptions = _count(subscriptions, "subscriptions", 0)
    partitions = _partitions(tier, enable_partitioning, partition_count)
    sizes = tiers.allowed_sizes_mb(tier)
    if _count(max_size_in_megabytes, "max_size_in_megabytes", 1) not in sizes:
        raise ValueError(f"max_size_in_megabytes must be one of {list(sizes)} in the {tier} tier, "
                         f"got {max_size_in_megabytes!r}")
    if tier == "basic" and subscriptions:
        raise ValueError("the basic tier has queues only: subscriptions must be 0")
    limits = tiers.default_limits(tier, partitions, 1)
    header_limit = limits.max_header_size_in_kilobytes * tiers.KB
    message_limit = tiers.largest_message_kb(tier, partitions) * tiers.KB
    if header_size > header_limit:
        raise MessageSizeExceededError(f"message header of {header_size} bytes exceeds the {header_limit}-byte limit")
    if body_size + header_size > message_limit:
        raise MessageSizeExceededError(f"message of {body_size + header_size} bytes exceeds the {message_limit}-byte "
                                       f"message size limit of the {tier} tier")
    partition_bytes = int(tiers.size_per_partition_mb(tier, max_size_in_megabytes, partitions) * MB)
    if max_partition_size_in_bytes is not None:
        partition_bytes = min(partition_bytes, _count(max_partition_size_in_bytes, "max_partition_size_in_bytes", 1))
    bytes_per_message = body_size + header_size * (subscriptions or 1)
    if bytes_per_message == 0:
        raise ValueError("a message of 0 body and 0 header bytes stores nothing: the capacity is unbounded")
    per_partition = partition_bytes // bytes_per_message
    return CapacityPlan(kind="topic" if subscriptions else "queue", tier=tier, body_size=body_size,
                        header_size=header_size, subscriptions=subscriptions, message_size=body_size + header_size,
                        bytes_per_message=bytes_per_message, partitions=partitions, partition_bytes=partition_bytes,
                        entity_bytes=partition_bytes * partitions, messages_per_partition=per_partition,
                        messages=per_partition * partitions)
