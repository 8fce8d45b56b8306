"""Demo job (spark-submit): create a namespace from a definition, then look at it with the API and Spark.

    spark-submit jobs/demo.py --namespace .sparkbus/demo --definition conf/namespace.toml
"""
from __future__ import annotations

import argparse

import pyarrow as pa

from sparkbus import ServiceBusAdministrationClient
from sparkbus.cli import format_table, namespace_rows
from sparkbus.definitions import apply_definition, load_definition
from sparkbus.spark import get_spark


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--namespace", default=".sparkbus/demo")
    parser.add_argument("--definition", default="conf/namespace.toml")
    args = parser.parse_args()

    report = apply_definition(load_definition(args.definition), args.namespace)
    print("\n".join(report.changes))
    admin = ServiceBusAdministrationClient(args.namespace)
    ns = admin.get_namespace_properties()
    print(f"\nnamespace {ns.path} ({ns.tier}):")
    rows = namespace_rows(admin)
    print(format_table(rows))

    queue = admin.get_queue("orders")
    print(f"\norders: {queue.partition_count} partitions, {queue.max_size_in_megabytes_per_partition:.0f} MB per "
          f"partition, {queue.total_max_size_in_megabytes} MB in total")
    for rule in admin.list_rules("events", "eu-orders"):
        print(f"events/eu-orders rule {rule.name}: {rule.filter!r} action={rule.action!r}")
    print("\nentity tables of orders:", admin.get_entity_tables("orders"))

    spark = get_spark("sparkbus-demo")
    frame = spark.createDataFrame(pa.Table.from_pylist(rows).to_pandas())
    frame.createOrReplaceTempView("entities")
    print("\nSpark SQL over the namespace:")
    spark.sql("SELECT kind, count(*) AS entities, sum(partitions) AS partitions FROM entities "
              "GROUP BY kind ORDER BY kind").show()
    spark.stop()


if __name__ == "__main__":
    main()
