"""Crash safety with real kills: tests/crash_worker.py runs seeded random operations on one namespace and is
SIGKILLed at a random moment, again and again (each round a new worker with a new seed, continuing on
what the last one left). After every kill: every table opens, sequence numbers are gap-free in every
partition, every send is all or nothing, every acknowledged send is stored exactly once. At the end
(after the killed workers' locks lapsed, the interrupted fan-out and forwarding finished): every
message is where the acknowledged operations put it (a completed or cancelled message is never seen
again, a dead-lettered one is in the dead-letter sub-queue, a deferred one is deferred, an unsettled
one is received again with its delivery count raised), every copy and forward happened exactly once,
sessions hold their last acknowledged state, every message that left q is in its archive exactly once
(workers run maintenance sweeps too), runtime counts equal the tables, and Spark reads every entity. An operation interrupted by the kill may have happened or not: both are accepted for it alone.

`make test` runs CRASH_KILLS (default 6) rounds; `make crash` runs 60 (CRASH_KILLS=60, CRASH_SEED=N to
replay a run: the schedule of operations and kill times follows from the seed).
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import pytest
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

import sparkbus
from sparkbus import ServiceBusClient, ServiceBusSubQueue
from sparkbus.core import sequencing
from sparkbus.core.schemas import GONE_STATES
from sparkbus.engine import archive, fanout, forwarding, retention
from sparkbus.engine.namespace import open_catalog
from sparkbus.engine.registry import resolve
from sparkbus.management import SqlRuleFilter

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "crash_worker.py")
KILLS = int(os.environ.get("CRASH_KILLS", "6"))
SEED = int(os.environ.get("CRASH_SEED", "20261123"))
LOCK_SECONDS = 5
ENTITIES = ("q", "sq", "t", "t/Subscriptions/all", "t/Subscriptions/even", "src", "dst")


def setup(ns: str) -> None:
    sparkbus.create_namespace(ns, credits_per_second=None)
    admin = sparkbus.ServiceBusAdministrationClient(ns)
    admin.create_queue("q", enable_partitioning=True, lock_duration=f"PT{LOCK_SECONDS}S", max_delivery_count=1000,
                       archive_retention="P1D")
    admin.create_queue("sq", enable_partitioning=True, requires_session=True, lock_duration=f"PT{LOCK_SECONDS}S")
    admin.create_topic("t", enable_partitioning=True)
    admin.create_subscription("t", "all")
    admin.create_subscription("t", "even")
    admin.create_rule("t", "even", "even", filter=SqlRuleFilter("n % 2 = 0"))
    admin.delete_rule("t", "even", "$Default")
    admin.create_queue("dst")
    admin.create_queue("src", forward_to="dst")


@dataclass
class Ledger:
    """What the workers' logs say: started and acknowledged operations, per message id."""

    batches: list[tuple[str, list[str]]] = field(default_factory=list)  # every send started: (entity, ids)
    sent: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # acknowledged, per entity
    events: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))  # q: acks per id, in order
    open_ops: dict[str, str] = field(default_factory=dict)  # q ids whose last started op was never acked
    last_received: dict[str, int] = field(default_factory=dict)  # q id -> delivery count when last received
    # session -> [(value, acknowledged)] in the order set
    states: dict[str, list[tuple[str, bool]]] = field(default_factory=lambda: defaultdict(list))
    created: dict[str, bool] = field(default_factory=dict)  # management: queue -> exists per the acks
    uncertain: set[str] = field(default_factory=set)  # queues whose create or delete was interrupted
    interrupted: Counter = field(default_factory=Counter)  # the operation each kill landed in

    def read(self, path: str) -> None:
        with open(path) as handle:
            lines = [json.loads(line) for line in handle if line.endswith("\n")]
        pending: dict = {}
        for record in lines:
            if "start" in record:
                pending = record
                op, entity = record["start"], record.get("entity")
                if op in ("send", "send_batch", "schedule"):
                    self.batches.append((entity, record["ids"]))
                if entity == "q":
                    for i in record.get("ids", []):
                        self.open_ops[i] = op
                if op == "state":
                    self.states[record["session"]].append((record["value"], False))
                if op in ("create", "delete"):
                    self.uncertain.add(entity)
                continue
            ack, entity = record.get("ack"), record.get("entity")
            pending = {}
            if ack == "sent":
                self.sent[entity].update(record["ids"])
            elif ack in ("received", "received_dead_letter") and entity == "q":
                for i, count, _ in record["msgs"]:
                    self.last_received[i] = count
                    if ack == "received":
                        self.events[i].append("received")
            elif entity == "q" and ack in ("completed", "abandoned", "deferred", "dead_lettered", "cancelled"):
                for i in record["ids"]:
                    self.events[i].append(ack)
                    self.open_ops.pop(i, None)
            elif ack == "state":
                self.states[record["session"]][-1] = (record["value"], True)
            elif ack in ("created", "deleted"):
                self.created[entity] = ack == "created"
                self.uncertain.discard(entity)
        if pending:
            self.interrupted[pending["start"]] += 1
        for i, op in list(self.open_ops.items()):  # ops acked completely are not open
            if op in ("send", "send_batch", "schedule") and i in self.sent["q"]:
                del self.open_ops[i]


