"""Archive benchmark: what keeping an archive costs a queue's send + receive + complete, and how fast a replay
sends the archive again.

    make bench-archive    # or: python benchmarks/bench_archive.py --messages 100000 --single 300 --rounds 3
1. Batched: --messages 1 KiB messages sent in batches of 1,000, received and completed in batches of 1,000,
   then one maintenance sweep (what the namespace service does every few seconds: with the archive on, every
   completed message moves to the archive), on a 16-partition queue with archive_retention off and on.
   The rounds alternate off and on in one run (this machine's disk drifts between runs: compare ratios).
2. Single: --single messages sent, received and completed one at a time (p50 of receive + complete) with the
   archive off and on: the archive is not on this path (retention moves messages later).
3. Replay: the archived messages sent again to a second queue (admin.replay_messages), in messages/s.
"""
from __future__ import annotations

import argparse
import statistics
import time
from datetime import datetime, timezone

from common import bench_namespace

from sparkbus import ServiceBusClient, ServiceBusMessage
from sparkbus.engine import housekeeping
from sparkbus.engine.catalog import Catalog

BATCH = 1_000
EPOCH = datetime(2000, 1, 1, tzinfo=timezone.utc)


def batched(path: str, queue: str, count: int, body: bytes) -> float:
    """Seconds to send, receive and complete count messages in batches, and sweep once."""
    client = ServiceBusClient(path)
    sender, receiver = client.get_queue_sender(queue), client.get_queue_receiver(queue, max_wait_time=1)
    started = time.perf_counter()
    for first in range(0, count, BATCH):
        sender._send([ServiceBusMessage(body) for _ in range(min(BATCH, count - first))], batch_limit=False)
    done = 0
    while done < count:
        got = receiver.receive_messages(max_message_count=BATCH, max_wait_time=1)
        receiver.complete_messages(got)
        done += len(got)
    housekeeping.sweep(Catalog(path))
    return time.perf_counter() - started


def single(path: str, queue: str, count: int, body: bytes) -> float:
    """p50 milliseconds of one receive + complete, count times (each after one send)."""
    client = ServiceBusClient(path)
    sender, receiver = client.get_queue_sender(queue), client.get_queue_receiver(queue, max_wait_time=1)
    times = []
    for _ in range(count):
        sender.send_messages(ServiceBusMessage(body))
        started = time.perf_counter()
        [message] = receiver.receive_messages(max_message_count=1, max_wait_time=1)
        receiver.complete_message(message)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--single", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=1024)
    args = parser.parse_args()
    body = b"x" * args.size
    with bench_namespace() as (path, admin):
        seconds: dict[str, list[float]] = {"off": [], "on": []}
        for round_ in range(args.rounds):
            for setting in ("off", "on"):
                name = f"{setting}{round_}"
                admin.create_queue(name, enable_partitioning=True, max_size_in_megabytes=5120,
                                   archive_retention="P1D" if setting == "on" else None)
                seconds[setting].append(batched(path, name, args.messages, body))
        off, on = statistics.median(seconds["off"]), statistics.median(seconds["on"])
        print(f"send + receive + complete + sweep, {args.messages:,} x {args.size} B in batches of {BATCH:,} "
              f"(median of {args.rounds}): archive off {args.messages / off:,.0f} msg/s, "
              f"on {args.messages / on:,.0f} msg/s ({on / off:.2f}x the time)")
        p50 = {}
        for setting in ("off", "on"):
            name = f"single-{setting}"
            admin.create_queue(name, archive_retention="P1D" if setting == "on" else None)
            p50[setting] = single(path, name, args.single, body)
        print(f"single receive + complete p50 ({args.single}): archive off {p50['off']:.2f} ms, "
              f"on {p50['on']:.2f} ms")
        admin.create_queue("copy", enable_partitioning=True, max_size_in_megabytes=5120)
        held = admin.get_queue_runtime_properties("on0").archive_message_count
        started = time.perf_counter()
        result = admin.replay_messages("on0", start_time=EPOCH, to="copy")
        elapsed = time.perf_counter() - started
        assert result.replayed == args.messages, f"replayed {result.replayed} of {args.messages}"
        print(f"replay: {result.replayed:,} messages ({held:,} in the archive table, the rest still in the queue's) "
              f"in {elapsed:.2f} s = {result.replayed / elapsed:,.0f} msg/s")


if __name__ == "__main__":
    main()
