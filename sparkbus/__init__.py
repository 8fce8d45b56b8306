"""sparkbus: the Azure Service Bus messaging model on Spark and Delta Lake."""
from __future__ import annotations

from .autolock import AutoLockRenewer
from .availability import set_partition_availability
from .client import ServiceBusClient
from .entities import (QueueProperties, QueueRuntimeProperties, SubscriptionProperties,
                       SubscriptionRuntimeProperties, TopicProperties, TopicRuntimeProperties)
from .enqueue import EnqueueResult
from .exceptions import (InvalidOperationError, MessageAlreadySettled, MessageLockLostError, MessageNotFoundError,
                     MessageSizeExceededError, MessagingEntityAlreadyExistsError, MessagingEntityDisabledError,
                     MessagingEntityNotFoundError, OperationTimeoutError,
                     PartitionUnavailableError, ServiceBusError, ServiceBusQuotaExceededError,
                     ServiceBusServerBusyError, SessionCannotBeLockedError, SessionLockLostError)
from .management import ServiceBusAdministrationClient
from .message import ServiceBusMessage, ServiceBusMessageBatch
from .namespace import NamespaceProperties, create_namespace
from .receiver import (NEXT_AVAILABLE_SESSION, ServiceBusMessageState, ServiceBusReceivedMessage,
                       ServiceBusReceiveMode, ServiceBusReceiver, ServiceBusSession, ServiceBusSessionFilter,
                       ServiceBusSubQueue)
from .sender import ServiceBusSender
from .transactions import ServiceBusTransaction
from .rules import (CorrelationRuleFilter, FalseRuleFilter, RuleProperties, SqlRuleAction, SqlRuleFilter,
                    TrueRuleFilter)

__version__ = "0.1.0"

__all__ = [
    "create_namespace", "NamespaceProperties", "ServiceBusAdministrationClient", "ServiceBusClient",
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
    "MessagingEntityDisabledError", "MessageNotFoundError",
]
