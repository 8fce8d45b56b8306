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
LINE = re.compile(r"^(?P<thread>\d+)\s+(?P<call>.*)$")  # strace pads a process id to 5 columns
RESUMED = re.compile(r"^<\.\.\. \w+ resumed>(?P<rest>.*)$")
# (an unnamed file, O_TMPFILE, shows as "<directory>/#<inode>" followed by "(deleted)" until linked)
FSYNC = re.compile(r"^f(?:data)?sync\((?P<fd>\d+)(?:<(?P<path>[^>]*)>(?:\(deleted\))?)?\)\s+= 0")
OPENAT = re.compile(r'^openat\([^,]+, "(?P<path>[^"]+)", (?P<flags>[^,)]*).*\)\s+= (?P<fd>\d+)(?:<(?P<opened>[^>]*)>)?')
DIRECTORY = r'(?:(?:AT_FDCWD|\d+)(?:<(?P<{}>[^>]*)>)?, )?'
LINK = re.compile(rf'^link(?:at)?\({DIRECTORY.format("source_dir")}"(?P<source>[^"]+)", '
                  rf'{DIRECTORY.format("target_dir")}"(?P<target>[^"]+)"(?:, \w+)?\)\s+= 0')
PROC_FD = re.compile(r"^/proc/self/fd/(?P<fd>\d+)$")


def _fsynced(tmp_path, durability: str) -> tuple[str, dict[str, list[int]], dict[str, tuple[str, int]]]:
    """(namespace, the trace lines at which each path's fsyncs had returned, entry -> (temporary file
    linked to it, line)). A call another thread's interrupted is joined with its resumption first; an
    fsync's file is known from the descriptor's path (strace -y) or else from the latest open that returned
    the descriptor, in any thread (descriptors are the process's: an unnamed file made ahead on one thread
    is written, fsynced and linked on another; strace cannot always read a descriptor's path)."""
    namespace, trace = str(tmp_path / "ns"), str(tmp_path / "trace")
    env = {**os.environ, "SPARKBUS_DURABILITY": durability}
    subprocess.run(["strace", "-f", "-y", "-e", "trace=openat,fsync,fdatasync,link,linkat", "-o", trace,
                    sys.executable, "-c", SCENARIO, namespace], env=env, check=True, timeout=300)
    synced: dict[str, list[int]] = {}
    linked: dict[str, tuple[str, int]] = {}
    pending: dict[str, str] = {}  # thread id -> the start of its call in progress
    opened: dict[int, str] = {}  # descriptor -> path of its latest open
    with open(trace) as lines:
        for number, line in enumerate(lines):
            if (found := LINE.match(line.rstrip("\n"))) is None:
                continue
            thread, call = found["thread"], found["call"]
            if call.endswith(" <unfinished ...>"):
                pending[thread] = call.removesuffix(" <unfinished ...>")
                continue
            if (resumed := RESUMED.match(call)) is not None:
                call = pending.pop(thread, "") + resumed["rest"]
            if (found := OPENAT.match(call)) is not None:  # an unnamed file: known by its "<directory>/#<inode>"
                unnamed = "O_TMPFILE" in found["flags"] and found["opened"]
                opened[int(found["fd"])] = unnamed or found["path"]
            elif (found := FSYNC.match(call)) is not None:
                path = found["path"] or opened.get(int(found["fd"]), "")
                synced.setdefault(path.rstrip("/"), []).append(number)
            elif (found := LINK.match(call)) is not None:  # (a relative name is in its directory descriptor's)
                source, target = found["source"], os.path.join(found["target_dir"] or "", found["target"])
                if (by_descriptor := PROC_FD.match(source)) is not None:  # an unnamed file linked by descriptor
                    source = opened.get(int(by_descriptor["fd"]), source)
                linked[target] = (source, number)
    return namespace, synced, linked


def _mentions(tmp_path, path: str) -> str:
    """The trace's lines naming path (what a failure shows)."""
    with open(tmp_path / "trace") as lines:
        return "".join(line for line in lines if os.path.basename(path) in line)


def test_every_commit_its_files_and_their_directories_are_fsynced(tmp_path):
    """Every entry and the data files it adds, and their directories, are fsynced; a direct commit (sends,
    locks, settlements) fsyncs its entry's content, data files and their directories before the entry is
    linked into place (the commit point), and its log directory after."""
    namespace, synced, linked = _fsynced(tmp_path, "on")
    assert synced and linked, "no fsync or link read from the trace:\n" + (tmp_path / "trace").read_text()[:2000]
    entries = glob.glob(os.path.join(namespace, "**", "_delta_log", "*.json"), recursive=True)
    assert len(entries) >= 10  # catalog, 3 tables x creation, 3 sends, the lock and the completes
    direct = 0
    for entry in entries:
        log_dir = os.path.dirname(entry)
        staged, at = linked.get(entry, ("", -1))
        if staged.endswith(".json.tmp") or "/#" in staged:  # a direct commit (storage.commits): named or unnamed
            direct += 1
            assert any(line < at for line in synced.get(staged, [])), \
                f"{entry} linked before its content was fsynced:\n{_mentions(tmp_path, staged)}"
            assert any(line > at for line in synced.get(log_dir, [])), f"{log_dir} not fsynced after {entry}"
        else:  # delta-rs commits: this module fsyncs their files, the entry, then the directories (sync_version)
            assert entry in synced, f"log entry {entry} was not fsynced"
            assert log_dir in synced
            at = None
        table = os.path.dirname(log_dir)
        with open(entry) as actions:
            added = [json.loads(line)["add"]["path"] for line in actions if '"add"' in line]
        for path in added:
            data = os.path.join(table, path)
            for durable in (data, os.path.dirname(data)):
                assert any(at is None or line < at for line in synced.get(durable, [])), \
                    f"{durable} not durable before {entry}"
    assert direct >= 5  # the sends, the lock and the completes commit directly


def test_durability_off_fsyncs_nothing_of_the_namespace(tmp_path):
    namespace, synced, _ = _fsynced(tmp_path, "off")
    assert glob.glob(os.path.join(namespace, "**", "*.json"), recursive=True)
    assert not [path for path in synced if path.startswith(namespace)]
