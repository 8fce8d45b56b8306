"""ServiceBusSender: send, schedule and cancel messages on a queue or topic (azure-servicebus shape).

A sender follows its entity across a delete (sparkbus.engine.registry, sparkbus.engine.enqueue): once the
entity is gone a send raises MessagingEntityNotFoundError, and after it was created again sends go to the
new one, as a reconnecting SDK sender's do; nothing is ever written into a deleted entity's storage to
stay. Sequence numbers schedule_messages returned belong to the entity they were assigned in: cancelling
them after it was deleted and created again raises MessageNotFoundError (numbering starts again in the
new one) and cancels nothing.
"""
from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Callable, Iterable, Optional, TypeVar, Union

from .engine.catalog import Catalog
from .core.throttling import data_cost
from .core.wire import check_sequence_numbers
from .engine.enqueue import EnqueueResult, EntityWriter, cancel_scheduled
from .engine.namespace import governor_of, open_connection
from .engine.registry import CachedEntity, EntityDeleted, EntityInfo
from .engine.retry import DEFAULT as DEFAULT_RETRY, RetryPolicy
from .engine.throttle import Usage
from .amqp import AmqpAnnotatedMessage
from .exceptions import MessageNotFoundError, MessagingEntityNotFoundError
from .message import ServiceBusMessage, ServiceBusMessageBatch, to_outgoing, to_utc
from .handler import requires_open
from .transactions import ServiceBusTransaction

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SENDER_KINDS = ("queue", "topic")
T = TypeVar("T")
Single = Union[ServiceBusMessage, AmqpAnnotatedMessage]
Sendable = Union[Single, Iterable[Single], ServiceBusMessageBatch]


def as_messages(message: Sendable) -> list[ServiceBusMessage]:
    """The messages to send; AmqpAnnotatedMessages become the ServiceBusMessages they stand for.

    Args:
        message: A ServiceBusMessage or AmqpAnnotatedMessage, a list of them, or a ServiceBusMessageBatch.

    Returns:
        The ServiceBusMessages, in order.

    Raises:
        TypeError: message is none of those.
    """
    if isinstance(message, (ServiceBusMessage, AmqpAnnotatedMessage)):
        message = [message]
    if isinstance(message, ServiceBusMessageBatch):
        return message.messages
    if isinstance(message, (str, bytes)) or not isinstance(message, Iterable):
        raise TypeError("send_messages takes a ServiceBusMessage or AmqpAnnotatedMessage, a list of them or a "
                        f"ServiceBusMessageBatch, got {type(message).__name__}")
    messages = [ServiceBusMessage.from_amqp(m) if isinstance(m, AmqpAnnotatedMessage) else m for m in message]
    for m in messages:
        if not isinstance(m, ServiceBusMessage):
            raise TypeError("send_messages lists must hold ServiceBusMessage or AmqpAnnotatedMessage objects, "
                            f"got {type(m).__name__}")
    return messages


def _renumbered(info: EntityInfo) -> MessageNotFoundError:
    """cancel_scheduled_messages' answer when the entity was deleted and created again since this sender
    scheduled messages in it."""
    return MessageNotFoundError(
        f"{info.kind} {info.path!r} was deleted and created again since this sender scheduled messages in it: "
        "the sequence numbers it returned name nothing in the new one (numbering starts again); nothing was "
        "cancelled")


def sent(count: int) -> Usage:
    """A send of `count` messages: 1 credit each.

    Args:
        count: How many messages the send holds.

    Returns:
        Its usage: the credits it costs and the incoming messages it counts.
    """
    return Usage(data_cost(count), incoming_messages=count)


