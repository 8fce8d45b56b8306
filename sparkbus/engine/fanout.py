"""Topic fan-out: each topic message becomes copies in the subscriptions whose rules select it, exactly once.

Where progress lives. A copy of a topic message from topic partition p goes to partition p of the
subscription (as in partitioned Service Bus, where a subscription's partition lives beside the topic's;
keyed messages land where the key would place them anyway). Each subscription's `messages` table carries
one Delta application transaction per topic partition, app id "sparkbus.fanout.p<p>", whose version is
the highest topic sequence number (low 48 bits) fanned into that subscription. The copies and that
version are one Delta commit: either both are there or neither is.

Why nothing is copied twice. A batch reads the subscription's versions at the table version it commits
against and copies only topic messages above them; the commit names every partition it covers (a
conditional overwrite, `partition_id = p AND sequence_number > high-water mark`). delta-rs rejects a
commit when a concurrent commit added rows to those partitions or set the same app ids (measured: two
commits setting one app id conflict even on different partitions), so a replayed batch (after a crash or
restart), or a second fan-out running on the same topic by mistake, re-reads the versions and copies
only what is still missing. delta-rs itself does not refuse a lower or repeated version: the check above,
inside the conflict-checked commit, is what does.

Why nothing is lost. A topic's own cursor (the same app ids on the topic's `messages` table) advances
only after every subscription committed the batch; it is the start of the next batch and the bound of
topic retention (fanned-out rows leave the topic, except each partition's highest row, which keeps
sequence numbering gap-free). A lost race or a crash leaves the cursor behind, and the next batch
re-reads messages the subscriptions' versions then skip.

Subscriptions and rules are read from the catalog after the batch's messages were read, so a
subscription created before a message was sent sees it; one created later starts with messages enqueued
after its creation. Scheduled topic messages are not part of the cursor's pass: when due they are copied
one by one under app ids "sparkbus.fanout.s<sequence number>" and then marked completed in the topic's
`locks` table (cancel_scheduled_messages on the topic marks them cancelled before that).

Throttling: each batch waits until the namespace's credits admit it and is charged one credit per filter
evaluated (sparkbus.engine.throttle), as the seeds charge a topic's filter evaluations.

What no batch stops on. Stored messages and rules can hold what this version's checks refuse (written by
an older version or by another tool). A message a rule cannot evaluate, or whose copy an action would
give a value Service Bus refuses, becomes a dead-letter copy (reason FilterEvaluationException, the rule
and the error as description) in that subscription, numbered and committed with the batch's other copies,
so the exactly-once reasoning above covers it. Its dead-lettered state row is a second commit (to the
locks table); the copy's row says it is born dead-lettered (core.schemas, born_dead_letter_reason), so
in between no receiver of the active queue can take it (receivers polling a local namespace see the
copy within milliseconds); a rule that cannot be evaluated at all is logged (a
warning naming topic, subscription, rule and error) and skipped (sparkbus.core.language.select). A topic
deleted during fan-out ends it with MessagingEntityNotFoundError; a subscription deleted meanwhile is
skipped; what either had written into the deleted directories is removed (registry.CachedEntity.confirm).
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Callable, Iterator, Optional, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import storage
from ..exceptions import CommitConflictError
from ..core import archiving, records
from ..core import sequencing, transitions
from ..core.durations import MAX_DURATION
from ..core.encoding import header_sizes
from ..core.filters import compile_filter
from ..core.forwarding import fanout_app_id
from ..core.language import CompiledRule, Copies, MessageView, select, take_rows
from ..core.names import key, split_subscription_path
from ..core.throttling import FILTER_COST
from ..core.values import encode_properties
from ..storage import CommitProperties, DeltaTable, Transaction, commits, maintenance
from ..storage.reader import PartitionReader
from ..core.schemas import BORN_DEAD_LETTER_COLUMNS, DEAD_LETTERED, FORWARDED, LOCKS, MESSAGES
from . import archive, locks, retry
from .catalog import Catalog, Row, Snapshot
from .namespace import governor_of
from .registry import CachedEntity, EntityDeleted, EntityInfo, resolve
from .throttle import Usage
from . import clock

LOG = logging.getLogger("sparkbus.fanout")
T = TypeVar("T")
FILTER_EVALUATION_REASON = "FilterEvaluationException"
NO_RETRY = retry.NO_RETRY  # the cursor: one round of re-plans, then left to the next batch
BATCH_ROWS = 200_000  # topic messages fanned out at once (1 KiB bodies: about 200 MB in memory)
_LATEST_US = records.micros(datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=timezone.utc))


def scheduled_app_id(sequence_number: int) -> str:
    return f"sparkbus.fanout.s{sequence_number}"


@dataclass(frozen=True)
class Target:
    """A subscription as the fan-out sees it: where copies go and the rules that select them."""

    info: EntityInfo
    rules: tuple[CompiledRule, ...]
    created_us: int
    enabled: bool


@dataclass
class FanoutResult:
    """What one batch did: topic messages handled, filter evaluations (one credit each), and copies and
    dead-letters per subscription path."""

    messages: int = 0
    evaluations: int = 0
    copies: dict[str, int] = field(default_factory=dict)
    dead_lettered: dict[str, int] = field(default_factory=dict)

    def add(self, other: "FanoutResult") -> None:
        self.messages += other.messages
        self.evaluations += other.evaluations
        for mine, theirs in ((self.copies, other.copies), (self.dead_lettered, other.dead_lettered)):
            for path, count in theirs.items():
                mine[path] = mine.get(path, 0) + count


def _charged(catalog: Catalog, topic: EntityInfo, work: Callable[[], FanoutResult]) -> FanoutResult:
    """work once the namespace's throttling admits it (waiting for credits, never failing: the service
    is charged like a client), charged one credit per filter evaluated."""
    return governor_of(catalog).call(topic.path, work, lambda done: Usage(FILTER_COST * done.evaluations), NO_RETRY,
                                     wait=True)


def compile_rule(row: Row) -> CompiledRule:
    """A stored rule ready to evaluate; a rule that no longer parses keeps its problem (validated here)."""
    name = row.path.split("/")[-1]
    try:
        rule_filter, action = row.rule_filter, row.rule_action
    except (ValueError, TypeError, KeyError) as error:
        return CompiledRule(name, problem=f"the stored rule cannot be read: {error}")
    return compile_filter(name, rule_filter, action)


def targets(root: str, snap: Snapshot, topic: EntityInfo) -> list[Target]:
    """The topic's subscriptions with their compiled rules, as of one catalog snapshot; EntityDeleted when
    the snapshot no longer has the topic's incarnation."""
    topic_row = snap.get(key(topic.path))
    if topic_row is None or topic_row.kind != "topic" or topic_row.storage != topic.incarnation:
        again = topic_row is not None and topic_row.kind == "topic"
        raise EntityDeleted(topic, resolve(root, snap, topic.path, ("topic",)) if again else None)
    found = []
    for sub in snap.children(topic_row.key, "subscription"):
        info = resolve(root, snap, sub.path, ("subscription",))
        rules = tuple(compile_rule(r) for r in snap.children(sub.key, "rule"))
        found.append(Target(info, rules, records.micros(sub.created_at_utc),
                            info.options.status not in ("Disabled",)))
    return found


