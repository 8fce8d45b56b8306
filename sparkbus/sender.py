"""ServiceBusSender: send, schedule and cancel messages on a queue or topic (azure-servicebus shape)."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING, Iterable, Optional, Union

import pyarrow as pa

from . import maintenance, retry, sequencing, storage
from .catalog import Catalog
from .enqueue import EnqueueResult, EntityWriter
from .exceptions import MessageNotFoundError
from .message import ServiceBusMessage, ServiceBusMessageBatch, _utc, to_outgoing
from .registry import CachedEntity, EntityInfo
from .retry import DEFAULT as DEFAULT_RETRY, RetryPolicy
from .schemas import CANCELLED, LOCKS

if TYPE_CHECKING:
    from .transactions import ServiceBusTransaction

SENDER_KINDS = ("queue", "topic")
Sendable = Union[ServiceBusMessage, Iterable[ServiceBusMessage], ServiceBusMessageBatch]


def as_messages(message: Sendable) -> list[ServiceBusMessage]:
    if isinstance(message, ServiceBusMessage):
        return [message]
    if isinstance(message, ServiceBusMessageBatch):
        return message.messages
    if isinstance(message, (str, bytes)) or not isinstance(message, Iterable):
        raise TypeError("send_messages takes a ServiceBusMessage, a list of them or a ServiceBusMessageBatch, "
                        f"got {type(message).__name__}")
    messages = list(message)
    for m in messages:
        if not isinstance(m, ServiceBusMessage):
            raise TypeError(f"send_messages lists must hold ServiceBusMessage objects, got {type(m).__name__}")
    return messages


class ServiceBusSender:
    """Sender of one queue or topic. One send_messages call is one atomic Delta commit."""

    def __init__(self, catalog: Catalog, entity_name: str, spark: object = None, *,
                 retry: RetryPolicy = DEFAULT_RETRY) -> None:
        self._catalog = catalog
        self.entity_name = entity_name
        self._spark = spark
        self._retry = retry
        self._entity = CachedEntity(catalog, entity_name, SENDER_KINDS)
        self._writer = EntityWriter(self._entity.get, retry=retry)

    def entity_info(self) -> EntityInfo:
        """The entity's settings (re-read from the catalog at most once a second)."""
        return self._entity.get()

    @property
    def fully_qualified_namespace(self) -> str:
        return self._catalog.root

    def __enter__(self) -> "ServiceBusSender":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing to release: sends are committed before they return."""

    def send_messages(self, message: Sendable, *, timeout: Optional[float] = None,
                      transaction: Optional["ServiceBusTransaction"] = None) -> None:
        """Send one message, a list or a batch: all of them commit together or none does.

        With transaction=, the messages become visible when the transaction's block exits normally.
        Duplicates (with duplicate detection) are acknowledged and discarded, as Service Bus does.
        """
        messages = as_messages(message)
        if transaction is not None:
            transaction.add(self, messages)
            return
        if messages:
            self._writer.append(to_outgoing(messages))

    def _send(self, messages: list[ServiceBusMessage], *, batch_limit: bool = True) -> EnqueueResult:
        """One atomic commit of messages, returning the result (used by transactions)."""
        return self._writer.append(to_outgoing(messages), batch_limit=batch_limit)

    def schedule_messages(self, messages: Sendable, schedule_time_utc: datetime, *,
                          timeout: Optional[float] = None) -> list[int]:
        """Enqueue messages that become receivable at schedule_time_utc; returns their sequence numbers."""
        when = _utc(schedule_time_utc, "schedule_time_utc")
        if when is None:
            raise TypeError("schedule_time_utc must be a datetime")
        messages = as_messages(messages)
        for m in messages:
            m.scheduled_enqueue_time_utc = when
        if not messages:
            return []
        result = self._writer.append(to_outgoing(messages))
        return [s for s in result.sequence_numbers if s is not None]

    def cancel_scheduled_messages(self, sequence_numbers: Union[int, Iterable[int]], *,
                                  timeout: Optional[float] = None) -> None:
        """Cancel scheduled messages so they are never delivered; unknown or already delivered -> MessageNotFoundError."""
        numbers = [sequence_numbers] if isinstance(sequence_numbers, int) else list(sequence_numbers)
        for n in numbers:
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise TypeError(f"sequence numbers must be non-negative ints, got {n!r}")
        if numbers:
            cancel_scheduled(self.entity_info(), sorted(set(numbers)), self._retry)

    def create_message_batch(self, max_size_in_bytes: Optional[int] = None) -> ServiceBusMessageBatch:
        """A batch limited to max_size_in_bytes (at most the tier's batch limit, which is the default)."""
        limit = self.entity_info().max_batch_bytes
        if max_size_in_bytes is None:
            return ServiceBusMessageBatch(limit)
        if isinstance(max_size_in_bytes, bool) or not isinstance(max_size_in_bytes, int):
            raise TypeError(f"max_size_in_bytes must be an int, got {type(max_size_in_bytes).__name__}")
        if not 0 < max_size_in_bytes <= limit:
            raise ValueError(f"max_size_in_bytes must be between 1 and the entity's batch limit {limit}, got {max_size_in_bytes}")
        return ServiceBusMessageBatch(max_size_in_bytes)

    def send_dataframe(self, df: object) -> EnqueueResult:
        """Send every row of a Spark DataFrame as one atomic commit (see sparkbus.dataframes)."""
        from .dataframes import send_dataframe

        return send_dataframe(self._writer, df)


def cancel_scheduled(info: EntityInfo, numbers: list[int], policy: RetryPolicy = DEFAULT_RETRY) -> None:
    """Mark scheduled, not yet enqueued messages cancelled, all or none, in one MERGE naming their partitions."""
    now = datetime.now(timezone.utc)
    now_us = storage.micros(now)
    wanted = ", ".join(str(n) for n in numbers)
    messages = storage.open_table(info.tables["messages"])
    found = storage.query(
        f"SELECT sequence_number FROM messages WHERE sequence_number IN ({wanted}) "
        f"AND CAST(scheduled_enqueue_time_utc AS BIGINT) > {now_us}", messages=messages)["sequence_number"].to_pylist()
    missing = sorted(set(numbers) - set(found))
    if missing:
        raise MessageNotFoundError(
            f"no message waiting for its scheduled time with sequence number(s) {missing[:10]} in {info.path!r}")
    partitions = sorted({sequencing.partition_of_sequence(n) for n in numbers})
    source = pa.Table.from_pylist([
        {"partition_id": sequencing.partition_of_sequence(n), "sequence_number": n, "state": CANCELLED,
         "delivery_count": 0, "lock_token": None, "locked_until_utc": None, "dead_letter_reason": None,
         "dead_letter_error_description": None, "dead_letter_source": None, "updated_at_utc": now}
        for n in numbers], schema=LOCKS)
    predicate = (f"t.partition_id IN ({', '.join(map(str, partitions))}) AND t.partition_id = s.partition_id "
                 "AND t.sequence_number = s.sequence_number")

    def merge() -> None:
        locks = storage.open_table(info.tables["locks"])  # checked and merged at this one version
        taken = storage.query(f"SELECT sequence_number FROM locks WHERE sequence_number IN ({wanted})", locks=locks)
        if taken.num_rows:
            raise MessageNotFoundError(
                f"message(s) {sorted(taken['sequence_number'].to_pylist())[:10]} were already delivered, settled "
                "or cancelled")
        (locks.merge(source, predicate, source_alias="s", target_alias="t", post_commithook_properties=storage.NO_HOOKS)
            .when_not_matched_insert_all().execute())
        maintenance.after_commit(locks)

    retry.run(merge, policy, what=f"cancelling scheduled messages of {info.path!r}")
