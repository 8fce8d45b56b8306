"""Forwarding job (spark-submit): moves messages of queues and subscriptions with forward_to (and
dead-lettered messages of those with forward_dead_lettered_messages_to) to their destinations, exactly once.

    spark-submit jobs/forward.py --namespace /data/sb/prod [--once]

Without --once it runs until stopped (a streaming query with a 500 ms trigger); a restart, or a second
copy started by mistake, neither loses nor duplicates a message.
"""
from __future__ import annotations

import sys

from sparkbus.cli import main

if __name__ == "__main__":
    sys.exit(main(["forward", *sys.argv[1:]]))
