"""The namespace service (spark-submit): fan-out, forwarding, scheduled messages falling due and
maintenance of one namespace, until SIGTERM or Ctrl-C (the batch under way finishes first).

    spark-submit jobs/serve.py --namespace /data/sb/prod [--trigger-ms 500] [--maintenance-interval 30]
"""
from __future__ import annotations

import sys

from sparkbus.cli import main

if __name__ == "__main__":
    sys.exit(main(["serve", *sys.argv[1:]]))
