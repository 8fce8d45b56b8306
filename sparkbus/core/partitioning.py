"""Partition assignment (exact and stable across releases).

Key precedence: session_id > partition_key > message_id (only when the entity requires duplicate
detection) > none. A keyed message goes to mmh3(key, seed 0, unsigned) % partition_count. Keyless ones
are placed round-robin over the available partitions, a send's keyless messages together: up to
KEYLESS_RUN of them on one partition, then the next one (each partition a send writes costs a data file
and its fsync, so a batch spread message by message over 16 partitions paid 16 of each; sends still fill
the partitions evenly, run after run). `partition_codes` is the one implementation: the
Python send path calls it on a list, and the Spark UDF calls it on each Arrow batch.
"""
from __future__ import annotations

import random
from typing import Optional, Sequence, Union

import mmh3
import numpy as np
import pyarrow as pa

from ..exceptions import InvalidOperationError, PartitionUnavailableError

KEYLESS = -1
KEY_MISMATCH = -2
KEYLESS_RUN = 1000  # keyless messages of one send placed on one partition before the next is used


def partition_key(session_id: Optional[str], partition_key: Optional[str], message_id: Optional[str],
                  requires_duplicate_detection: bool) -> Optional[str]:
    """The key that pins a message to a partition, or None; a session/partition key mismatch is invalid."""
    if session_id is not None:
        if partition_key is not None and partition_key != session_id:
            raise InvalidOperationError(
                f"partition_key {partition_key!r} differs from session_id {session_id!r}; when both are set "
                "they must be identical")
        return session_id
    if partition_key is not None:
        return partition_key
    if requires_duplicate_detection and message_id is not None:
        return message_id
    return None


def partition_of(key: str, partition_count: int) -> int:
    return mmh3.hash(key.encode("utf-8"), seed=0, signed=False) % partition_count


def partition_codes(session_ids: Sequence[Optional[str]], partition_keys: Sequence[Optional[str]],
                    message_ids: Sequence[Optional[str]], requires_duplicate_detection: bool,
                    partition_count: int) -> list[int]:
    """Per message: its partition, KEYLESS (-1), or KEY_MISMATCH (-2) for session_id != partition_key."""
    codes = []
    for session_id, key, message_id in zip(session_ids, partition_keys, message_ids):
        if session_id is not None and key is not None and key != session_id:
            codes.append(KEY_MISMATCH)
            continue
        chosen = session_id if session_id is not None else key
        if chosen is None and requires_duplicate_detection:
            chosen = message_id
        codes.append(KEYLESS if chosen is None else partition_of(chosen, partition_count))
    return codes


def table_codes(rows: pa.Table, requires_duplicate_detection: bool, partition_count: int) -> np.ndarray:
    """partition_codes over the session_id, partition_key and message_id columns of an Arrow table."""
    n = rows.num_rows
    if rows["session_id"].null_count == n and rows["partition_key"].null_count == n and not requires_duplicate_detection:
        return np.full(n, KEYLESS, dtype=np.int32)  # no row carries a key
    return np.asarray(partition_codes(rows["session_id"].to_pylist(), rows["partition_key"].to_pylist(),
                                      rows["message_id"].to_pylist(), requires_duplicate_detection, partition_count),
                      dtype=np.int32)


class RoundRobin:
    """Places keyless messages round-robin over the available partitions, starting at a random one: each
    take() (one send's keyless messages) in runs of up to KEYLESS_RUN per partition, the next run and the
    next take() on the next partition."""

    def __init__(self, partition_count: int) -> None:
        self._next = random.randrange(partition_count)

    def take(self, count: int, available: Sequence[int]) -> np.ndarray:
        """The partitions of `count` keyless messages of one send. PartitionUnavailableError when no
        partition is available."""
        if not available:
            raise PartitionUnavailableError("no partition of the entity is available")
        runs = np.arange(count, dtype=np.int64) // KEYLESS_RUN
        positions = (self._next + runs) % len(available)
        self._next += -(-count // KEYLESS_RUN)
        return np.asarray(available, dtype=np.int32)[positions]


def keyless_files(counts: Sequence[int], available: Sequence[int], round_robin: RoundRobin) -> list[int]:
    """The partitions of files of keyless messages, each placed whole (a bulk send's executors wrote them
    before placement: storage.unnumbered), in order: consecutive files share a partition until together
    they hold KEYLESS_RUN messages; the file that reaches it ends the run, and the next goes on the next
    partition. PartitionUnavailableError when no partition is available."""
    if not counts:
        return []
    if not available:
        raise PartitionUnavailableError("no partition of the entity is available")
    placed, held, run = [], 0, round_robin.take(1, available)[0]
    for count in counts:
        if held >= KEYLESS_RUN:
            run, held = round_robin.take(1, available)[0], 0
        placed.append(int(run))
        held += count
    return placed


def resolve(given: Union[Sequence[int], np.ndarray], unavailable: set[int], round_robin: RoundRobin, partition_count: int) -> np.ndarray:
    """Final partitions: keyless ones round-robin over available partitions; pinned ones must be available."""
    codes = np.asarray(given, dtype=np.int32)
    mismatched = np.flatnonzero(codes == KEY_MISMATCH)
    if mismatched.size:
        raise InvalidOperationError(
            f"partition_key differs from session_id in message(s) at position {mismatched[:5].tolist()}; when "
            "both are set they must be identical")
    pinned_down = sorted(set(np.unique(codes[codes >= 0]).tolist()) & set(unavailable))
    if pinned_down:
        raise PartitionUnavailableError(
            f"partition(s) {pinned_down} unavailable: messages with a session id, partition key or (with "
            "duplicate detection) message id are pinned to them; send without a key to use another partition")
    keyless = np.flatnonzero(codes == KEYLESS)
    result: np.ndarray = codes.copy()
    if keyless.size:
        available = [p for p in range(partition_count) if p not in unavailable]
        result[keyless] = round_robin.take(keyless.size, available)
    return result
