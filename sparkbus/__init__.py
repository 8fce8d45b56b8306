"""sparkbus: the Azure Service Bus messaging model on Spark and Delta Lake."""
from __future__ import annotations

from .autolock import AutoLockRenewer
from .client import ServiceBusClient
from .core.connection import ServiceBusConnectionStringProperties, parse_connection_string
from .core.vocabulary import TransportType
from .core.entities import (QueueProperties, QueueRuntimeProperties, SubscriptionProperties,
                            SubscriptionRuntimeProperties, TopicProperties, TopicRuntimeProperties)
from .engine.availability import set_partition_availability
from .engine.enqueue import EnqueueResult
from .engine.namespace import NamespaceProperties, create_namespace
from .exceptions import (AutoLockRenewFailed, AutoLockRenewTimeout, CommitConflictError, InvalidOperationError,
                         MessageAlreadySettled, MessageLockLostError, MessageNotFoundError, MessageSizeExceededError,
                         MessagingEntityAlreadyExistsError, MessagingEntityDisabledError, MessagingEntityNotFoundError,
                         OperationTimeoutError, PartitionUnavailableError, ServiceBusAuthenticationError,
                         ServiceBusAuthorizationError, ServiceBusCommunicationError, ServiceBusConnectionError,
                         ServiceBusError, ServiceBusQuotaExceededError, ServiceBusServerBusyError,
                         SessionCannotBeLockedError, SessionLockLostError, StorageError)
from .engine.replay import ReplayResult
from .management import ServiceBusAdministrationClient, archive_table
from .message import ServiceBusMessage, ServiceBusMessageBatch
from .receiver import (NEXT_AVAILABLE_SESSION, ServiceBusMessageState, ServiceBusReceivedMessage, ServiceBusReceiveMode,
                       ServiceBusReceiver, ServiceBusSession, ServiceBusSessionFilter, ServiceBusSubQueue)
from .rules import CorrelationRuleFilter, FalseRuleFilter, RuleProperties, SqlRuleAction, SqlRuleFilter, TrueRuleFilter
from .sender import ServiceBusSender
from .transactions import ServiceBusTransaction

__version__ = "0.1.0"

__all__ = [
    "create_namespace", "NamespaceProperties", "ServiceBusAdministrationClient", "ServiceBusClient",
    "archive_table", "ReplayResult",
    "set_partition_availability", "ServiceBusMessage", "ServiceBusMessageBatch", "ServiceBusSender",
    "ServiceBusTransaction", "EnqueueResult", "ServiceBusReceiver", "ServiceBusReceivedMessage",
    "ServiceBusReceiveMode", "ServiceBusSubQueue", "ServiceBusMessageState", "AutoLockRenewer",
    "ServiceBusSession", "ServiceBusSessionFilter", "NEXT_AVAILABLE_SESSION",
    "QueueProperties", "TopicProperties", "SubscriptionProperties", "QueueRuntimeProperties",
    "TopicRuntimeProperties", "SubscriptionRuntimeProperties",
    "SqlRuleFilter", "CorrelationRuleFilter", "TrueRuleFilter", "FalseRuleFilter", "SqlRuleAction", "RuleProperties",
    "ServiceBusError", "MessagingEntityNotFoundError", "MessagingEntityAlreadyExistsError", "InvalidOperationError",
    "MessageSizeExceededError", "ServiceBusQuotaExceededError", "ServiceBusServerBusyError", "MessageLockLostError",
    "SessionLockLostError", "SessionCannotBeLockedError", "MessageAlreadySettled", "OperationTimeoutError", "PartitionUnavailableError",
    "StorageError",
    "MessagingEntityDisabledError", "MessageNotFoundError", "CommitConflictError", "ServiceBusConnectionError",
    "ServiceBusAuthenticationError", "ServiceBusAuthorizationError", "ServiceBusCommunicationError",
    "AutoLockRenewFailed", "AutoLockRenewTimeout", "TransportType", "parse_connection_string",
    "ServiceBusConnectionStringProperties",
]