def topic_cursors(topic_messages: DeltaTable, partitions: int) -> dict[int, int]:
    """Per topic partition, the n up to which every message has been fanned out (one read of the log)."""
    done = commits.app_versions(topic_messages, [fanout_app_id(p) for p in range(partitions)])
    return {p: done[fanout_app_id(p)] or 0 for p in range(partitions)}


# ---- one batch ------------------------------------------------------------------------------------------

def deliver(catalog: Catalog, topic: EntityInfo, rows: pa.Table, *, advance: bool = True) -> FanoutResult:
    """Fan out a batch of topic message rows (MESSAGES columns, any partitions, replays allowed).

    Rows with a scheduled time are left to deliver_scheduled. advance: move the topic's cursor past the
    batch and let its rows leave the topic (a caller delivering several batches in a row does it once,
    with advance_topic, at the end). Returns what was done; raises only for storage failures (the batch
    can then be run again).
    """
    if rows.num_rows == 0:
        return FanoutResult()
    return _on_topic(catalog, topic, lambda: _deliver_batch(catalog, topic, rows, advance))


def _on_topic(catalog: Catalog, topic: EntityInfo, work: Callable[[], T]) -> T:
    """work(), which writes to the topic and its subscriptions, confirmed afterwards: MessagingEntityNotFoundError
    (EntityDeleted) instead of a storage error, or of success in a deleted incarnation, when the topic was
    deleted meanwhile."""
    return CachedEntity(catalog, topic.path, ("topic",)).confirmed(topic, work)


