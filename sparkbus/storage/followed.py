"""Tables followed from their logs and held in memory, shared by the threads of a process: what runtime
properties (and any dashboard asking for many entities at once) read.

A table's state is a LogView (its live files, moved forward by reading the log entries written since) and a
PartitionReader (the rows of those files, each file read once: Delta data files never change). Asking for a
table's rows again costs one round of requests when nothing changed (the next log entry is not there) and
one more for the files added since, fetched concurrently; many tables are asked in parallel, so a listing
of fifty queues costs what one does. The first read of a table in a process opens it with delta-rs (its
log listing and checkpoint).

Receivers keep views of their own (a view is one reader's), but start from a copy of the process's view of
the table (view_of) and give theirs back when done (offer): a receiver made per session, or per batch job
step, then starts with one round of requests instead of delta-rs opening its three tables.

Ordering. Retention removes a message's row from `messages` before its state row from `locks`, so a reader
must not see a `messages` version older than its `locks` version across a retention run (a completed
message without its state row would look active). advance_pair moves both views at once and, when the
locks view applied a DELETE commit (retention's) or was seeded again, moves the messages view once more
afterwards: then every retention run whose locks commit was seen has its messages commit seen too.

Thread-safety: each followed table has its own lock, held while its view moves and its rows are read; the
registry keeps at most KEPT tables (least recently used dropped).
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

import pyarrow as pa

from . import concurrently, location, open_table
from .commits import AddedFile, Committed, Entry, LogView, Position
from .reader import PartitionReader

KEPT = 512
FOLLOW_POOL = "follow"  # the storage pool views move and tables are read on, side by side


@dataclass(frozen=True)
class TableRows:
    """A table's live rows (the columns asked for) at a version, and its latest commit's time."""

    rows: pa.Table
    version: int
    last_commit_ms: Optional[int]
    skipped: frozenset[int]  # partitions left out: their files could not be read
    app_versions: dict[str, Optional[int]]  # of the application transactions asked for


class Followed:
    """One table followed from its log, its rows kept in memory."""

    def __init__(self, uri: str, schema: pa.Schema, columns: Optional[tuple[str, ...]]) -> None:
        self.uri = uri
        self.lock = threading.Lock()
        self.view: Optional[LogView] = None
        self.reader = PartitionReader(schema, columns=columns)

    def advance(self) -> LogView:
        """The view at the table's latest version (opened on first use). Hold self.lock."""
        if self.view is None:
            self.view = LogView(open_table(self.uri))
            return self.view
        return self.view.advance()

    def rows(self, skipped: Iterable[int] = (), app_ids: Iterable[str] = ()) -> TableRows:
        """Every live row of the partitions not skipped, at the view's version, the files it lacks fetched
        together; PartitionUnavailableError (naming it) when a partition's files cannot be read. Hold
        self.lock."""
        assert self.view is not None
        view, left_out = self.view, set(skipped)
        partitions = sorted(view.partitions() - left_out)
        self.reader.prefetch(view, partitions)
        parts = [self.reader.rows(view, partition) for partition in partitions]
        rows = pa.concat_tables(parts) if parts else self.reader.with_partition([], 0)
        return TableRows(rows, view.version, view.last_commit_ms(), frozenset(left_out),
                         {app: view.app_version(app) for app in app_ids})


_tables: OrderedDict[tuple[str, tuple[str, ...] | None], Followed] = OrderedDict()
_guard = threading.Lock()


def followed(uri: str, schema: pa.Schema, columns: Optional[tuple[str, ...]] = None) -> Followed:
    """The process's followed table at uri (read with those columns)."""
    key = (uri, columns)
    with _guard:
        table = _tables.get(key)
        if table is None:
            table = _tables[key] = Followed(uri, schema, columns)
            while len(_tables) > KEPT:
                _tables.popitem(last=False)
        _tables.move_to_end(key)
        return table


_views: OrderedDict[str, tuple[threading.Lock, list[LogView]]] = OrderedDict()


