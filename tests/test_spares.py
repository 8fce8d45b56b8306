"""Unnamed files made ahead of commits (sparkbus.storage.spares), on this machine's real file system: handed
out once, linked where they belong or nowhere, never left behind, never shared with a forked child, and
what keeps a single operation's calling thread from making files itself."""
from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import wait_until
from test_commits import _rows
from sparkbus import storage
from sparkbus.engine import availability
from sparkbus.core.schemas import LOCKS, TABLE_CONFIGURATION
from sparkbus.storage import commits, spares


def _ready(directory: str) -> int:
    """A file made ahead in directory, waiting for the thread that makes it (each take asks for the next)."""
    found: list[int] = []
    assert wait_until(lambda: (d := spares.take(directory)) is not None and not found.append(d), 10), directory
    return found[0]


def _unnamed_in(root: str) -> list[str]:
    """This process's open unnamed files under root (their descriptors read "<directory>/#<inode> (deleted)")."""
    names = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:
            continue
        if target.startswith(root) and target.endswith("(deleted)"):
            names.append(target)
    return names


def test_a_file_made_ahead_is_unnamed_in_its_directory_handed_out_once_and_linked_there(tmp_path):
    directory = str(tmp_path / "part")
    os.mkdir(directory)
    first = _ready(directory)
    second = _ready(directory)
    try:
        assert first != second
        info = os.fstat(first)
        assert stat.S_ISREG(info.st_mode) and info.st_nlink == 0 and info.st_size == 0  # unnamed and empty
        assert info.st_dev == os.stat(directory).st_dev
        assert os.readlink(f"/proc/self/fd/{first}").startswith(directory + "/#")
        os.write(first, b"payload")
        assert spares.link(first, os.path.join(directory, "named"))
        assert os.stat(os.path.join(directory, "named")).st_ino == info.st_ino
        assert open(os.path.join(directory, "named"), "rb").read() == b"payload"
        assert os.listdir(directory) == ["named"]  # the other ready file has no name
    finally:
        os.close(first)
        os.close(second)


def test_a_file_made_ahead_for_a_removed_directory_is_linked_nowhere(tmp_path):
    directory = tmp_path / "gone"
    directory.mkdir()
    spare = _ready(str(directory))
    try:
        directory.rmdir()
        assert not spares.link(spare, str(directory / "named"))
        assert not directory.exists()
    finally:
        os.close(spare)


def test_a_file_made_ahead_that_cannot_be_named_fails_naming_its_partition_and_leaves_nothing(tmp_path):
    """An immutable directory (chattr +i, which binds root too) refuses the link: the error names the target,
    whose partition_id=N directory is how a send finds the faulty partition and places its messages elsewhere."""
    directory = tmp_path / "partition_id=13"
    directory.mkdir()
    spare = _ready(str(directory))
    subprocess.run(["chattr", "+i", str(directory)], check=True)
    try:
        with pytest.raises(PermissionError) as raised:
            spares.link(spare, str(directory / "named"))
        assert raised.value.filename == str(directory / "named")
        assert availability.partition_named(raised.value) == 13
    finally:
        subprocess.run(["chattr", "-i", str(directory)], check=True)
        os.close(spare)
    assert os.listdir(directory) == []


def test_a_data_file_of_a_removed_table_is_refused_though_a_file_was_made_for_it(tmp_path):
    """write_file takes the ready file, finds the partition's directory gone, and reports the removed table as
    it does without one: TableRemovedError, and no directory made again."""
    table = storage.create_table(str(tmp_path / "locks"), LOCKS, configuration=TABLE_CONFIGURATION["locks"])
    log = commits.TableLog.of(table)
    rows = _rows([1])
    written = commits.write_file(log, 3, rows)  # the partition's first file: its directory is made
    partition = os.path.join(log.uri, os.path.dirname(written.path))
    os.close(_ready(partition))
    os.close(_ready(partition))  # (one is ready again now or soon: the next write finds it or makes its own)
    time.sleep(0.2)
    storage.remove_tree(str(tmp_path / "locks"))
    with pytest.raises(commits.TableRemovedError):
        commits.write_file(log, 3, rows)
    assert not (tmp_path / "locks").exists()