class ServiceBusSender:
    """Sender of one queue or topic. The messages of one send_messages call commit atomically; threads
    sending through one sender at once share commits (group commit, sparkbus.engine.enqueue).

    Every call is admitted by the namespace's throttling (sparkbus.engine.throttle) and charged 1 credit
    per message; a throttled call is retried under the client's retry policy, within the call's timeout=
    (seconds) when one is given: OperationTimeoutError when the next retry would start after it. After
    close(), every operation raises ValueError, as the SDK's sender does.
    """

    def __init__(self, catalog: Catalog, entity_name: str, spark: Optional["SparkSession"] = None, *,
                 retry: RetryPolicy = DEFAULT_RETRY) -> None:
        self._catalog = catalog
        self.entity_name = entity_name
        self._spark = spark
        self._retry = retry
        self._entity = CachedEntity(catalog, entity_name, SENDER_KINDS)
        self._writer = EntityWriter(self._entity.get, retry=retry, entity=self._entity)
        self._scheduled_in: Optional[str] = None  # the incarnation the last schedule_messages numbered in
        self._governor = governor_of(catalog)
        self._closed = False

    @classmethod
    def _from_connection_string(cls, conn_str: str, *, queue_name: Optional[str] = None,
                                topic_name: Optional[str] = None, **kwargs: object) -> "ServiceBusSender":
        """A sender straight from a connection string, as the SDK's (underscored, but used by its samples);
        retry_* keywords as ServiceBusClient's, the SDK's others ignored."""
        if (queue_name is None) == (topic_name is None):
            raise TypeError("give exactly one of queue_name and topic_name")
        name = queue_name if queue_name is not None else topic_name
        assert name is not None  # exactly one of them is given (checked above)
        catalog, _ = open_connection(conn_str)
        return cls(catalog, name, retry=RetryPolicy.from_keywords(kwargs))

    def entity_info(self) -> EntityInfo:
        """The entity's settings (re-read from the catalog at most once a second)."""
        return self._entity.get()

    @property
    def entity_path(self) -> str:
        return self.entity_name

    @property
    def fully_qualified_namespace(self) -> str:
        return self._catalog.root

    def __enter__(self) -> "ServiceBusSender":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing to release: sends are committed before they return (the client's close persists the
        process's metrics). The sender refuses further operations."""
        self._closed = True

    def _charged(self, count: int, operation: Callable[[], T], timeout: object = None) -> T:
        """operation, admitted and charged as a send of `count` messages, retried within timeout."""
        try:
            return self._governor.call(self.entity_info().path, operation, lambda _: sent(count),
                                       self._retry.bounded(timeout))
        except EntityDeleted as gone:
            if gone.current is not None:  # created again: the caller decides (cancel_scheduled_messages)
                raise
            raise MessagingEntityNotFoundError(str(gone)) from gone

    @requires_open
    def send_messages(self, message: Sendable, *, timeout: Optional[float] = None,
                      transaction: Optional[ServiceBusTransaction] = None) -> None:
        """Send one message, a list or a batch: all of them commit together or none does.

        Duplicates (with duplicate detection) are acknowledged and discarded, as Service Bus does.

        Args:
            message: A ServiceBusMessage, a list of them, or a ServiceBusMessageBatch.
            timeout: Seconds the send (with its retries) may take; default: the client's retry policy.
            transaction: A client.transaction(): the messages become visible when its block exits normally.

        Raises:
            MessagingEntityNotFoundError: the queue or topic does not exist.
            MessageSizeExceededError: a message or the list is larger than the entity allows.
            ServiceBusQuotaExceededError: the entity is full.
            TypeError: transaction is not a ServiceBusTransaction.
        """
        self._retry.bounded(timeout)  # checked before anything else
        if transaction is not None and not isinstance(transaction, ServiceBusTransaction):
            raise TypeError(f"transaction must be a ServiceBusTransaction (client.transaction()), got "
                            f"{type(transaction).__name__}")
        messages = as_messages(message)
        if transaction is not None:
            self._charged(len(messages), lambda: transaction.add(
                self.entity_info(), lambda held: self._send(held, batch_limit=False), messages), timeout)
            return
        if messages:
            rows = message.outgoing() if isinstance(message, ServiceBusMessageBatch) else to_outgoing(messages)
            self._charged(len(messages), lambda: self._writer.send(rows), timeout)

    def _send(self, messages: list[ServiceBusMessage], *, batch_limit: bool = True) -> EnqueueResult:
        """One atomic commit of messages, returning the result (used by transactions)."""
        return self._writer.append(to_outgoing(messages), batch_limit=batch_limit)

    @requires_open
    def schedule_messages(self, messages: Sendable, schedule_time_utc: datetime, *,
                          timeout: Optional[float] = None) -> list[int]:
        """Enqueue messages that become receivable at a time.

        Args:
            messages: A ServiceBusMessage, a list of them, or a ServiceBusMessageBatch.
            schedule_time_utc: When they become receivable (a naive datetime is UTC).
            timeout: Seconds the call may take; default: the client's retry policy.

        Returns:
            Their sequence numbers, to cancel them with cancel_scheduled_messages.

        Raises:
            TypeError: schedule_time_utc is not a datetime.
        """
        self._retry.bounded(timeout)
        when = to_utc(schedule_time_utc, "schedule_time_utc")
        if when is None:
            raise TypeError("schedule_time_utc must be a datetime")
        messages = as_messages(messages)
        for m in messages:
            m.scheduled_enqueue_time_utc = when
        if not messages:
            return []
        rows = to_outgoing(messages)
        result = self._charged(len(messages), lambda: self._writer.send(rows), timeout)
        self._scheduled_in = self.entity_info().incarnation  # the one the send went to (it follows a new one)
        return [s for s in result.sequence_numbers if s is not None]

    @requires_open
    def cancel_scheduled_messages(self, sequence_numbers: Union[int, Iterable[int]], *,
                                  timeout: Optional[float] = None) -> None:
        """Cancel scheduled messages so they are never delivered.

        Args:
            sequence_numbers: One sequence number or several, as schedule_messages returned them.
            timeout: Seconds the call may take; default: the client's retry policy.

        Raises:
            MessageNotFoundError: a number is unknown, or its message was already delivered.
        """
        self._retry.bounded(timeout)
        numbers = check_sequence_numbers(sequence_numbers)
        if not numbers:
            return
        info = self.entity_info()
        if self._scheduled_in not in (None, info.incarnation):
            self._scheduled_in = info.incarnation  # reported once: numbers scheduled from now are the new one's
            raise _renumbered(info)
        try:
            self._charged(len(numbers), lambda: self._entity.confirmed(info, lambda: cancel_scheduled(
                info, sorted(set(numbers)), self._retry, confirm=lambda: self._entity.confirm(info))), timeout)
        except EntityDeleted as gone:  # deleted while this ran and created again (the cached settings named it)
            assert gone.current is not None  # _charged raises MessagingEntityNotFoundError when it was not
            if self._scheduled_in is not None:
                self._scheduled_in = gone.current.incarnation
            raise _renumbered(gone.current) from gone

    @requires_open
    def create_message_batch(self, max_size_in_bytes: Optional[int] = None) -> ServiceBusMessageBatch:
        """An empty batch to fill with add_message and send in one commit.

        Args:
            max_size_in_bytes: Its size limit, at most the tier's batch limit (the default).

        Returns:
            The empty batch.

        Raises:
            TypeError: max_size_in_bytes is not an int.
            ValueError: max_size_in_bytes is not between 1 and the entity's batch limit.
        """
        limit = self.entity_info().max_batch_bytes
        if max_size_in_bytes is None:
            return ServiceBusMessageBatch(limit)
        if isinstance(max_size_in_bytes, bool) or not isinstance(max_size_in_bytes, int):
            raise TypeError(f"max_size_in_bytes must be an int, got {type(max_size_in_bytes).__name__}")
        if not 0 < max_size_in_bytes <= limit:
            raise ValueError(f"max_size_in_bytes must be between 1 and the entity's batch limit {limit}, got {max_size_in_bytes}")
        return ServiceBusMessageBatch(max_size_in_bytes)

    @requires_open
    def send_dataframe(self, df: "DataFrame") -> EnqueueResult:
        """Send every row of a Spark DataFrame as one atomic commit (see sparkbus.spark.dataframes). It is
        admitted as one request and charged 1 credit per row: a large DataFrame goes through and leaves
        the namespace throttled until the following periods repaid it.

        Args:
            df: A body column and optional message-field and application-property columns
                (messages_from_dataset makes one from any dataset).

        Returns:
            How many messages were sent and discarded as duplicates, and their sequence numbers per partition.
        """
        from .spark.dataframes import send_dataframe

        return self._governor.call(self.entity_info().path, lambda: send_dataframe(self._writer, df),
                                   lambda result: sent(result.message_count + result.duplicate_count), self._retry)

