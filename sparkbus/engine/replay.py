"""Replay: send what an entity's archive holds (sparkbus.engine.archive) again, exactly once per replay id.

A replay reads the archived messages enqueued in [start, end), partition by partition in sequence-number
order, keeps those a rule filter selects, and sends them to the target as new messages (as sent, with
their session id and partition key, annotated with where and when they came from) in batches of one
source partition each. Each batch's commit records, as an application transaction of the target's
messages table, the highest source sequence number it holds: "replay.<id>.<source>.p<p>"
(EntityWriter.append, as forwarding copies). Run again with the same id, a replay skips in each source
partition what the target already recorded, so an interrupted replay continues where it stopped and
never sends a message twice; two runs of one id racing commit each batch once (the second finds it
committed, or conflicts on the app id, reads the cursor again and goes on). Messages archived later
with a lower sequence number than a partition's cursor (a message deferred for long) are not sent by a
run that continues.

Before reading, every gone message of the source moves to its archive (retention.run_entity, eager): a
replay sees everything that left up to the moment it starts. Sends are charged to the namespace's
throttling like any send into the target, and wait for credits.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Callable, Optional, Union

import numpy as np
import pyarrow as pa

from .. import storage
from ..core import archiving
from ..core.encoding import OUTGOING
from ..core.filters import CorrelationRuleFilter, SqlRuleFilter, compile_filter
from ..core.language import CompiledRule, MessageView, select
from ..core.throttling import data_cost
from ..exceptions import CommitConflictError, InvalidOperationError
from ..storage import commits
from . import archive, retention, retry
from .catalog import Catalog
from .enqueue import EntityWriter
from .namespace import governor_of
from .registry import EntityInfo, resolve
from .throttle import Usage

BATCH = 1_000  # messages per commit (one source partition's)
KINDS = ("queue", "topic", "subscription")


@dataclass(frozen=True)
class ReplayResult:
    """What a replay did: its id (give it again to continue it), the entities, the time range, how many
    messages it sent now and how many an earlier run of the same id had sent already."""

    replay_id: str
    entity_path: str
    to: str
    start_time: datetime
    end_time: Optional[datetime]
    replayed: int
    already_replayed: int


RuleFilterArg = Union[SqlRuleFilter, CorrelationRuleFilter, None]


def app_id(replay_id: str, source: EntityInfo, partition: int) -> str:
    """The target's application transaction of one source partition of a replay."""
    return f"replay.{replay_id}.{source.incarnation}.p{partition}"


def replay(catalog: Catalog, entity_path: str, *, start: datetime, end: Optional[datetime], to: Optional[str],
           rule_filter: RuleFilterArg, replay_id: Optional[str],
           progress: Optional[Callable[[int], None]] = None) -> ReplayResult:
    """Replay (module docstring); progress(n) is called after each batch with the messages it sent.
    MessagingEntityNotFoundError for a source or target that does not exist; InvalidOperationError when
    the source keeps no archive."""
    snap = catalog.snapshot()
    source = resolve(catalog.root, snap, entity_path, KINDS)
    if source.options.archive_retention is None:
        raise InvalidOperationError(f"{source.path!r} keeps no archive to replay: set its archive_retention (up to "
                                    f"90 days) and messages that leave it from then on can be replayed")
    target = resolve(catalog.root, snap, to or source.path, KINDS)
    rule = _compiled(rule_filter)
    replay_id = replay_id or uuid.uuid4().hex
    retention.run_entity(source, eager=True)
    governor = governor_of(catalog)
    writer = EntityWriter(lambda: target)
    sent = skipped = 0
    for rows in archive.read(source, start, end):
        partition = int(rows["partition_id"][0].as_py())
        if rule is not None:
            rows = rows.filter(pa.array(select([rule], MessageView(rows), np.ones(rows.num_rows, bool)).plain))
        app = app_id(replay_id, source, partition)
        numbers = rows["sequence_number"].to_numpy()
        done, cursor = 0, _cursor(target, app)
        while done < rows.num_rows:
            ahead = int(np.searchsorted(numbers, cursor, side="right")) if cursor is not None else 0
            if ahead > done:  # an earlier run (or a racing one) sent these
                skipped += ahead - done
                done = ahead
                continue
            batch = rows.slice(done, BATCH)
            copies = _copies(batch, source.path)
            last = int(numbers[done + batch.num_rows - 1])
            try:
                result = governor.call(target.path, lambda: writer.append(
                    copies, batch_limit=False, info=target, with_sequence_numbers=False, app_transactions={app: last}),
                    lambda _: Usage(data_cost(copies.num_rows), incoming_messages=copies.num_rows), retry.NO_RETRY,
                    wait=True)
            except CommitConflictError:  # a racing run of this id committed meanwhile: where does it stand?
                cursor = _cursor(target, app)
                continue
            if result.message_count + result.duplicate_count == 0:  # the target had the batch already
                cursor = _cursor(target, app)
                continue
            sent += batch.num_rows
            done += batch.num_rows
            cursor = last
            if progress is not None:
                progress(batch.num_rows)
    return ReplayResult(replay_id, source.path, target.path, start, end, sent, skipped)


def _cursor(target: EntityInfo, app: str) -> Optional[int]:
    return commits.app_versions(storage.open_table(target.tables["messages"]), [app])[app]


def _compiled(rule_filter: RuleFilterArg) -> Optional[CompiledRule]:
    """The filter ready to evaluate (None: every message); ValueError when it does not parse, TypeError
    for anything but a SqlRuleFilter or CorrelationRuleFilter."""
    if rule_filter is None:
        return None
    if not isinstance(rule_filter, (CorrelationRuleFilter, SqlRuleFilter)):
        raise TypeError(f"rule_filter must be a SqlRuleFilter or CorrelationRuleFilter, got "
                        f"{type(rule_filter).__name__}")
    rule = compile_filter("replay", rule_filter)
    if rule.problem:
        raise ValueError(f"rule_filter: {rule.problem}")
    return rule


def _copies(rows: pa.Table, source_path: str) -> pa.Table:
    """Archive rows as the messages a replay sends: as they were sent (OUTGOING), not scheduled, their
    application properties annotated with the source, the original sequence number and enqueue time."""
    out = rows.select(OUTGOING.names)
    out = out.set_column(OUTGOING.get_field_index("application_properties"), "application_properties",
                         archiving.replayed_properties(rows, source_path))
    index = OUTGOING.get_field_index("scheduled_enqueue_time_utc")
    return out.set_column(index, OUTGOING.field(index), pa.nulls(out.num_rows, OUTGOING.field(index).type))
