"""Transactions (seed "Use transactions with partitioned entities").

Messages sent with transaction=txn are held until the `with client.transaction()` block exits normally,
then committed to their entity in one Delta commit; if the block raises, nothing is written. A
transaction belongs to the namespace of the client that started it (Service Bus: to one connection) and
spans one entity of it (Service Bus' send-via across entities is not offered): a sender of another
namespace, even to an entity of the same name, is refused before anything is held. On a partitioned
entity every message needs a partition key (session id, partition key, or message id with duplicate
detection) and all keys must be equal, so messages of different sessions cannot share a transaction.
"""
from __future__ import annotations

from typing import Callable, Optional

from .core import names, partitioning
from .engine.enqueue import check_rows
from .engine.registry import EntityInfo
from .exceptions import InvalidOperationError
from .message import ServiceBusMessage, to_outgoing

_NO_KEY = object()


class ServiceBusTransaction:
    """Collects messages for one entity of one namespace; commit() writes them atomically, discard() drops
    them.

    Args:
        namespace: The location of the client's namespace (None: the namespace of the first send).
    """

    def __init__(self, namespace: Optional[str] = None) -> None:
        self._namespace = namespace
        self._entity: Optional[EntityInfo] = None
        self._send: Optional[Callable[[list[ServiceBusMessage]], object]] = None
        self._messages: list[ServiceBusMessage] = []
        self._key: object = _NO_KEY
        self._open = True

    def add(self, info: EntityInfo, send: Callable[[list[ServiceBusMessage]], object],
            messages: list[ServiceBusMessage]) -> None:
        """Validate and hold messages for the entity `info`, to be written by send(messages) at commit; a
        violation raises here and holds nothing.

        Args:
            info: The entity the messages are sent to.
            send: Writes a list of messages in one commit; called with the messages held, at commit.
            messages: The messages to hold.

        Raises:
            InvalidOperationError: the transaction has ended; the entity is of another namespace, or another
                entity than the transaction's; on a partitioned entity, a message has no partition key, or
                another than the others'.
        """
        if not self._open:
            raise InvalidOperationError("the transaction has ended; start a new `with client.transaction()` block")
        namespace = self._namespace if self._namespace is not None else info.namespace.path
        if info.namespace.path != namespace:
            raise InvalidOperationError(
                f"a transaction belongs to one namespace: it was started for {namespace!r}, not "
                f"{info.namespace.path!r}; use a transaction of a client of that namespace")
        if self._entity is not None and names.key(info.path) != names.key(self._entity.path):
            raise InvalidOperationError(
                f"a transaction spans one entity: it already sends to {self._entity.path!r}, not {info.path!r}")
        check_rows(info, to_outgoing(messages), batch_limit=True)
        key = self._key
        if info.partition_count > 1:
            dedup = info.options.requires_duplicate_detection
            for m in messages:
                this = partitioning.partition_key(m.session_id, m.partition_key, m.message_id, dedup)
                if this is None:
                    raise InvalidOperationError(
                        "messages sent in a transaction to a partitioned entity need a partition key: set "
                        "session_id or partition_key (or message_id with duplicate detection)")
                if key is not _NO_KEY and this != key:
                    raise InvalidOperationError(
                        f"all messages of a transaction on a partitioned entity need the same partition key "
                        f"(or session); got {this!r} after {key!r}")
                key = this
        self._namespace, self._entity, self._send, self._key = namespace, info, send, key
        self._messages.extend(messages)

    def commit(self) -> None:
        self._open = False
        if self._send is not None and self._messages:
            self._send(self._messages)
        self._messages = []

    def discard(self) -> None:
        self._open = False
        self._messages = []
