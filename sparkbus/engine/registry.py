"""Runtime view of one entity for the data plane: its settings, tables, limits and available partitions.

Entity identity. Deleting an entity removes its catalog row, then its storage directory (entities/<uuid>);
creating one of the same name again gives a new row with a new directory. That directory is the entity's
incarnation (EntityInfo.incarnation), and whatever a client holds belongs to one incarnation: a lock token
with the state row kept from the receive, a session lock, the sequence numbers a receiver deferred or a
sender scheduled, a sender's table handle and high-water marks. Used with another incarnation they would
settle, renew, defer or number messages nobody received (sequence numbers start again in a new one). So:

- Every handle carries its incarnation, and every use compares it with the entity's current one
  (CachedEntity.get: re-read from the catalog at most once a second, nothing read per operation): a
  mismatch is refused before anything is read or written.
- Within that second the cached info may still name a deleted incarnation, whose directory may be whole,
  being removed, or gone. An operation on it then fails (a file of the removed directory is missing; writes
  never create a table's directory, sparkbus.storage.commits), or it succeeds in the doomed directory (an
  object store creates any key). CachedEntity.confirm settles which: run after every write and after every
  failure, it checks that the catalog has no version after the one the info was read from (one small read
  of a log entry that does not exist yet: no listing, no catalog read) and reads the catalog only when it
  has. When the incarnation is gone it removes the incarnation's directory again, taking what this writer
  added during or after the delete's own removal, and raises EntityDeleted, which callers turn into their
  handle's error or follow to the new incarnation (a sender's send, a receiver's receive).
- Why that is complete: the delete removes the catalog row before the directory. A write confirmed
  afterwards (no catalog version since) ended before the catalog changed, so before the directory's removal
  began, and goes with the directory; a write that is not confirmed is removed by its writer, after it was
  made. No file of a deleted incarnation remains, and none is written in another incarnation.
- Why the cached info alone does not do: a commit to a removed table fails on local disk, but on an object
  store it succeeds (any key can be created), so only a read can tell that a write went into a deleted
  incarnation. On local disk that read follows the write (a failed open: microseconds).
- On an object store the read would be a third round trip after a commit's two, so it is sent side by
  side with the write instead (CachedEntity.check_ahead, before the write's first request) and vouches for
  it when the write ended within CONFIRM_WINDOW_SECONDS of sending it; a slower write is confirmed after
  it, as above. The delete pays for this: it removes an object-store incarnation's directory at once and
  again REMOVAL_DELAY_SECONDS after its catalog commit (remove_deleted). Why that is complete: a read that
  found no catalog version after the info's was served before the delete's catalog commit C, so it was
  sent before C; the write's requests all ended within the window of that sending, so before
  C + CONFIRM_WINDOW_SECONDS, and the second removal, begun after C + REMOVAL_DELAY_SECONDS, takes what
  they left. (Two machines' monotonic clocks measure durations alike to far better than the half second
  between the two.) So a send or a settlement waits for its commit's two requests only. The delete does
  not wait for its second removal either: a thread of its own makes it when it is due (wait_removed waits
  for it). That thread is not a daemon, so a process that ends normally makes it before it exits; one
  killed or ended by os._exit within the delay can leave what such a write added, as a process killed
  during the delete's own removal can.
- Background maintenance (sparkbus.storage.maintenance: checkpoints, compaction) asked for by commits
  before a delete is not confirmed; it finds a removed table gone and writes nothing, unless it runs while
  the directory is being removed (delta-rs then creates what it writes). So a directory is removed
  (remove_incarnation) at once and again on the process's maintenance thread, after the work it is doing:
  jobs waiting for a removed table then find it gone. Limit: a job of another process that runs during
  the removal, in a process that never uses the deleted incarnation again, can leave a file there.
"""
from __future__ import annotations

import functools
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional, TypeVar

