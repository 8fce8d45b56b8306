"""Scheduled upkeep of a whole namespace (the namespace service runs it every few seconds): retention of
completed messages in every partition of every entity (into its archive, when it keeps one), the archive's
retention, compaction of small files and cleanup of expired log entries of every table.

Clients already do all of this as they commit (sparkbus.engine.retention after receives,
sparkbus.storage.maintenance after commits); the sweep covers entities nobody receives from or commits
to for a while. Every step is a conditional commit that is skipped when it loses a race, so a sweep can
run beside any client and beside another sweep.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..storage import maintenance
from . import archive, retention
from .catalog import Catalog
from .registry import resolve

KINDS = ("queue", "topic", "subscription")


@dataclass
class SweepResult:
    tables: int = 0
    removed: int = 0  # completed or cancelled messages that left the tables


def sweep(catalog: Catalog, stopping: Callable[[], bool] = lambda: False) -> SweepResult:
    """One pass over every entity of the namespace; ends early, between entities, once stopping()."""
    result = SweepResult()
    snap = catalog.snapshot()
    for row in snap.of_kind(*KINDS):
        if stopping():
            break
        info = resolve(catalog.root, snap, row.path, KINDS)
        archived = info.options.archive_retention is not None
        if info.kind != "topic":  # a topic's rows leave as its fan-out cursor moves (sparkbus.engine.fanout)
            result.removed += retention.run_entity(info, eager=archived)  # archived: within a sweep
        if archived:
            archive.prune(info)
        for uri in info.tables.values():
            maintenance.compact(uri)
            maintenance.cleanup(uri)
            result.tables += 1
    return result
