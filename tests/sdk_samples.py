"""Run azure-servicebus 7.15.0's own samples on sparkbus with only the import prefix changed: its 28 async
samples (sparkbus.aio) and its 30 sync ones, each on a fresh local namespace (`make sdk-samples`; about 12
minutes, 8 of them auto_lock_renew's sleeps, so not part of `make test`).

The samples come from the package index's source distribution (downloaded once into .cache/). Each runs
as its own process with the environment the samples read (SERVICEBUS_FULLY_QUALIFIED_NAMESPACE is the
namespace's path, SERVICEBUS_CONNECTION_STR a sparkbus:// connection string), entities made as the samples
expect them, a queue and topic filled for the samples that only receive, and topic messages fanned out
meanwhile, as the namespace service would. Checked, for every async sample and its sync counterpart:

- both end with exit code 0 (receive_iterator_queue instead keeps waiting, as the SDK's iterator does,
  after printing what the queue held);
- they leave the same number of messages in each entity;
- they print the same lines, once ids, lock tokens and times are masked, apart from lines that only one
  of the two sample sources has a print for (the samples differ in places, e.g. "Thread 0" / "Coroutine 0").

Exit code 0 when everything holds; otherwise each failure is printed and the exit code is 1.
"""
from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Optional

VERSION = "7.15.0"
CACHE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".cache", "sdk-samples")
PREFIXES = (("azure.servicebus.aio.management", "sparkbus.aio.management"), ("azure.servicebus.aio", "sparkbus.aio"),
            ("azure.servicebus.management", "sparkbus.management"), ("azure.servicebus", "sparkbus"))