from .. import storage
from ..storage import commits, location, maintenance
from ..core import tiers
from ..core.entities import EntityOptions
from ..core.names import key, subscription_path
from ..exceptions import InvalidOperationError, MessagingEntityNotFoundError, ServiceBusError
from ..core.schemas import ENTITY_TABLES
from . import availability
from .availability import unavailable_partitions
from .catalog import NAMESPACE_KEY, Catalog, Row, Snapshot
from .namespace import NamespaceProperties, namespace_properties
from . import clock

T = TypeVar("T")
LOG = logging.getLogger("sparkbus")
KB = 1024
MB = 1024 * 1024


def table_uris(root: str, row: Row) -> dict[str, str]:
    assert row.storage is not None  # an entity's row names its storage directory
    return {role: location.join(root, row.storage, role) for role in ENTITY_TABLES}


@dataclass(frozen=True)
class EntityInfo:
    """What senders and receivers need to know about an entity, read from one catalog snapshot."""

    kind: str
    path: str
    partition_count: int
    options: EntityOptions
    tables: dict[str, str]  # role (messages, locks, sessions) -> table uri
    namespace: NamespaceProperties
    unavailable: frozenset[int]
    subscription_count: int
    incarnation: str  # the entity's storage directory under the namespace: see the module docstring
    catalog_version: int  # the catalog version this was read from

    def avoided(self) -> set[int]:
        """Partitions to avoid now: declared unavailable, or found faulty by this process (availability)."""
        return availability.down(self.namespace.path, self.path, self.unavailable)

    def fault_in(self, error: BaseException) -> Optional[int]:
        """The partition of this entity whose storage fault error is (reported to availability), or None."""
        return availability.fault_of(self.namespace.path, self.path, self.partition_count, error)

    @property
    def max_message_bytes(self) -> int:
        kilobytes = self.options.max_message_size_in_kilobytes or self.namespace.limits.max_message_size_in_kilobytes
        return kilobytes * KB

    @property
    def max_header_bytes(self) -> int:
        return self.namespace.limits.max_header_size_in_kilobytes * KB

    @property
    def max_batch_bytes(self) -> int:
        return max(self.namespace.limits.max_batch_size_in_kilobytes * KB, self.max_message_bytes)

    @property
    def max_partition_bytes(self) -> int:
        """What one partition may hold: the tier's per-partition share of max_size_in_megabytes."""
        per_partition = tiers.size_per_partition_mb(self.namespace.tier, self.options.max_size_in_megabytes,
                                                    self.partition_count)
        return min(int(per_partition * MB), self.namespace.limits.max_partition_size_in_kilobytes * KB)

    @property
    def header_copies(self) -> int:
        """A topic stores header bytes once per subscription: N x (body + header x subscriptions)."""
        return self.subscription_count if self.kind == "topic" else 1


def resolve(root: str, snap: Snapshot, path: str, kinds: tuple[str, ...]) -> EntityInfo:
    """The entity at `path` ('<topic>/Subscriptions/<name>' for a subscription) if its kind is in kinds."""
    row = snap.get(key(path, " or ".join(kinds)))  # checked as written first: TypeError, ValueError
    if row is None or row.kind not in ("queue", "topic", "subscription"):
        raise MessagingEntityNotFoundError(f"no queue, topic or subscription {path!r} in namespace {root}"
                                           f"{_subscription_hint(snap, path)}")
    if row.kind not in kinds:
        raise InvalidOperationError(f"{path!r} is a {row.kind}; this operation needs a {' or '.join(kinds)}")
    subs = len(snap.children(row.key, "subscription")) if row.kind == "topic" else 0
    assert row.storage is not None  # an entity's row names its storage directory
    return EntityInfo(kind=row.kind, path=row.path, partition_count=row.partition_count,
                      options=row.options, tables=table_uris(root, row),
                      namespace=namespace_properties(snap.rows[NAMESPACE_KEY], root),
                      unavailable=frozenset(unavailable_partitions(snap, row.key, row.partition_count)),
                      subscription_count=subs, incarnation=row.storage, catalog_version=snap.version)