def test_small_and_large_files_written_into_files_made_ahead_read_back_whole(tmp_path):
    """A data file written into a file made ahead holds exactly its rows, whether it was encoded in memory
    and written at once (up to BUFFERED_WRITE bytes of buffers) or encoded straight into the file; its
    size in the add action is the file's."""
    import pyarrow.parquet as pq

    table = storage.create_table(str(tmp_path / "locks"), LOCKS, configuration=TABLE_CONFIGURATION["locks"])
    log = commits.TableLog.of(table)
    first = commits.write_file(log, 0, _rows([0]))  # the partition's first file: made inline
    partition = os.path.join(log.uri, os.path.dirname(first.path))
    small = _rows(list(range(1, 11)))
    large = _rows(list(range(11, 11 + 120_000)))
    assert small.get_total_buffer_size() <= commits.BUFFERED_WRITE < large.get_total_buffer_size()
    for rows in (small, large):
        os.close(_ready(partition))  # the one made ready: the next is made now, then waited for
        assert wait_until(lambda: partition in spares._spares.ready, 10)
        spare = os.fstat(spares._spares.ready[partition]).st_ino
        before = set(os.listdir(partition))
        added = commits.write_file(log, 0, rows)
        path = os.path.join(log.uri, added.path)
        assert os.stat(path).st_ino == spare  # the file made ahead, now named
        assert set(os.listdir(partition)) - before == {os.path.basename(path)}
        assert added.size == os.path.getsize(path) and added.rows == rows.num_rows
        read = pq.read_table(path)
        assert read.num_rows == rows.num_rows
        for name in rows.schema.names:  # (columns null in every row are left out of the file)
            expected = rows[name]
            if name in read.schema.names:
                assert read[name].cast(expected.type).equals(expected), name
            else:
                assert expected.null_count == len(expected), name


def test_files_are_kept_ready_for_the_directories_last_written_to_only(tmp_path):
    directories = [str(tmp_path / f"d{i:03d}") for i in range(spares.MAX_DIRECTORIES + 8)]
    for directory in directories:
        os.mkdir(directory)
        assert spares.take(directory) is None  # a directory's first take: nothing was made for it yet
    # every directory asked for one; the oldest eight were closed again
    assert wait_until(lambda: len(_unnamed_in(str(tmp_path))) == spares.MAX_DIRECTORIES, 20)
    time.sleep(0.3)
    held = _unnamed_in(str(tmp_path))
    assert len(held) == spares.MAX_DIRECTORIES
    assert not [name for name in held for d in directories[:8] if name.startswith(d + "/")]
    for directory in directories[8:]:
        spare = spares.take(directory)
        assert spare is not None
        os.close(spare)
    assert all(os.listdir(d) == [] for d in directories)  # nothing was ever named


UNWRITABLE = textwrap.dedent("""
    import errno, os, resource, signal, sys
    sys.path.insert(0, sys.argv[2])
    from conftest import wait_until
    from test_commits import _rows
    from sparkbus import storage
    from sparkbus.core.schemas import LOCKS, TABLE_CONFIGURATION
    from sparkbus.engine import availability
    from sparkbus.storage import commits, spares
    log = commits.TableLog.of(storage.create_table(sys.argv[1], LOCKS, configuration=TABLE_CONFIGURATION["locks"]))
    partition = os.path.join(log.uri, os.path.dirname(commits.write_file(log, 7, _rows([0])).path))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
    for rows in (_rows(list(range(1, 1001))), _rows(list(range(1, 120_001)))):  # encoded in memory, natively
        if (ready := spares.take(partition)) is not None:  # (the next one is asked for either way)
            os.close(ready)
        assert wait_until(lambda: partition in spares._spares.ready, 10)
        before = set(os.listdir(partition))
        try:
            commits.write_file(log, 7, rows)
            raise AssertionError("written past the limit")
        except OSError as error:
            assert error.errno == errno.EFBIG and error.filename.startswith(partition + "/part-"), repr(error)
            assert availability.partition_named(error) == 7, repr(error)
        assert set(os.listdir(partition)) == before  # nothing named
    print("ok")
""")


