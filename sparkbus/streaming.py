"""Structured Streaming entry points: topic fan-out as a streaming query (see sparkbus.spark.fanout and, for
the exactly-once reasoning, sparkbus.engine.fanout)."""
from __future__ import annotations

from typing import Optional


def start_fanout(spark, namespace: str, topic_name: Optional[str] = None, *, trigger: Optional[dict] = None):
    """Start fanning out topic messages to subscriptions; returns the StreamingQuery.

    topic_name None: every topic, including topics created later. trigger: keyword arguments of
    DataStreamWriter.trigger (default {"processingTime": "500 milliseconds"}).
    """
    from .spark.fanout import start

    return start(spark, namespace, topic_name, trigger=trigger)


def fanout_once(spark, namespace: str, topic_name: Optional[str] = None) -> None:
    """Fan out everything pending now and return (a trigger(availableNow=True) run): for batch jobs and tests."""
    from .spark.fanout import run_once

    run_once(spark, namespace, topic_name)
