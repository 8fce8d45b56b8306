"""The bytes of object-store data files this process read or wrote, shared by every reader of the process;
and the rows of small files this process wrote lately, for its compaction.

Delta data files never change once written (their names are new UUIDs), so bytes kept here are never
stale. A file this process wrote is kept as it was uploaded: its next reader (a receiver reading the
messages a sender of the same process committed, a new receiver reading the locks and sessions files the
previous one wrote) then costs no request. Least recently used files are dropped beyond FETCHED_BYTES;
files larger than KEPT_WRITE_BYTES are not kept when written (a bulk send would push out what readers use).

Compaction merges the small files of the process's own sends and settlements soon after they were written;
reading them back cost a single send's compaction 27 file reads of Python under the GIL, which the sends
then waited for (their p99). So the rows of each small file written are kept until compaction takes them
(rows_written), up to WRITTEN_ROWS_BYTES. Only compaction takes them: receivers and peeks read what the
store holds, so a file damaged after it was written is found damaged by them.
"""
from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from typing import Iterable, Optional

import pyarrow as pa

from . import concurrently, location

FETCHED_BYTES = 64 << 20
KEPT_WRITE_BYTES = 4 << 20
WRITTEN_ROWS_BYTES = 16 << 20
KEPT_ROWS_BYTES = 256 << 10  # a file's rows kept for compaction at most (compaction merges small files)
_fetched: OrderedDict[str, bytes] = OrderedDict()
_fetched_bytes = [0]
_guard = threading.Lock()
_rows: OrderedDict[str, tuple[pa.Table, int]] = OrderedDict()
_rows_bytes = [0]


def fetch(paths: Iterable[str]) -> dict[str, bytes]:
    """The bytes of object-store files, from the shared cache or fetched concurrently (one round trip);
    OSError (FileNotFoundError when missing) as the first failure raised."""
    wanted = list(dict.fromkeys(paths))
    found: dict[str, bytes] = {}
    with _guard:
        for path in wanted:
            if path in _fetched:
                found[path] = _fetched[path]
                _fetched.move_to_end(path)
    missing = [path for path in wanted if path not in found]
    if len(missing) == 1:
        found[missing[0]] = location.get(missing[0])
    elif missing:
        got = concurrently([functools.partial(location.get, path) for path in missing], "fetch")
        found.update(zip(missing, got))
    for path in missing:
        _keep(path, found[path])
    return found


def written(path: str, data: bytes) -> None:
    """This process uploaded data as path: keep it for the file's readers (unless it is large)."""
    if len(data) <= KEPT_WRITE_BYTES:
        _keep(path, data)


def _keep(path: str, data: bytes) -> None:
    with _guard:
        if path not in _fetched:
            _fetched[path] = data
            _fetched_bytes[0] += len(data)
        while _fetched_bytes[0] > FETCHED_BYTES and len(_fetched) > 1:
            _, dropped = _fetched.popitem(last=False)
            _fetched_bytes[0] -= len(dropped)


def wrote_rows(path: str, data: pa.Table) -> None:
    """This process wrote data as the file at path: keep its rows for compaction (unless they are large)."""
    size = data.get_total_buffer_size()
    if size > KEPT_ROWS_BYTES:
        return
    with _guard:
        if path not in _rows:
            _rows[path] = (data, size)
            _rows_bytes[0] += size
        while _rows_bytes[0] > WRITTEN_ROWS_BYTES and _rows:
            _, (_, dropped) = _rows.popitem(last=False)
            _rows_bytes[0] -= dropped


def rows_written(path: str) -> Optional[pa.Table]:
    """The rows of the file at path as this process wrote it lately (then forgotten), or None."""
    with _guard:
        kept = _rows.pop(path, None)
        if kept is None:
            return None
        _rows_bytes[0] -= kept[1]
        return kept[0]
