"""Demo job (spark-submit): create a namespace from a definition, send and receive messages, and look at
it with the API and Spark.

    spark-submit jobs/demo.py --namespace .sparkbus/demo --definition conf/namespace.toml
"""
from __future__ import annotations

import argparse

import pyarrow as pa

from sparkbus import NEXT_AVAILABLE_SESSION, ServiceBusAdministrationClient, ServiceBusClient, ServiceBusMessage
from sparkbus.cli import format_table, namespace_rows
from sparkbus.definitions import apply_definition, load_definition
from sparkbus.metrics import format_metrics
from sparkbus.spark import get_spark
from sparkbus.streaming import fanout_once, forward_once


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
    client = ServiceBusClient(args.namespace, spark=spark)
    with client.get_queue_sender("orders") as sender:
        sender.send_messages([ServiceBusMessage(f"order {i}", message_id=f"order-{i}",
                                                application_properties={"amount": i * 10}) for i in range(5)])
        sender.send_messages(ServiceBusMessage("order 0 again", message_id="order-0"))  # a duplicate: dropped
        orders = spark.range(10_000).selectExpr("concat('bulk order ', id) AS body",
                                                "concat('bulk-', id) AS message_id")
        result = sender.send_dataframe(orders)
        print(f"\nsent a DataFrame of 10,000 orders in one commit: {result.message_count} accepted, "
              f"{result.duplicate_count} duplicates, {len(result.partitions)} partitions; the namespace's "
              "1,000 credits per second now owe about 9 s, so the next requests wait (throttled, retried)")
    with client.get_queue_sender("invoices") as sender, client.transaction() as txn:
        for i in range(3):
            sender.send_messages(ServiceBusMessage(f"invoice line {i}", session_id="customer-7"), transaction=txn)
    with client.get_topic_sender("events") as sender:
        sender.send_messages([
            ServiceBusMessage("order 1 placed", subject="order",
                              application_properties={"region": "eu", "amount": 250, "audited": True}),
            ServiceBusMessage("order 2 placed", subject="order", application_properties={"region": "us", "amount": 40}),
            ServiceBusMessage("refund 7 issued", subject="refund", application_properties={"region": "eu", "amount": 5}),
        ])
    fanout_once(spark, args.namespace, "events")  # a Structured Streaming query run with trigger(availableNow)
    forward_once(spark, args.namespace)  # the audit subscription forwards what it gets to the audit-archive queue
    print("\nafter fan-out and forwarding, what each subscription of events received:")
    for sub in admin.list_subscriptions("events"):
        if sub.forward_to:  # a forwarding subscription cannot be received from: read its destination
            receiver = client.get_queue_receiver(sub.forward_to, max_wait_time=1)
        else:
            receiver = client.get_subscription_receiver("events", sub.name, max_wait_time=1)
        with receiver:
            copies = receiver.receive_messages(max_message_count=20)
            receiver.complete_messages(copies)
        rules = ", ".join(f"{r.name}: {r.filter!r}" for r in admin.list_rules("events", sub.name))
        print(f"  {sub.name} ({rules})" + (f", forwarded to queue {sub.forward_to}" if sub.forward_to else ""))
        for m in copies:
            print(f"    {str(m)!r} {m.str_application_properties}")
    with client.get_queue_receiver("orders", max_wait_time=1) as receiver:
        first = receiver.receive_messages(max_message_count=3)
        receiver.complete_message(first[0])
        receiver.abandon_message(first[1])
        receiver.dead_letter_message(first[2], reason="demo", error_description="dead-lettered on purpose")
        frame = receiver.receive_dataframe(max_message_count=500)
        print(f"\nreceived {len(first)} messages one by one (completed one, abandoned one and dead-lettered one on "
              f"purpose, reason 'demo') and {frame.count()} as a DataFrame; completed "
              f"{receiver.complete_dataframe(frame)} of those by lock token")
    with client.get_queue_receiver("invoices", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1) as receiver:
        lines = receiver.receive_messages(max_message_count=10)
        receiver.complete_messages(lines)
        receiver.session.set_state(f"{len(lines)} lines invoiced".encode())
        print(f"\nsession {receiver.session.session_id}: {[str(m) for m in lines]} in order; "
              f"state {receiver.session.get_state()!r}")
    rows = namespace_rows(admin)
    print("\nafter sending and receiving:")
    print(format_table(rows))

    frame = spark.createDataFrame(pa.Table.from_pylist(rows).to_pandas())
    frame.createOrReplaceTempView("entities")
    print("\nSpark SQL over the namespace:")
    spark.sql("SELECT kind, count(*) AS entities, sum(partitions) AS partitions, sum(active) AS messages "
              "FROM entities GROUP BY kind ORDER BY kind").show()
    client.close()  # persists this process's request metrics to the namespace's _metrics table
    print("request metrics (as `sparkbus metrics --namespace ...` prints them):")
    print(format_metrics(admin.get_namespace_metrics()))
    spark.stop()
    print(f"\nthe message dead-lettered on purpose: sparkbus dead-letter list --namespace {args.namespace} "
          "--entity orders")
    print(f"next, see the namespace in the Explorer (http://127.0.0.1:8642/): sparkbus ui --namespace {args.namespace}")


if __name__ == "__main__":
    main()