def _reading_topic(catalog: Catalog, topic: EntityInfo, read: Callable[[], T]) -> T:
    """read(), which only reads the topic's tables: EntityDeleted instead of its error when the topic was
    deleted meanwhile (confirmed only after a failure)."""
    try:
        return read()
    except Exception as error:
        CachedEntity(catalog, topic.path, ("topic",)).confirm(topic, error)
        raise


def _deliver_batch(catalog: Catalog, topic: EntityInfo, rows: pa.Table, advance: bool) -> FanoutResult:
    return _charged(catalog, topic, lambda: _deliver(catalog, topic, rows, advance))


def _deliver(catalog: Catalog, topic: EntityInfo, rows: pa.Table, advance: bool) -> FanoutResult:
    result = FanoutResult()
    rows = rows.select(MESSAGES.names).cast(MESSAGES)
    ends = batch_ends(rows)
    immediate = np.asarray(pc.is_null(rows["scheduled_enqueue_time_utc"]).to_numpy(zero_copy_only=False), dtype=bool)
    snap = catalog.snapshot()  # after the rows were read: see the module docstring
    view = MessageView(rows if immediate.all() else take_rows(rows, np.flatnonzero(immediate)))
    result.messages = view.n
    # two subscriptions at a time (Arrow and delta-rs free the GIL), their requests counted as branches
    for done in storage.concurrently([functools.partial(_unless_deleted, catalog, target, view, _batch_plan(ends))
                                      for target in targets(catalog.root, snap, topic)], "fan-out", workers=1):
        result.add(done)
    if advance:
        advance_topic(topic, ends)
    return result


def batch_ends(rows: pa.Table) -> dict[int, int]:
    """Per topic partition, the highest n (low sequence bits) among the rows."""
    partitions = np.asarray(rows["partition_id"].to_numpy(zero_copy_only=False), dtype=np.int64)
    low = np.asarray(rows["sequence_number"].to_numpy(zero_copy_only=False), dtype=np.int64) & sequencing.LOW_MASK
    return {int(p): int(low[partitions == p].max()) for p in np.unique(partitions)}


def _unless_deleted(catalog: Catalog, target: Target, view: MessageView, plan: "Plan", *,
                    scheduled: bool = False) -> FanoutResult:
    """_deliver_to, or nothing when the subscription was deleted meanwhile (what it wrote there removed)."""
    try:
        return CachedEntity(catalog, target.info.path, ("subscription",)).confirmed(
            target.info, lambda: _deliver_to(target, view, plan, scheduled=scheduled))
    except EntityDeleted:
        LOG.info("subscription %r was deleted during fan-out: skipped", target.info.path)
        return FanoutResult()


def _deliver_to(target: Target, view: MessageView, plan: "Plan", *, scheduled: bool = False) -> FanoutResult:
    """Copies of the view's rows selected by the target's rules, committed as `plan` says (retried on
    conflicts, re-planned each time). scheduled: the rows are due scheduled messages, enqueued now."""
    result = FanoutResult()
    enqueued = np.asarray(view.rows["enqueued_time_utc"].cast(pa.int64()).to_numpy(zero_copy_only=False))
    eligible = (enqueued >= target.created_us) if target.enabled else np.zeros(view.n, dtype=bool)
    copies = select(list(target.rules), view, eligible)
    for rule, error in copies.skipped:
        topic, subscription = split_subscription_path(target.info.path) or (target.info.path, "")
        LOG.warning("fan-out of topic %r: rule %r of subscription %r cannot be evaluated and is skipped: %s",
                    topic, rule, subscription, error)
    result.evaluations = copies.evaluations
    built = _copies_table(target, view, copies)
    if scheduled:
        column = MESSAGES.field("scheduled_enqueue_time_utc")
        built.rows = built.rows.set_column(built.rows.schema.get_field_index(column.name), column.name,
                                           pa.nulls(built.rows.num_rows, column.type))
    committed = retry.run(lambda: _commit(target, built, plan), what=f"fanning out to {target.info.path!r}")
    positions, numbers = committed if committed is not None else (np.zeros(0, np.int64), np.zeros(0, np.int64))
    dead_letters = np.asarray(pc.is_valid(built.reasons).to_numpy(zero_copy_only=False), dtype=bool)
    dead = dead_letters[positions]
    states = dict(zip(positions[dead].tolist(), numbers[dead].tolist()))
    stored_before = np.setdiff1d(np.flatnonzero(dead_letters), positions)
    if len(stored_before):  # a replay: their dead-lettering may have been cut short by a crash
        states.update(_stored_copies(target, built, stored_before))
    _dead_letter(target, built, states)
    if committed is not None:
        result.copies[target.info.path] = int((~dead).sum())
        result.dead_lettered[target.info.path] = int(dead.sum())
    return result


