"""Fan-out job (spark-submit): copies topic messages to their subscriptions, exactly once.

    spark-submit jobs/fanout.py --namespace /data/sb/prod [--topic events] [--once]

Without --once it runs until stopped (a streaming query with a 500 ms trigger); a restart, or a second
copy started by mistake, neither loses nor duplicates a copy.
"""
from __future__ import annotations

import sys

from sparkbus.cli import main

if __name__ == "__main__":
    sys.exit(main(["fanout", *sys.argv[1:]]))
