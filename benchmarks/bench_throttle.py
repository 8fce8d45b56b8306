"""Throttling: admitted operations per second against the configured budget, and what the shared ledger
costs a single send.

    make bench-throttle   # or: python benchmarks/bench_throttle.py --budgets 1000,10000 --seconds 5 --sends 1000

1. Admitted rate: threads call as fast as they can for --seconds with retry_total=0 (a throttled call is
   counted and tried again at once), a) through the governor alone (an operation that does nothing, 1
   credit: the ledger's exactness at any rate), b) as peeks of 50 messages (50 credits each, the real
   path). Admitted credits per second should be the budget (plus the first full bucket over the run).
2. Ledger cost: single sends p50/p99 with the ledger charging (a budget no send reaches) and with credit
   throttling off, interleaved; and one governor call alone.
"""
from __future__ import annotations

import argparse
import statistics
import threading
import time

from common import bench_namespace

import sparkbus
from sparkbus import ServiceBusClient, ServiceBusMessage, ServiceBusServerBusyError
from sparkbus.engine.namespace import governor_of, open_catalog
from sparkbus.engine.retry import NO_RETRY
from sparkbus.engine.throttle import Usage


def admitted_rate(call, seconds: float, threads: int) -> tuple[float, int]:
    """(admitted credits per second, throttled calls) of `call` (returning credits) from threads."""
    admitted, throttled, lock = [0], [0], threading.Lock()
    end = time.monotonic() + seconds

    def run() -> None:
        mine, refused = 0, 0
        while time.monotonic() < end:
            try:
                mine += call()
            except ServiceBusServerBusyError:
                refused += 1
                time.sleep(0.001)
        with lock:
            admitted[0] += mine
            throttled[0] += refused
    pool = [threading.Thread(target=run) for _ in range(threads)]
    started = time.monotonic()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return admitted[0] / (time.monotonic() - started), throttled[0]


def rates(path: str, admin, budget: int, seconds: float) -> None:
    admin.update_namespace(credits_per_second=budget)
    governor = governor_of(open_catalog(path))
    time.sleep(1.05)  # a full bucket
    rate, refused = admitted_rate(lambda: governor.call("q", lambda: 1, lambda _: Usage(1), NO_RETRY), seconds, 4)
    print(f"budget {budget:>6}/s  governor only:   admitted {rate:9.0f} credits/s over {seconds:.0f} s "
          f"({rate / budget:.2f} x budget; first full bucket adds {1 / seconds:.2f}), {refused} throttled calls")
    receiver = ServiceBusClient(path, retry_total=0).get_queue_receiver("q")
    time.sleep(1.05)
    rate, refused = admitted_rate(lambda: len(receiver.peek_messages(50, sequence_number=1)), seconds, 2)
    print(f"budget {budget:>6}/s  peeks of 50:     admitted {rate:9.0f} credits/s over {seconds:.0f} s "
          f"({rate / budget:.2f} x budget), {refused} throttled calls")


def ledger_cost(path: str, sends: int) -> None:
    """Interleaved single sends to a namespace whose ledger charges every send (a budget no send reaches)
    and to one with credit throttling off."""
    senders = {}
    for mode, credits in (("charged", 10_000_000), ("off", None)):
        where = f"{path}-{mode}"
        sparkbus.create_namespace(where, credits_per_second=credits)
        sparkbus.ServiceBusAdministrationClient(where).create_queue("q")
        senders[mode] = ServiceBusClient(where).get_queue_sender("q")
        senders[mode].send_messages(ServiceBusMessage(b"warm-up"))
    timings: dict[str, list[float]] = {mode: [] for mode in senders}
    for i in range(sends):
        mode = "charged" if i % 2 else "off"
        started = time.perf_counter()
        senders[mode].send_messages(ServiceBusMessage(b"x" * 1024))
        timings[mode].append((time.perf_counter() - started) * 1000)
    for mode, values in timings.items():
        values.sort()
        print(f"single send, ledger {mode:>7}: p50 {statistics.median(values):6.2f} ms  "
              f"p99 {values[int(len(values) * 0.99) - 1]:6.2f} ms  ({len(values)} sends)")
    governor = governor_of(open_catalog(f"{path}-charged"))
    started = time.perf_counter()
    for _ in range(20_000):
        governor.call("q", lambda: None, lambda _: Usage(1), NO_RETRY)
    print(f"one governor call (admit, run, charge, count): {(time.perf_counter() - started) / 20_000 * 1e6:.1f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budgets", default="1000,10000")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--sends", type=int, default=1000)
    args = parser.parse_args()
    with bench_namespace() as (path, admin):
        admin.create_queue("q")
        with ServiceBusClient(path).get_queue_sender("q") as sender:
            sender.send_messages([ServiceBusMessage(str(i)) for i in range(100)])
        for budget in (int(b) for b in args.budgets.split(",")):
            rates(path, admin, budget, args.seconds)
        if args.sends:
            ledger_cost(path, args.sends)


if __name__ == "__main__":
    main()
