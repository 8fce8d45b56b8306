"""Receive benchmark: receive+complete throughput for 1, 2 and 4 processes, single-message latency, and
receive cost with a short versus a long history of completed messages.

    make bench-receive   # or: python benchmarks/bench_receive.py --messages 200000 --history 1000000
Then four processes receive and complete one message at a time (--concurrent 4), --single / 4 each; both
without prefetch and with prefetch_count --prefetch (default 10).
Each process loops receive_messages(1000) + complete_messages(batch) on a 16-partition queue until it
is empty; the aggregate rate is all messages over the wall time from the common start to the last finish.
"""
from __future__ import annotations

import argparse
import multiprocessing
import resource
import statistics
import time

from common import bench_namespace

from sparkbus import ServiceBusClient, ServiceBusMessage
from sparkbus.storage import commits

BATCH = 1000


def fill(path: str, queue: str, count: int, size: int, per_send: int = 10_000) -> None:
    """count messages in commits of per_send (the bulk path without Spark; a send of messages without keys
    lands in one partition, so per_send is also the rows of each data file a receiver reads)."""
    sender = ServiceBusClient(path).get_queue_sender(queue)
    body = b"x" * size
    for start in range(0, count, per_send):
        sender._send([ServiceBusMessage(body) for _ in range(min(per_send, count - start))], batch_limit=False)


def drain(path: str, queue: str, barrier, results) -> None:
    """Receive and complete until the queue stays empty for 0.5 s; report (messages, time of the end, CPU
    seconds of the whole process, its commits to the locks table: commits.Outcomes)."""
    receiver = ServiceBusClient(path).get_queue_receiver(queue)
    locks_uri = receiver._entity_info().tables["locks"]
    barrier.wait()
    before = resource.getrusage(resource.RUSAGE_SELF)
    done = 0
    while True:
        batch = receiver.receive_messages(max_message_count=BATCH, max_wait_time=0.5)
        if not batch:
            break
        done += receiver.complete_messages(batch)
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    results.put((done, time.time(), cpu, commits.outcomes(locks_uri)))


def throughput(path: str, admin, processes: int, count: int, size: int, per_send: int) -> None:
    """processes receivers draining count messages sent in commits of per_send: messages/s, CPU per message
    over the receivers' processes and their lock commits refused by a conflict (what several receivers of
    one queue fight over)."""
    queue = f"drain{processes}x{per_send}"
    admin.create_queue(queue, enable_partitioning=True, max_size_in_megabytes=5120, lock_duration="PT5M")
    fill(path, queue, count, size, per_send)
    spawn = multiprocessing.get_context("spawn")
    barrier, results = spawn.Barrier(processes + 1), spawn.Queue()
    procs = [spawn.Process(target=drain, args=(path, queue, barrier, results)) for _ in range(processes)]
    for p in procs:
        p.start()
    barrier.wait()
    start = time.time()
    outcomes = [results.get() for _ in procs]
    for p in procs:
        p.join()
    total = sum(done for done, *_ in outcomes)
    # Each process waits 0.5 s for more before it stops: that idle tail is not receiving.
    elapsed = max(end for _, end, *_ in outcomes) - start - 0.5
    cpu = sum(seconds for _, _, seconds, _ in outcomes)
    made = sum(counts.committed + counts.refused for *_, counts in outcomes)
    refused = sum(counts.refused for *_, counts in outcomes)
    lost = sum(counts.versions_lost for *_, counts in outcomes)
    print(f"receive+complete, batches of {BATCH}, {processes} process(es), sends of {per_send:,}: {total:,} messages "
          f"in {elapsed:.2f} s = {total / elapsed:,.0f} messages/s; CPU {cpu / total * 1e6:.1f} us a message "
          f"(the whole processes, about 0.5 s idle each at the end); lock-table commits {made:,}, refused by a "
          f"conflict {refused:,} ({refused / max(made, 1):.1%}), versions lost to another writer first {lost:,}")
    assert total == count, f"drained {total} of {count}"


def latency(path: str, admin, queue: str, count: int, size: int, label: str, prefetch: int = 0) -> float:
    """p50 of receive_messages(1) + complete_message on a queue holding count fresh messages."""
    fill(path, queue, count, size)
    receiver = ServiceBusClient(path).get_queue_receiver(queue, prefetch_count=prefetch)
    latencies = []
    for _ in range(count):
        start = time.perf_counter()
        message = receiver.receive_messages(max_message_count=1)[0]
        receiver.complete_message(message)
        latencies.append((time.perf_counter() - start) * 1000)
    latencies.sort()
    p50 = statistics.median(latencies)
    print(f"single receive+complete{label}: {count:,} messages of {size} B: p50 {p50:.1f} ms, "
          f"p99 {latencies[int(count * 0.99) - 1]:.1f} ms")
    return p50