def _subscription_hint(snap: Snapshot, path: str) -> str:
    """For 'events/eu' naming nothing while topic events has a subscription eu: where it is."""
    parts = path.split("/")
    if len(parts) != 2:
        return ""
    candidate = subscription_path(*parts)
    try:
        found = snap.get(key(candidate)) is not None
    except (TypeError, ValueError):  # not a name a subscription path can have
        return ""
    return f"; the subscription is {candidate!r}" if found else ""


def resolve_current(catalog: Catalog, path: str, kinds: tuple[str, ...]) -> EntityInfo:
    return resolve(catalog.root, catalog.snapshot(), path, kinds)


# Entity settings are re-read at most this often by senders and receivers, so a status change or a
# partition fault reaches clients that already exist within a second; new clients start from the catalog.
SETTINGS_REFRESH_SECONDS = 1.0
# On an object store a check sent beside a write vouches for it when the write ended within the window of
# sending it, and a delete removes the directory again after the delay (past the window) from its catalog
# commit.
CONFIRM_WINDOW_SECONDS = 1.0
REMOVAL_DELAY_SECONDS = 1.5
_removals: set[threading.Timer] = set()  # delayed second removals (remove_deleted) waiting or running
_removing = threading.Condition()  # guards _removals; notified as each ends


def remove_deleted(root: str, incarnations: list[str], deleted_at: float) -> None:
    """Remove the directories of incarnations whose catalog rows a commit that returned at `deleted_at`
    (time.monotonic()) deleted, side by side; on an object store once more REMOVAL_DELAY_SECONDS after that
    commit, taking what writes vouched for by a check sent before it left (see the module docstring), on a
    thread of its own: the caller does not wait for it."""
    storage.concurrently([functools.partial(remove_incarnation, root, gone) for gone in incarnations], "remove")
    if location.is_local(root) or not incarnations:
        return
    later = threading.Timer(max(0.0, deleted_at + REMOVAL_DELAY_SECONDS - time.monotonic()), _remove_again,
                            (root, list(incarnations)))
    later.name = "sparkbus-removal"
    with _removing:
        _removals.add(later)
    later.start()


def _remove_again(root: str, incarnations: list[str]) -> None:
    """The delayed second removal (remove_deleted). A store that fails it leaves only files no catalog row
    names; the failure is logged, since no caller waits for it."""
    try:
        storage.concurrently([functools.partial(storage.remove_tree, location.join(root, gone))
                              for gone in incarnations], "remove")
    except Exception as error:
        LOG.warning("the second removal of deleted %s under %s failed: %s", incarnations, root, error)
    finally:
        with _removing:
            _removals.discard(threading.current_thread())
            _removing.notify_all()


def wait_removed(timeout: Optional[float] = None) -> bool:
    """Block until the delayed second removals of this process's deletes are done; False on timeout."""
    with _removing:
        return _removing.wait_for(lambda: not _removals, timeout)



def remove_incarnation(root: str, incarnation: str) -> None:
    """Remove a deleted entity's storage directory, now and once more on this process's maintenance thread
    after the work it is doing (a checkpoint or compaction of a table being removed writes into it)."""
    directory = location.join(root, incarnation)
    maintenance.run_later(f"remove {directory}", lambda: storage.remove_tree(directory))
    storage.remove_tree(directory)


class EntityDeleted(MessagingEntityNotFoundError):
    """The incarnation an operation used is no longer its entity's: deleted, perhaps created again since
    (`current`: the entity's info now, or None). Callers turn it into the error of the handle they used or
    follow the new incarnation; one that does neither reports the entity as not found."""

    def __init__(self, info: EntityInfo, current: Optional[EntityInfo]) -> None:
        again = " and created again" if current is not None else ""
        super().__init__(f"{info.kind} {info.path!r} was deleted{again} (namespace {info.namespace.path})")
        self.current = current


