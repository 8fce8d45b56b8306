"""Property-based tests (hypothesis) of the rules every message goes through: partition placement,
sequence numbering (pure, and under concurrent senders on a real queue), and message size accounting.
No Spark."""
from __future__ import annotations

import threading
import uuid
from collections import Counter
from datetime import timedelta

import numpy as np
import pytest
from deltalake import DeltaTable
from hypothesis import given, settings
from hypothesis import strategies as st

import sparkbus
from sparkbus import ServiceBusClient, ServiceBusMessage
from sparkbus.core import partitioning, sequencing
from sparkbus.core.encoding import body_sizes, header_sizes
from sparkbus.message import ServiceBusMessageBatch, to_outgoing

IDS = st.none() | st.text(min_size=1, max_size=20)
COUNTS = st.sampled_from([1, 2, 4, 16])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(IDS, IDS, IDS), max_size=30), st.booleans(), COUNTS)
def test_placement_is_deterministic_in_range_and_follows_the_key_precedence(messages, dedup, count):
    sessions, keys, ids = (list(column) for column in zip(*messages)) if messages else ([], [], [])
    codes = partitioning.partition_codes(sessions, keys, ids, dedup, count)
    assert codes == partitioning.partition_codes(sessions, keys, ids, dedup, count)  # the same on every machine
    for (session, key, message_id), code in zip(messages, codes):
        if session is not None and key is not None and key != session:
            assert code == partitioning.KEY_MISMATCH
            continue
        chosen = session if session is not None else key if key is not None else message_id if dedup else None
        assert code == (partitioning.KEYLESS if chosen is None else partitioning.partition_of(chosen, count))
        assert code == partitioning.KEYLESS or 0 <= code < count


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=2_500), min_size=1, max_size=40),
       st.sets(st.integers(min_value=0, max_value=15), max_size=15), st.integers(min_value=0, max_value=10_000))
def test_keyless_sends_go_round_robin_in_runs_and_never_onto_an_unavailable_partition(sends, down, start):
    """Each send's keyless messages fill runs of KEYLESS_RUN on one partition each, run after run on the next
    available partition, so the partitions take runs in turn: their run counts differ by at most one."""
    run = partitioning.KEYLESS_RUN
    rr = partitioning.RoundRobin(16)  # starts at a random partition
    rr.take(start, list(range(16)))  # and wherever earlier sends left it
    available = [p for p in range(16) if p not in down]
    runs: list[int] = []
    for count in sends:
        placed = partitioning.resolve([partitioning.KEYLESS] * count, down, rr, 16).tolist()
        chunks = [placed[i:i + run] for i in range(0, count, run)]
        assert all(len(set(chunk)) == 1 for chunk in chunks)
        runs += [chunk[0] for chunk in chunks]
    assert not set(runs) & down
    assert all(available[(available.index(a) + 1) % len(available)] == b for a, b in zip(runs, runs[1:]))
    taken = Counter(runs)
    assert max(taken.values()) - min(taken.get(p, 0) for p in available) <= 1


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=15), max_size=200),
       st.dictionaries(st.integers(min_value=0, max_value=15), st.integers(min_value=0, max_value=2 ** 40)))
def test_numbering_continues_each_partition_gap_free_in_row_order(partitions, marks):
    numbers, ranges = sequencing.number(np.asarray(partitions, dtype=np.int32), marks)
    for p in set(partitions):
        mine = [int(n) for n, q in zip(numbers, partitions) if q == p]
        assert all(sequencing.partition_of_sequence(n) == p for n in mine)
        low = [n & sequencing.LOW_MASK for n in mine]
        assert low == list(range(marks.get(p, 0) + 1, marks.get(p, 0) + 1 + len(mine)))  # gap-free, in order
        assert ranges[p] == (mine[0], mine[-1])
    assert len(set(numbers.tolist())) == len(partitions)  # unique across partitions too


PROPERTY_VALUES = st.integers(min_value=-2 ** 63, max_value=2 ** 63 - 1) | st.text(max_size=30) | st.booleans() \
    | st.floats(allow_nan=False) | st.binary(max_size=30)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=2000) | st.text(max_size=500), st.dictionaries(st.text(min_size=1, max_size=10),
                                                                        PROPERTY_VALUES, max_size=5),
       IDS, st.booleans())
