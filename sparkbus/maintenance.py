"""Keeping Delta tables cheap to commit to and read.

delta-rs spends time per data file and per log file on every commit (measured: a one-row commit took
17 ms with 50 data files and 60 ms with 400; 26.9 ms with 2,317 log files and 12.1 ms with 18), so the
process that commits every CHECKPOINT_EVERY-th version writes a checkpoint and removes log files past
the retention, and every COMPACT_EVERY-th compacts small files. Commits themselves run without
delta-rs' post-commit hooks (storage.NO_HOOKS): maintenance may lose a race with another process's,
and that must never be mistaken for a failed commit. Compaction rewrites data without changing it, so
it never conflicts with appends; whatever maintenance loses to a race is simply skipped.
"""
from __future__ import annotations

from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError

from .storage import NO_HOOKS

CHECKPOINT_EVERY = 10
COMPACT_EVERY = 20
# Files reaching this size are left alone: with delta-rs' default target (100 MB) a partition holding one
# large file and one new small file was rewritten whole every COMPACT_EVERY commits.
COMPACT_TARGET_BYTES = 16 * 1024 * 1024


def after_commit(table: DeltaTable) -> None:
    """Call after committing to `table` (the object is at the new version). Never raises for races."""
    version = table.version()
    try:
        if version % COMPACT_EVERY == 0:
            table.optimize.compact(target_size=COMPACT_TARGET_BYTES, post_commithook_properties=NO_HOOKS)
        if version % CHECKPOINT_EVERY == 0:
            table.create_checkpoint()
            table.cleanup_metadata()
    except (CommitFailedError, DeltaError, FileNotFoundError):
        pass
