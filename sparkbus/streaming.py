"""Structured Streaming entry points: topic fan-out, auto-forwarding, and the namespace service that runs
both with scheduled maintenance (see sparkbus.spark.background and sparkbus.spark.service; for the
exactly-once reasoning, sparkbus.engine.fanout and sparkbus.engine.forwarding).

Each takes storage_options for a namespace on object storage, as create_namespace does (credentials and
endpoints; without them, the environment's)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from .engine.fanout import FanoutResult
    from .engine.forwarding import ForwardResult
    from .spark.service import NamespaceService


def start_fanout(spark: SparkSession, namespace: str, topic_name: Optional[str] = None, *,
                 trigger: Optional[dict[str, Any]] = None,
                 storage_options: Optional[dict[str, str]] = None) -> StreamingQuery:
    """Start fanning out topic messages to subscriptions; returns the StreamingQuery.

    Args:
        spark: The SparkSession the stream runs in.
        namespace: The namespace's location, as create_namespace's path.
        topic_name: The topic to fan out; None: every topic, including topics created later.
        trigger: Keyword arguments of DataStreamWriter.trigger (default {"processingTime": "500 milliseconds"}).
        storage_options: An object-store namespace's credentials and endpoints (default: the environment's).

    Returns:
        The running stream.
    """
    from .spark.background import start
    from .spark.datasource import ALL_TOPICS

    return start(spark, namespace, entity=topic_name or ALL_TOPICS, fan_out=True, forward=False, trigger=trigger,
                 storage_options=storage_options)


def fanout_once(spark: SparkSession, namespace: str, topic_name: Optional[str] = None, *,
                storage_options: Optional[dict[str, str]] = None) -> "FanoutResult":
    """Fan out everything pending now and return what was done (a trigger(availableNow=True) run): for batch
    jobs and tests. Over Spark Connect the batches run in the server's process: the result is empty.

    Args:
        spark: The SparkSession the batches run in.
        namespace: The namespace's location, as create_namespace's path.
        topic_name: The topic to fan out; None: every topic.
        storage_options: An object-store namespace's credentials and endpoints (default: the environment's).

    Returns:
        The messages handled, filter evaluations, and copies and dead-letters per subscription.
    """
    from .spark.background import run_once
    from .spark.datasource import ALL_TOPICS

    return run_once(spark, namespace, entity=topic_name or ALL_TOPICS, fan_out=True, forward=False,
                    storage_options=storage_options).fanout


def start_forwarding(spark: SparkSession, namespace: str, *, trigger: Optional[dict[str, Any]] = None,
                     storage_options: Optional[dict[str, str]] = None) -> StreamingQuery:
    """Start forwarding the messages (and dead-letters) of every queue and subscription that forwards,
    including ones configured later; returns the StreamingQuery.

    Args:
        spark: The SparkSession the stream runs in.
        namespace: The namespace's location, as create_namespace's path.
        trigger: Keyword arguments of DataStreamWriter.trigger (default {"processingTime": "500 milliseconds"}).
        storage_options: An object-store namespace's credentials and endpoints (default: the environment's).

    Returns:
        The running stream.
    """
    from .spark.background import start
    from .spark.datasource import ALL_FORWARDING

    return start(spark, namespace, entity=ALL_FORWARDING, fan_out=False, forward=True, trigger=trigger,
                 storage_options=storage_options)


def forward_once(spark: SparkSession, namespace: str, *,
                 storage_options: Optional[dict[str, str]] = None) -> "ForwardResult":
    """Forward everything forwardable now and return what was moved (empty over Spark Connect, as
    fanout_once).

    Args:
        spark: The SparkSession the batches run in.
        namespace: The namespace's location, as create_namespace's path.
        storage_options: An object-store namespace's credentials and endpoints (default: the environment's).

    Returns:
        The messages forwarded and transfer-dead-lettered, per source entity.
    """
    from .spark.background import run_once
    from .spark.datasource import ALL_FORWARDING

    return run_once(spark, namespace, entity=ALL_FORWARDING, fan_out=False, forward=True,
                    storage_options=storage_options).forwarding


def serve(spark: SparkSession, namespace: str, *, trigger: Optional[dict[str, Any]] = None,
          maintenance_interval: float = 30.0, storage_options: Optional[dict[str, str]] = None) -> "NamespaceService":
    """Run all background work of the namespace (fan-out, forwarding, scheduled messages falling due,
    maintenance) until .stop() is called on the returned handle.

    Args:
        spark: The SparkSession the stream runs in.
        namespace: The namespace's location, as create_namespace's path.
        trigger: Keyword arguments of DataStreamWriter.trigger (default {"processingTime": "500 milliseconds"}).
        maintenance_interval: Seconds between maintenance sweeps.
        storage_options: An object-store namespace's credentials and endpoints (default: the environment's).

    Returns:
        The running service.
    """
    from .spark.service import NamespaceService

    return NamespaceService(spark, namespace, trigger=trigger, maintenance_interval=maintenance_interval,
                            storage_options=storage_options)
