"""sparkbus.aio: the async API, shaped as azure.servicebus.aio (and sparkbus.aio.management as
azure.servicebus.aio.management). Message classes, enums and exceptions are the sync package's, as in the
SDK. One engine serves both APIs: every operation here is the sync API's own, run on a bounded thread pool
per client (sparkbus.aio.runner), with waiting done on the event loop.
"""
from .autolock import AutoLockRenewer
from .client import ServiceBusClient
from .receiver import ServiceBusReceiver, ServiceBusSession
from .sender import ServiceBusSender

__all__ = ["ServiceBusClient", "ServiceBusSender", "ServiceBusReceiver", "ServiceBusSession", "AutoLockRenewer"]