@dataclass
class _Built:
    """Copies in MESSAGES columns, sorted by topic order, with their source numbers and, for copies that
    go to the dead-letter sub-queue, the reason and description."""

    rows: pa.Table
    sources: np.ndarray     # topic n (low bits) of each copy
    reasons: pa.Array       # dead-letter reason, null for a normal copy
    descriptions: pa.Array  # dead-letter error description


def _copies_table(target: Target, view: MessageView, copies: Copies) -> _Built:
    """The target's copies, in topic order (a message's copies in rule order). A filter evaluation error
    dead-letters the copy when the subscription says so; a copy without a session id (after its action)
    is dead-lettered by a session-enabled subscription, as Service Bus does."""
    parts, order, descriptions = [], [], []
    dead_letter = target.info.options.dead_lettering_on_filter_evaluation_exceptions
    for rank, (rows, source) in enumerate(_copy_sources(view, copies, dead_letter)):
        if source is None:
            continue
        parts.append(source)
        order.append(np.stack([rows, np.full(len(rows), rank)], axis=1))
        descriptions.append(pa.array([transitions.dead_letter_text(copies.reasons[i]) for i in rows.tolist()],
                                     pa.string()) if rank == 0 else pa.nulls(len(rows), pa.string()))
    if not parts:
        none = pa.array([], pa.string())
        return _Built(MESSAGES.empty_table(), np.zeros(0, dtype=np.int64), none, none)
    table = pa.concat_tables(parts)
    keys = np.concatenate(order)
    sort = pa.array(np.lexsort((keys[:, 1], keys[:, 0])))
    table = _for_subscription(target, table.take(sort))
    sources = np.asarray(table["sequence_number"].to_numpy(zero_copy_only=False), dtype=np.int64) & sequencing.LOW_MASK
    described = pa.concat_arrays(descriptions).take(sort)
    reasons = pc.if_else(pc.is_valid(described), FILTER_EVALUATION_REASON, pa.nulls(len(described), pa.string()))
    if target.info.options.requires_session:
        sessionless = pc.and_(pc.is_null(table["session_id"]), pc.is_null(reasons))
        reasons = pc.if_else(sessionless, transitions.SESSION_ID_NULL_REASON, reasons)
        described = pc.if_else(sessionless, transitions.SESSION_ID_NULL_DESCRIPTION, described)
    reasons = reasons.combine_chunks() if isinstance(reasons, pa.ChunkedArray) else reasons
    described = described.combine_chunks() if isinstance(described, pa.ChunkedArray) else described
    for name, column in zip(BORN_DEAD_LETTER_COLUMNS, (reasons, described)):  # dead-lettered as committed
        table = table.set_column(table.schema.get_field_index(name), name, column.cast(pa.string()))
    return _Built(table, sources, reasons, described)


def _copy_sources(view: MessageView, copies: Copies,
                  dead_letter: bool) -> Iterator[tuple[np.ndarray, Optional[pa.Table]]]:
    """(row positions, rows) of dead-letter copies first (rank 0; none unless the subscription dead-letters
    filter evaluation errors: otherwise such a message is not delivered to it), then plain copies, then
    each action's."""
    dead = np.flatnonzero(copies.dead_letter) if dead_letter else np.zeros(0, dtype=np.int64)
    yield dead, (view.rows_at(dead) if len(dead) else None)
    plain = np.flatnonzero(copies.plain)
    yield plain, (view.rows_at(plain) if len(plain) else None)
    for _, rows, changed in copies.actions:
        yield rows, _changed_rows(changed)


def _changed_rows(view: MessageView) -> pa.Table:
    """The rows of a view after an action: application properties and changed system columns written back."""
    table = view.rows
    encoded = pa.array([encode_properties(p) for p in view.properties()], pa.string())
    table = table.set_column(table.schema.get_field_index("application_properties"), "application_properties", encoded)
    for column, values in view.system_overrides().items():
        table = table.set_column(table.schema.get_field_index(column), column, values.cast(pa.string()))
    sizes = pa.array(header_sizes(table), pa.int64())
    return table.set_column(table.schema.get_field_index("header_size"), "header_size", sizes).cast(MESSAGES)


