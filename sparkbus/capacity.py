"""Capacity planning: how many messages of a given size a queue or topic holds before sends raise
ServiceBusQuotaExceededError, by the accounting sparkbus's size quotas use (body + header bytes, headers
once per subscription in a topic), next to Service Bus's published measurements."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .core.capacity import CapacityPlan, estimate_header_size, plan_capacity

__all__ = ["CapacityPlan", "SeedRow", "MEASURED_QUEUE_CAPACITY", "plan", "format_plan", "seed_table",
           "format_seed_table"]

KB = 1024
# Service Bus's published measurements (its capacity-planning guidance): how many messages of random bytes
# of each size (KB) one queue of 1, 2, 3, 4 and 5 GB held.
QUEUE_SIZES_GB = (1, 2, 3, 4, 5)
MEASURED_QUEUE_CAPACITY = {
    1: (1_041_790, 2_059_920, 3_128_550, 4_186_400, 5_238_750),
    10: (102_996, 208_358, 312_537, 416_716, 520_895),
    50: (20_857, 41_792, 62_507, 83_343, 104_179),
    100: (10_466, 20_836, 31_254, 41_672, 52_090),
    250: (4_191, 8_334, 12_501, 16_669, 20_836),
}


def plan(body_size: int, *, header_size: Optional[int] = None, application_properties: Optional[dict[str, Any]] = None,
         max_size_in_megabytes: int = 1024, tier: str = "standard", enable_partitioning: bool = False,
         subscriptions: int = 0, partition_count: Optional[int] = None,
         max_partition_size_in_bytes: Optional[int] = None) -> CapacityPlan:
    """Plan a queue (subscriptions=0) or a topic with that many subscriptions for messages of body_size bytes.

    Args:
        body_size: The messages' body size in bytes.
        header_size: Their header size in bytes (ServiceBusMessage(...).size_in_bytes - body length gives it for
            any message); default: estimated from application_properties.
        application_properties: The messages' application properties: the header is estimated for a message
            with these and a default message id (not with header_size).
        max_size_in_megabytes: As in queue creation.
        tier: As in queue creation: "basic", "standard" or "premium".
        enable_partitioning: As in queue creation.
        subscriptions: 0 plans a queue; more, a topic with that many subscriptions.
        partition_count: The premium namespace's partition count.
        max_partition_size_in_bytes: Caps each partition (as a namespace's max_partition_size_in_kilobytes
            override).

    Returns:
        The plan: what is stored per message, per partition, and how many messages fit.

    Raises:
        TypeError: an invalid argument (the message says what is allowed).
        ValueError: an invalid argument (the message says what is allowed), or both header_size and
            application_properties.
        MessageSizeExceededError: a message over the tier's size limit.
    """
    if header_size is not None and application_properties is not None:
        raise ValueError("give header_size or application_properties (to estimate the header), not both")
    if header_size is None:
        header_size = estimate_header_size(application_properties)
    return plan_capacity(body_size, header_size, max_size_in_megabytes=max_size_in_megabytes, tier=tier,
                         enable_partitioning=enable_partitioning, subscriptions=subscriptions,
                         partition_count=partition_count, max_partition_size_in_bytes=max_partition_size_in_bytes)


def format_plan(p: CapacityPlan) -> str:
    """A plan as text: what is stored per message, per partition, and how many messages fit.

    Args:
        p: A plan, as plan returns it.

    Returns:
        The plan's text.
    """
    copies = f" x {p.subscriptions} subscriptions" if p.kind == "topic" else ""
    partitions = f"{p.partitions} partition{'s' if p.partitions > 1 else ''}"
    return "\n".join([
        f"{p.kind}, {p.tier} tier, {partitions} of {p.partition_bytes:,} bytes = {p.entity_bytes:,} bytes",
        f"message: {p.body_size:,} body + {p.header_size:,} header bytes = {p.message_size:,} bytes",
        f"stored per message: {p.body_size:,} + {p.header_size:,}{copies} = {p.bytes_per_message:,} bytes",
        f"messages per partition: {p.messages_per_partition:,}",
        f"messages: {p.messages:,}",
    ])


@dataclass(frozen=True)
class SeedRow:
    """One cell of Service Bus's measured table next to sparkbus's plan for the same queue."""

    message_kilobytes: int
    queue_gigabytes: int
    measured: int  # messages Service Bus held
    planned: CapacityPlan  # sparkbus, a queue without partitioning
    partitioned: CapacityPlan  # sparkbus, a partitioned standard queue: 16 partitions of the size each

    @property
    def ratio(self) -> float:
        """sparkbus's count over Service Bus's."""
        return self.planned.messages / self.measured


def seed_table() -> list[SeedRow]:
    """Messages of 1, 10, 50, 100 and 250 KB of body (default header) in standard queues of 1 to 5 GB."""
    return [SeedRow(kb, gb, measured, plan(kb * KB, max_size_in_megabytes=gb * KB),
                    plan(kb * KB, max_size_in_megabytes=gb * KB, enable_partitioning=True))
            for kb, counts in MEASURED_QUEUE_CAPACITY.items() for gb, measured in zip(QUEUE_SIZES_GB, counts)]


def format_seed_table(rows: Optional[list[SeedRow]] = None) -> str:
    """seed_table() (or rows) as an aligned text table.

    Args:
        rows: The rows to show; default: seed_table().

    Returns:
        The table's text.
    """
    rows = seed_table() if rows is None else rows
    head = ("message", "queue", "Service Bus measured", "sparkbus", "sparkbus/measured", "sparkbus partitioned (x16)")
    cells = [head] + [(f"{r.message_kilobytes} KB", f"{r.queue_gigabytes} GB", f"{r.measured:,}",
                       f"{r.planned.messages:,}", f"{r.ratio:.3f}", f"{r.partitioned.messages:,}") for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(head))]
    lines = ["  ".join(v.rjust(w) if i > 1 else v.ljust(w) for i, (v, w) in enumerate(zip(row, widths))).rstrip()
             for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
