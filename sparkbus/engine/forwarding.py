"""Auto-forwarding: messages of a queue or subscription with forward_to (and dead-lettered messages of one
with forward_dead_lettered_messages_to) move to the destination entity, exactly once.

A transfer is three conditional commits per source partition, each safe to repeat:

1. Claim. The oldest available messages of one source partition get a claim: a lock whose token names
   the kind of transfer and a batch number k (sparkbus.core.forwarding.claim_token), and whose commit
   records k as the application transaction "claim.p<p>" of the source's locks table. Messages the
   destination would refuse for what they are (the hop limit, no session id for a session-enabled
   destination, too big, a destination that does not exist or is disabled) go to the source's transfer
   dead-letter sub-queue in the same commit instead. Expired and over-delivered messages are moved as a
   receiver would move them. A partition is claimed only when it has no claim outstanding, and two
   claims of one partition both set "claim.p<p>", so delta-rs lets one of them commit: batch numbers of a
   source partition are claimed one at a time, in increasing order.
2. Copy. The claimed messages are sent to the destination in one commit (EntityWriter.append: the
   destination's placement by SessionId / PartitionKey / MessageId, its sequence numbers, its duplicate
   detection and quota) that records k as the destination's application transaction
   "<source tables>.p<p>". The destination holds batch k exactly when that version is k or more: a
   replay sees it and writes nothing, and two forwarders copying the same batch conflict on the app id.
   A destination that refuses the whole batch (full, disabled since the claim) writes nothing. The copy
   waits until the namespace's throttling admits it and is charged as a send of its messages.
3. Release. The claimed rows become completed (or, when the copy was refused, transfer-dead-lettered
   with the error), conditionally on still carrying the claim token.

A crash anywhere leaves either no claim (nothing happened), or a claim whose batch the destination has
(step 3 is redone) or has not (step 2 is redone): no message is lost or copied twice. Claims are locks
that lapse, so if forwarding is switched off, claimed messages become receivable again; the forwarder
itself redoes an outstanding claim whether or not its lock lapsed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Optional, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import storage
from ..core import records
from ..core import forwarding as rules
from ..core import transitions
from ..core.encoding import OUTGOING, body_sizes, header_sizes
from ..core.throttling import data_cost
from ..core.values import decode_properties, encode_properties
from ..exceptions import (CommitConflictError, InvalidOperationError, MessagingEntityDisabledError,
                          PartitionUnavailableError, ServiceBusError)
from ..storage import Transaction, commits
from ..core.schemas import ACTIVE, DEAD_LETTERED, LOCKS, MESSAGES, TRANSFER_COLUMNS
from . import locks, retention, retry
from .catalog import Catalog, Snapshot
from .enqueue import EntityWriter
from .namespace import governor_of
from .registry import EntityInfo, resolve
from .throttle import Usage
from . import clock

CLAIM_DURATION = timedelta(minutes=5)  # a claim's lock, should forwarding be switched off meanwhile
BATCH = 5_000                          # messages claimed at once per source partition
SOURCE_KINDS = ("queue", "subscription")


@dataclass
class ForwardResult:
    """What a pass did, per source entity path: messages forwarded and messages transfer-dead-lettered."""

    forwarded: dict[str, int] = field(default_factory=dict)
    dead_lettered: dict[str, int] = field(default_factory=dict)

    def add(self, other: "ForwardResult") -> None:
        for mine, theirs in ((self.forwarded, other.forwarded), (self.dead_lettered, other.dead_lettered)):
            for path, count in theirs.items():
                mine[path] = mine.get(path, 0) + count

    @property
    def moved(self) -> int:
        return sum(self.forwarded.values()) + sum(self.dead_lettered.values())


def destination_of(info: EntityInfo, kind: str) -> Optional[str]:
    return info.options.forward_to if kind == rules.FORWARD else info.options.forward_dead_lettered_messages_to


def sources(root: str, snap: Snapshot) -> list[EntityInfo]:
    """Queues and subscriptions that forward messages or dead-letters."""
    return [resolve(root, snap, row.path, SOURCE_KINDS) for row in snap.of_kind(*SOURCE_KINDS)
            if row.options.forward_to or row.options.forward_dead_lettered_messages_to]


def forward_all(catalog: Catalog, *, batch: int = BATCH) -> ForwardResult:
    """Forward everything forwardable now from every source in the namespace, until a pass moves nothing."""
    total = ForwardResult()
    while True:
        snap = catalog.snapshot()
        done = ForwardResult()
        for info in sources(catalog.root, snap):
            done.add(forward_entity(catalog, snap, info, batch=batch))
        total.add(done)
        if not done.moved:
            return total


def forward_entity(catalog: Catalog, snap: Snapshot, info: EntityInfo, *, batch: int = BATCH) -> ForwardResult:
    """One pass over the source's available partitions: per partition and kind, an outstanding claim is
    finished, then one new batch is claimed and transferred."""
    result = ForwardResult()
    kinds = [kind for kind in rules.KINDS if destination_of(info, kind) is not None]
    for partition in _partitions_with_work(info, kinds):
        if partition in info.avoided():
            continue
        for kind in kinds:
            try:
                result.add(_step(catalog, snap, info, partition, kind, batch))
            except (CommitConflictError, PartitionUnavailableError):
                continue  # the claim stays; the next pass finishes it
    return result


def _partitions_with_work(info: EntityInfo, kinds: list[str]) -> list[int]:
    """Partitions that may have something to forward or a claim to finish, in one query over the entity
    (a superset: each is then planned exactly): an idle pass over a 16-partition source took 16 x 3
    queries before."""
    wanted = [f"l.{rules.CLAIM_SQL}"]
    if rules.FORWARD in kinds:
        now_us = records.micros(clock.now())
        wanted.append(f"((l.state IS NULL OR l.state = '{ACTIVE}') AND (m.scheduled_enqueue_time_utc IS NULL "
                      f"OR CAST(m.scheduled_enqueue_time_utc AS BIGINT) <= {now_us}))")
    if rules.DEAD_LETTER in kinds:
        wanted.append(f"l.state = '{DEAD_LETTERED}'")
    state = storage.open_table(info.tables["locks"])  # before messages: see sparkbus.engine.retention
    found = storage.query(f"""
        SELECT DISTINCT m.partition_id FROM messages m
        LEFT JOIN locks l ON m.partition_id = l.partition_id AND m.sequence_number = l.sequence_number
        WHERE {" OR ".join(wanted)} ORDER BY m.partition_id""",
                          messages=storage.open_table(info.tables["messages"]), locks=state)
    return cast(list[int], found["partition_id"].to_pylist())


# ---- one step --------------------------------------------------------------------------------------------

def _step(catalog: Catalog, snap: Snapshot, info: EntityInfo, partition: int, kind: str, batch: int) -> ForwardResult:
    result = ForwardResult()
    outstanding = _claimed(info, partition)
    if outstanding is not None:
        result.add(_finish(catalog, info, partition, *outstanding))
    claimed = retry.run(lambda: _claim(catalog.root, snap, info, partition, kind, batch, result),
                        what=f"claiming messages of {info.path!r} to forward")
    if claimed is not None:
        result.add(_finish(catalog, info, partition, *claimed))
    return result


def _claimed(info: EntityInfo, partition: int) -> Optional[tuple[str, int, pa.Table]]:
    """(kind, batch, state rows) of the partition's outstanding claim, if any."""
    state = storage.open_table(info.tables["locks"])
    rows = storage.query(f"SELECT * FROM locks WHERE partition_id = {partition} AND {rules.CLAIM_SQL} "
                         f"AND state IN ('{ACTIVE}', '{DEAD_LETTERED}') ORDER BY sequence_number", locks=state)
    if rows.num_rows == 0:
        return None
    # every row selected carries a claim token (CLAIM_SQL)
    claims = {claim for t in rows["lock_token"].to_pylist() if (claim := rules.parse_claim(t)) is not None}
    kind, batch = max(claims, key=lambda c: c[1])  # one at a time: only ever one batch number
    return kind, batch, rows


