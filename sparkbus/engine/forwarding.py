"""Auto-forwarding: messages of a queue or subscription with forward_to (and dead-lettered messages of one
with forward_dead_lettered_messages_to) move to the destination entity, exactly once.

A transfer is three conditional commits, each safe to repeat. A pass makes each of them once for all the
source partitions with work (one claim commit, one copy, one release: on an object store a pass costs the
same for one partition or sixteen), but every partition keeps its own claim, batch number and application
transactions, so what follows holds partition by partition:

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
   replay copies only the batches the destination lacks (one that finds some of its batches made
   meanwhile writes nothing: CommitConflictError, and the next pass sees them), and two forwarders
   copying the same batch conflict on the app id. A destination that refuses the copy (full, disabled
   since the claim) writes nothing, and every batch in it goes to the transfer dead-letters. The copy
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
from typing import Any, Optional, cast

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
    """One pass over the source's available partitions that have work: outstanding claims are finished,
    then per kind one new batch of each partition is claimed and transferred, all the partitions together
    (one claim commit, one copy, one release: a pass costs the same for one partition or sixteen), up to
    `batch` messages in all. When a partition's files cannot be read, the others are done one by one."""
    result = ForwardResult()
    kinds = [kind for kind in rules.KINDS if destination_of(info, kind) is not None]
    partitions = [p for p in _partitions_with_work(info, kinds) if p not in info.avoided()]
    if not partitions:
        return result
    try:
        _pass(catalog, snap, info, partitions, kinds, batch, result)
    except CommitConflictError:
        pass  # the claims stay; the next pass finishes them
    except PartitionUnavailableError:
        for partition in partitions:
            try:
                _pass(catalog, snap, info, [partition], kinds, batch, result)
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


# ---- one pass --------------------------------------------------------------------------------------------

Claims = dict[int, tuple[int, pa.Table]]  # partition -> (batch number, its claimed state rows)


def _where(partitions: list[int]) -> str:
    return f"partition_id IN ({', '.join(map(str, partitions))})"


