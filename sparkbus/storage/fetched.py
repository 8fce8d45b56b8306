"""The bytes of object-store data files this process read or wrote, shared by every reader of the process.

Delta data files never change once written (their names are new UUIDs), so bytes kept here are never
stale. A file this process wrote is kept as it was uploaded: its next reader (a receiver reading the
messages a sender of the same process committed, a new receiver reading the locks and sessions files the
previous one wrote) then costs no request. Least recently used files are dropped beyond FETCHED_BYTES;
files larger than KEPT_WRITE_BYTES are not kept when written (a bulk send would push out what readers use).
"""
from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from typing import Iterable

from . import concurrently, location

FETCHED_BYTES = 64 << 20
KEPT_WRITE_BYTES = 4 << 20
_fetched: OrderedDict[str, bytes] = OrderedDict()
_fetched_bytes = [0]
_guard = threading.Lock()


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
