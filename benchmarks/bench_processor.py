"""Processors: messages per second through a processor's handler, beside the loop it replaces.

    make bench-processor   # or: python benchmarks/bench_processor.py --messages 1000 --calls 1,8

For a queue of one partition and one of 16 (enable_partitioning), --messages 1 KB messages are handled
by: a hand-written loop (receive one message, complete it), then the sync processor and the async one
with each --calls value of max_concurrent_calls; the handler returns at once (auto-completion), so the
figure is what the processor itself costs. Each run starts from a full queue and ends when it is empty.
"""
from __future__ import annotations

import argparse
import asyncio
import time
from typing import Callable

from common import bench_namespace

from sparkbus import ServiceBusClient, ServiceBusMessage
from sparkbus.aio import ServiceBusClient as AsyncClient

IDLE = 0.5  # a processor's run ends this long after its last message; taken off its time


def fill(path: str, queue: str, count: int) -> None:
    with ServiceBusClient(path) as client, client.get_queue_sender(queue) as sender:
        for start in range(0, count, 200):  # batches within the standard tier's 256 KB
            sender.send_messages([ServiceBusMessage(b"x" * 1024) for _ in range(min(200, count - start))])


def loop(path: str, queue: str) -> None:
    with ServiceBusClient(path) as client, client.get_queue_receiver(queue, max_wait_time=IDLE) as receiver:
        while got := receiver.receive_messages(1):
            receiver.complete_message(got[0])


def sync_processor(calls: int) -> Callable[[str, str], None]:
    def run(path: str, queue: str) -> None:
        with ServiceBusClient(path) as client:
            client.get_queue_processor(queue, lambda context: None, max_concurrent_calls=calls).run(until_idle=IDLE)
    return run


def async_processor(calls: int) -> Callable[[str, str], None]:
    async def handle(context: object) -> None:
        return None

    async def main(path: str, queue: str) -> None:
        async with AsyncClient(path) as client:
            await client.get_queue_processor(queue, handle, max_concurrent_calls=calls).run(until_idle=IDLE)
    return lambda path, queue: asyncio.run(main(path, queue))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--calls", default="1,8", help="max_concurrent_calls values, comma-separated")
    args = parser.parse_args()
    calls = [int(c) for c in args.calls.split(",")]
    runs: list[tuple[str, Callable[[str, str], None], float]] = [("receive + complete loop", loop, 0.0)]
    runs += [(f"processor, {c} call(s)", sync_processor(c), IDLE) for c in calls]
    runs += [(f"async processor, {c} call(s)", async_processor(c), IDLE) for c in calls]
    with bench_namespace() as (path, admin):
        for partitioned in (False, True):
            queue = "p16" if partitioned else "p1"
            admin.create_queue(queue, enable_partitioning=partitioned)
            print(f"\n{'16 partitions' if partitioned else 'one partition'}, {args.messages} messages of 1 KB")
            for name, run, idle in runs:
                fill(path, queue, args.messages)
                started = time.perf_counter()
                run(path, queue)
                elapsed = time.perf_counter() - started - idle
                left = admin.get_queue_runtime_properties(queue).total_message_count
                print(f"  {name:<28} {args.messages / elapsed:8.0f} msg/s" + (f"  ({left} left!)" if left else ""))


if __name__ == "__main__":
    main()