def _kept_view(uri: str) -> tuple[threading.Lock, list[LogView]]:
    with _guard:
        entry = _views.get(uri)
        if entry is None:
            entry = _views[uri] = (threading.Lock(), [])
            while len(_views) > KEPT:
                _views.popitem(last=False)
        _views.move_to_end(uri)
        return entry


def view_of(uri: str, advance: bool = True) -> LogView:
    """A view of the table at uri, for a reader of its own (a receiver): a copy of the process's view of
    that table (moved to the latest version first unless advance is False: one round of requests when
    little changed), instead of the table opened anew with delta-rs (its log listed, its checkpoint read)
    for every receiver made."""
    lock, kept = _kept_view(uri)
    with lock:
        if not kept:
            kept.append(LogView(open_table(uri)))
        elif advance:
            kept[0].advance()
        return kept[0].copy()


def kept_copy(uri: str) -> Optional[LogView]:
    """A copy of the process's view of the table at uri, moved to the latest version first, when the
    process follows that table already; None when it does not (the caller opens the table itself)."""
    with _guard:
        entry = _views.get(uri)
    if entry is None:
        return None
    lock, kept = entry
    with lock:
        return kept[0].advance().copy() if kept else None


def offer(view: LogView) -> None:
    """A reader's view, now done with: it becomes the process's view of its table when it is further on."""
    lock, kept = _kept_view(view.log.uri)
    with lock:
        if not kept or kept[0].version < view.version:
            kept[:] = [view.copy()]


def committed(uri: str, base: int, done: Committed, added: list[AddedFile],
              app_transactions: Optional[dict[str, int]] = None) -> None:
    """This process committed added to the table at uri, planned at version base (a send): the process's
    view of the table, when it is at base or since, learns that commit and the entries it skipped, so the
    next receiver made starts past them with no request (a session sent to a moment ago is seen at once)."""
    with _guard:
        entry = _views.get(uri)
    if entry is None:
        return
    lock, kept = entry
    with lock:
        if not kept or not base <= kept[0].version < done.version:
            return
        view = kept[0]
        for skipped in done.skipped:
            if skipped.version > view.version:
                if skipped.table_changed:  # read again when asked (advance seeds it anew)
                    return
                view.apply(skipped, Position(skipped.version, view.position.known_at))
        view.apply(Entry(done.version, list(added), app_ids=dict(app_transactions or {}),
                         timestamp=int(time.time() * 1000)), done.position)


def advance_pair(locks: LogView, messages: LogView, advance: Callable[[LogView], LogView] = LogView.advance) -> None:
    """Move an entity's locks and messages views to their latest versions at once (one round of requests
    when nothing changed), then messages again if the locks view applied a retention run or was seeded
    again (see the module docstring). On local disk one after the other, locks first: a read there costs
    microseconds, handing one to a pool thread a tenth of a millisecond."""
    deletes = locks.deletes
    if location.is_local(locks.log.uri):
        advance(locks)
        advance(messages)
    else:
        concurrently([lambda: advance(locks), lambda: advance(messages)], FOLLOW_POOL)
    if locks.deletes != deletes:
        advance(messages)


def entity_rows(locks_uri: str, locks_schema: pa.Schema, locks_columns: tuple[str, ...], messages_uri: str,
                messages_schema: pa.Schema, messages_columns: tuple[str, ...], skipped: Iterable[int] = (),
                app_ids: Iterable[str] = ()) -> tuple[TableRows, TableRows]:
    """(locks, messages) rows of an entity, consistent as advance_pair makes them, with the versions of
    the messages table's application transactions app_ids."""
    locks = followed(locks_uri, locks_schema, locks_columns)
    messages = followed(messages_uri, messages_schema, messages_columns)
    with locks.lock, messages.lock:
        if locks.view is None or messages.view is None:  # first use: opened in order, locks first
            locks.advance()
            messages.advance()
        else:
            advance_pair(locks.view, messages.view)
        skip, apps = list(skipped), list(app_ids)
        found = concurrently([lambda: locks.rows(skip), lambda: messages.rows(skip, apps)], FOLLOW_POOL)
    return found[0], found[1]
