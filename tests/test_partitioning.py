"""Partition assignment: the exact placement function, precedence, round-robin, and the Spark UDF."""
from __future__ import annotations

import random

import mmh3
import numpy as np
import pyarrow as pa
import pytest

from sparkbus import InvalidOperationError, PartitionUnavailableError
from sparkbus.core.partitioning import (KEY_MISMATCH, KEYLESS, KEYLESS_RUN, RoundRobin, keyless_files, partition_codes, partition_key, partition_of,
                                        resolve)


def test_hash_is_exactly_the_contract():
    for key in ("a", "session-1", "ключ", "鍵", "🙂", ""):
        assert partition_of(key, 16) == mmh3.hash(key.encode("utf-8"), seed=0, signed=False) % 16
    assert partition_of("orders-42", 1) == 0


def test_precedence():
    assert partition_key("s", None, "m", True) == "s"
    assert partition_key("s", "s", "m", True) == "s"
    assert partition_key(None, "k", "m", True) == "k"
    assert partition_key(None, None, "m", True) == "m"
    assert partition_key(None, None, "m", False) is None
    with pytest.raises(InvalidOperationError, match="must be identical"):
        partition_key("s", "k", None, False)


def test_files_of_keyless_messages_share_a_partition_until_they_fill_a_run():
    available = [p for p in range(16) if p != 5]
    small = keyless_files([53, 54, 53], available, RoundRobin(16))  # one send's few keyless messages stay together
    assert len(set(small)) == 1 and small[0] != 5
    halves = keyless_files([KEYLESS_RUN // 2] * 6, available, RoundRobin(16))
    assert [halves.count(p) for p in dict.fromkeys(halves)] == [2, 2, 2]  # two files fill a run
    rr = RoundRobin(16)
    big = keyless_files([62_500] * 15, available, rr)  # each file beyond a run ends it: the next partition
    assert sorted(big) == available
    assert keyless_files([1], available, rr) == [available[(available.index(big[-1]) + 1) % 15]]
    assert keyless_files([], [], rr) == []
    with pytest.raises(PartitionUnavailableError, match="no partition"):
        keyless_files([1], [], rr)


def test_codes():
    codes = partition_codes(["s", None, None, None, "a"], [None, "k", None, None, "b"], ["m1", "m2", "m3", "m4", "m5"],
                            True, 16)
    assert codes[:4] == [partition_of("s", 16), partition_of("k", 16), partition_of("m3", 16), partition_of("m4", 16)]
    assert codes[4] == KEY_MISMATCH
    assert partition_codes([None], [None], ["m"], False, 16) == [KEYLESS]


def test_round_robin_is_even_and_skips_unavailable():
    rr = RoundRobin(16)
    sends = [resolve([KEYLESS] * 100, {3, 7}, rr, 16) for _ in range(14)]
    assert all(len(set(placed.tolist())) == 1 for placed in sends)  # a send's keyless messages stay together
    counts = np.bincount(np.concatenate(sends), minlength=16)
    assert counts[3] == counts[7] == 0 and set(np.delete(counts, [3, 7]).tolist()) == {100}
    big = resolve([KEYLESS] * (2 * KEYLESS_RUN + 500), {3, 7}, rr, 16)  # runs of KEYLESS_RUN, then the rest
    runs = [int(big[i]) for i in (0, KEYLESS_RUN, 2 * KEYLESS_RUN)]
    assert [int(np.sum(big == p)) for p in runs] == [KEYLESS_RUN, KEYLESS_RUN, 500]
    available = [p for p in range(16) if p not in (3, 7)]
    following = [available[(available.index(runs[0]) + i) % 14] for i in range(3)]
    assert runs == following  # the next available partitions in turn, after where the last send ended
    assert following[0] == available[(available.index(int(sends[-1][0])) + 1) % 14]
    with pytest.raises(PartitionUnavailableError, match=r"\[3\]"):
        resolve([partition_of("x", 16) if partition_of("x", 16) == 3 else 3], {3}, rr, 16)
    with pytest.raises(InvalidOperationError, match="position \\[1\\]"):
        resolve([0, KEY_MISMATCH], set(), rr, 16)


def _random_keys(count: int) -> list[str]:
    rng = random.Random(7)
    alphabet = "abcXYZ019-_ éüßжщ中文鍵🙂"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 24))) for _ in range(count)]


@pytest.mark.spark
def test_udf_and_python_agree_on_100k_keys(spark):
    from pyspark.sql import functions as F

    from sparkbus.spark.dataframes import placement_udf

    keys = _random_keys(100_000)
    assert any(not k.isascii() for k in keys)
    df = spark.createDataFrame(pa.table({"i": pa.array(range(len(keys)), pa.int64()), "k": keys}).to_pandas())
    udf = placement_udf(False, 16)
    got = df.select("i", udf("k", "k", "k").alias("p")).orderBy("i").toArrow()["p"].to_pylist()
    assert got == [partition_of(k, 16) for k in keys]
    none = F.lit(None).cast("string")
    by_message_id = df.select("i", placement_udf(True, 16)(none, none, "k").alias("p")).orderBy("i")
    assert by_message_id.toArrow()["p"].to_pylist() == got
    keyless = df.select(udf(none, none, "k").alias("p")).distinct().toArrow()["p"].to_pylist()
    assert keyless == [KEYLESS]  # without duplicate detection the message id is no key
