"""The sparkbus error classes, importable as in azure-servicebus: `from sparkbus.exceptions import ...`
(`azure.servicebus.exceptions`); every one is also exported from `sparkbus`.

Invalid argument values raise ValueError or TypeError; violations of Service Bus rules raise these.
"""
from __future__ import annotations


class ServiceBusError(Exception):
    """Base of every Service Bus rule violation raised by sparkbus."""


class MessagingEntityNotFoundError(ServiceBusError):
    """The namespace, queue, topic, subscription or rule does not exist."""


class MessagingEntityDisabledError(ServiceBusError):
    """The entity's status forbids the operation (Disabled, SendDisabled or ReceiveDisabled)."""


class MessageNotFoundError(ServiceBusError):
    """No message with the given sequence number is in the entity."""


class MessagingEntityAlreadyExistsError(ServiceBusError):
    """An entity (or namespace) with that name already exists."""


class InvalidOperationError(ServiceBusError):
    """The operation is not allowed on this entity or in this state."""


class MessageSizeExceededError(ServiceBusError):
    """A message or batch is larger than the tier allows."""


class ServiceBusQuotaExceededError(ServiceBusError):
    """An entity, partition or namespace quota would be exceeded."""


class ServiceBusServerBusyError(ServiceBusError):
    """The namespace is throttled; retry after the stated wait."""


class CommitConflictError(ServiceBusServerBusyError):
    """Other writers kept changing what the operation read, through every round the retry policy allows
    (a sparkbus addition: the busy error of optimistic Delta commits)."""


class MessageLockLostError(ServiceBusError):
    """The message lock expired or was taken by another receiver."""


class SessionLockLostError(ServiceBusError):
    """The session lock expired or was taken by another receiver."""


class SessionCannotBeLockedError(ServiceBusError):
    """The requested session is locked by another receiver."""


class MessageAlreadySettled(ServiceBusError):
    """The message was already completed, abandoned, deferred or dead-lettered."""


class OperationTimeoutError(ServiceBusError):
    """The operation did not finish within its time limit."""


class PartitionUnavailableError(ServiceBusError):
    """A partition the operation needs is unavailable."""


__all__ = [
    "ServiceBusError",
    "MessagingEntityNotFoundError",
    "MessagingEntityAlreadyExistsError",
    "MessagingEntityDisabledError",
    "MessageNotFoundError",
    "InvalidOperationError",
    "MessageSizeExceededError",
    "ServiceBusQuotaExceededError",
    "ServiceBusServerBusyError",
    "CommitConflictError",
    "MessageLockLostError",
    "SessionLockLostError",
    "SessionCannotBeLockedError",
    "MessageAlreadySettled",
    "OperationTimeoutError",
    "PartitionUnavailableError",
]
