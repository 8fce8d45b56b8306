"""Local disk against an object store (Azurite, the Azure Storage emulator, by default): single send and
receive+complete latency, and batched send (200 a call) and receive (1,000 a call) throughput, of 1 KiB messages.

    make bench-store            # starts Azurite on loopback; or, with AZURE_STORAGE_* (or AZURITE_BLOB_STORAGE_URL)
                                # set: python benchmarks/bench_store.py --object-root az://container/prefix
Prints one row per store with the command that ran.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid

import sparkbus
from sparkbus import ServiceBusClient, ServiceBusMessage


SEND_BATCH = 200  # 1 KiB messages: about 211 KB, under the 256 KB batch limit


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(path: str, singles: int, batched: int) -> dict:
    sparkbus.create_namespace(path, credits_per_second=None)
    sparkbus.ServiceBusAdministrationClient(path).create_queue("q", enable_partitioning=True)
    body = b"x" * 1024
    out = {}
    with ServiceBusClient(path) as client, client.get_queue_sender("q") as sender, \
            client.get_queue_receiver("q", max_wait_time=5) as receiver:
        sends = []
        for _ in range(singles):
            start = time.perf_counter()
            sender.send_messages(ServiceBusMessage(body))
            sends.append((time.perf_counter() - start) * 1000)
        takes = []
        for _ in range(singles):
            start = time.perf_counter()
            [message] = receiver.receive_messages(1)
            receiver.complete_message(message)
            takes.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        for _ in range(batched // SEND_BATCH):
            sender.send_messages([ServiceBusMessage(body) for _ in range(SEND_BATCH)])
        out["send_batches_per_s"] = batched / (time.perf_counter() - start)
        start, done = time.perf_counter(), 0
        while done < batched:
            got = receiver.receive_messages(1000)
            receiver.complete_messages(got)
            done += len(got)
        out["receive_batches_per_s"] = batched / (time.perf_counter() - start)
    out.update(send_p50=statistics.median(sends), send_p99=percentile(sends, 0.99),
               take_p50=statistics.median(takes), take_p99=percentile(takes, 0.99))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--object-root", required=True, help="e.g. az://sparkbus/bench")
    parser.add_argument("--single", type=int, default=200)
    parser.add_argument("--batched", type=int, default=20000)
    args = parser.parse_args()
    print("command:", " ".join([sys.executable.rsplit("/", 1)[-1], *sys.argv]))
    rows = [("local disk", measure(tempfile.mkdtemp(prefix="sparkbus-bench-") + "/ns", args.single, args.batched)),
            (args.object_root, measure(f"{args.object_root}/{uuid.uuid4().hex[:12]}/ns", args.single, args.batched))]
    print(f"{'store':28} {'send p50/p99 ms':>16} {'receive+complete p50/p99 ms':>28} {'send msg/s':>11} {'receive msg/s':>14}"
          " (send batches of 200, receives of 1,000)")
    for name, r in rows:
        print(f"{name:28} {r['send_p50']:7.1f}/{r['send_p99']:<8.1f} {r['take_p50']:14.1f}/{r['take_p99']:<13.1f} "
              f"{r['send_batches_per_s']:11,.0f} {r['receive_batches_per_s']:14,.0f}")


if __name__ == "__main__":
    main()
