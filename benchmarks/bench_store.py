"""Every operation on local disk, Azurite and S3 (SeaweedFS), each object store reached through a proxy that adds
--latency-ms to every request (benchmarks/latency_proxy.py): a store one region away.

    make bench-store                                  # starts Azurite and SeaweedFS on loopback, stops them after
    python benchmarks/bench_store.py --latency-ms 0,20 --single 40 --processes 1,2,4

For each store and latency, each operation's p50 and p99 (ms) and the storage requests it makes (counted by
the proxy); the number of requests it waits for one after another, counted by the storage layer (the median
over the samples, at the highest latency: "in a row"), and estimated from the p50s at 0 and at L ms,
(p50 at L - p50 at 0) / L ("from p50s": it includes what a request waits for beside the store, and is noisy
over few samples). Then processes sharing one 16-partition queue at the highest latency: batches of
200 sent, receives of 1,000 completed, every message exactly once; and as many writers racing for one log's
next version with nothing else to do (the ceiling of one entity's log). JSON under benchmarks/results/
(store-<time>.json and store-latest.json) and a plot (store-latest.png).

Each (store, latency) runs in a process of its own, so that its store clients are made for its endpoint.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path[:0] = [HERE, os.path.join(REPO, "tests")]

BODY = b"x" * 1024
SEND_BATCH = 200  # 1 KiB messages: about 211 KB, under the 256 KB batch limit
RECEIVE_BATCH = 1000
EMULATOR_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ---- one (store, latency), in its own process ---------------------------------------------------------------

def _timed(samples: int, prepare: Optional[Callable[[], Any]], run: Callable[[Any], Any],
           requests: Callable[[], int]) -> dict[str, float]:
    """p50/p99 of run(prepare()) over samples, the requests per run the proxy saw (prepare's not counted),
    and the median of the chains of requests each run waited for one after another, as the storage layer
    counts them (sparkbus.storage.requests: the caller's thread and the branches it waited for; the
    maintenance thread's requests are not in it)."""
    from sparkbus.storage import requests as chains

    times, counted, sequential = [], 0, []
    for _ in range(samples):
        given = prepare() if prepare else None
        before = requests()
        start = time.perf_counter()
        with chains.counting() as tally:
            run(given)
        times.append((time.perf_counter() - start) * 1000)
        counted += requests() - before
        sequential.append(tally.sequential)
    return {"p50": statistics.median(times), "p99": percentile(times, 0.99), "requests": counted / samples,
            "sequential": statistics.median(sequential)}


def measure(root: str, samples: int, requests: Callable[[], int]) -> dict[str, dict[str, float]]:
    import sparkbus
    from sparkbus import NEXT_AVAILABLE_SESSION, ServiceBusClient, ServiceBusMessage
    from sparkbus.engine import fanout, forwarding
    from sparkbus.engine.namespace import open_catalog

    admin = sparkbus.ServiceBusAdministrationClient(root)
    admin.create_queue("q", enable_partitioning=True)
    admin.create_queue("s", enable_partitioning=True, requires_session=True)
    admin.create_topic("t", enable_partitioning=True)
    admin.create_subscription("t", "sub")
    admin.create_subscription("t", "sub2")
    admin.create_queue("fwd-target", enable_partitioning=True)
    admin.create_queue("fwd", enable_partitioning=True, forward_to="fwd-target")
    catalog = open_catalog(root)
    for i in range(50):
        admin.create_queue(f"many-{i:02d}")
    out: dict[str, dict[str, float]] = {}
    with ServiceBusClient(root) as client, client.get_queue_sender("q") as sender, \
            client.get_queue_receiver("q", max_wait_time=5) as receiver, \
            client.get_queue_sender("s") as session_sender:
        def one() -> list[Any]:
            return receiver.receive_messages(1, max_wait_time=5)

        def fill(n: int) -> Callable[[], None]:
            return lambda: sender.send_messages([ServiceBusMessage(BODY) for _ in range(n)])

        # warm: the first call of each kind opens tables
        sender.send_messages(ServiceBusMessage(BODY))
        receiver.complete_message(one()[0])
        out["send 1"] = _timed(samples, None, lambda _: sender.send_messages(ServiceBusMessage(BODY)), requests)
        out["send 200"] = _timed(samples, None, lambda _: sender.send_messages(
            [ServiceBusMessage(BODY) for _ in range(SEND_BATCH)]), requests)
        out["peek 10"] = _timed(samples, None, lambda _: receiver.peek_messages(10), requests)
        out["receive 1 + complete"] = _timed(samples, None, lambda _: receiver.complete_message(one()[0]), requests)

        def take(n: int) -> Callable[[Any], None]:
            def run(_: Any) -> None:
                got: list[Any] = []
                while len(got) < n:
                    got += receiver.receive_messages(n - len(got), max_wait_time=5)
                receiver.complete_messages(got)
            return run
        drain_count = max(1, samples // 4)
        out["receive 200 + complete"] = _timed(drain_count, fill(200), take(200), requests)
        out["receive 1000 + complete"] = _timed(drain_count, lambda: [fill(SEND_BATCH)() for _ in range(5)],
                                                take(1000), requests)
        out["abandon"] = _timed(samples, one, lambda m: receiver.abandon_message(m[0]), requests)
        out["renew lock"] = _timed(samples, one, lambda m: receiver.renew_message_lock(m[0]), requests)
        for m in receiver.receive_messages(50, max_wait_time=2):
            receiver.complete_message(m)
        out["dead-letter"] = _timed(samples, lambda: (fill(1)(), one())[1],
                                    lambda m: receiver.dead_letter_message(m[0], reason="bench"), requests)
        deferred: list[int] = []

        def defer(m: list[Any]) -> None:
            receiver.defer_message(m[0])
            deferred.append(m[0].sequence_number)
        out["defer"] = _timed(samples, lambda: (fill(1)(), one())[1], defer, requests)
        out["receive deferred + complete"] = _timed(samples, deferred.pop, lambda seq: [
            receiver.complete_message(m) for m in receiver.receive_deferred_messages([seq])], requests)
        later = datetime.now(timezone.utc) + timedelta(hours=1)
        out["schedule"] = _timed(samples, None, lambda _: sender.schedule_messages(ServiceBusMessage(BODY), later),
                                 requests)
        out["schedule + cancel"] = _timed(samples, None, lambda _: sender.cancel_scheduled_messages(
            sender.schedule_messages(ServiceBusMessage(BODY), later)), requests)
        out["queue runtime properties"] = _timed(samples, None, lambda _: admin.get_queue_runtime_properties("q"),
                                                 requests)
        # the first listing reads every table; a dashboard's later ones follow them (timed)
        list(admin.list_queues_runtime_properties())
        out["50 queues with runtime properties"] = _timed(max(3, samples // 3), None,
                                                          lambda _: list(admin.list_queues_runtime_properties()),
                                                          requests)
        out["get queue"] = _timed(samples, None, lambda _: admin.get_queue("q"), requests)
        names = iter(range(1 << 20))
        out["create + delete queue"] = _timed(max(1, samples // 4), lambda: f"tmp-{next(names)}",
                                              lambda name: (admin.create_queue(name), admin.delete_queue(name)),
                                              requests)
        out["create + delete rule"] = _timed(max(1, samples // 4), lambda: f"r{next(names)}", lambda name: (
            admin.create_rule("t", "sub", name, filter=sparkbus.SqlRuleFilter("color = 'red'")),
            admin.delete_rule("t", "sub", name)), requests)

        def session_round(_: Any) -> None:
            with client.get_queue_receiver("s", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5) as session:
                for m in session.receive_messages(1, max_wait_time=5):
                    session.complete_message(m)
        out["session accept + receive + complete + close"] = _timed(
            samples, lambda: session_sender.send_messages(ServiceBusMessage(BODY, session_id=uuid.uuid4().hex)),
            session_round, requests)
        with client.get_topic_sender("t") as topic_sender:
            out["topic send 1"] = _timed(samples, None, lambda _: topic_sender.send_messages(ServiceBusMessage(BODY)),
                                         requests)
            # fan-out's and forwarding's per-batch work, as their services run it (engine calls: one pass each)
            fanout.drain(catalog, "t")
            out["fan-out of 200 to 2 subscriptions"] = _timed(
                samples, lambda: topic_sender.send_messages([ServiceBusMessage(BODY) for _ in range(SEND_BATCH)]),
                lambda _: fanout.drain(catalog, "t"), requests)
        with client.get_queue_sender("fwd") as forwarded:
            forwarding.forward_all(catalog)
            out["forward 200"] = _timed(
                samples, lambda: forwarded.send_messages([ServiceBusMessage(BODY) for _ in range(SEND_BATCH)]),
                lambda _: forwarding.forward_all(catalog), requests)
    return out


def _worker(root: str, role: str, count: int, start: "multiprocessing.synchronize.Event",
            results: "multiprocessing.Queue[tuple[str, float, list[int]]]", threads: int = 1) -> None:
    """Send count messages (from `threads` threads sharing the process's sender: its group commit joins
    what they send at once), or receive and complete until count were seen or the queue stays empty;
    reports when its last batch was done (seconds after the start), so a receiver's final empty wait is not
    counted."""
    from concurrent.futures import ThreadPoolExecutor

    from sparkbus import ServiceBusClient, ServiceBusMessage

    with ServiceBusClient(root) as client, client.get_queue_sender("tp") as sender, \
            client.get_queue_receiver("tp", max_wait_time=1) as receiver:
        if role == "receive":
            receiver.peek_messages(1)  # the tables opened before the clock starts, as a running worker has them
        results.put(("ready", 0.0, []))
        start.wait()
        began = time.perf_counter()
        done = 0.0
        seen: list[int] = []
        if role == "send":
            def send(batches: int) -> float:
                last = 0.0
                for _ in range(batches):
                    sender.send_messages([ServiceBusMessage(BODY) for _ in range(SEND_BATCH)])
                    last = time.perf_counter() - began
                return last
            with ThreadPoolExecutor(threads) as pool:
                done = max(pool.map(send, [count // SEND_BATCH // threads] * threads))
        else:
            while len(seen) < count:
                got = receiver.receive_messages(RECEIVE_BATCH, max_wait_time=1)
                if not got:
                    break
                receiver.complete_messages(got)
                seen += [m.sequence_number for m in got]
                done = time.perf_counter() - began
        results.put((role, done, seen))


def _racer(uri: str, seconds: float, start: "multiprocessing.synchronize.Event",
           results: "multiprocessing.Queue[Any]") -> None:
    """Create the next entry of one log as fast as it can for `seconds`, reading what won after each lost
    race (the least a commit does per version); reports (won, lost)."""
    from sparkbus.storage import commits

    payload = b'{"commitInfo":{"operation":"WRITE"}}\n'
    version = commits.read_entries(uri, 0)[0][-1].version
    results.put("ready")
    start.wait()
    won = lost = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if commits.create_entry(commits.entry_uri(uri, version + 1), payload):
            won, version = won + 1, version + 1
        else:
            lost += 1
            version += max(1, len(commits.read_entries(uri, version + 1)[0]))
    results.put((won, lost))


def log_ceiling(root: str, processes: int, seconds: float = 4.0) -> dict[str, float]:
    """The ceiling of one entity's log on this store: `processes` writers racing for its next version with
    nothing else to do (a conditional PUT, and a read of the winner after a lost race). Every message an
    entity moves needs a share of these versions: a send of 200 one (fewer with group commit), a receive
    of 1,000 and its settlement two."""
    from sparkbus.storage import commits, location

    uri = location.join(root, f"ceiling-{uuid.uuid4().hex[:8]}")
    if location.is_local(uri):
        os.makedirs(os.path.join(uri, "_delta_log"))
    commits.create_entry(commits.entry_uri(uri, 0), b'{"commitInfo":{"operation":"CREATE"}}\n')
    context = multiprocessing.get_context("spawn")
    start, results = context.Event(), context.Queue()
    racers = [context.Process(target=_racer, args=(uri, seconds, start, results)) for _ in range(processes)]
    for r in racers:
        r.start()
    for _ in racers:
        assert results.get(timeout=300) == "ready"
    start.set()
    got = [results.get(timeout=300) for _ in racers]
    for r in racers:
        r.join(60)
    won, lost = sum(g[0] for g in got), sum(g[1] for g in got)
    return {"versions/s": won / seconds, "lost per version": lost / max(1, won)}


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, every core, from /proc/stat."""
    with open("/proc/stat") as handle:
        fields = [int(x) for x in handle.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle and iowait
    return sum(fields) - idle, sum(fields)


def _process_cpu(pid: Optional[int]) -> float:
    """CPU seconds a process (the store's server) has used so far; 0 when there is none."""
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def throughput(root: str, processes: int, messages: int, threads: int,
               server: Optional[int] = None) -> dict[str, float]:
    """msg/s of `processes` senders sharing the queue (one thread each, then `threads` threads each), then of
    `processes` receivers draining it; checks every message was received exactly once. Beside each rate,
    "cpu busy, <rate>": the share of the machine's cores busy meanwhile (every process: the workers, the
    store's server, the latency proxy), which says whether the rate is bound by the CPU; and "server cores,
    <rate>": the cores the store's server process (pid `server`) kept busy (Azurite is one Node.js process:
    at 1.0 it is saturated)."""
    import sparkbus

    sparkbus.ServiceBusAdministrationClient(root).create_queue("tp", enable_partitioning=True)
    context = multiprocessing.get_context("spawn")
    out: dict[str, float] = {}
    received: list[int] = []
    per = messages // processes // (SEND_BATCH * threads) * SEND_BATCH * threads
    runs = [("send", 1, "send msg/s"), ("send", threads, f"send msg/s, {threads} threads"),
            ("receive", 1, "receive msg/s")] if threads > 1 else [("send", 1, "send msg/s"), ("receive", 1, "receive msg/s")]
    sent = per * processes * (len(runs) - 1)
    for role, each, name in runs:
        start, results = context.Event(), context.Queue()
        workers = [context.Process(target=_worker, args=(root, role, per if role == "send" else sent,
                                                          start, results, each)) for _ in range(processes)]
        for w in workers:
            w.start()
        for _ in workers:  # imported, connected, and (receivers) the tables read once
            assert results.get(timeout=300)[0] == "ready"
        before, server_before, began = _cpu_times(), _process_cpu(server), time.perf_counter()
        start.set()
        got = [results.get(timeout=600) for _ in workers]
        after, server_after, ended = _cpu_times(), _process_cpu(server), time.perf_counter()
        if server is not None:
            out[f"server cores, {name}"] = (server_after - server_before) / (ended - began)
        elapsed = max(done for _, done, _ in got)  # until the last batch was sent, or received and completed
        out[f"cpu busy, {name}"] = (after[0] - before[0]) / max(1, after[1] - before[1])
        for w in workers:
            w.join(60)
        if role == "receive":
            received = [seq for _, _, seen in got for seq in seen]
        out[name] = (sent if role == "receive" else per * processes) / elapsed
    assert len(received) == len(set(received)) == sent, \
        f"{len(received)} received, {len(set(received))} distinct, {sent} sent"
    sparkbus.ServiceBusAdministrationClient(root).delete_queue("tp")
    return out


def child(store: str, latency: float, samples: int, processes: list[int], messages: int, threads: int) -> None:
    """Runs in the process made for one (store, latency): prints its results as one JSON line."""
    from latency_proxy import Proxy

    proxy: Optional[Proxy] = None
    if store == "azurite":
        proxy = Proxy(os.environ["AZURITE_BLOB_STORAGE_URL"].removeprefix("http://"), latency)
        os.environ["AZURITE_BLOB_STORAGE_URL"] = f"http://127.0.0.1:{proxy.start()}"
        root = f"az://sparkbus/{uuid.uuid4().hex[:12]}/ns"
    elif store == "s3":
        proxy = Proxy(os.environ["AWS_ENDPOINT_URL"].removeprefix("http://"), latency)
        os.environ["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{proxy.start()}"
        root = f"s3://sparkbus/{uuid.uuid4().hex[:12]}/ns"
    else:
        root = tempfile.mkdtemp(prefix="sparkbus-bench-") + "/ns"
    requests = proxy.requests if proxy else (lambda: 0)
    try:
        import sparkbus

        sparkbus.create_namespace(root, credits_per_second=None)
        result: dict[str, Any] = {"store": store, "latency_ms": latency,
                                  "operations": measure(root, samples, requests) if samples else {}}
        pid = os.environ.get({"azurite": "SPARKBUS_BENCH_AZURITE_PID", "s3": "SPARKBUS_BENCH_S3_PID"}.get(store, ""))
        result["throughput"] = {n: throughput(root, n, messages, threads, int(pid) if pid else None)
                                for n in processes}
        result["log ceiling"] = {n: log_ceiling(root, n) for n in processes}
    finally:
        if proxy:
            proxy.stop()
        if store == "local":
            shutil.rmtree(os.path.dirname(root), ignore_errors=True)
    print("RESULT " + json.dumps(result), flush=True)


# ---- the whole run ------------------------------------------------------------------------------------------

def _servers(stores: list[str]) -> tuple[dict[str, str], list[Callable[[], None]]]:
    """Start Azurite and SeaweedFS as the stores need: (their environment, how to stop them)."""
    environment: dict[str, str] = {}
    stops: list[Callable[[], None]] = []
    if "azurite" in stores:
        from servers import free_port

        azurite = os.path.join(REPO, ".azurite", "node_modules", ".bin", "azurite-blob")
        data = tempfile.mkdtemp(prefix="sparkbus-azurite-")
        port = free_port()
        server = subprocess.Popen([azurite, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", data,
                                   "--skipApiVersionCheck", "--loose", "--disableTelemetry"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def stop_azurite() -> None:
            server.terminate()
            server.wait(30)
            shutil.rmtree(data, ignore_errors=True)
        stops.append(stop_azurite)
        endpoint = f"http://127.0.0.1:{port}"
        environment.update(SPARKBUS_BENCH_AZURITE_PID=str(server.pid))
        environment.update(AZURE_STORAGE_USE_EMULATOR="true", AZURE_STORAGE_ACCOUNT_NAME="devstoreaccount1",
                           AZURE_STORAGE_ACCOUNT_KEY=EMULATOR_KEY, AZURITE_BLOB_STORAGE_URL=endpoint)
        from azure.storage.blob import BlobServiceClient

        for _ in range(150):
            try:
                BlobServiceClient.from_connection_string(
                    f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={EMULATOR_KEY};"
                    f"BlobEndpoint={endpoint}/devstoreaccount1;").create_container("sparkbus")
                break
            except Exception:
                time.sleep(0.2)
        else:
            raise RuntimeError("Azurite did not start")
    if "s3" in stores:
        from s3server import S3Server

        s3 = S3Server("sparkbus")
        stops.append(s3.stop)
        environment.update(s3.environment(), SPARKBUS_BENCH_S3_PID=str(s3.process.pid))
    return environment, stops


def plot(results: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    top = max(r["latency_ms"] for r in results)
    chosen = [r for r in results if r["latency_ms"] == top and r["store"] != "local"] or results
    operations = list(chosen[0]["operations"])
    fig, ax = plt.subplots(figsize=(11, 6))
    width = 0.8 / len(chosen)
    for i, r in enumerate(chosen):
        ax.barh([j + i * width for j in range(len(operations))],
                [r["operations"].get(op, {}).get("p50", 0) for op in operations], height=width,
                label=f"{r['store']}, {r['latency_ms']:g} ms per request")
    ax.set_yticks([j + width * (len(chosen) - 1) / 2 for j in range(len(operations))], operations)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("p50 (ms, log scale)")
    ax.legend(loc="lower right")
    ax.set_title("sparkbus operations on object stores (make bench-store)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def report(results: list[dict[str, Any]]) -> None:
    by = {(r["store"], r["latency_ms"]): r for r in results}
    latencies = sorted({r["latency_ms"] for r in results})
    top = latencies[-1]
    for store in dict.fromkeys(r["store"] for r in results):
        print(f"\n{store}")
        header = f"{'operation':38}" + "".join(f" {f'p50/p99 ms @{l:g}':>20}" for l in latencies if (store, l) in by)
        print(header + f" {'requests':>9} {'in a row':>9} {'from p50s':>10}")
        base, high = by.get((store, 0.0)) or by.get((store, 0)), by.get((store, top))
        for op in (base or high)["operations"]:
            cells = "".join(f" {by[(store, l)]['operations'][op]['p50']:9.1f}/{by[(store, l)]['operations'][op]['p99']:<10.1f}"
                            for l in latencies if (store, l) in by and op in by[(store, l)]["operations"])
            requests = (high or base)["operations"][op]["requests"]
            in_a_row = (high or base)["operations"][op].get("sequential")  # absent from runs before it was counted
            counted = "" if in_a_row is None else f"{in_a_row:9.1f}"
            estimated = ""
            if base and high and high is not base and op in base["operations"] and op in high["operations"]:
                estimated = f"{(high['operations'][op]['p50'] - base['operations'][op]['p50']) / top:10.1f}"
            print(f"{op:38}{cells} {requests:9.1f} {counted:>9} {estimated:>10}")
        for latency in latencies:
            if (store, latency) in by and by[(store, latency)].get("throughput"):
                for n, t in by[(store, latency)]["throughput"].items():
                    def busy(name: str) -> str:
                        share, server = t.get(f"cpu busy, {name}"), t.get(f"server cores, {name}")
                        return "" if share is None else \
                            f" (CPU {share:.0%}" + ("" if server is None else f", server {server:.2f} cores") + ")"
                    sends = ", ".join(f"{name.removeprefix('send msg/s').lstrip(', ') or '1 thread'} {rate:,.0f}"
                                      f"{busy(name)}" for name, rate in t.items() if name.startswith("send"))
                    print(f"  {n} process(es) @{latency:g} ms: send msg/s ({sends}), receive + complete "
                          f"{t['receive msg/s']:,.0f} msg/s{busy('receive msg/s')}")
                    ceiling = by[(store, latency)].get("log ceiling", {}).get(n)
                    if ceiling:  # a receive of RECEIVE_BATCH and its settlement: two versions
                        print(f"    one log's ceiling, {n} writer(s): {ceiling['versions/s']:.1f} versions/s "
                              f"({ceiling['lost per version']:.1f} lost races per version): receive + complete "
                              f"at most {ceiling['versions/s'] * RECEIVE_BATCH / 2:,.0f} msg/s, "
                              f"{t['receive msg/s'] / (ceiling['versions/s'] * RECEIVE_BATCH / 2):.0%} reached")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", default="local,azurite,s3")
    parser.add_argument("--latency-ms", default="0,20", help="comma-separated; object stores only (local: 0)")
    parser.add_argument("--single", type=int, default=40, help="samples per operation (0: throughput only)")
    parser.add_argument("--processes", default="1,2,4", help="throughput at the highest latency; '' for none")
    parser.add_argument("--messages", type=int, default=20000, help="messages per throughput run")
    parser.add_argument("--threads", type=int, default=4, help="sending threads per process in a second send run")
    parser.add_argument("--child", nargs=2, metavar=("STORE", "LATENCY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    processes = [int(p) for p in args.processes.split(",") if p]
    latencies = [float(x) for x in args.latency_ms.split(",")]
    if args.child:
        store, latency = args.child[0], float(args.child[1])
        child(store, latency, args.single, processes if store == "local" or latency == max(latencies) else [],
              args.messages, args.threads)
        return
    print("command:", " ".join([os.path.basename(sys.executable), *sys.argv]))
    stores = args.stores.split(",")
    environment, stops = _servers(stores)
    results = []
    try:
        for store in stores:
            for latency in ([0.0] if store == "local" else latencies):
                command = [sys.executable, __file__, "--child", store, str(latency), "--single", str(args.single),
                           "--latency-ms", args.latency_ms, "--messages", str(args.messages),
                           "--processes", args.processes, "--threads", str(args.threads)]
                print(f"running {store} at {latency:g} ms ...", flush=True)
                done = subprocess.run(command, env={**os.environ, **environment}, capture_output=True, text=True)
                lines = [l for l in done.stdout.splitlines() if l.startswith("RESULT ")]
                if done.returncode or not lines:
                    print(done.stdout[-3000:], done.stderr[-3000:])
                    raise SystemExit(f"{store} at {latency} ms failed")
                results.append(json.loads(lines[-1][len("RESULT "):]))
    finally:
        for stop in stops:
            stop()
    report(results)
    out = os.path.join(HERE, "results")
    os.makedirs(out, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    document = {"command": " ".join(sys.argv), "machine": f"{os.cpu_count()} cores", "time": stamp, "results": results}
    whole = all(r["operations"] for r in results)  # a throughput-only run (--single 0) is not the latest
    for name in (f"store-{stamp}.json", "store-latest.json") if whole else (f"store-{stamp}.json",):
        with open(os.path.join(out, name), "w") as f:
            json.dump(document, f, indent=1)
    if whole:
        plot(results, os.path.join(out, "store-latest.png"))
    print(f"\nwrote benchmarks/results/store-{stamp}.json" + (", store-latest.json and store-latest.png" if whole else ""))


if __name__ == "__main__":
    main()
