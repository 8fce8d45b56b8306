"""Soak: 4 sender and 4 receiver processes for a given time on a 16-partition queue and on a topic with two
subscriptions, with the namespace service (`sparkbus serve`) fanning out; then a checker.

    python tests/soak.py --minutes 10          (make soak; SOAK_MINUTES=N)

Senders send batches of 1-50 messages alternately to the queue and the topic and log, fsynced, the ids
of every acknowledged send. Receivers (two on the queue, one on each subscription) receive up to 100
messages, complete them, and log each receipt (message id, sequence number, when it was received, the
lock's expiry) and each acknowledged completion. After the time is up the senders stop, the service
fans out what is left, the receivers drain until nothing arrives for 15 s, and the service stops. The
checker then requires: no loss (every acknowledged message completed, on the queue once and on each
subscription once), no duplicate completion, no double lock (a message received again only after the
previous lock lapsed), gap-free numbering (the sequence numbers completed in each partition are
1..highest), and runtime counts equal to the tables (everything drained: 0 messages, and as many as the
entities' tables hold).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from datetime import datetime, timezone

import sparkbus
from sparkbus import ServiceBusClient, ServiceBusMessage
from sparkbus.core import sequencing

from crash_worker import Log  # the fsynced line log the crash harness's workers keep

ENTITIES = {"q": ("q",), "t": ("t/Subscriptions/a", "t/Subscriptions/b")}
RECEIVERS = ("q", "q", "t/Subscriptions/a", "t/Subscriptions/b")
QUIET_SECONDS = 15.0


def sender(ns: str, log_path: str, worker: int, stop_at: float) -> None:
    log, rng, n = Log(log_path), random.Random(worker), 0
    with ServiceBusClient(ns, retry_total=20) as client:
        senders = {name: client.get_queue_sender(name) if name == "q" else client.get_topic_sender(name)
                   for name in ENTITIES}
        while time.time() < stop_at:
            entity = "q" if n % 2 == 0 else "t"
            ids = [f"s{worker}-{n}-{i}" for i in range(rng.randint(1, 50))]
            senders[entity].send_messages([ServiceBusMessage(f"{i} " + "x" * 200, message_id=i) for i in ids])
            log.write(sent=entity, ids=ids)
            n += 1


def receiver(ns: str, log_path: str, entity: str, stop_file: str) -> None:
    log = Log(log_path)
    topic, _, subscription = entity.partition("/Subscriptions/")
    idle_since = None
    with ServiceBusClient(ns, retry_total=20) as client:
        handle = (client.get_subscription_receiver(topic, subscription, max_wait_time=1) if subscription
                  else client.get_queue_receiver(entity, max_wait_time=1))
        with handle as r:
            while True:
                got = r.receive_messages(100)
                now = datetime.now(timezone.utc).timestamp()
                if not got:
                    if os.path.exists(stop_file):
                        idle_since = idle_since or time.monotonic()
                        if time.monotonic() - idle_since > QUIET_SECONDS:
                            return
                    continue
                idle_since = None
                log.write(received=entity, at=now, msgs=[[m.message_id, m.sequence_number,
                                                          m.locked_until_utc.timestamp()] for m in got])
                try:
                    r.complete_messages(got)
                except sparkbus.MessageLockLostError:  # all or nothing: they will be delivered again
                    log.write(lost=entity, ids=[m.message_id for m in got])
                    continue
                log.write(completed=entity, ids=[m.message_id for m in got])


def check(ns: str, logs: list[str]) -> dict:
    sent: dict[str, list[str]] = defaultdict(list)
    completed: dict[str, Counter] = defaultdict(Counter)
    receipts: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    numbers: dict[str, dict[int, set[int]]] = defaultdict(lambda: defaultdict(set))
    for path in logs:
        with open(path) as handle:
            for record in map(json.loads, handle):
                if "sent" in record:
                    sent[record["sent"]] += record["ids"]
                elif "received" in record:
                    for i, seq, until in record["msgs"]:
                        receipts[(record["received"], i)].append((record["at"], until))
                        partition = sequencing.partition_of_sequence(seq)
                        numbers[record["received"]][partition].add(seq & sequencing.LOW_MASK)
                elif "completed" in record:
                    completed[record["completed"]].update(record["ids"])
    problems = []
    for topic_or_queue, destinations in ENTITIES.items():
        wanted = set(sent[topic_or_queue])
        assert len(wanted) == len(sent[topic_or_queue]), "a sender reused an id"
        for entity in destinations:
            missing = wanted - set(completed[entity])
            twice = [i for i, c in completed[entity].items() if c > 1]
            extra = set(completed[entity]) - wanted
            if missing or twice or extra:
                problems.append(f"{entity}: lost {len(missing)}, completed twice {len(twice)}, unknown {len(extra)}")
    for (entity, i), held in receipts.items():
        held.sort()
        for (at, until), (later, _) in zip(held, held[1:]):
            if later < until - 1.0:  # FRESH_MARGIN: clocks of processes on one machine agree
                problems.append(f"{entity} {i}: received again at {later} while locked until {until}")
    for entity, partitions in numbers.items():
        for partition, seen in partitions.items():
            if seen != set(range(1, max(seen) + 1)):
                problems.append(f"{entity} partition {partition}: numbering has gaps")
    admin = sparkbus.ServiceBusAdministrationClient(ns)
    client = ServiceBusClient(ns)
    for entity in ("q", "t/Subscriptions/a", "t/Subscriptions/b"):
        topic, _, subscription = entity.partition("/Subscriptions/")
        runtime = (admin.get_subscription_runtime_properties(topic, subscription) if subscription
                   else admin.get_queue_runtime_properties(entity))
        handle = (client.get_subscription_receiver(topic, subscription) if subscription
                  else client.get_queue_receiver(entity))
        stored = 0
        with handle as peeker:
            while batch := peeker.peek_messages(1000):
                stored += len(batch)
        if runtime.total_message_count != stored or stored != 0:
            problems.append(f"{entity}: runtime says {runtime.total_message_count}, the tables hold {stored}")
    return {"sent": {k: len(v) for k, v in sent.items()},
            "completed": {k: sum(v.values()) for k, v in completed.items()},
            "redelivered": sum(1 for held in receipts.values() if len(held) > 1), "problems": problems}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--keep", action="store_true", help="keep the namespace and logs")
    args = parser.parse_args()
    print("command:", " ".join([sys.executable.rsplit("/", 1)[-1], *sys.argv]))
    root = tempfile.mkdtemp(prefix="sparkbus-soak-")
    ns, stop_file = os.path.join(root, "ns"), os.path.join(root, "stop")
    sparkbus.create_namespace(ns, credits_per_second=None)
    admin = sparkbus.ServiceBusAdministrationClient(ns)
    admin.create_queue("q", enable_partitioning=True, lock_duration="PT30S")
    admin.create_topic("t", enable_partitioning=True)
    for name in ("a", "b"):
        admin.create_subscription("t", name, lock_duration="PT30S")
    service_log = os.path.join(root, "service.log")
    service = subprocess.Popen([sys.executable, "-m", "sparkbus.cli", "serve", "--namespace", ns,
                                "--trigger-ms", "300", "--maintenance-interval", "20"],
                               stdout=open(service_log, "w"), stderr=subprocess.STDOUT)
    while "serving namespace" not in open(service_log).read():  # Spark is up: the clock starts now
        if service.poll() is not None:
            raise SystemExit(f"the namespace service failed: {open(service_log).read()[-2000:]}")
        time.sleep(0.5)
    spawn = multiprocessing.get_context("spawn")
    started, stop_at = time.time(), time.time() + args.minutes * 60
    logs = [os.path.join(root, f"{kind}-{i}.log") for kind in ("send", "recv") for i in range(4)]
    procs = [spawn.Process(target=sender, args=(ns, logs[i], i, stop_at)) for i in range(4)]
    procs += [spawn.Process(target=receiver, args=(ns, logs[4 + i], entity, stop_file))
              for i, entity in enumerate(RECEIVERS)]
    for p in procs:
        p.start()
    for p in procs[:4]:
        p.join()
    deadline = time.monotonic() + 600  # the service fans out what the senders sent last
    while admin.get_topic_runtime_properties("t").active_message_count and time.monotonic() < deadline:
        time.sleep(1)
    with open(stop_file, "w"):
        pass
    for p in procs[4:]:
        p.join()
    service.send_signal(signal.SIGTERM)
    service.wait(120)
    codes = [p.exitcode for p in procs] + [service.returncode]
    report = check(ns, logs)
    report.update(minutes=round((time.time() - started) / 60, 1), exit_codes=codes)
    print(json.dumps(report, indent=1))
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    else:
        print("kept:", root)
    return 0 if not report["problems"] and not any(codes) else 1


if __name__ == "__main__":
    sys.exit(main())