def _pass(catalog: Catalog, snap: Snapshot, info: EntityInfo, partitions: list[int], kinds: list[str], batch: int,
          result: ForwardResult) -> None:
    """forward_entity over these partitions, counting what moved in result as it goes."""
    for kind, outstanding in _claimed(info, partitions).items():
        _finish(catalog, info, kind, outstanding, result)
    limit = max(1, batch // len(partitions))
    for kind in kinds:
        claimed = retry.run(lambda: _claim(catalog.root, snap, info, partitions, kind, limit, result),
                            what=f"claiming messages of {info.path!r} to forward")
        if claimed:
            _finish(catalog, info, kind, claimed, result)


def _claimed(info: EntityInfo, partitions: list[int]) -> dict[str, Claims]:
    """The partitions' outstanding claims by kind: {kind: {partition: (batch, state rows)}}."""
    state = storage.open_table(info.tables["locks"])
    rows = storage.query(f"SELECT * FROM locks WHERE {_where(partitions)} AND {rules.CLAIM_SQL} "
                         f"AND state IN ('{ACTIVE}', '{DEAD_LETTERED}') ORDER BY partition_id, sequence_number",
                         locks=state)
    found: dict[str, Claims] = {}
    for partition in sorted(set(rows["partition_id"].to_pylist())):
        part = rows.filter(pc.equal(rows["partition_id"], partition))
        # every row selected carries a claim token (CLAIM_SQL)
        claims = {claim for t in part["lock_token"].to_pylist() if (claim := rules.parse_claim(t)) is not None}
        kind, number = max(claims, key=lambda c: c[1])  # one at a time: only ever one batch number
        found.setdefault(kind, {})[partition] = (number, part)
    return found


def _claim(root: str, snap: Snapshot, info: EntityInfo, partitions: list[int], kind: str, limit: int,
           result: ForwardResult) -> Claims:
    """Claim up to `limit` messages of each partition without a claim outstanding, in one commit (see the
    module docstring); returns the claims made. Messages refused outright are counted in result as
    transfer-dead-lettered."""
    state = storage.open_table(info.tables["locks"])  # before messages: see sparkbus.engine.retention
    messages = storage.open_table(info.tables["messages"])
    now = clock.now()
    queue = ACTIVE if kind == rules.FORWARD else DEAD_LETTERED
    where = _where(partitions)
    all_states = storage.query(f"SELECT * FROM locks WHERE {where}", locks=state).select(LOCKS.names).cast(LOCKS)
    all_messages = storage.query(f"SELECT * FROM messages WHERE {where}", messages=messages
                                 ).select(MESSAGES.names).cast(MESSAGES)
    numbers = commits.app_versions(state, [rules.claim_app_id(p) for p in partitions])
    policy = transitions.Policy(lock_duration=CLAIM_DURATION, max_delivery_count=info.options.max_delivery_count,
                                dead_letter_on_expiry=info.options.dead_lettering_on_message_expiration)
    written: dict[int, pa.Table] = {}
    versions: list[Transaction] = []
    claims: Claims = {}
    refused_count = 0
    for partition in partitions:
        state_rows = all_states.filter(pc.equal(all_states["partition_id"], partition))
        if any(rules.parse_claim(t) for t in state_rows["lock_token"].to_pylist()):
            continue  # another forwarder claimed meanwhile; the next pass finishes its batch
        message_rows = all_messages.filter(pc.equal(all_messages["partition_id"], partition))
        found = transitions.candidates(message_rows, state_rows, queue, now, limit)
        if found.num_rows == 0:
            continue
        planned, deliver = transitions.plan(found, policy, now, queue, False, limit)
        taken = found.take(pa.array(deliver, pa.int64()))
        batch = (numbers[rules.claim_app_id(partition)] or 0) + 1
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
        written[partition] = table
        versions.append(Transaction(rules.claim_app_id(partition), batch))
        refused_count += len(refused)
        claimed = table.filter(pc.equal(pc.fill_null(table["lock_token"], ""), rules.claim_token(kind, batch)))
        if claimed.num_rows:
            claims[partition] = (batch, claimed)
    if not written:
        return {}
    locks.commit_partitions(commits.LogView(state), written, versions)
    if refused_count:
        result.dead_lettered[info.path] = result.dead_lettered.get(info.path, 0) + refused_count
    return claims


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
    sizes = (body_sizes(taken) + header_sizes(taken)).tolist()
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


def _finish(catalog: Catalog, info: EntityInfo, kind: str, claims: Claims, result: ForwardResult) -> None:
    """Copy the claimed batches to the destination in one commit (those it does not have already), then
    release the claims in one commit; counted in result."""
    target = destination_of(info, kind)
    failure: Optional[tuple[str, str]] = None
    try:
        if target is None:
            raise InvalidOperationError(f"{info.path!r} no longer forwards its {'dead-lettered ' if kind != rules.FORWARD else ''}messages")
        destination = resolve(catalog.root, catalog.snapshot(), target, ("queue", "topic"))
        app_ids = {p: rules.transfer_app_id(_storage_id(info), p) for p in claims}
        # Has it some already (a forwarder stopped before releasing)? Asked before the destination's checks:
        # one that became disabled since must not send a copy it holds to the transfer dead-letters.
        have = commits.app_versions(storage.open_table(destination.tables["messages"]), app_ids.values())
        missing = {p: number for p, (number, _) in claims.items() if (have[app_ids[p]] or 0) < number}
        if missing:
            copies = _copies(info, kind, {p: claims[p][1] for p in sorted(missing)})
            governor_of(catalog).call(  # charged as a send into the destination; waits for credits
                destination.path, lambda: EntityWriter(lambda: destination).append(
                    copies, batch_limit=False, info=destination, with_sequence_numbers=False,
                    app_transactions={app_ids[p]: number for p, number in missing.items()}),
                lambda _: Usage(data_cost(copies.num_rows), incoming_messages=copies.num_rows), retry.NO_RETRY,
                wait=True)
    except (CommitConflictError, PartitionUnavailableError):
        raise  # transient: the claims stay and are finished later
    except ServiceBusError as error:  # refused (full, disabled, gone): to the transfer dead-letter sub-queue
        failure = (rules.failure_reason(target or "", type(error).__name__), str(error))
    released = retry.run(lambda: _release(info, kind, {p: number for p, (number, _) in claims.items()}, failure),
                         what=f"releasing forwarded messages of {info.path!r}")
    counts = result.dead_lettered if failure else result.forwarded
    counts[info.path] = counts.get(info.path, 0) + released


def _copies(info: EntityInfo, kind: str, claimed: dict[int, pa.Table]) -> pa.Table:
    """The claimed messages (partition -> claimed state rows) as the destination receives them: as sent,
    one more hop, and out of a dead-letter sub-queue with its source, reason and description."""
    messages = storage.open_table(info.tables["messages"])
    wanted = " OR ".join(f"(partition_id = {p} AND sequence_number IN "
                         f"({', '.join(str(n) for n in rows['sequence_number'].to_pylist())}))"
                         for p, rows in claimed.items())
    rows = storage.query(f"SELECT * FROM messages WHERE {wanted} ORDER BY partition_id, sequence_number",
                         messages=messages)
    hops = pc.add(pc.fill_null(rows["transfer_hop_count"], 0), 1).cast(pa.int32())
    rows = rows.set_column(rows.schema.get_field_index("transfer_hop_count"), "transfer_hop_count", hops)
    if kind == rules.DEAD_LETTER:
        states = {(p, r["sequence_number"]): r for p, part in claimed.items() for r in part.select(
            ["sequence_number", "dead_letter_reason", "dead_letter_error_description"]).to_pylist()}
        properties = []
        for p, n, text in zip(rows["partition_id"].to_pylist(), rows["sequence_number"].to_pylist(),
                              rows["application_properties"].to_pylist()):
            decoded = decode_properties(text)
            for name, column in ((rules.DEAD_LETTER_REASON_PROPERTY, "dead_letter_reason"),
                                 (rules.DEAD_LETTER_DESCRIPTION_PROPERTY, "dead_letter_error_description")):
                if states[(p, n)][column] is not None:
                    decoded[name] = states[(p, n)][column]
            properties.append(encode_properties(decoded))
        rows = rows.set_column(rows.schema.get_field_index("application_properties"), "application_properties",
                               pa.array(properties, pa.string()))
        source = pa.array([info.path] * rows.num_rows, pa.string())
        rows = rows.set_column(rows.schema.get_field_index("dead_letter_source_entity"), "dead_letter_source_entity",
                               source)
    return rows.select([*OUTGOING.names, *TRANSFER_COLUMNS])


def _release(info: EntityInfo, kind: str, batches: dict[int, int], failure: Optional[tuple[str, str]]) -> int:
    """The batches' claimed rows (partition -> batch number) completed (or transfer-dead-lettered with
    failure) in one commit; returns how many."""
    state = storage.open_table(info.tables["locks"])
    wanted = " OR ".join(f"(partition_id = {p} AND lock_token = {storage.quoted(rules.claim_token(kind, number))})"
                         for p, number in batches.items())
    found = storage.query(f"SELECT * FROM locks WHERE {wanted}", locks=state)
    if not found.num_rows:
        return 0  # another forwarder released them
    now = clock.now()
    by_partition: dict[int, list[dict[str, Any]]] = {}
    for r in records.as_rows(found):
        by_partition.setdefault(r["partition_id"], []).append(
            transitions.transfer_dead_lettered(r, now, *failure) if failure else transitions.forwarded(r, now))
    view = commits.LogView(state)
    locks.commit_partitions(view, {p: records.from_rows(rows, LOCKS) for p, rows in by_partition.items()})
    if retention.due(view.version):  # nobody receives from a forwarding entity: its forwarder lets rows go
        for p in sorted(by_partition):
            retention.run(info, storage.open_table(info.tables["messages"]), storage.refresh(state), p)
    return sum(len(rows) for rows in by_partition.values())


def _storage_id(info: EntityInfo) -> str:
    """The directory naming the entity's tables (new for every entity created)."""
    return info.tables["messages"].rstrip("/").split("/")[-2]
