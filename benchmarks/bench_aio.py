"""The async API (sparkbus.aio): how soon a waiting receive wakes, how late the event loop runs while a large
batch commits, and what many coroutines sending at once achieve.

    make bench-aio   # or: python benchmarks/bench_aio.py --wakes 100 --coroutines 1000

1. Wake-up: a receive waits (async: awaited on the loop; sync: poll on its thread, for comparison) while
   another thread sends one message at a random moment; the latency is from the send's return (committed)
   to the receive's return. p50/p95/max over --wakes messages, each of the two receivers in turn.
2. Loop lateness: a heartbeat coroutine sleeping 10 ms at a time while 20 coroutines send 900 x 1 KB each
   (18 MB) at once; how late its wake-ups are (p50/p99/max).
3. Coroutine sends: --coroutines coroutines send one message each on one client at once (group commit joins
   them); messages per second and commits, beside the same count sent one after another by one coroutine.
"""
from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import threading
import time

from common import bench_namespace

import sparkbus
from sparkbus import ServiceBusClient as SyncClient
from sparkbus import ServiceBusMessage, storage
from sparkbus.aio import ServiceBusClient


def percentiles(values: list[float]) -> str:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    return (f"p50 {statistics.median(ordered) * 1000:6.1f} ms  p95 {p95 * 1000:6.1f} ms  "
            f"max {ordered[-1] * 1000:6.1f} ms")


def _send_later(path: str, queue: str, sent: list[float]) -> threading.Thread:
    """A thread that sends one message after 50-250 ms and records when the send returned."""
    def send() -> None:
        time.sleep(random.uniform(0.05, 0.25))
        with SyncClient(path).get_queue_sender(queue) as sender:
            sender.send_messages(ServiceBusMessage("wake"))
        sent.append(time.monotonic())
    thread = threading.Thread(target=send)
    thread.start()
    return thread


def wake_latencies(path: str, wakes: int) -> None:
    async def async_wakes() -> list[float]:
        latencies = []
        async with ServiceBusClient(path) as client, client.get_queue_receiver("wake-async") as receiver:
            await receiver.receive_messages(max_wait_time=0)  # connected
            for _ in range(wakes):
                sent: list[float] = []
                thread = _send_later(path, "wake-async", sent)
                [message] = await receiver.receive_messages(max_wait_time=10)
                received = time.monotonic()
                await receiver.complete_message(message)
                thread.join()
                latencies.append(received - sent[0])
        return latencies

    def sync_wakes() -> list[float]:
        latencies = []
        with SyncClient(path).get_queue_receiver("wake-sync") as receiver:
            receiver.receive_messages(max_wait_time=0)
            for _ in range(wakes):
                sent: list[float] = []
                thread = _send_later(path, "wake-sync", sent)
                [message] = receiver.receive_messages(max_wait_time=10)
                received = time.monotonic()
                receiver.complete_message(message)
                thread.join()
                latencies.append(received - sent[0])
        return latencies

    print(f"wake-up after a commit, {wakes} messages each:")
    print(f"  async receive (awaited)   {percentiles(asyncio.run(async_wakes()))}")
    print(f"  sync receive (poll)       {percentiles(sync_wakes())}")


def loop_lateness(path: str) -> None:
    lateness: list[float] = []

    async def heartbeat(stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            due = loop.time() + 0.01
            await asyncio.sleep(0.01)
            lateness.append(loop.time() - due)

    async def run() -> float:
        stop = asyncio.Event()
        beat = asyncio.create_task(heartbeat(stop))
        async with ServiceBusClient(path, retry_total=10) as client:
            sender = client.get_queue_sender("large")
            started = time.monotonic()
            await asyncio.gather(*(sender.send_messages([ServiceBusMessage(b"x" * 1000) for _ in range(900)])
                                   for _ in range(20)))
            took = time.monotonic() - started
        stop.set()
        await beat
        return took

    took = asyncio.run(run())
    ordered = sorted(lateness)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    print(f"loop lateness while 20 x 900 messages (18 MB) commit in {took:.2f} s: {len(ordered)} ticks of 10 ms, "
          f"p50 {statistics.median(ordered) * 1000:.1f} ms  p99 {p99 * 1000:.1f} ms  max {ordered[-1] * 1000:.1f} ms")


def coroutine_sends(path: str, admin: sparkbus.ServiceBusAdministrationClient, coroutines: int) -> None:
    table = admin.get_entity_tables("sends")["messages"]

    async def together() -> float:
        async with ServiceBusClient(path) as client:
            sender = client.get_queue_sender("sends")
            await sender.entity_info()
            started = time.monotonic()
            await asyncio.gather(*(sender.send_messages(ServiceBusMessage(f"m{i}")) for i in range(coroutines)))
            return time.monotonic() - started

    async def one_by_one() -> float:
        async with ServiceBusClient(path) as client:
            sender = client.get_queue_sender("sends")
            await sender.entity_info()
            started = time.monotonic()
            for i in range(coroutines):
                await sender.send_messages(ServiceBusMessage(f"s{i}"))
            return time.monotonic() - started

    before = storage.open_table(table).version()
    took = asyncio.run(together())
    commits = storage.open_table(table).version() - before
    alone = asyncio.run(one_by_one())
    print(f"{coroutines} coroutines sending one message each: {coroutines / took:7.0f} msg/s in {commits} commits; "
          f"one coroutine sending them in turn: {coroutines / alone:7.0f} msg/s ({alone / took:.1f}x slower)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wakes", type=int, default=100)
    parser.add_argument("--coroutines", type=int, default=1000)
    args = parser.parse_args()
    with bench_namespace(tier="premium") as (path, admin):  # premium: batches beyond 256 KB
        for name in ("wake-async", "wake-sync", "large", "sends"):
            admin.create_queue(name)
        wake_latencies(path, args.wakes)
        loop_lateness(path)
        coroutine_sends(path, admin, args.coroutines)

if __name__ == "__main__":
    main()