def test_a_file_made_ahead_that_cannot_be_written_fails_naming_its_partition(tmp_path):
    """A write into a file made ahead fails as a write into a named one would (here past RLIMIT_FSIZE):
    with the target's path, whose partition_id=N directory is the partition a send places elsewhere."""
    done = subprocess.run([sys.executable, "-c", UNWRITABLE, str(tmp_path / "locks"), os.path.dirname(__file__)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


FORKED = textwrap.dedent("""
    import os, sys, time
    from sparkbus.storage import spares
    directory = sys.argv[1]
    spares.take(directory)
    deadline = time.monotonic() + 10
    while not spares._spares.ready and time.monotonic() < deadline:
        time.sleep(0.01)
    held = spares._spares.ready[directory]
    child = os.fork()
    if child == 0:
        try:
            os.fstat(held)
            os._exit(3)  # the parent's file is still open here
        except OSError:
            pass
        os._exit(0 if spares.take(directory) is None else 4)  # and the child has none of its own yet
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0, os.waitstatus_to_exitcode(status)
    assert spares.take(directory) == held  # the parent's file stayed the parent's
    print("ok")
""")


def test_a_forked_child_closes_the_files_made_for_its_parent(tmp_path):
    done = subprocess.run([sys.executable, "-c", FORKED, str(tmp_path)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


SENDS = textwrap.dedent("""
    import os, sys
    import sparkbus
    from sparkbus import ServiceBusClient, ServiceBusMessage
    path = sys.argv[1]
    sparkbus.create_namespace(path, credits_per_second=None)
    sparkbus.ServiceBusAdministrationClient(path).create_queue("q", enable_partitioning=True)
    with ServiceBusClient(path) as client, client.get_queue_sender("q") as sender:
        for i in range(60):
            sender.send_messages(ServiceBusMessage("m", partition_key="k"))
        os.path.exists("/sparkbus-trace-marker")  # from here on, the steady state
        for i in range(40):
            sender.send_messages(ServiceBusMessage("m", partition_key="k"))
""")
OPENAT = re.compile(r'^(?P<thread>\d+)\s+openat\([^,]+, "(?P<path>[^"]*)", (?P<flags>[^,)]*)')


def test_steady_single_sends_make_almost_no_file_on_the_calling_thread(tmp_path):
    """Once a partition and its log have been written to, a send's data file and log entry are files made
    ahead: the thread that sends creates almost none (a file made on it cost 0.4-0.75 ms where deletions are
    frequent; made inline, each of the 40 sends made 2). A commit that finds the thread behind, as on a
    loaded machine, makes its own: a few of 80 may be."""
    trace, namespace = str(tmp_path / "trace"), str(tmp_path / "ns")
    subprocess.run(["strace", "-f", "-e", "trace=openat,newfstatat,stat", "-o", trace, sys.executable, "-c", SENDS,
                    namespace], check=True, timeout=300)
    lines = open(trace).read().splitlines()
    main = lines[0].split()[0]
    marker = next(i for i, line in enumerate(lines) if "/sparkbus-trace-marker" in line)
    made_by_sender = [line for line in lines[marker:] if (found := OPENAT.match(line)) and found["thread"] == main
                      and ("O_TMPFILE" in found["flags"]  # (made relative to a directory's descriptor)
                           or "O_CREAT" in found["flags"] and found["path"].startswith(namespace))]
    made_ahead = [line for line in lines[marker:] if (found := OPENAT.match(line)) and found["thread"] != main
                  and "O_TMPFILE" in found["flags"]]
    assert len(made_by_sender) <= 8, "\n".join(made_by_sender[:10])
    assert len(made_ahead) >= 2 * 40 - 8 - 4  # a data file and an entry per send (a few may be ready already)