@dataclass(frozen=True)
class Ahead:
    """A confirm's read sent before a write (CachedEntity.check_ahead): whether the catalog had a version
    after the one known to hold the incarnation, asked at `sent` (time.monotonic())."""

    sent: float
    moved: storage.Started[bool]

    def vouches(self) -> bool:
        """Whether the read found no newer catalog version and the write, done now, ended within the
        window of its sending (see the module docstring). A failed read vouches for nothing."""
        ended = time.monotonic()
        try:
            moved = self.moved.result()
        except Exception:  # the confirm after the write asks again, under its own error handling
            return False
        return not moved and ended - self.sent <= CONFIRM_WINDOW_SECONDS


class CachedEntity:
    """An entity's settings for a long-lived sender or receiver, refreshed at most once a second, and
    the check that the incarnation an operation used is still the entity's (see the module docstring)."""

    def __init__(self, catalog: Catalog, path: str, kinds: tuple[str, ...]) -> None:
        self._catalog, self.path, self._kinds = catalog, path, kinds
        self._info: Optional[EntityInfo] = None
        self._read_at = 0.0

    def get(self) -> EntityInfo:
        if self._info is None or clock.monotonic() - self._read_at > SETTINGS_REFRESH_SECONDS:
            self._info = resolve_current(self._catalog, self.path, self._kinds)
            self._read_at = clock.monotonic()
        return self._info

    def _known(self, info: EntityInfo) -> int:
        """The latest catalog version known to hold info's incarnation."""
        cached = self._info
        if cached is not None and cached.incarnation == info.incarnation:
            return max(info.catalog_version, cached.catalog_version)
        return info.catalog_version

    def check_ahead(self, info: EntityInfo) -> Optional[Ahead]:
        """On an object store, the confirm's read sent now, beside the write the caller sends next, for
        confirm(info, ahead=...) after it (see the module docstring); None on local disk."""
        if location.is_local(self._catalog.uri):
            return None
        uri, known = self._catalog.uri, self._known(info)
        return Ahead(time.monotonic(), storage.Started(lambda: commits.has_version(uri, known + 1), "confirm"))

    def confirm(self, info: EntityInfo, cause: Optional[BaseException] = None, ahead: Optional[Ahead] = None) -> None:
        """Nothing if info's incarnation is still the entity's now: a read sent before the write vouches
        for it (ahead), or the catalog has no version after the one known to hold it (one small read, no
        listing). Otherwise (the catalog is read then) its directory is removed again and EntityDeleted
        raised, chained to cause (the operation's error)."""
        if ahead is not None and ahead.vouches():
            return
        if not commits.has_version(self._catalog.uri, self._known(info) + 1):
            return
        snap = self._catalog.snapshot()
        row = snap.get(key(self.path))
        current: Optional[EntityInfo] = None
        if row is not None and row.kind in self._kinds:
            current = resolve(self._catalog.root, snap, self.path, self._kinds)
        self._info, self._read_at = current, clock.monotonic()
        if current is not None and current.incarnation == info.incarnation:
            return
        try:
            remove_incarnation(self._catalog.root, info.incarnation)
        except (OSError, ServiceBusError) as error:  # the store failed now (unreachable, busy): the removal
            # on the maintenance thread may still succeed; the caller is told its entity is gone either way
            LOG.warning("removing deleted %s under %s failed: %s", info.incarnation, self._catalog.root, error)
        if cause is None:
            raise EntityDeleted(info, current)
        raise EntityDeleted(info, current) from cause

    def confirmed(self, info: EntityInfo, operation: Callable[[], T]) -> T:
        """operation() on info's incarnation, confirmed after it returned or failed: EntityDeleted (chained
        to the operation's error, if any) when that incarnation is gone."""
        ahead = self.check_ahead(info)
        try:
            result = operation()
        except EntityDeleted:
            raise
        except Exception as error:
            self.confirm(info, error)
            raise
        self.confirm(info, ahead=ahead)
        return result
