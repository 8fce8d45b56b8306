"""The namespace service: one entry point for all background work of a namespace.

One Structured Streaming query (sparkbus.spark.background) fans topic messages out to subscriptions,
forwards messages of entities with forward_to or forward_dead_lettered_messages_to, and fans out or
forwards scheduled messages as they fall due; a thread sweeps the namespace (sparkbus.engine.housekeeping:
retention, compaction, log cleanup) every maintenance_interval seconds and persists the process's request
metrics (sparkbus.engine.metrics). Entities created after the start
are picked up by the next batch. Each batch is logged as one line with its counts.

Stopping: stop() lets the batch under way finish (it holds a lock the stop waits for) before the query
stops, so nothing is cut short; and were a process killed mid-batch, the engines' claims and
application transactions make the next batch finish it exactly once. Over Spark Connect the batches run in
the server's Python worker: no reports reach this process and a stop does not wait for a batch under way
(the engines' claims make the next batch finish it exactly once).
"""
from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Optional

from ..engine import housekeeping
from ..engine.catalog import Catalog
from ..engine.namespace import governor_of, namespace_root
from . import background
from .datasource import ALL_BACKGROUND

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LOG = logging.getLogger("sparkbus.service")
MAINTENANCE_INTERVAL = 30.0  # seconds between sweeps


class NamespaceService:
    """A running namespace service (sparkbus.streaming.serve); stop() ends it."""

    def __init__(self, spark: SparkSession, namespace: str, *, trigger: Optional[dict[str, Any]] = None,
                 maintenance_interval: float = MAINTENANCE_INTERVAL,
                 storage_options: Optional[dict[str, str]] = None) -> None:
        self.root = namespace_root(namespace, storage_options)
        self.reports: list[background.BatchReport] = []  # the latest batches (at most 100)
        self._gate = background.Gate()
        self.query = background.start(spark, self.root, entity=ALL_BACKGROUND, fan_out=True, forward=True,
                                      trigger=trigger, on_batch=self._report, gate=self._gate)
        self._sweeper = threading.Thread(target=self._sweep, args=(maintenance_interval,),
                                         name="sparkbus-service-maintenance", daemon=True)
        self._sweeper.start()
        LOG.info("serving namespace %s (query %s)", self.root, self.query.name)

    def _report(self, report: background.BatchReport) -> None:
        self.reports = (self.reports + [report])[-100:]
        LOG.info("%s", report.line())

    def _sweep(self, interval: float) -> None:
        """Sweep the namespace every interval seconds, beside the batches, not under their lock: a sweep's
        commits are conditional and skipped when they lose a race (sparkbus.engine.housekeeping), and under
        the lock, a sweep's retention runs (seconds on a large queue) held fan-out and forwarding back for
        their whole length. A stop ends the sweep at its next entity and waits for it."""
        catalog = Catalog(self.root)
        while not self._gate.closed.wait(interval):
            try:
                done = housekeeping.sweep(catalog, stopping=self._gate.closed.is_set)
                written = governor_of(catalog).recorder.flush()
            except Exception as error:  # a storage fault: logged, and the next sweep tries again
                LOG.warning("maintenance failed, tried again in %.0f s: %s", interval, error)
                continue
            LOG.info("maintenance: %d tables, %d completed messages removed, %d metrics rows persisted",
                     done.tables, done.removed, written)

    @property
    def is_active(self) -> bool:
        return self.query.isActive and not self._gate.closed.is_set()

    def await_termination(self, timeout: Optional[float] = None) -> bool:
        """Wait until stopped (True) or timeout seconds passed (False)."""
        return self._gate.closed.wait(timeout)

    def stop(self) -> None:
        """Finish the batch under way, then stop the query and the sweeps (the one under way ends at its
        next entity), and persist the process's metrics."""
        if self._gate.closed.is_set():
            return
        self._gate.closed.set()
        with self._gate.lock:  # the batch under way ends; later ones do nothing
            pass
        background.stop_query(self.query)  # not under the lock: a batch waiting for it must be let through
        self._sweeper.join(timeout=60)
        governor_of(Catalog(self.root)).recorder.flush()  # the counts since the last sweep
        LOG.info("stopped serving namespace %s", self.root)
