"""What every benchmark does around its measurements: print the command, and run in a throw-away namespace."""
from __future__ import annotations

import shutil
import sys
import tempfile
from contextlib import contextmanager
from typing import Iterator

import sparkbus


@contextmanager
def bench_namespace(tier: str = "standard") -> Iterator[tuple[str, sparkbus.ServiceBusAdministrationClient]]:
    """(path, admin) of a fresh namespace of the tier (standard: with credit throttling off), removed
    afterwards."""
    print("command:", " ".join([sys.executable.rsplit("/", 1)[-1], *sys.argv]))
    root = tempfile.mkdtemp(prefix="sparkbus-bench-")
    path = root + "/ns"
    try:
        sparkbus.create_namespace(path, credits_per_second=None, tier=tier)
        yield path, sparkbus.ServiceBusAdministrationClient(path)
    finally:
        shutil.rmtree(root, ignore_errors=True)