def test_a_message_size_is_its_body_and_header_bytes_and_grows_with_what_it_carries(body, properties, subject, ttl):
    message = ServiceBusMessage(body, application_properties=properties or None, subject=subject,
                                time_to_live=timedelta(seconds=30) if ttl else None)
    rows = to_outgoing([message])
    body_bytes = len(body.encode("utf-8") if isinstance(body, str) else body)
    assert body_sizes(rows).tolist() == [body_bytes]
    assert message.size_in_bytes == body_bytes + header_sizes(rows).tolist()[0]
    bare = ServiceBusMessage(body, message_id=message.message_id)
    extra = sum(len(k.encode("utf-8")) for k in properties) + len((subject or "").encode("utf-8")) + (8 if ttl else 0)
    assert message.size_in_bytes >= bare.size_in_bytes + extra  # every property, subject and TTL counts


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=300) | st.text(max_size=100),
                          st.dictionaries(st.text(min_size=1, max_size=10), PROPERTY_VALUES, max_size=3),
                          IDS, st.booleans()), min_size=1, max_size=8))
def test_a_batch_sends_its_messages_as_they_were_when_added(drawn):
    """ServiceBusMessageBatch keeps each message's rows as added: the same rows and sizes a send of the
    messages computes, and a message changed afterwards (even to a value without a wire form) changes
    nothing the batch sends."""
    messages = [ServiceBusMessage(body, application_properties=properties or None, subject=subject,
                                  time_to_live=timedelta(seconds=30) if ttl else None)
                for body, properties, subject, ttl in drawn]
    batch = ServiceBusMessageBatch(10 ** 7)
    for message in messages:
        batch.add_message(message)
    expected = to_outgoing(messages)
    assert batch.outgoing().equals(expected)
    assert batch.size_in_bytes == sum(message.size_in_bytes for message in messages)
    for message in messages:
        message.subject, message.application_properties = "changed", {"p": 2 ** 100}
    assert batch.outgoing().equals(expected)


@pytest.fixture(scope="module")
def shared_namespace(tmp_path_factory):
    ns = str(tmp_path_factory.mktemp("numbering") / "ns")
    sparkbus.create_namespace(ns, credits_per_second=None)
    return ns, sparkbus.ServiceBusAdministrationClient(ns)


@pytest.mark.slow
@settings(max_examples=8, deadline=None)
@given(st.lists(st.lists(st.integers(min_value=1, max_value=20), min_size=1, max_size=4), min_size=2, max_size=3),
       st.sampled_from([1, 16]))
def test_numbering_under_concurrent_senders_is_gap_free_and_each_batch_contiguous(shared_namespace, plans, count):
    """Threads, each with its own sender (so each commits on its own and conflicts are real), send batches
    of the drawn sizes into one queue at once: the stored numbers of each partition are 1..n, and the
    messages of one batch that landed in one partition got consecutive numbers."""
    ns, admin = shared_namespace
    name = f"q{uuid.uuid4().hex[:8]}"
    admin.create_queue(name, enable_partitioning=count == 16)
    client = ServiceBusClient(ns)
    start = threading.Barrier(len(plans))

    def send(worker: int, sizes: list[int]) -> None:
        sender = client.get_queue_sender(name)
        start.wait()
        for b, size in enumerate(sizes):
            sender.send_messages([ServiceBusMessage("x", message_id=f"{worker}-{b}-{i}") for i in range(size)])

    threads = [threading.Thread(target=send, args=(w, sizes)) for w, sizes in enumerate(plans)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    table = DeltaTable(admin.get_entity_tables(name)["messages"]).to_pyarrow_table(
        columns=["message_id", "sequence_number", "partition_id"])
    assert table.num_rows == sum(map(sum, plans))
    by_partition: dict[int, list[int]] = {}
    batches: dict[tuple[str, int], list[int]] = {}
    for mid, seq, pid in zip(*(table[c].to_pylist() for c in ("message_id", "sequence_number", "partition_id"))):
        by_partition.setdefault(pid, []).append(seq & sequencing.LOW_MASK)
        batches.setdefault((mid.rsplit("-", 1)[0], pid), []).append(seq & sequencing.LOW_MASK)
    for numbers in by_partition.values():
        assert sorted(numbers) == list(range(1, len(numbers) + 1))
    for numbers in batches.values():
        assert sorted(numbers) == list(range(min(numbers), min(numbers) + len(numbers)))