def _claim(root: str, snap: Snapshot, info: EntityInfo, partition: int, kind: str, limit: int,
           result: ForwardResult) -> Optional[tuple[str, int, pa.Table]]:
    """Claim up to `limit` messages of one partition (see the module docstring); returns (kind, batch,
    claimed state rows) or None when nothing is to be forwarded. Messages refused outright are counted in
    result as transfer-dead-lettered."""
    state = storage.open_table(info.tables["locks"])  # before messages: see sparkbus.engine.retention
    messages = storage.open_table(info.tables["messages"])
    now = clock.now()
    queue = ACTIVE if kind == rules.FORWARD else DEAD_LETTERED
    where = f"partition_id = {partition}"
    state_rows = storage.query(f"SELECT * FROM locks WHERE {where}", locks=state).select(LOCKS.names).cast(LOCKS)
    if any(rules.parse_claim(t) for t in state_rows["lock_token"].to_pylist()):
        return None  # another forwarder claimed meanwhile; the next pass finishes its batch
    message_rows = storage.query(f"SELECT * FROM messages WHERE {where}", messages=messages)
    found = transitions.candidates(message_rows.select(MESSAGES.names).cast(MESSAGES), state_rows, queue, now, limit)
    if found.num_rows == 0:
        return None
    policy = transitions.Policy(lock_duration=CLAIM_DURATION, max_delivery_count=info.options.max_delivery_count,
                                dead_letter_on_expiry=info.options.dead_lettering_on_message_expiration)
    planned, deliver = transitions.plan(found, policy, now, queue, False, limit)
    taken = found.take(pa.array(deliver, pa.int64()))
    batch = (storage.transaction_version(state, rules.claim_app_id(partition)) or 0) + 1
    refused = _refusals(root, snap, info, kind, taken)
    rows = []
    for i, row in enumerate(records.as_rows(planned)):
        if i < len(deliver):
            row["delivery_count"] -= 1  # a transfer is not a delivery
            reason = refused.get(row["sequence_number"])
            if reason is not None:
                row = transitions.transfer_dead_lettered(row, now, *reason)
            else:
                row["lock_token"] = rules.claim_token(kind, batch)
        rows.append(row)
    table = records.from_rows(rows, LOCKS)
    locks.commit(commits.LogView(state), partition, table, [Transaction(rules.claim_app_id(partition), batch)])
    if refused:
        result.dead_lettered[info.path] = result.dead_lettered.get(info.path, 0) + len(refused)
    claimed = table.filter(pc.equal(pc.fill_null(table["lock_token"], ""), rules.claim_token(kind, batch)))
    return (kind, batch, claimed) if claimed.num_rows else None


