"""ServiceBusClient: the data-plane entry point (senders and receivers), as in azure-servicebus."""
from __future__ import annotations

from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, Iterator, Optional, Union

from .core import throttling
from .core.connection import parse_connection_string
from .core.names import checked_name, key, subscription_path
from .engine import sessions
from .engine.namespace import governor_of, open_namespace
from .engine.registry import resolve
from .engine.throttle import Usage
from .exceptions import InvalidOperationError
from .message import to_utc
from .engine.retry import RetryPolicy
from .receiver import ServiceBusReceiveMode, ServiceBusReceiver, ServiceBusSessionFilter, ServiceBusSubQueue
from .sender import ServiceBusSender
from .transactions import ServiceBusTransaction

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from .autolock import AutoLockRenewer
    from .processor import MessageHandler, ServiceBusProcessor, ServiceBusSessionProcessor

ReceiveMode = Union[ServiceBusReceiveMode, str]
SubQueue = Optional[Union[ServiceBusSubQueue, str]]
SessionId = Union[str, ServiceBusSessionFilter, None]


class ServiceBusClient:
    """Client of a namespace, constructed as azure-servicebus': ServiceBusClient(fully_qualified_namespace,
    credential, **kwargs), or from_connection_string(conn_str).

    The SDK's other keyword arguments (transport_type, http_proxy, custom_endpoint_address,
    connection_verify, uamqp_transport, logging_enable, user_agent, ...) are accepted and ignored: there is
    no network connection to configure.

    Args:
        fully_qualified_namespace: The namespace's location: a directory, a file:// URI or an object-store
            URI (az://, abfss://, s3://), optionally written 'sparkbus://<location>'.
        credential: Any azure-core credential (TokenCredential, AzureNamedKeyCredential, AzureSasCredential)
            for an object-store namespace; a local namespace needs none and ignores it.
        retry_total: azure-servicebus' retry settings: one policy for every transient condition of the
            client's senders and receivers (sparkbus.engine.retry) and for throttled requests.
        retry_backoff_factor: As retry_total.
        retry_backoff_max: As retry_total.
        retry_mode: "exponential" or "fixed".
        spark: A SparkSession for DataFrame sends and receives; message operations never need one.
        storage_options: An object-store namespace's options (account_key, sas_token, ...); default: the
            environment's credentials.
    """

    def __init__(self, fully_qualified_namespace: str, credential: Optional[object] = None, *,
                 retry_total: int = 3, retry_backoff_factor: float = 0.8, retry_backoff_max: float = 120,
                 retry_mode: str = "exponential", spark: Optional["SparkSession"] = None,
                 storage_options: Optional[dict[str, str]] = None, **kwargs: object) -> None:
        self._retry = RetryPolicy(retry_total, retry_backoff_factor, retry_backoff_max, retry_mode)
        self._catalog = open_namespace(fully_qualified_namespace, credential, storage_options)
        self.credential = credential
        self._governor = governor_of(self._catalog)
        self.retry_total = int(retry_total)
        self.retry_backoff_factor = float(retry_backoff_factor)
        self.retry_backoff_max = float(retry_backoff_max)
        self.spark = spark
        self._entity_path: Optional[str] = None

    @classmethod
    def from_connection_string(cls, conn_str: str, **kwargs: Any) -> "ServiceBusClient":
        """A client of the namespace a connection string names.

        Args:
            conn_str: 'Endpoint=sparkbus://<path>;...'; an EntityPath binds the client to that entity, as in
                the SDK.
            **kwargs: The constructor's keyword arguments (retry settings, spark, storage_options, ...).

        Returns:
            The client.
        """
        info = parse_connection_string(conn_str)
        client = cls(info.fully_qualified_namespace, **kwargs)
        client._entity_path = info.entity_path
        return client

    @property
    def fully_qualified_namespace(self) -> str:
        return self._catalog.root

    def __enter__(self) -> "ServiceBusClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Persists the process's metrics of the namespace (every operation opens the tables it needs)."""
        self._governor.recorder.flush()

    def _check_entity_path(self, name: object, what: str) -> None:
        named = key(name, what)  # the name as written: TypeError, ValueError "invalid <what> name"
        if self._entity_path is not None and named != key(self._entity_path):
            raise ValueError(f"The {what} name provided does not match the EntityPath in the connection string "
                             "used to construct the ServiceBusClient.")

    def _subscription_path(self, topic_name: str, subscription_name: str) -> str:
        """'<topic>/Subscriptions/<name>', both names checked (ValueError as _check_entity_path's)."""
        self._check_entity_path(topic_name, "topic")
        return subscription_path(topic_name, checked_name(subscription_name, "subscription"))

    def get_queue_sender(self, queue_name: str, **kwargs: object) -> ServiceBusSender:
        """A sender for a queue; the queue is looked up at the first send, as the SDK connects lazily.

        Args:
            queue_name: The queue's name.
            **kwargs: The SDK's other keyword arguments, accepted and ignored.

        Returns:
            The queue's sender.

        Raises:
            ValueError: the name is not a name an entity can have, or not the connection string's EntityPath.
        """
        self._check_entity_path(queue_name, "queue")
        return ServiceBusSender(self._catalog, queue_name, self.spark, retry=self._retry)

    def get_topic_sender(self, topic_name: str, **kwargs: object) -> ServiceBusSender:
        """A sender for a topic; the topic is looked up at the first send, as for get_queue_sender.

        Args:
            topic_name: The topic's name.
            **kwargs: The SDK's other keyword arguments, accepted and ignored.

        Returns:
            The topic's sender.

        Raises:
            ValueError: the name is not a name an entity can have, or not the connection string's EntityPath.
        """
        self._check_entity_path(topic_name, "topic")
        return ServiceBusSender(self._catalog, topic_name, self.spark, retry=self._retry)

    def get_queue_receiver(self, queue_name: str, *, receive_mode: ReceiveMode = ServiceBusReceiveMode.PEEK_LOCK,
                           sub_queue: SubQueue = None, prefetch_count: int = 0, max_wait_time: Optional[float] = None,
                           session_id: SessionId = None, auto_lock_renewer: Optional["AutoLockRenewer"] = None,
                           **kwargs: object) -> ServiceBusReceiver:
        """A receiver of a queue, its dead-letter sub-queue, or one of its sessions.

        Args:
            queue_name: The queue's name.
            receive_mode: PEEK_LOCK (settle each message) or RECEIVE_AND_DELETE (removed when received).
            sub_queue: ServiceBusSubQueue.DEAD_LETTER to read the dead-letter sub-queue.
            prefetch_count: Messages to lock ahead of receive_messages calls (0: none).
            max_wait_time: Seconds receive_messages waits for a first message (None: until one arrives).
            session_id: A session id or NEXT_AVAILABLE_SESSION: a session receiver, the session locked for it.
            auto_lock_renewer: An AutoLockRenewer every received message, and the session, is registered with.
            **kwargs: The SDK's other keyword arguments, accepted and ignored.

        Returns:
            The receiver.

        Raises:
            ValueError: the name is not a name an entity can have, or not the connection string's EntityPath.
        """
        self._check_entity_path(queue_name, "queue")
        return ServiceBusReceiver(self._catalog, queue_name, receive_mode=receive_mode, sub_queue=sub_queue,
                                  prefetch_count=prefetch_count, max_wait_time=max_wait_time, session_id=session_id,
                                  spark=self.spark, retry=self._retry, auto_lock_renewer=auto_lock_renewer)

    def get_subscription_receiver(self, topic_name: str, subscription_name: str, *,
                                  receive_mode: ReceiveMode = ServiceBusReceiveMode.PEEK_LOCK, sub_queue: SubQueue = None,
                                  prefetch_count: int = 0, max_wait_time: Optional[float] = None,
                                  session_id: SessionId = None, auto_lock_renewer: Optional["AutoLockRenewer"] = None,
                                  **kwargs: object) -> ServiceBusReceiver:
        """A receiver of a subscription, its dead-letter sub-queue, or one of its sessions.

        Args:
            topic_name: The topic's name.
            subscription_name: The subscription's name.
            receive_mode: PEEK_LOCK (settle each message) or RECEIVE_AND_DELETE (removed when received).
            sub_queue: ServiceBusSubQueue.DEAD_LETTER to read the dead-letter sub-queue.
            prefetch_count: Messages to lock ahead of receive_messages calls (0: none).
            max_wait_time: Seconds receive_messages waits for a first message (None: until one arrives).
            session_id: A session id or NEXT_AVAILABLE_SESSION: a session receiver, the session locked for it.
            auto_lock_renewer: An AutoLockRenewer every received message, and the session, is registered with.
            **kwargs: The SDK's other keyword arguments, accepted and ignored.

        Returns:
            The receiver.

        Raises:
            ValueError: a name is not a name an entity can have, or the topic's is not the connection
                string's EntityPath.
        """
        path = self._subscription_path(topic_name, subscription_name)
        return ServiceBusReceiver(self._catalog, path,
                                  receive_mode=receive_mode, sub_queue=sub_queue, prefetch_count=prefetch_count,
                                  max_wait_time=max_wait_time, session_id=session_id, spark=self.spark,
                                  retry=self._retry, auto_lock_renewer=auto_lock_renewer)

    def list_queue_sessions(self, queue_name: str, *, state_updated_after: Optional[datetime] = None,
                            **kwargs: object) -> list[str]:
        """Session ids of a session-enabled queue: sessions with messages in it or with a session state.

        Args:
            queue_name: The queue's name.
            state_updated_after: Only the sessions whose state was set after that time (a naive datetime is
                UTC); default: every session.
            **kwargs: The SDK's other keyword arguments, accepted and ignored.

        Returns:
            The session ids.

        Raises:
            ValueError: the name is not a name an entity can have, or not the connection string's EntityPath.
            InvalidOperationError: the queue does not require sessions.
        """
        self._check_entity_path(queue_name, "queue")
        return self._list_sessions(queue_name, ("queue",), state_updated_after)

    def list_subscription_sessions(self, topic_name: str, subscription_name: str, *,
                                   state_updated_after: Optional[datetime] = None, **kwargs: object) -> list[str]:
        """Session ids of a session-enabled subscription (as list_queue_sessions).

        Args:
            topic_name: The topic's name.
            subscription_name: The subscription's name.
            state_updated_after: Only the sessions whose state was set after that time (a naive datetime is
                UTC); default: every session.
            **kwargs: The SDK's other keyword arguments, accepted and ignored.

        Returns:
            The session ids.

        Raises:
            ValueError: a name is not a name an entity can have, or the topic's is not the connection
                string's EntityPath.
            InvalidOperationError: the subscription does not require sessions.
        """
        path = self._subscription_path(topic_name, subscription_name)
        return self._list_sessions(path, ("subscription",), state_updated_after)

    def _list_sessions(self, path: str, kinds: tuple[str, ...], after: Optional[datetime]) -> list[str]:
        info = resolve(self._catalog.root, self._catalog.snapshot(), path, kinds)
        if not info.options.requires_session:
            raise InvalidOperationError(f"{info.kind} {info.path!r} does not require sessions: it has none to list")
        when = None if after is None else to_utc(after, "state_updated_after")
        return self._governor.call(info.path, lambda: sessions.listed(info.tables, when),
                                   lambda _: Usage(throttling.MANAGEMENT_COST), self._retry)

    def get_queue_processor(self, queue_name: str, process_message: "MessageHandler",
                            **options: Any) -> "ServiceBusProcessor":
        """A processor running process_message for every message of a queue (sparkbus.processor).

        Args:
            queue_name: The queue's name.
            process_message: The handler, called with a ProcessMessageContext for each message.
            **options: ServiceBusProcessor's options: process_error, max_concurrent_calls,
                auto_complete_messages, max_auto_lock_renewal_duration, receive_mode, prefetch_count.

        Returns:
            The processor, not started yet.

        Raises:
            ValueError: the name is not a name an entity can have, or not the connection string's EntityPath.
        """
        from .processor import ServiceBusProcessor

        self._check_entity_path(queue_name, "queue")
        return ServiceBusProcessor(self, queue_name, process_message, **options)

    def get_subscription_processor(self, topic_name: str, subscription_name: str, process_message: "MessageHandler",
                                   **options: Any) -> "ServiceBusProcessor":
        """A processor of a subscription's messages, as get_queue_processor.

        Args:
            topic_name: The topic's name.
            subscription_name: The subscription's name.
            process_message: The handler, called with a ProcessMessageContext for each message.
            **options: ServiceBusProcessor's options, as get_queue_processor's.

        Returns:
            The processor, not started yet.

        Raises:
            ValueError: a name is not a name an entity can have, or the topic's is not the connection
                string's EntityPath.
        """
        from .processor import ServiceBusProcessor

        path = self._subscription_path(topic_name, subscription_name)
        return ServiceBusProcessor(self, path, process_message, **options)

    def get_queue_session_processor(self, queue_name: str, process_message: "MessageHandler",
                                    **options: Any) -> "ServiceBusSessionProcessor":
        """A processor of a session-enabled queue: each session's messages in order, sessions in parallel
        (sparkbus.processor.ServiceBusSessionProcessor).

        Args:
            queue_name: The queue's name.
            process_message: The handler, called with a ProcessMessageContext for each message.
            **options: ServiceBusSessionProcessor's options: max_concurrent_sessions,
                max_concurrent_calls_per_session, session_ids, session_idle_timeout, process_error,
                auto_complete_messages, max_auto_lock_renewal_duration, receive_mode, prefetch_count.

        Returns:
            The processor, not started yet.

        Raises:
            ValueError: the name is not a name an entity can have, or not the connection string's EntityPath.
        """
        from .processor import ServiceBusSessionProcessor

        self._check_entity_path(queue_name, "queue")
        return ServiceBusSessionProcessor(self, queue_name, process_message, **options)

    def get_subscription_session_processor(self, topic_name: str, subscription_name: str,
                                           process_message: "MessageHandler",
                                           **options: Any) -> "ServiceBusSessionProcessor":
        """A processor of a session-enabled subscription, as get_queue_session_processor.

        Args:
            topic_name: The topic's name.
            subscription_name: The subscription's name.
            process_message: The handler, called with a ProcessMessageContext for each message.
            **options: ServiceBusSessionProcessor's options, as get_queue_session_processor's.

        Returns:
            The processor, not started yet.

        Raises:
            ValueError: a name is not a name an entity can have, or the topic's is not the connection
                string's EntityPath.
        """
        from .processor import ServiceBusSessionProcessor

        path = self._subscription_path(topic_name, subscription_name)
        return ServiceBusSessionProcessor(self, path, process_message, **options)

    @contextmanager
    def transaction(self) -> Iterator[ServiceBusTransaction]:
        """`with client.transaction() as txn:` sends with transaction=txn commit together when the block exits."""
        txn = ServiceBusTransaction(self._catalog.root)
        try:
            yield txn
        except BaseException:
            txn.discard()
            raise
        txn.commit()