PREFILLED = {"receive_queue", "receive_peek", "receive_iterator_queue", "receive_subscription"}
# seconds they run before they are stopped: `for msg in receiver` without max_wait_time waits for more messages
ENDLESS = {"receive_iterator_queue": 15, "failure_and_recovery": 15}
TIMEOUT = {"auto_lock_renew": 900}  # its handlers sleep 100 s at a time, five times over
# Samples whose sync and async sources send different messages, so only exit codes and counts compare: the
# sync session_pool_receive sends 20 messages to each of 10 sessions, the async one 20 and a "shutdown" to 5.
OUTPUTS_DIFFER = {"session_pool_receive"}
MASKS = [(re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "<uuid>"),
         (re.compile(r"\b[0-9a-f]{32}\b"), "<id>"),
         (re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?(\+00:00)?"), "<time>")]


@dataclass
class Run:
    code: Optional[int]  # None: an endless sample, stopped as planned
    lines: list[str]
    errors: str
    counts: dict[str, int] = field(default_factory=dict)


def samples_dir() -> str:
    """The samples of the source distribution, downloaded and unpacked into CACHE once."""
    root = os.path.join(CACHE, f"azure_servicebus-{VERSION}")
    if not os.path.isdir(root):
        os.makedirs(CACHE, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                        f"azure-servicebus=={VERSION}", "-d", CACHE], check=True)
        with tarfile.open(os.path.join(CACHE, f"azure_servicebus-{VERSION}.tar.gz")) as archive:
            archive.extractall(CACHE, filter="data")
    return os.path.join(root, "samples")


def ported(source: str) -> str:
    for old, new in PREFIXES:
        source = source.replace(old, new)
    return source


def masked(text: str) -> str:
    for pattern, mask in MASKS:
        text = pattern.sub(mask, text)
    return text


def print_templates(source: str) -> list[re.Pattern]:
    """What the sample's print calls can print, as patterns: a literal, an f-string or a '...'.format()
    with each replacement field matching anything."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print" and node.args):
            continue
        first = node.args[0]
        if isinstance(first, ast.Call) and isinstance(first.func, ast.Attribute) and first.func.attr == "format":
            first = first.func.value
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            parts = re.split(r"\{[^}]*\}", first.value)
        elif isinstance(first, ast.JoinedStr):
            parts, current = [], ""
            for value in first.values:
                if isinstance(value, ast.Constant):
                    current += str(value.value)
                else:
                    parts.append(current)
                    current = ""
            parts.append(current)
        else:
            continue
        tail = " .*" if len(node.args) > 1 else ""
        found.append(re.compile(".*".join(re.escape(p) for p in parts) + tail))
    return found


def namespace(root: str, sample: str) -> str:
    import sparkbus

    path = os.path.join(root, "ns")
    sparkbus.create_namespace(path, credits_per_second=None)
    admin = sparkbus.ServiceBusAdministrationClient(path)
    admin.create_queue("orders")
    admin.create_queue("session-orders", requires_session=True)
    admin.create_topic("events")
    admin.create_subscription("events", "all", requires_session=sample == "list_sessions")
    if sample in PREFILLED:
        with sparkbus.ServiceBusClient(path) as client:
            for name, sender in (("orders", client.get_queue_sender("orders")), ("events", client.get_topic_sender("events"))):
                sender.send_messages([sparkbus.ServiceBusMessage(f"prefilled {name} {i}") for i in range(5)])
    return path


def environment(path: str) -> dict[str, str]:
    return {**os.environ, "SERVICEBUS_FULLY_QUALIFIED_NAMESPACE": path,
            "SERVICEBUS_CONNECTION_STR": f"Endpoint=sparkbus://{path};SharedAccessKeyName=policy;SharedAccessKey=key",
            "SERVICEBUS_QUEUE_NAME": "orders", "SERVICEBUS_SESSION_QUEUE_NAME": "session-orders",
            "SERVICEBUS_TOPIC_NAME": "events", "SERVICEBUS_SUBSCRIPTION_NAME": "all", "SERVICEBUS_SAS_POLICY": "policy",
            "SERVICEBUS_SAS_KEY": "key", "SERVICEBUS_SESSION_ID": "session-1"}


def fan_out_until(path: str, stop: threading.Event) -> None:
    """Deliver topic messages to subscriptions every 0.1 s, as the namespace service does (without Spark)."""
    import sparkbus
    from sparkbus.engine import fanout
    from sparkbus.engine.catalog import Catalog
    from sparkbus.storage.location import normalize

    catalog = Catalog(normalize(path))
    while not stop.wait(0.1):
        for topic in sparkbus.ServiceBusAdministrationClient(path).list_topics():
            try:
                fanout.drain(catalog, topic.name)
            except sparkbus.MessagingEntityNotFoundError:  # a sample deleted it meanwhile
                pass


def run(source_path: str, sample: str) -> Run:
    import sparkbus

    with tempfile.TemporaryDirectory() as root:
        path = namespace(root, sample)
        script = os.path.join(root, os.path.basename(source_path))
        with open(source_path, encoding="utf-8") as original, open(script, "w", encoding="utf-8") as copy:
            copy.write(ported(original.read()))
        stop = threading.Event()
        fanning = threading.Thread(target=fan_out_until, args=(path, stop), daemon=True)
        fanning.start()
        try:
            done = subprocess.run([sys.executable, script], env=environment(path), cwd=root, capture_output=True,
                                  text=True, timeout=ENDLESS.get(sample, TIMEOUT.get(sample, 120)))
            result = Run(done.returncode, done.stdout.splitlines(), done.stderr)
        except subprocess.TimeoutExpired as ended:
            output = ended.stdout.decode() if isinstance(ended.stdout, bytes) else (ended.stdout or "")
            result = Run(None if sample in ENDLESS else -1, output.splitlines(), "timed out")
        finally:
            stop.set()
            fanning.join()
        admin = sparkbus.ServiceBusAdministrationClient(path)
        result.counts = {q.name: admin.get_queue_runtime_properties(q.name).total_message_count
                         for q in admin.list_queues()}
        result.counts.update({f"events/{s.name}": admin.get_subscription_runtime_properties("events", s.name)
                              .total_message_count for s in admin.list_subscriptions("events")}
                             if "events" in {t.name for t in admin.list_topics()} else {})
        return result


def unexplained(mine: list[str], theirs: list[str], my_source: str, their_source: str) -> list[str]:
    """Lines printed by one sample and not the other that its own source accounts for and the other's does
    not: a print template only it has, or (for a printed value) its words, which only its source holds."""
    mine_t, theirs_t = print_templates(my_source), print_templates(their_source)

    def explained(line: str) -> bool:
        if any(t.fullmatch(line) for t in mine_t) and not any(t.fullmatch(line) for t in theirs_t):
            return True
        words = re.findall(r"[A-Za-z][A-Za-z ]{5,}[A-Za-z]", line)
        return bool(words) and all(w in my_source and w not in their_source for w in words)
    extra = sorted(set(map(masked, mine)) - set(map(masked, theirs)))
    return [line for line in extra if not explained(line)]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("samples", nargs="*", help="sample names (default: all), e.g. send_queue")
    args = parser.parse_args(argv)
    root = samples_dir()
    sync_dir, async_dir = os.path.join(root, "sync_samples"), os.path.join(root, "async_samples")
    sync_names = sorted(n[:-3] for n in os.listdir(sync_dir) if n.endswith(".py"))
    async_names = {n[:-len("_async.py")] for n in os.listdir(async_dir) if n.endswith("_async.py")}
    failures = []
    for name in args.samples or sync_names:
        sync_source = open(os.path.join(sync_dir, f"{name}.py"), encoding="utf-8").read()
        sync = run(os.path.join(sync_dir, f"{name}.py"), name)
        problems = [] if sync.code in (0, None) else [f"sync exit code {sync.code}: {sync.errors.strip()[-500:]}"]
        if name in async_names:
            async_source = open(os.path.join(async_dir, f"{name}_async.py"), encoding="utf-8").read()
            done = run(os.path.join(async_dir, f"{name}_async.py"), name)
            if done.code not in (0, None):
                problems.append(f"async exit code {done.code}: {done.errors.strip()[-500:]}")
            if done.counts != sync.counts:
                problems.append(f"messages left: async {done.counts}, sync {sync.counts}")
            for which, lines in (("async", unexplained(done.lines, sync.lines, async_source, sync_source)),
                                 ("sync", unexplained(sync.lines, done.lines, sync_source, async_source))):
                if lines and name not in OUTPUTS_DIFFER:
                    problems.append(f"only the {which} sample printed {lines[:5]}")
        status = "ok" if not problems else "FAILED"
        kinds = "sync and async" if name in async_names else "sync"
        print(f"{name}: {status} ({kinds}; {len(sync.lines)} lines, messages left {sync.counts})", flush=True)
        for problem in problems:
            print(f"    {problem}")
        failures += problems
    print(f"{len(failures)} problem(s)" if failures else "every sample ran as its counterpart did")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
