"""Resubmitting dead-lettered messages (what Service Bus Explorer's "resubmit" does): each is copied (body,
properties and application properties as sent, time to live; not the broker's fields), the copy sent to a
queue or topic (by default the queue itself, or the topic of a subscription, whose rules then route it
again), and then the dead-lettered message completed.

The target is checked before anything is received, and each round's copies are packed and checked
(sparkbus.packing) before they are sent; refused, the round's messages are abandoned (back in the dead-letter
sub-queue at once) and the error raised. Messages chosen by sequence number are locked all at once: all or
none. A crash between sending and completing leaves the message dead-lettered and its copy sent:
resubmitting again sends a second copy unless the destination detects duplicates (the message id is kept).
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

from .amqp import AmqpAnnotatedMessage
from .client import ServiceBusClient
from .core.names import split_subscription_path
from .exceptions import ServiceBusError
from .message import ServiceBusMessage
from .packing import check_target, pack
from .receiver import ServiceBusReceivedMessage, ServiceBusReceiver, ServiceBusSubQueue

MESSAGE_FIELDS = ("message_id", "session_id", "partition_key", "correlation_id", "content_type", "subject", "to",
                  "reply_to", "reply_to_session_id")
ROUND = 100  # dead-lettered messages received, copied and completed together when none are chosen by number


def default_destination(entity: str) -> str:
    """Where a dead-lettered message of entity goes back to: the queue itself, or a subscription's topic."""
    subscription = split_subscription_path(entity)
    return subscription[0] if subscription else entity


def dead_letter_receiver(client: ServiceBusClient, entity: str, *,
                         max_wait_time: Optional[float] = None) -> ServiceBusReceiver:
    """A receiver of the dead-letter sub-queue of a queue or '<topic>/Subscriptions/<name>'."""
    subscription = split_subscription_path(entity)
    if subscription is None:
        return client.get_queue_receiver(entity, sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=max_wait_time)
    return client.get_subscription_receiver(*subscription, sub_queue=ServiceBusSubQueue.DEAD_LETTER,
                                            max_wait_time=max_wait_time)


def copy_to_resubmit(message: ServiceBusReceivedMessage) -> ServiceBusMessage:
    """A new message with a dead-lettered message's body (of any kind), properties, application
    properties (as sent) and time to live; the broker's fields (numbers, counts, reasons) are not copied."""
    kind = message.body_type.value
    body: Any = message.body if kind == "value" else list(message.body)  # a value body is any AMQP value
    copy = ServiceBusMessage.from_amqp(AmqpAnnotatedMessage(**{f"{kind}_body": body}))
    for name in MESSAGE_FIELDS:
        setattr(copy, name, getattr(message, name))
    copy.application_properties = dict(message.str_application_properties)
    copy.time_to_live = message.time_to_live
    return copy


def resubmit_dead_lettered(client: ServiceBusClient, entity: str, *, to: Optional[str] = None,
                           sequence_numbers: Optional[Iterable[int]] = None, max_message_count: int = 1000,
                           max_wait_time: float = 1.0,
                           edit: Optional[Callable[[ServiceBusMessage], ServiceBusMessage]] = None,
                           progress: Optional[Callable[[int], Any]] = None) -> int:
    """Resubmit dead-lettered messages of a queue or subscription (module docstring): those of
    sequence_numbers (all or none; a number given twice is one message), else up to max_message_count in
    rounds, waiting max_wait_time for the first. edit may change each copy before it is sent; progress is
    called with the number moved by each round. Returns how many were resubmitted.

    Raises:
        MessagingEntityNotFoundError: the entity or the destination does not exist.
        MessageNotFoundError: a chosen number is not an unlocked dead-lettered message (nothing moved).
        ValueError, TypeError, MessageSizeExceededError: a copy (as edited) is refused (its round is abandoned).
    """
    destination = to or default_destination(entity)
    chosen = list(dict.fromkeys(sequence_numbers or ()))
    wanted = len(chosen) or max_message_count
    moved = 0
    with client.get_queue_sender(destination) as sender, dead_letter_receiver(client, entity) as receiver:
        check_target(sender)
        while moved < wanted:
            if chosen:  # all at once: all or none
                got, chosen = receiver.receive_messages_by_sequence_number(chosen), []
            else:
                got = receiver.receive_messages(min(wanted - moved, ROUND), max_wait_time=max_wait_time if not moved else 0)
            if not got:
                break
            try:
                copies = [copy_to_resubmit(m) for m in got]
                batches = pack(sender, [(f"dead-lettered message {m.sequence_number}", edit(c) if edit else c)
                                        for m, c in zip(got, copies)])
            except Exception:
                _abandon(receiver, got)
                raise
            for batch, _ in batches:
                sender.send_messages(batch)
            receiver.complete_messages(got)
            moved += len(got)
            if progress is not None:
                progress(len(got))
    return moved


def _abandon(receiver: ServiceBusReceiver, messages: list[ServiceBusReceivedMessage]) -> None:
    """Give back messages whose copies were refused; a lock that cannot be given back expires by itself,
    and the refusal is the error to report, so errors here are not raised."""
    for message in messages:
        try:
            receiver.abandon_message(message)
        except ServiceBusError:
            pass