def _refusals(root: str, snap: Snapshot, info: EntityInfo, kind: str, taken: pa.Table) -> dict[int, tuple[str, str]]:
    """{sequence number: (reason, description)} of messages the destination would refuse for what they are."""
    target = destination_of(info, kind)
    assert target is not None  # only kinds with a destination are claimed (forward_entity)
    numbers = taken["sequence_number"].to_pylist()
    try:
        destination = resolve(root, snap, target, ("queue", "topic"))
        if destination.options.status in ("Disabled", "SendDisabled"):
            raise MessagingEntityDisabledError(f"{destination.kind} {destination.path!r} is {destination.options.status}")
    except ServiceBusError as error:
        return {n: (rules.failure_reason(target, type(error).__name__), str(error)) for n in numbers}
    refused = {}
    hops = pc.fill_null(taken["transfer_hop_count"], 0).to_pylist()
    sessions = taken["session_id"].to_pylist()
    sizes = (np.asarray(body_sizes(taken), dtype=np.int64) + np.asarray(header_sizes(taken), dtype=np.int64)).tolist()
    for n, hop, session, size in zip(numbers, hops, sessions, sizes):
        if hop >= rules.MAX_TRANSFER_HOPS:
            refused[n] = (rules.HOP_LIMIT_REASON, rules.hop_limit_description(hop, target))
        elif destination.options.requires_session and session is None:
            refused[n] = (transitions.SESSION_ID_NULL_REASON,
                          f"{transitions.SESSION_ID_NULL_DESCRIPTION} (forwarding to {destination.kind} {destination.path!r})")
        elif size > destination.max_message_bytes:
            refused[n] = (rules.failure_reason(target, "MessageSizeExceededError"),
                          f"the message of {size} bytes exceeds the {destination.max_message_bytes}-byte limit of "
                          f"{destination.path!r}")
    return refused