def messages_of(ns: str, entity: str) -> tuple[list[str], list[int], list[int]]:
    """(message ids, sequence numbers, partitions) of every row of an entity's messages table."""
    admin = sparkbus.ServiceBusAdministrationClient(ns)
    table = DeltaTable(admin.get_entity_tables(entity)["messages"]).to_pyarrow_table(
        columns=["message_id", "sequence_number", "partition_id"])
    return (table["message_id"].to_pylist(), table["sequence_number"].to_pylist(), table["partition_id"].to_pylist())


def archived_of(ns: str, entity: str) -> tuple[list[str], list[int], list[int]]:
    """(message ids, sequence numbers, partitions) of the rows of an entity's archive (none without one)."""
    catalog = open_catalog(ns)
    uri = archive.table_uri(resolve(catalog.root, catalog.snapshot(), entity, ("queue",)).tables)
    try:
        table = DeltaTable(uri).to_pyarrow_table(columns=["message_id", "sequence_number", "partition_id"])
    except TableNotFoundError:
        return [], [], []
    return (table["message_id"].to_pylist(), table["sequence_number"].to_pylist(), table["partition_id"].to_pylist())


def stored_or_archived(ns: str, entity: str) -> tuple[list[str], list[int], list[int]]:
    """messages_of the entity and of its archive, each sequence number once: a sweep killed between its
    archive commit and its removal leaves rows in both (the next one removes them)."""
    seen: dict[int, tuple[str, int]] = {}
    for ids, numbers, partitions in (messages_of(ns, entity), archived_of(ns, entity)):
        for i, n, p in zip(ids, numbers, partitions):
            seen.setdefault(n, (i, p))
    return [i for i, _ in seen.values()], list(seen), [p for _, p in seen.values()]


def check_after_kill(ns: str, ledger: Ledger) -> None:
    admin = sparkbus.ServiceBusAdministrationClient(ns)
    catalog = open_catalog(ns)
    DeltaTable(catalog.uri).to_pyarrow_table()
    for queue in admin.list_queues():  # every table of every entity opens and reads
        for uri in admin.get_entity_tables(queue.name).values():
            DeltaTable(uri).to_pyarrow_table()
    names = {q.name for q in admin.list_queues()}
    for name, exists in ledger.created.items():
        if name not in ledger.uncertain:
            assert (name in names) == exists, f"queue {name}: acknowledged {'created' if exists else 'deleted'}"
    for entity in ENTITIES:  # q keeps an archive: what left it is numbered and stored there
        ids, numbers, partitions = stored_or_archived(ns, entity) if entity == "q" else messages_of(ns, entity)
        if entity == "t":  # a topic's rows leave once fanned out (the highest of each partition stays)
            assert len(ids) == len(set(ids)), "t: a topic message was stored twice"
            continue
        by_partition = defaultdict(list)
        for n, p in zip(numbers, partitions):
            assert sequencing.partition_of_sequence(n) == p
            by_partition[p].append(n & sequencing.LOW_MASK)
        for p, local in by_partition.items():
            assert sorted(local) == list(range(1, len(local) + 1)), f"{entity} partition {p}: numbering has gaps"
        if "/Subscriptions/" in entity or entity == "dst":
            assert len(ids) == len(set(ids)), f"{entity}: a copy or forward happened twice"
            continue
        counts = Counter(ids)
        for batch_entity, batch in ledger.batches:
            if batch_entity == entity:
                present = {counts[i] for i in batch}
                assert present in ({0}, {1}), f"{entity}: a send was partly stored or stored twice: {present}"
        assert all(counts[i] == 1 for i in ledger.sent[entity]), f"{entity}: an acknowledged send is missing"


