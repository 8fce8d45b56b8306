"""azure-servicebus's enums, importable from sparkbus where the SDK has them (pure: names and values only),
so ported code that names them runs: str enums compare equal to the strings sparkbus stores.
"""
from __future__ import annotations

from enum import Enum


class EntityStatus(str, Enum):
    ACTIVE = "Active"
    CREATING = "Creating"
    DELETING = "Deleting"
    DISABLED = "Disabled"
    RECEIVE_DISABLED = "ReceiveDisabled"
    RENAMING = "Renaming"
    RESTORING = "Restoring"
    SEND_DISABLED = "SendDisabled"
    UNKNOWN = "Unknown"


class EntityAvailabilityStatus(str, Enum):
    AVAILABLE = "Available"
    LIMITED = "Limited"
    RENAMING = "Renaming"
    RESTORING = "Restoring"
    UNKNOWN = "Unknown"


class AccessRights(str, Enum):
    MANAGE = "Manage"
    SEND = "Send"
    LISTEN = "Listen"


class MessagingSku(str, Enum):
    BASIC = "Basic"
    STANDARD = "Standard"
    PREMIUM = "Premium"


class NamespaceType(str, Enum):
    MESSAGING = "Messaging"
    NOTIFICATION_HUB = "NotificationHub"
    MIXED = "Mixed"
    EVENT_HUB = "EventHub"
    RELAY = "Relay"


class ApiVersion(str, Enum):
    """Accepted by ServiceBusAdministrationClient(api_version=...) and ignored: there is no REST API."""

    V2024_05 = "2024-05"
    V2021_05 = "2021-05"
    V2017_04 = "2017-04"


class TransportType(Enum):
    """Accepted by ServiceBusClient(transport_type=...) and ignored: a namespace is storage, not a socket."""

    Amqp = 1
    AmqpOverWebsocket = 2