def _finish(catalog: Catalog, info: EntityInfo, partition: int, kind: str, batch: int,
            claimed: pa.Table) -> ForwardResult:
    """Copy a claimed batch to the destination (unless it has it already), then release the claim."""
    result = ForwardResult()
    target = destination_of(info, kind)
    failure: Optional[tuple[str, str]] = None
    try:
        if target is None:
            raise InvalidOperationError(f"{info.path!r} no longer forwards its {'dead-lettered ' if kind != rules.FORWARD else ''}messages")
        destination = resolve(catalog.root, catalog.snapshot(), target, ("queue", "topic"))
        app_id = rules.transfer_app_id(_storage_id(info), partition)
        # Has it already (a forwarder stopped before releasing)? Asked before the destination's checks:
        # one that became disabled since must not send a copy it holds to the transfer dead-letters.
        if (storage.transaction_version(storage.open_table(destination.tables["messages"]), app_id) or 0) < batch:
            copies = _copies(info, partition, kind, claimed)
            governor_of(catalog).call(  # charged as a send into the destination; waits for credits
                destination.path, lambda: EntityWriter(lambda: destination).append(
                    copies, batch_limit=False, info=destination, with_sequence_numbers=False,
                    app_transaction=(app_id, batch)),
                lambda _: Usage(data_cost(copies.num_rows), incoming_messages=copies.num_rows), retry.NO_RETRY,
                wait=True)
    except (CommitConflictError, PartitionUnavailableError):
        raise  # transient: the claim stays and is finished later
    except ServiceBusError as error:  # refused (full, disabled, gone): to the transfer dead-letter sub-queue
        failure = (rules.failure_reason(target or "", type(error).__name__), str(error))
    released = retry.run(lambda: _release(info, partition, kind, batch, failure),
                         what=f"releasing forwarded messages of {info.path!r}")
    counts = result.dead_lettered if failure else result.forwarded
    counts[info.path] = released
    return result


def _copies(info: EntityInfo, partition: int, kind: str, claimed: pa.Table) -> pa.Table:
    """The claimed messages as the destination receives them: as sent, one more hop, and out of a
    dead-letter sub-queue with its source, reason and description."""
    messages = storage.open_table(info.tables["messages"])
    numbers = ", ".join(str(n) for n in claimed["sequence_number"].to_pylist())
    rows = storage.query(f"SELECT * FROM messages WHERE partition_id = {partition} AND sequence_number IN ({numbers}) "
                         "ORDER BY sequence_number", messages=messages)
    hops = pc.add(pc.fill_null(rows["transfer_hop_count"], 0), 1).cast(pa.int32())
    rows = rows.set_column(rows.schema.get_field_index("transfer_hop_count"), "transfer_hop_count", hops)
    if kind == rules.DEAD_LETTER:
        states = {r["sequence_number"]: r for r in claimed.select(
            ["sequence_number", "dead_letter_reason", "dead_letter_error_description"]).to_pylist()}
        properties = []
        for n, text in zip(rows["sequence_number"].to_pylist(), rows["application_properties"].to_pylist()):
            decoded = decode_properties(text)
            for name, column in ((rules.DEAD_LETTER_REASON_PROPERTY, "dead_letter_reason"),
                                 (rules.DEAD_LETTER_DESCRIPTION_PROPERTY, "dead_letter_error_description")):
                if states[n][column] is not None:
                    decoded[name] = states[n][column]
            properties.append(encode_properties(decoded))
        rows = rows.set_column(rows.schema.get_field_index("application_properties"), "application_properties",
                               pa.array(properties, pa.string()))
        source = pa.array([info.path] * rows.num_rows, pa.string())
        rows = rows.set_column(rows.schema.get_field_index("dead_letter_source_entity"), "dead_letter_source_entity",
                               source)
    return rows.select([*OUTGOING.names, *TRANSFER_COLUMNS])


def _release(info: EntityInfo, partition: int, kind: str, batch: int, failure: Optional[tuple[str, str]]) -> int:
    """The batch's claimed rows completed (or transfer-dead-lettered with failure); returns how many."""
    state = storage.open_table(info.tables["locks"])
    token = rules.claim_token(kind, batch)
    rows = records.as_rows(storage.query(
        f"SELECT * FROM locks WHERE partition_id = {partition} AND lock_token = {storage.quoted(token)}", locks=state))
    if not rows:
        return 0  # another forwarder released them
    now = clock.now()
    written = [transitions.transfer_dead_lettered(r, now, *failure) if failure else transitions.completed(r, now)
               for r in rows]
    view = commits.LogView(state)
    locks.commit(view, partition, records.from_rows(written, LOCKS))
    if retention.due(view.version):  # nobody receives from a forwarding entity: its forwarder lets rows go
        retention.run(info, storage.open_table(info.tables["messages"]), storage.refresh(state), partition)
    return len(written)


def _storage_id(info: EntityInfo) -> str:
    """The directory naming the entity's tables (new for every entity created)."""
    return info.tables["messages"].rstrip("/").split("/")[-2]