def run_rounds(ns: str, logs: str, kills: int, seed: int) -> Ledger:
    rng = random.Random(seed)
    ledger = Ledger()
    for round_ in range(kills):
        log = os.path.join(logs, f"round-{round_}.log")
        errors = os.path.join(logs, f"round-{round_}.stderr")
        with open(errors, "w") as stderr:
            worker = subprocess.Popen([sys.executable, WORKER, ns, log, str(rng.randrange(1 << 30))],
                                      stdout=subprocess.DEVNULL, stderr=stderr)
        deadline = time.monotonic() + 120
        while not (os.path.exists(log) and os.path.getsize(log)):
            assert worker.poll() is None, f"the worker died before it was ready: {_tail(errors)}"
            assert time.monotonic() < deadline, "the worker did not start"
            time.sleep(0.05)
        time.sleep(rng.uniform(0.05, 2.5))
        assert worker.poll() is None, f"the worker failed on its own: {_tail(errors)}"
        worker.send_signal(signal.SIGKILL)
        worker.wait(30)
        ledger.read(log)
        check_after_kill(ns, ledger)
    return ledger


def peek_all(client: ServiceBusClient, entity: str, sub_queue=None) -> list:
    """Every message of a queue (or its sub-queue): peeking goes partition by partition until it returns none."""
    found = []
    with client.get_queue_receiver(entity, sub_queue=sub_queue) as peeker:
        while batch := peeker.peek_messages(1000):
            found += batch
    return found


def _tail(path: str) -> str:
    with open(path) as handle:
        return handle.read()[-3000:]


