"""Acknowledged operations are on stable storage when the call returns: every commit's log entry and
data files, and the directories naming them, are fsynced (observed with strace in a real subprocess)."""
from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import textwrap

SCENARIO = textwrap.dedent("""
    import sys
    import sparkbus
    from sparkbus import ServiceBusClient, ServiceBusMessage
    path = sys.argv[1]
    sparkbus.create_namespace(path)
    sparkbus.ServiceBusAdministrationClient(path).create_queue("q", enable_partitioning=True, requires_duplicate_detection=True)
    with ServiceBusClient(path) as client:
        with client.get_queue_sender("q") as sender:
            for i in range(3):
                sender.send_messages(ServiceBusMessage(f"m{i}", message_id=str(i)))
        with client.get_queue_receiver("q") as receiver:
            for message in receiver.receive_messages(max_message_count=3):
                receiver.complete_message(message)
""")
FSYNC = re.compile(r"f(?:data)?sync\(\d+<(?P<path>[^>]*)>\)\s+= 0")

def _fsynced(tmp_path, durability: str) -> tuple[str, set[str]]:
    namespace, trace = str(tmp_path / "ns"), str(tmp_path / "trace")
    env = {**os.environ, "SPARKBUS_DURABILITY": durability}
    subprocess.run(["strace", "-f", "-y", "-e", "trace=fsync,fdatasync", "-o", trace,
                    sys.executable, "-c", SCENARIO, namespace], env=env, check=True, timeout=300)
    with open(trace) as lines:
        return namespace, {m["path"].rstrip("/") for m in map(FSYNC.search, lines) if m}


def test_every_commit_its_files_and_their_directories_are_fsynced(tmp_path):
    namespace, synced = _fsynced(tmp_path, "on")
    entries = glob.glob(os.path.join(namespace, "**", "_delta_log", "*.json"), recursive=True)
    assert len(entries) >= 10  # catalog, 3 tables x creation, 3 sends, the lock and the completes
    for entry in entries:
        # delta-rs fsyncs (through this module) the entry itself; a direct commit fsyncs its content under a
        # temporary name and links that inode to the entry's name (storage.commits), then the directory
        linked = os.path.join(os.path.dirname(entry), "." + os.path.basename(entry) + ".")
        assert entry in synced or any(p.startswith(linked) and p.endswith(".tmp") for p in synced), \
            f"log entry {entry} was not fsynced"
        assert os.path.dirname(entry) in synced
        table = os.path.dirname(os.path.dirname(entry))
        with open(entry) as actions:
            added = [json.loads(line)["add"]["path"] for line in actions if '"add"' in line]
        for path in added:
            data = os.path.join(table, path)
            assert data in synced, f"data file {data} of {entry} was not fsynced"
            assert os.path.dirname(data) in synced


def test_durability_off_fsyncs_nothing_of_the_namespace(tmp_path):
    namespace, synced = _fsynced(tmp_path, "off")
    assert glob.glob(os.path.join(namespace, "**", "*.json"), recursive=True)
    assert not [path for path in synced if path.startswith(namespace)]
