"""Sequence numbers: per partition, gap-free, strictly increasing in commit order, starting at 1.

sequence_number = (partition_id << 48) | n. A send reads each touched partition's high-water mark n from
the Delta add actions' max statistics (no data scan: sparkbus.storage.high_water_marks), numbers its rows hwm+1.., and commits claiming
exactly "partition p, sequence_number > hwm" for each touched partition (a direct commit's claim, or a
delta-rs write's predicate: commit_predicate). The commit is rejected if any other writer added rows to
those partitions since the snapshot, and the send is renumbered and retried; writers of different
partitions never conflict.

Rule for whoever removes message rows (retention): the row holding a partition's highest sequence
number must stay, or the high-water mark would fall and numbers would repeat.
"""
from __future__ import annotations

from typing import Iterable, Optional

import numpy as np

PARTITION_SHIFT = 48
LOW_MASK = (1 << PARTITION_SHIFT) - 1


def compose(partition_id: int, n: int) -> int:
    return (partition_id << PARTITION_SHIFT) | n


def partition_of_sequence(sequence_number: int) -> int:
    return sequence_number >> PARTITION_SHIFT


def high_water_marks(tops: Iterable[tuple[int, Optional[int]]]) -> dict[int, int]:
    """Per partition, the highest n (low bits) among (partition, a data file's max sequence number) pairs;
    files without that statistic are skipped, partitions without any are absent."""
    marks: dict[int, int] = {}
    for partition, top in tops:
        if top is not None:
            marks[partition] = max(marks.get(partition, 0), int(top) & LOW_MASK)
    return marks


def number(partitions: np.ndarray, marks: dict[int, int]) -> tuple[np.ndarray, dict[int, tuple[int, int]]]:
    """Sequence numbers for rows placed in `partitions`, in row order within each partition.

    Returns the numbers and, per touched partition, the (first, last) sequence numbers assigned.
    """
    sequence = np.zeros(len(partitions), dtype=np.int64)
    ranges = {}
    for pid in np.unique(partitions).tolist():
        where = np.flatnonzero(partitions == pid)
        start = marks.get(pid, 0) + 1
        sequence[where] = (pid << PARTITION_SHIFT) | np.arange(start, start + len(where), dtype=np.int64)
        ranges[pid] = (compose(pid, start), compose(pid, start + len(where) - 1))
    return sequence, ranges


def commit_predicate(marks: dict[int, int], partitions: list[int]) -> str:
    """The region a send may write and must find untouched: above each touched partition's mark."""
    return " OR ".join(f"(partition_id = {p} AND sequence_number > {compose(p, marks.get(p, 0))})"
                       for p in sorted(partitions))