def one_at_a_time(path: str, queue: str, count: int, prefetch: int, barrier, results) -> None:
    """receive_messages(1) + complete_message count times; reports the complete latencies (ms)."""
    receiver = ServiceBusClient(path).get_queue_receiver(queue, prefetch_count=prefetch)
    barrier.wait()
    completes = []
    for _ in range(count):
        got = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        if not got:
            break
        start = time.perf_counter()
        receiver.complete_message(got[0])
        completes.append((time.perf_counter() - start) * 1000)
    results.put(completes)


def concurrent_single(path: str, admin, processes: int, count: int, size: int, prefetch: int) -> None:
    """processes receivers on one 16-partition queue, each receiving and completing one message at a time."""
    queue = f"single{processes}p{prefetch}"
    admin.create_queue(queue, enable_partitioning=True)
    fill(path, queue, processes * count, size)
    spawn = multiprocessing.get_context("spawn")
    barrier, results = spawn.Barrier(processes), spawn.Queue()
    procs = [spawn.Process(target=one_at_a_time, args=(path, queue, count, prefetch, barrier, results)) for _ in range(processes)]
    for p in procs:
        p.start()
    completes = sorted(ms for _ in procs for ms in results.get())
    for p in procs:
        p.join()
    print(f"complete_message with {processes} processes receiving and completing one at a time, prefetch_count "
          f"{prefetch}: {len(completes):,} "
          f"completes, p50 {statistics.median(completes):.1f} ms, p99 {completes[int(len(completes) * 0.99) - 1]:.1f} ms")


def history(path: str, admin, completed: int, probes: int, size: int) -> float:
    """Single receive+complete latency after `completed` messages were received and completed."""
    queue = f"history{completed}"
    admin.create_queue(queue, enable_partitioning=True, max_size_in_megabytes=5120, lock_duration="PT5M")
    fill(path, queue, completed, size)
    receiver = ServiceBusClient(path).get_queue_receiver(queue)
    while batch := receiver.receive_messages(max_message_count=BATCH, max_wait_time=0):
        receiver.complete_messages(batch)
    return latency(path, admin, queue, probes, size, f" behind {completed:,} completed")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=200_000, help="messages per throughput run (0: skip)")
    parser.add_argument("--processes", default="1,2,4", help="receiver process counts")
    parser.add_argument("--single", type=int, default=1000, help="single receive+complete round trips (0: skip)")
    parser.add_argument("--concurrent", type=int, default=4,
                        help="processes completing one message at a time, --single each (0: skip)")
    parser.add_argument("--history", type=int, default=1_000_000, help="long completed history (0: skip)")
    parser.add_argument("--prefetch", type=int, default=10,
                        help="also run --single and --concurrent with this prefetch_count (0: only without)")
    parser.add_argument("--size", type=int, default=1024, help="body bytes per message")
    parser.add_argument("--per-send", default="10000",
                        help="messages per send commit when filling the throughput runs' queue, comma-separated "
                             "(248: what a full standard-tier batch of 1 KiB messages holds)")
    args = parser.parse_args()
    with bench_namespace() as (path, admin):
        for prefetch in sorted({0, args.prefetch}):
            if args.single:
                admin.create_queue(f"single{prefetch}", enable_partitioning=True)
                latency(path, admin, f"single{prefetch}", args.single, args.size, f", prefetch_count {prefetch}",
                        prefetch)
            if args.concurrent and args.single:
                concurrent_single(path, admin, args.concurrent, args.single // 4 or 1, args.size, prefetch)
        if args.messages:
            for per_send in (int(n) for n in args.per_send.split(",")):
                for processes in (int(p) for p in args.processes.split(",")):
                    throughput(path, admin, processes, args.messages, args.size, per_send)
        if args.history:
            short = history(path, admin, 10_000, 300, args.size)
            long = history(path, admin, args.history, 300, args.size)
            print(f"history: p50 behind {args.history:,} completed is {long / short:.2f}x that behind 10,000")

if __name__ == "__main__":
    main()
