"""Forwarding benchmark: throughput of auto-forwarding between two 16-partition queues, and the latency
from send to receivable through a running namespace service.

    make bench-forward    # or: python benchmarks/bench_forward.py --messages 200000 --latency 100
1. Throughput: --messages 1 KiB messages are sent to a queue with forward_to (commits of 10,000), then
   forwarded without Spark (sparkbus.engine.forwarding.forward_all, the work of one service batch).
2. Latency: with a running namespace service (sparkbus.streaming.serve, 200 ms trigger), --latency single
   sends to the forwarding queue, each timed until it is receivable at the destination: p50 and p99 (after
   one untimed message that waits for the query's start).
"""
from __future__ import annotations

import argparse
import statistics
import time

from common import bench_namespace

from sparkbus import ServiceBusClient, ServiceBusMessage
from sparkbus.engine import forwarding
from sparkbus.engine.catalog import Catalog


def throughput(path: str, admin, count: int, size: int) -> None:
    admin.create_queue("dest", enable_partitioning=True, max_size_in_megabytes=5120)
    admin.create_queue("src", enable_partitioning=True, max_size_in_megabytes=5120, forward_to="dest")
    sender = ServiceBusClient(path).get_queue_sender("src")
    body = b"x" * size
    for start in range(0, count, 10_000):
        sender._send([ServiceBusMessage(body) for _ in range(min(10_000, count - start))], batch_limit=False)
    started = time.perf_counter()
    result = forwarding.forward_all(Catalog(path))
    elapsed = time.perf_counter() - started
    moved = sum(result.forwarded.values())
    assert moved == count, f"forwarded {moved} of {count}"
    print(f"forward_all: {moved:,} messages of {size} B in {elapsed:.2f} s = {moved / elapsed:,.0f} messages/s")


def latency(path: str, admin, count: int, size: int) -> None:
    from sparkbus.spark import get_spark
    from sparkbus.streaming import serve

    admin.create_queue("near", enable_partitioning=True)
    admin.create_queue("far", enable_partitioning=True, forward_to="near")
    client = ServiceBusClient(path)
    service = serve(get_spark("sparkbus-bench-forward"), path, trigger={"processingTime": "200 milliseconds"})
    sender, receiver = client.get_queue_sender("far"), client.get_queue_receiver("near")
    latencies = []
    try:
        sender.send_messages(ServiceBusMessage(b"warm-up"))  # the query's first batch starts it: not timed
        receiver.complete_message(receiver.receive_messages(1, max_wait_time=120)[0])
        for _ in range(count):
            started = time.perf_counter()
            sender.send_messages(ServiceBusMessage(b"y" * size))
            got = receiver.receive_messages(1, max_wait_time=30)
            assert got, "nothing arrived within 30 s"
            latencies.append((time.perf_counter() - started) * 1000)
            receiver.complete_message(got[0])
    finally:
        service.stop()
    latencies.sort()
    print(f"send to receivable through the namespace service: {count} messages, p50 "
          f"{statistics.median(latencies):.0f} ms, p99 {latencies[max(int(count * 0.99) - 1, 0)]:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=200_000, help="messages forwarded at once (0: skip)")
    parser.add_argument("--latency", type=int, default=100, help="single sends timed through the service (0: skip)")
    parser.add_argument("--size", type=int, default=1024, help="body bytes per message")
    args = parser.parse_args()
    with bench_namespace() as (path, admin):
        if args.messages:
            throughput(path, admin, args.messages, args.size)
        if args.latency:
            latency(path, admin, args.latency, args.size)


if __name__ == "__main__":
    main()
