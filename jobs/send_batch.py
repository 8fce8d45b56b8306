"""Send a dataset to a queue or topic (spark-submit): one message per row of a parquet, CSV or JSON dataset.

    spark-submit jobs/send_batch.py --namespace /data/sb/prod --entity orders --input /data/orders.parquet \
        [--format parquet|csv|json] [--body-column payload] [--property-columns region,amount|*]
        [--field session_id=customer] [--batch-rows 100000] [--json]

The body is --body-column, else a 'body' column, else the whole row as JSON; columns named like message
fields (subject, session_id, message_id, ...) set them, --field FIELD=COLUMN maps another column to a field;
--property-columns become typed application properties (CSV column types are inferred). Without --batch-rows the whole dataset is one atomic
commit; with it, commits of about that many rows with a progress bar (a failure leaves the committed ones).
"""
from __future__ import annotations

import sys

from sparkbus.cli import main

if __name__ == "__main__":
    sys.exit(main(["send-batch", *sys.argv[1:]]))
