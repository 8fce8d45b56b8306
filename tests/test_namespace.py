"""Namespaces: creation rules, durable metadata, reopening from a fresh process, connection strings."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from deltalake import DeltaTable

import sparkbus
from sparkbus import (MessagingEntityAlreadyExistsError, MessagingEntityNotFoundError, ServiceBusAdministrationClient,
                      ServiceBusClient)


def test_create_standard_namespace(ns_path):
    props = sparkbus.create_namespace(ns_path)
    assert (props.tier, props.partition_count, props.credits_per_second) == ("standard", 1, 1000)
    assert props.limits.max_entities == 10_000 and props.limits.max_partitioned_entities == 100
    assert DeltaTable(os.path.join(ns_path, "_catalog")).version() == 0


def test_create_premium_namespace_and_overrides(ns_path):
    props = sparkbus.create_namespace(ns_path, tier="premium", partition_count=4, messaging_units=2,
                                      max_entities=5)
    assert (props.tier, props.partition_count, props.messaging_units) == ("premium", 4, 2)
    assert props.limits.max_entities == 5
    assert props.credits_per_second is None  # premium is not credit-throttled
    assert ServiceBusAdministrationClient(ns_path).get_namespace_properties() == props


def test_credits_off_and_invalid(ns_path, tmp_path):
    assert sparkbus.create_namespace(ns_path, credits_per_second=None).credits_per_second is None
    with pytest.raises(ValueError, match="credits_per_second must be between 1 and"):
        sparkbus.create_namespace(str(tmp_path / "other"), credits_per_second=0)
    assert not os.path.exists(tmp_path / "other")


def test_bad_arguments_write_nothing(tmp_path):
    target = tmp_path / "bad"
    with pytest.raises(ValueError, match="tier must be one of"):
        sparkbus.create_namespace(str(target), tier="gold")
    with pytest.raises(ValueError, match="only in the premium tier"):
        sparkbus.create_namespace(str(target), partition_count=2)
    with pytest.raises(TypeError, match="unknown namespace override"):
        sparkbus.create_namespace(str(target), max_topics=1)
    assert not target.exists()


def test_existing_namespace_rejected(ns_path):
    sparkbus.create_namespace(ns_path)
    with pytest.raises(MessagingEntityAlreadyExistsError, match="already exists"):
        sparkbus.create_namespace(ns_path, tier="premium")
    assert ServiceBusAdministrationClient(ns_path).get_namespace_properties().tier == "standard"


def test_non_empty_directory_rejected(tmp_path):
    (tmp_path / "data.txt").write_text("x")
    with pytest.raises(ValueError, match="not an empty directory"):
        sparkbus.create_namespace(str(tmp_path))


def test_not_a_namespace_names_the_path(tmp_path):
    missing = str(tmp_path / "nowhere")
    with pytest.raises(MessagingEntityNotFoundError, match="nowhere"):
        ServiceBusAdministrationClient(missing)
    with pytest.raises(MessagingEntityNotFoundError, match="nowhere"):
        ServiceBusClient(missing)


def test_reopen_from_fresh_process(admin, ns_path):
    admin.create_queue("orders", enable_partitioning=True, lock_duration="PT45S")
    admin.create_topic("events")
    admin.create_subscription("events", "s1")
    script = (
        "import sys, sparkbus\n"
        "a = sparkbus.ServiceBusAdministrationClient(sys.argv[1])\n"
        "q = a.get_queue('orders')\n"
        "print(q.partition_count, q.lock_duration.total_seconds(), [s.name for s in a.list_subscriptions('events')])\n"
    )
    out = subprocess.run([sys.executable, "-c", script, ns_path], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[0] == "16 45.0 ['s1']"


def test_connection_strings_open_the_namespace(ns_path):
    sparkbus.create_namespace(ns_path)
    conn = f"Endpoint=sparkbus://{ns_path};SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=abc="
    admin = ServiceBusAdministrationClient.from_connection_string(conn)
    admin.create_queue("q1")
    with ServiceBusClient.from_connection_string(conn + ";EntityPath=q1", retry_total=5) as client:
        assert client.retry_total == 5 and client._entity_path == "q1"
        assert client.fully_qualified_namespace == os.path.abspath(ns_path)
    uri_admin = ServiceBusAdministrationClient.from_connection_string(f"Endpoint=sparkbus://file://{ns_path}")
    assert [q.name for q in uri_admin.list_queues()] == ["q1"]
    with pytest.raises(ValueError, match="expected"):
        ServiceBusAdministrationClient.from_connection_string("Endpoint=sb://contoso.servicebus.windows.net/")


def test_client_argument_checks(ns_path):
    sparkbus.create_namespace(ns_path)
    with pytest.raises(ValueError, match="retry_total must be an int >= 0"):
        ServiceBusClient(ns_path, retry_total=-1)
    with pytest.raises(TypeError, match="retry_backoff_factor must be a number"):
        ServiceBusClient(ns_path, retry_backoff_factor="fast")
    with pytest.raises(ValueError, match="retry_mode must be one of exponential, fixed, got 'linear'"):
        ServiceBusClient(ns_path, retry_mode="linear")


def test_a_version_1_namespace_is_upgraded_when_opened(ns_path):
    """Namespaces written before the forwarding and body_type columns existed gain them on first open; old
    rows read as never forwarded ordinary bodies, and sends and receives work on the upgraded tables."""
    from datetime import datetime, timezone

    import pyarrow as pa
    from deltalake import write_deltalake

    from sparkbus import storage
    from sparkbus.engine.catalog import NAMESPACE_KEY, Catalog, Change
    from sparkbus.engine.namespace import FORMAT_VERSION
    from sparkbus.core.schemas import MESSAGES, TABLE_CONFIGURATION, TRANSFER_COLUMNS

    sparkbus.create_namespace(ns_path)
    sparkbus.ServiceBusAdministrationClient(ns_path).create_queue("q")
    uri = sparkbus.ServiceBusAdministrationClient(ns_path).get_entity_tables("q")["messages"]
    old = pa.schema([f for f in MESSAGES if f.name not in (*TRANSFER_COLUMNS, "body_type")])
    storage.remove_tree(uri)
    storage.create_table(uri, old, configuration=TABLE_CONFIGURATION["messages"])
    row = {f.name: None for f in old}
    row.update(partition_id=0, sequence_number=1, message_id="old", body=b"old", body_size=3, header_size=3,
               enqueued_time_utc=datetime.now(timezone.utc))
    write_deltalake(uri, pa.Table.from_pylist([row], schema=old), mode="append")
    catalog = Catalog(os.path.abspath(ns_path))
    catalog.transact(lambda snap: Change(upserts=[snap.rows[NAMESPACE_KEY].updated(
        {**snap.rows[NAMESPACE_KEY].properties, "format_version": 1})]))

    client = sparkbus.ServiceBusClient(ns_path)  # opening upgrades
    assert catalog.snapshot().rows[NAMESPACE_KEY].properties["format_version"] == FORMAT_VERSION
    assert {*TRANSFER_COLUMNS, "body_type"} <= {f.name for f in storage.open_table(uri).schema().fields}
    client.get_queue_sender("q").send_messages(sparkbus.ServiceBusMessage("new"))
    with client.get_queue_receiver("q") as receiver:
        got = receiver.receive_messages(5, max_wait_time=1)
        assert [(str(m), m.sequence_number, m.dead_letter_source, m.body_type) for m in got] == \
            [("old", 1, None, "data"), ("new", 2, None, "data")]
        receiver.complete_messages(got)
    assert sparkbus.ServiceBusAdministrationClient(ns_path).get_queue_runtime_properties("q").total_message_count == 0
