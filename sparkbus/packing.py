"""Sending many messages all or nothing as far as a sender can: every message is checked and packed into
batches (each as large as the entity allows, each one commit) before the first is sent, so a refused message
sends nothing and its error names where it came from (a file's line, a dead-lettered message's number).
The command line's `send` and `dead-letter resubmit` and the Explorer's changes pack through here.
"""
from __future__ import annotations

from typing import Iterable

from .engine.enqueue import check_rows
from .engine.registry import EntityInfo
from .exceptions import MessageSizeExceededError, ServiceBusError
from .message import ServiceBusMessage, ServiceBusMessageBatch, to_outgoing
from .sender import ServiceBusSender

Numbered = tuple[str, ServiceBusMessage]  # (where the message came from, e.g. "messages.jsonl line 3", message)


def reworded(error: BaseException, text: str) -> BaseException:
    """error, of the same type, with text as its message (so the one error line still names its type); a
    UnicodeError, whose message is made of its fields, becomes a ValueError."""
    if isinstance(error, UnicodeError):
        return ValueError(text)
    error.args = (text,)
    if hasattr(error, "message"):  # azure-core's errors keep their message here too
        error.message = text
    return error


def check_target(sender: ServiceBusSender) -> EntityInfo:
    """The sender's entity, if it exists, is a queue or topic and takes sends now; otherwise the error a
    send would raise (MessagingEntityNotFoundError, InvalidOperationError, MessagingEntityDisabledError)."""
    info = sender.entity_info()
    check_rows(info, to_outgoing([]), batch_limit=False)
    return info


def _fits(batch: ServiceBusMessageBatch, where: str, message: ServiceBusMessage) -> bool:
    """Adds message to batch; False when the batch is too full to take it, MessageSizeExceededError
    (naming where) when even an empty batch could not, and the error of a value the message's encoding
    refuses (naming where)."""
    try:
        batch.add_message(message)
    except MessageSizeExceededError as error:
        if len(batch):
            return False
        raise reworded(error, f"{where}: {error}") from None
    except (ValueError, TypeError) as error:
        raise reworded(error, f"{where}: {error}") from None
    return True


def _checked(info: EntityInfo, batch: ServiceBusMessageBatch, wheres: list[str]) -> tuple[ServiceBusMessageBatch, str]:
    """batch, if the entity's session and size rules take it as a send would; otherwise the error of its
    first refused message, naming where it came from. Returns (batch, where its last message came from)."""
    try:
        check_rows(info, to_outgoing(batch.messages), batch_limit=True)
    except (ServiceBusError, ValueError):
        for where, message in zip(wheres, batch.messages):
            try:
                check_rows(info, to_outgoing([message]), batch_limit=False)
            except (ServiceBusError, ValueError) as error:
                raise reworded(error, f"{where}: {error}") from None
        raise
    return batch, wheres[-1]


def pack(sender: ServiceBusSender, messages: Iterable[Numbered]) -> list[tuple[ServiceBusMessageBatch, str]]:
    """Every message in batches as large as the sender's entity allows, each checked as its send would be
    (check_target, then sessions and sizes); returns (batch, where its last message came from). The first
    message refused raises, naming where it came from, before anything is sent."""
    info = check_target(sender)
    batches = []
    wheres: list[str]
    batch, wheres = sender.create_message_batch(), []
    for where, message in messages:
        if not _fits(batch, where, message):
            batches.append(_checked(info, batch, wheres))
            batch, wheres = sender.create_message_batch(), []
            _fits(batch, where, message)  # an empty batch takes it, or _fits raised
        wheres.append(where)
    if len(batch):
        batches.append(_checked(info, batch, wheres))
    return batches