def _for_subscription(target: Target, rows: pa.Table) -> pa.Table:
    """Topic rows as the subscription stores them: expiry = enqueued + min(message TTL, subscription default)."""
    default = target.info.options.default_message_time_to_live
    if default >= MAX_DURATION:
        return rows
    default_ms = default // timedelta(milliseconds=1)
    ttl = pc.fill_null(rows["time_to_live_ms"], default_ms)
    ttl = np.minimum(np.asarray(ttl.to_numpy(zero_copy_only=False), dtype=np.int64), default_ms)
    enqueued = np.asarray(rows["enqueued_time_utc"].cast(pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64)
    expires = np.minimum(enqueued + ttl * 1000, _LATEST_US)
    column = pa.array(expires, pa.int64()).cast(MESSAGES.field("expires_at_utc").type)
    return rows.set_column(rows.schema.get_field_index("expires_at_utc"), "expires_at_utc", column)


# What to commit, decided at the subscription table's version: (positions in _Built of the copies still
# missing, the partitions the commit must name, the application transactions it records), or None when
# the subscription already has everything.
Plan = Callable[[DeltaTable, _Built], Optional[tuple[np.ndarray, list[int], list[Transaction]]]]


def _batch_plan(ends: dict[int, int]) -> Plan:
    """A batch: copies above the subscription's version of each topic partition; new versions = the ends."""
    def plan(table: DeltaTable, built: _Built) -> Optional[tuple[np.ndarray, list[int], list[Transaction]]]:
        versions_now = commits.app_versions(table, [fanout_app_id(p) for p in ends])
        done = {p: versions_now[fanout_app_id(p)] or 0 for p in ends}
        moving = {p: e for p, e in ends.items() if e > done[p]}
        if not moving:
            return None
        partitions = built.rows["partition_id"].to_pylist()
        wanted = [p in moving and s > done[p] for p, s in zip(partitions, built.sources.tolist())]
        versions = [Transaction(fanout_app_id(p), e) for p, e in sorted(moving.items())]
        return np.flatnonzero(np.array(wanted, dtype=bool)), sorted(moving), versions
    return plan


def _scheduled_plan(numbers: list[int]) -> Plan:
    """Due scheduled messages: each topic message is its own app id (they come out of sequence order)."""
    def plan(table: DeltaTable, built: _Built) -> Optional[tuple[np.ndarray, list[int], list[Transaction]]]:
        versions_now = commits.app_versions(table, [scheduled_app_id(n) for n in numbers])
        missing = {n for n in numbers if versions_now[scheduled_app_id(n)] is None}
        if not missing:
            return None
        partitions = built.rows["partition_id"].to_pylist()
        wanted = [sequencing.compose(p, s) in missing for p, s in zip(partitions, built.sources.tolist())]
        touched = sorted({sequencing.partition_of_sequence(n) for n in missing})
        return (np.flatnonzero(np.array(wanted, dtype=bool)), touched,
                [Transaction(scheduled_app_id(n), 1) for n in sorted(missing)])
    return plan


def _commit(target: Target, built: _Built, plan: Plan) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """One conditional commit of the planned copies, numbered above the subscription's high-water marks,
    with the plan's versions. Returns (positions in built, sequence numbers), or None if nothing was due."""
    table = storage.open_table(target.info.tables["messages"])
    planned = plan(table, built)
    if planned is None:
        return None
    positions, touched, versions = planned
    partitions = np.asarray(built.rows["partition_id"].to_numpy(zero_copy_only=False), dtype=np.int64)
    marks = storage.high_water_marks(table)
    numbers, _ = sequencing.number(partitions[positions], marks)
    data = built.rows.take(pa.array(positions))
    data = data.set_column(data.schema.get_field_index("sequence_number"), "sequence_number",
                           pa.array(numbers, pa.int64()))
    storage.write(table, data, mode="overwrite", predicate=sequencing.commit_predicate(marks, touched),
                  commit_properties=CommitProperties(app_transactions=versions),
                  post_commithook_properties=storage.NO_HOOKS)
    maintenance.after_commit(table)
    return positions, numbers


def _stored_copies(target: Target, built: _Built, positions: np.ndarray) -> dict[int, int]:
    """{position in built: sequence number} of stored copies equal to those copies (same partition,
    message id, enqueue time, body, properties and session). Copies equal in all of these are
    interchangeable; each stored copy answers for one."""
    wanted = built.rows.take(pa.array(positions))
    columns = ["partition_id", "message_id", "enqueued_time_utc", "body", "application_properties", "session_id"]
    enqueued = sorted(set(wanted["enqueued_time_utc"].cast(pa.int64()).to_pylist()))
    partitions = sorted(set(wanted["partition_id"].to_pylist()))
    stored = storage.query(f"""
        SELECT sequence_number, {", ".join(columns)} FROM messages
        WHERE partition_id IN ({", ".join(map(str, partitions))})
          AND CAST(enqueued_time_utc AS BIGINT) IN ({", ".join(map(str, enqueued))})
        ORDER BY sequence_number""", messages=storage.open_table(target.info.tables["messages"]))
    available: dict[tuple[object, ...], list[int]] = {}
    for row in stored.to_pylist():
        available.setdefault(tuple(row[c] for c in columns), []).append(row["sequence_number"])
    found = {}
    for position, row in zip(positions.tolist(), wanted.select(columns).to_pylist()):
        numbers = available.get(tuple(row[c] for c in columns))
        if numbers:
            found[position] = numbers.pop(0)
    return found


def _dead_letter(target: Target, built: _Built, states: dict[int, int]) -> None:
    """Move copies (position in built -> sequence number) to the dead-letter sub-queue with their reasons:
    per partition, one conditional commit of state rows for the copies that have none yet (a copy a
    receiver or another fan-out already gave a state keeps it)."""
    if not states:
        return
    reasons, descriptions = built.reasons.to_pylist(), built.descriptions.to_pylist()
    by_partition: dict[int, dict[int, int]] = {}
    for position, number in states.items():
        by_partition.setdefault(sequencing.partition_of_sequence(number), {})[number] = position
    for p, wanted in by_partition.items():
        def commit(p: int = p, wanted: dict[int, int] = wanted) -> None:
            table = storage.open_table(target.info.tables["locks"])
            predicate = locks.rows_predicate(p, sorted(wanted))
            have = set(storage.query(f"SELECT sequence_number FROM locks WHERE {predicate}", locks=table)
                       ["sequence_number"].to_pylist())
            now = clock.now()
            rows = [transitions.new_state(p, n, DEAD_LETTERED, 0, now, reason=reasons[i], description=descriptions[i])
                    for n, i in sorted(wanted.items()) if n not in have]
            if rows:
                locks.commit(commits.LogView(table), p, records.from_rows(rows, LOCKS))

        retry.run(commit, what=f"dead-lettering copies in {target.info.path!r}")


def advance_topic(topic: EntityInfo, ends: dict[int, int]) -> None:
    """Move the topic's cursor to the batch's ends and let fanned-out rows leave the topic, in one direct
    commit: the files holding rows up to the ends are rewritten without them (scheduled rows stay for
    deliver_scheduled, and each partition's highest row stays: its number carries the numbering on), and
    the commit records the new cursors. A topic with an archive archives the rows that leave first
    (sparkbus.engine.archive: the commit also records the archive's counts). It claims only the range
    fanned out and the files it rewrites, so
    sends committing above the cursors meanwhile never conflict with it (delta-rs' overwrite with a
    predicate lost to every such send: under steady sends it retried for minutes and held the batch).

    Skipped when it loses a race: the next batch starts from the old cursor and the subscriptions' versions
    skip what they already have. A re-plan after a lost race (mostly to a compaction of the files it read)
    follows the log from where the last plan stood and reads only the files committed since: planning
    from scratch each time read every file of the range again, and under the soak's sends a batch spent
    minutes re-planning."""
    view = commits.LogView(storage.open_table(topic.tables["messages"]))
    reader = PartitionReader(MESSAGES)
    archived = archive.open_view(topic) if topic.options.archive_retention is not None else None

    def attempt() -> None:
        view.advance()
        cursors = view.app_versions(fanout_app_id(p) for p in ends)
        moving = {p: e for p, e in ends.items() if e > (cursors[fanout_app_id(p)] or 0)}
        if not moving:
            return
        marks = view.high_water_marks()
        kept: dict[int, pa.Table] = {}
        removed: list[str] = []
        versions = {fanout_app_id(p): end for p, end in moving.items()}
        if archived is not None:
            archived.advance()
        for p, end in moving.items():
            last = sequencing.compose(p, min(end, marks.get(p, 0) - 1))  # the highest row that may go
            parts, leaving = [], []
            for path, data in reader.files(view, p, sequencing.compose(p, 0), last):
                gone = pc.and_(pc.less_equal(data["sequence_number"], last),
                               pc.is_null(data["scheduled_enqueue_time_utc"]))
                if pc.any(gone).as_py():
                    removed.append(path)
                    parts.append(data.filter(pc.invert(gone)))
                    leaving.append(data.filter(gone))
            if parts and sum(part.num_rows for part in parts):
                kept[p] = pa.concat_tables(parts)
            if archived is not None and leaving:  # to the topic's archive first (sparkbus.engine.archive)
                rows = reader.with_partition(leaving, p)
                versions.update(archive.archive_leaving(archived, p, archive.pending(archived, view, p), rows,
                                                        archiving.fanned_out_states(rows, clock.now())))
        claim = commits.Claim({p: (sequencing.compose(p, 0), sequencing.compose(p, end)) for p, end in moving.items()},
                              frozenset(removed), frozenset(versions))
        files: list[commits.AddedFile] = []
        try:
            files = commits.write_files(view.log, sorted(kept), lambda p: kept[p])
            done = commits.commit(view.log, view.position, files, removed, claim, versions, operation="DELETE")
        except BaseException:
            commits.discard(view.log, files)
            raise
        maintenance.after_direct_commit(view.log.uri, done.version)

    try:
        retry.run(attempt, NO_RETRY, what=f"advancing the cursor of {topic.path!r}")
    except CommitConflictError:
        pass


# ---- scheduled topic messages ---------------------------------------------------------------------------

def deliver_scheduled(catalog: Catalog, topic: EntityInfo, now: Optional[datetime] = None) -> FanoutResult:
    """Fan out scheduled topic messages whose time has come and that were not cancelled or fanned out.
    MessagingEntityNotFoundError when the topic was deleted."""
    due = _reading_topic(catalog, topic, lambda: _due(topic, now))
    if due.num_rows == 0:
        return FanoutResult()
    return _on_topic(catalog, topic, lambda: _charged(catalog, topic, lambda: _deliver_due(catalog, topic, due)))


def _due(topic: EntityInfo, now: Optional[datetime]) -> pa.Table:
    """The topic's scheduled messages due at `now` that were neither cancelled nor fanned out."""
    now_us = records.micros(now or clock.now())
    topic_locks = storage.open_table(topic.tables["locks"])
    topic_messages = storage.open_table(topic.tables["messages"])
    due = storage.query(f"""
        SELECT m.* FROM messages m
        LEFT JOIN locks l ON l.partition_id = m.partition_id AND l.sequence_number = m.sequence_number
        WHERE m.scheduled_enqueue_time_utc IS NOT NULL AND CAST(m.scheduled_enqueue_time_utc AS BIGINT) <= {now_us}
          AND l.sequence_number IS NULL
        ORDER BY m.partition_id, m.sequence_number""", messages=topic_messages, locks=topic_locks)
    return due


def _deliver_due(catalog: Catalog, topic: EntityInfo, due: pa.Table) -> FanoutResult:
    result = FanoutResult()
    due = due.select(MESSAGES.names).cast(MESSAGES)
    snap = catalog.snapshot()
    view = MessageView(due)
    numbers = due["sequence_number"].to_pylist()
    result.messages = view.n
    for target in targets(catalog.root, snap, topic):
        result.add(_unless_deleted(catalog, target, view, _scheduled_plan(numbers), scheduled=True))
    states = [transitions.new_state(sequencing.partition_of_sequence(n), n, FORWARDED, 0, clock.now())
              for n in numbers]
    table = records.from_rows(states, LOCKS)
    for p in sorted({s["partition_id"] for s in states}):
        part = table.filter(pc.equal(table["partition_id"], p))

        def complete(part: pa.Table = part, p: int = p) -> None:
            locks.commit(commits.LogView(storage.open_table(topic.tables["locks"])), p, part)

        retry.run(complete, what=f"completing due scheduled messages of {topic.path!r}")
    return result


# ---- without Spark: read pending messages with delta-rs ---------------------------------------------------

def pending(topic: EntityInfo, limit: int = 100_000) -> pa.Table:
    """Topic rows above the topic's cursor, oldest first per partition, at most `limit` in all."""
    table = storage.open_table(topic.tables["messages"])
    cursors = topic_cursors(table, topic.partition_count)
    where = " OR ".join(f"(partition_id = {p} AND sequence_number > {sequencing.compose(p, n)})"
                        for p, n in cursors.items())
    return storage.query(f"SELECT * FROM messages WHERE {where} ORDER BY sequence_number LIMIT {int(limit)}",
                         messages=table)


def awaiting(topic: EntityInfo, *, older_than: timedelta = timedelta(0), now: Optional[datetime] = None) -> int:
    """How many of the topic's messages no fan-out has taken yet (above its cursor, not scheduled for later),
    among those enqueued more than older_than ago."""
    now = now or clock.now()
    table = storage.open_table(topic.tables["messages"])
    cursors = topic_cursors(table, topic.partition_count)
    above = " OR ".join(f"(partition_id = {p} AND sequence_number > {sequencing.compose(p, n)})"
                        for p, n in cursors.items())
    due = records.micros(now)
    sql = (f"SELECT COUNT(*) AS n FROM messages WHERE ({above}) "
           f"AND CAST(enqueued_time_utc AS BIGINT) <= {records.micros(now - older_than)} "
           f"AND (scheduled_enqueue_time_utc IS NULL OR CAST(scheduled_enqueue_time_utc AS BIGINT) <= {due})")
    return int(storage.query(sql, messages=table)["n"][0].as_py())


def read_ranges(topic: EntityInfo, ranges: dict[int, tuple[int, int]]) -> pa.Table:
    """Topic rows with sequence numbers in [low, high] per partition (a micro-batch of the fan-out query)."""
    table = storage.open_table(topic.tables["messages"])
    where = " OR ".join(f"(partition_id = {int(p)} AND sequence_number >= {int(low)} AND sequence_number <= {int(high)})"
                        for p, (low, high) in ranges.items())
    return storage.query(f"SELECT * FROM messages WHERE {where} ORDER BY sequence_number", messages=table)


def deliver_ranges(catalog: Catalog, topic: EntityInfo, ranges: dict[int, tuple[int, int]], *,
                   batch_rows: int = BATCH_ROWS) -> FanoutResult:
    """Fan out the topic messages in [low, high] (sequence numbers) per partition, in rounds of at most
    about batch_rows messages (memory stays bounded by a round), each round a complete batch except that
    the topic's cursor and retention move once, after the last (deleting part of a file rewrites the rest:
    doing it per round copied the topic's bodies once per round). A crash in between re-reads the rounds
    done; the subscriptions' versions skip them. MessagingEntityNotFoundError when the topic was deleted."""
    return _on_topic(catalog, topic, lambda: _deliver_ranges(catalog, topic, ranges, batch_rows))


def _deliver_ranges(catalog: Catalog, topic: EntityInfo, ranges: dict[int, tuple[int, int]],
                    batch_rows: int) -> FanoutResult:
    total, ends = FanoutResult(), {}
    sizes = {p: high - low + 1 for p, (low, high) in ranges.items() if high >= low}
    rounds = max(1, -(-sum(sizes.values()) // batch_rows)) if sizes else 0
    pieces = [{p: (ranges[p][0] + size * r // rounds, ranges[p][0] + size * (r + 1) // rounds - 1)
               for p, size in sizes.items() if size * (r + 1) // rounds > size * r // rounds}
              for r in range(rounds)]
    ahead = storage.Started(functools.partial(read_ranges, topic, pieces[0]), "fan-out-read", 1) if pieces else None
    for r in range(rounds):  # the next round is read while this one is evaluated and committed
        assert ahead is not None  # a read is ahead for every round
        rows = ahead.result()
        ahead = storage.Started(functools.partial(read_ranges, topic, pieces[r + 1]), "fan-out-read", 1) \
            if r + 1 < rounds else None
        if rows.num_rows:
            total.add(_deliver_batch(catalog, topic, rows, advance=False))
        ends.update(batch_ends(rows) if rows.num_rows else {})
    if ends:
        advance_topic(topic, ends)
    return total


def drain(catalog: Catalog, topic_path: str, *, batch_size: int = 100_000) -> FanoutResult:
    """Fan out everything pending on one topic now, in batches, without Spark (tests, small jobs).
    MessagingEntityNotFoundError when the topic does not exist or is deleted meanwhile."""
    total = FanoutResult()
    while True:
        topic = resolve(catalog.root, catalog.snapshot(), topic_path, ("topic",))
        rows = _reading_topic(catalog, topic, lambda: pending(topic, batch_size))
        if rows.num_rows == 0:
            break
        total.add(deliver(catalog, topic, rows))
    total.add(deliver_scheduled(catalog, resolve(catalog.root, catalog.snapshot(), topic_path, ("topic",))))
    return total