def check_final(ns: str, ledger: Ledger, spark, clock) -> None:
    catalog = open_catalog(ns)
    fanout.drain(catalog, "t")  # what a killed fan-out or forward left is finished, exactly once
    forwarding.forward_all(catalog)
    check_after_kill(ns, ledger)
    topic, source = set(messages_of(ns, "t/Subscriptions/all")[0]), set(messages_of(ns, "src")[0])
    assert ledger.sent["t"] <= topic and ledger.sent["src"] <= source
    for entity, batch in ledger.batches:
        if entity == "t":
            assert len(topic & set(batch)) in (0, len(batch)), "a topic send was fanned out in part"
    even = {batch[k] for entity, batch in ledger.batches if entity == "t" for k in range(0, len(batch), 2)} & topic
    for entity, wanted in (("t/Subscriptions/even", even), ("dst", source)):
        present = set(messages_of(ns, entity)[0])
        assert present == wanted, \
            f"{entity}: missing {sorted(wanted - present)[:5]}, extra {sorted(present - wanted)[:5]}"
    clock.advance(LOCK_SECONDS + 1.5)  # every lock the killed workers held has lapsed
    client = ServiceBusClient(ns)
    live = {m.message_id: m for m in peek_all(client, "q")}
    dead = {m.message_id for m in peek_all(client, "q", ServiceBusSubQueue.DEAD_LETTER)}
    assert not set(live) & dead
    for i in ledger.sent["q"]:
        events, open_op = [e for e in ledger.events[i] if e != "received"], ledger.open_ops.get(i)
        last = events[-1] if events else None
        if open_op is not None:  # interrupted: whatever it would have done may or may not have happened
            continue
        if last in ("completed", "cancelled"):
            assert i not in live and i not in dead, f"{i} was {last} and is still there"
        elif last == "dead_lettered":
            assert i in dead, f"{i} was dead-lettered and is not in the dead-letter sub-queue"
        elif last == "deferred":
            assert i in live and live[i].state == sparkbus.ServiceBusMessageState.DEFERRED, i
        else:
            assert i in live or i in dead, f"acknowledged message {i} is lost"
    locked_before = {i: n for i, n in ledger.last_received.items()
                     if i in ledger.sent["q"] and not [e for e in ledger.events[i] if e != "received"][-1:]
                     and i not in ledger.open_ops and i in live}
    with client.get_queue_receiver("q", max_wait_time=1) as receiver:
        again = {}
        while batch := receiver.receive_messages(500):
            again.update((m.message_id, m) for m in batch)
            receiver.complete_messages(batch)
    for i, count in locked_before.items():
        if live[i].state == sparkbus.ServiceBusMessageState.ACTIVE:
            assert i in again and again[i].delivery_count >= count + 1, \
                f"{i}: locked by a killed worker at delivery {count}, not redelivered after its lock lapsed"
    for session, values in ledger.states.items():
        acked = [k for k, (_, ok) in enumerate(values) if ok]
        if not acked:
            continue
        allowed = {v for v, _ in values[acked[-1]:]}
        with client.get_queue_receiver("sq", session_id=session, max_wait_time=1) as r:
            state = r.session.get_state()
        assert state is not None and state.decode() in allowed, f"session {session}: state {state!r} not in {allowed}"
    check_archive(ns, ledger)
    admin = sparkbus.ServiceBusAdministrationClient(ns)
    for entity in ("q", "dst", "src"):
        runtime = admin.get_queue_runtime_properties(entity)
        stored = len(peek_all(client, entity)) + len(peek_all(client, entity, ServiceBusSubQueue.DEAD_LETTER))
        assert runtime.total_message_count == stored, entity
        read = spark.read.format("sparkbus").option("namespace", ns).option("entity", entity).load().count()
        assert read == stored, f"Spark reads {read} messages of {entity}, the tables hold {stored}"


def check_archive(ns: str, ledger: Ledger) -> None:
    """q keeps an archive, which workers killed in the middle of a sweep were moving messages to: once a
    last sweep moved every gone message, each message sent to q is exactly once in its table or in its
    archive (an interrupted send: at most once), and every archived one is gone, how it left recorded."""
    catalog = open_catalog(ns)
    info = resolve(catalog.root, catalog.snapshot(), "q", ("queue",))
    retention.run_entity(info, eager=True)
    rows = DeltaTable(archive.table_uri(info.tables)).to_pyarrow_table(
        columns=["message_id", "sequence_number", "left_as"]).to_pylist()
    numbers = Counter(r["sequence_number"] for r in rows)
    assert all(n == 1 for n in numbers.values()), "a message was archived twice"
    assert all(r["left_as"] in GONE_STATES for r in rows)
    stored = Counter(messages_of(ns, "q")[0]) + Counter(r["message_id"] for r in rows)
    assert all(stored[i] == 1 for i in ledger.sent["q"]), "an acknowledged message is neither stored nor archived"
    assert all(n == 1 for n in stored.values()), "a message is both stored and archived, or archived twice"
    assert any(r["left_as"] == "completed" for r in rows)


@pytest.mark.slow
def test_killed_clients_lose_and_duplicate_nothing(tmp_path, spark, clock):
    ns, logs = str(tmp_path / "ns"), tmp_path / "logs"
    logs.mkdir()
    setup(ns)
    ledger = run_rounds(ns, str(logs), KILLS, SEED)
    check_final(ns, ledger, spark, clock)
    total = sum(len(ids) for ids in ledger.sent.values())
    print(f"\ncrash: {KILLS} kills (seed {SEED}), {total} acknowledged sends, interrupted: {dict(ledger.interrupted)}")
    assert total > 0 and sum(ledger.interrupted.values()) >= KILLS // 2
