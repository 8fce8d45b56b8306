"""One maintenance sweep of a namespace (spark-submit or plain python): retention of settled messages,
compaction of small files and log cleanup in every table. The namespace service runs the same sweep every
few seconds; schedule this job instead where no service runs (e.g. a nightly Databricks job).

    spark-submit jobs/maintain.py --namespace /data/sb/prod [--json]
"""
from __future__ import annotations

import sys

from sparkbus.cli import main

if __name__ == "__main__":
    sys.exit(main(["maintain", *sys.argv[1:]]))
