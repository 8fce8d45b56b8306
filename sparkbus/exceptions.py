"""The sparkbus error classes, importable as in azure-servicebus: `from sparkbus.exceptions import ...`
(`azure.servicebus.exceptions`); every one is also exported from `sparkbus`.

Invalid argument values raise ValueError or TypeError; violations of Service Bus rules raise these. As in
the SDK, ServiceBusError is an azure-core AzureError, MessageSizeExceededError and MessageAlreadySettled
are also ValueErrors, and (as the SDK's management client raises azure-core's HTTP errors) a missing or
already existing entity is also azure-core's ResourceNotFoundError / ResourceExistsError, so code written
for either catches what sparkbus raises.
"""
from __future__ import annotations

from typing import Any, Optional, Union

from azure.core.exceptions import AzureError, ResourceExistsError, ResourceNotFoundError


class ServiceBusError(AzureError):
    """Base of every Service Bus rule violation raised by sparkbus. Takes the message positionally (as
    sparkbus raises them) or as message= (as the SDK constructs its subclasses)."""

    def __init__(self, message: Optional[Union[str, bytes]] = None, *args: Any, **kwargs: Any) -> None:
        message = kwargs.pop("message", message)
        if isinstance(message, bytes):
            message = message.decode("utf-8")
        for ignored in ("retryable", "shutdown_handler", "condition", "status_code"):  # SDK transport details
            kwargs.pop(ignored, None)
        super().__init__(message or "Service Bus has encountered an error.", *args, **kwargs)


class ServiceBusConnectionError(ServiceBusError):
    """An error occurred in the connection (for ported code: a local namespace has none)."""


class ServiceBusAuthenticationError(ServiceBusError):
    """Authenticating the connection failed (for ported code; storage credentials of object-store
    namespaces report here)."""


class ServiceBusAuthorizationError(ServiceBusError):
    """The credential is not allowed to do the operation."""


class ServiceBusCommunicationError(ServiceBusError):
    """The namespace could not be reached."""


class AutoLockRenewFailed(ServiceBusError):
    """An AutoLockRenewer could not renew a lock."""


class AutoLockRenewTimeout(ServiceBusError):
    """An AutoLockRenewer reached max_lock_renewal_duration."""


class MessagingEntityNotFoundError(ServiceBusError, ResourceNotFoundError):
    """The namespace, queue, topic, subscription or rule does not exist."""


class MessagingEntityDisabledError(ServiceBusError):
    """The entity's status forbids the operation (Disabled, SendDisabled or ReceiveDisabled)."""


class MessageNotFoundError(ServiceBusError):
    """No message with the given sequence number is in the entity."""


class MessagingEntityAlreadyExistsError(ServiceBusError, ResourceExistsError):
    """An entity (or namespace) with that name already exists."""


class InvalidOperationError(ServiceBusError):
    """The operation is not allowed on this entity or in this state."""


class MessageSizeExceededError(ServiceBusError, ValueError):
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


class MessageAlreadySettled(ServiceBusError, ValueError):
    """The message was already completed, abandoned, deferred or dead-lettered."""


class OperationTimeoutError(ServiceBusError):
    """The operation did not finish within its time limit."""


class StorageError(ServiceBusError):
    """The namespace's storage refused or failed a write or read (read-only files, permissions, a full disk,
    an unreachable object store); what was refused was not applied."""


class PartitionUnavailableError(ServiceBusError):
    """A partition the operation needs is unavailable (partition_id: which, when a storage fault of its
    files said so)."""

    partition_id: Optional[int] = None


__all__ = [
    "ServiceBusError",
    "ServiceBusConnectionError",
    "ServiceBusAuthenticationError",
    "ServiceBusAuthorizationError",
    "ServiceBusCommunicationError",
    "AutoLockRenewFailed",
    "AutoLockRenewTimeout",
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
