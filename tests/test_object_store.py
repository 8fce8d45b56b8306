"""Namespaces on object storage: locations, credentials and options, refusing unsafe stores, and what only
an object store needs (deleting by prefix, the cross-machine compaction lease). Tests taking ns_path run on
a local directory and on Azurite (see conftest)."""
from __future__ import annotations

import os
import uuid

import pytest
from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential

import sparkbus
from sparkbus import ServiceBusMessage
from sparkbus.storage import location, maintenance


def test_locations_are_normalized_or_refused_with_what_is_allowed():
    assert location.normalize("abfss://c@acct.dfs.core.windows.net/p/") == "abfss://c@acct.dfs.core.windows.net/p"
    assert location.normalize("file:///tmp/x") == "/tmp/x" and location.normalize("az://box/ns/") == "az://box/ns"
    for bad, message in (("", "cannot be empty"), ("file://relns", "absolute path"), ("http://x/y", "unsupported scheme"),
                         ("az:///ns", "name the container")):
        with pytest.raises(ValueError, match=message):
            location.normalize(bad)
    with pytest.raises(TypeError, match="must be a str"):
        location.normalize(None)
    with pytest.raises(ValueError, match="cannot be empty"):
        sparkbus.create_namespace("")


def test_s3_without_an_atomic_put_if_absent_is_refused(monkeypatch):
    for name in ("AWS_S3_CONDITIONAL_PUT", "AWS_S3_LOCKING_PROVIDER", "conditional_put", "aws_s3_locking_provider"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="S3 needs an atomic put-if-absent"):
        sparkbus.create_namespace("s3://bucket/ns-unsafe")
    location.register_options("s3://bucket/ns-safe", {"conditional_put": "etag"})
    location.check_safe("s3://bucket/ns-safe/entities/x")  # configured: accepted


def test_credentials_become_storage_options():
    root = "az://box/ns"
    assert location.credential_options(root, AzureNamedKeyCredential("acct", "a2V5")) == \
        {"account_name": "acct", "account_key": "a2V5"}
    assert location.credential_options(root, AzureSasCredential("sv=1&sig=x")) == {"sas_token": "sv=1&sig=x"}
    assert location.credential_options("/local/ns", AzureSasCredential("sv=1")) == {}
    with pytest.raises(TypeError, match="azure-core credential"):
        location.credential_options(root, "secret")


def test_a_namespace_on_azurite_through_every_way_in(azurite):
    ns = f"{azurite}/{uuid.uuid4().hex[:12]}/ns"
    key = os.environ["AZURE_STORAGE_ACCOUNT_KEY"]
    sparkbus.create_namespace(ns, storage_options={"account_name": "devstoreaccount1", "account_key": key})
    with pytest.raises(sparkbus.MessagingEntityAlreadyExistsError):
        sparkbus.create_namespace(ns)
    admin = sparkbus.ServiceBusAdministrationClient(ns, AzureNamedKeyCredential("devstoreaccount1", key))
    admin.create_queue("q")
    conn = f"Endpoint=sparkbus+{ns};SharedAccessKeyName=k;SharedAccessKey=v"
    with sparkbus.ServiceBusClient.from_connection_string(conn) as client:
        client.get_queue_sender("q").send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])
        with client.get_queue_receiver("q", max_wait_time=2) as receiver:
            got = receiver.receive_messages(5)
            assert sorted(str(m) for m in got) == ["a", "b"]
            receiver.complete_messages(got)
    tables = admin.get_entity_tables("q")
    assert all(uri.startswith(ns + "/") for uri in tables.values())
    admin.delete_queue("q")
    assert all(location.is_empty(uri) for uri in tables.values())  # nothing of it is left in the container
    with pytest.raises(sparkbus.MessagingEntityNotFoundError):
        sparkbus.ServiceBusClient(f"{azurite}/{uuid.uuid4().hex[:12]}/none")


def test_the_compaction_lease_admits_one_holder_and_is_taken_over_when_expired(azurite):
    uri = f"{azurite}/{uuid.uuid4().hex[:12]}/lease"
    with maintenance._lease(uri) as first:
        assert first
        with maintenance._lease(uri) as second:
            assert not second  # held and not expired
    with maintenance._lease(uri) as again:  # released on exit
        assert again
    store, key = location.store_of(uri)
    store.put(key, b'{"expires": 0}')  # the lease of a holder that died: long expired, never released
    with maintenance._lease(uri) as taken:
        assert taken


def test_compaction_on_an_object_store_keeps_every_row(admin, client, ns_path, store):
    admin.create_queue("q", enable_partitioning=False)
    with client.get_queue_sender("q") as sender:
        for i in range(12):
            sender.send_messages(ServiceBusMessage(f"m{i}"))
    uri = admin.get_entity_tables("q")["messages"]
    assert maintenance.compact(uri)
    with client.get_queue_receiver("q", max_wait_time=2) as receiver:
        got = receiver.receive_messages(20)
        assert sorted(str(m) for m in got) == sorted(f"m{i}" for i in range(12))
        receiver.complete_messages(got)


def test_streaming_source_and_sink_on_azurite(spark, azurite, tmp_path):
    """A stream tapping one az:// queue and writing into another: the source reads the store from the
    executors, the sink stages its batches there and commits each exactly once."""
    ns = f"{azurite}/{uuid.uuid4().hex[:12]}/ns"
    sparkbus.create_namespace(ns, credits_per_second=None)
    admin = sparkbus.ServiceBusAdministrationClient(ns)
    admin.create_queue("src", enable_partitioning=True)
    admin.create_queue("dst")
    with sparkbus.ServiceBusClient(ns) as client:
        client.get_queue_sender("src").send_messages([ServiceBusMessage(f"m{i}") for i in range(6)])
        checkpoint = str(tmp_path / "chk")
        for _ in range(2):  # the second run finds nothing new: no copy is written twice
            query = (spark.readStream.format("sparkbus").option("namespace", ns).option("entity", "src").load()
                     .selectExpr("body", "message_id").writeStream.format("sparkbus").option("namespace", ns)
                     .option("entity", "dst").option("checkpointLocation", checkpoint)
                     .trigger(availableNow=True).start())
            query.awaitTermination()
        with client.get_queue_receiver("dst", max_wait_time=2) as receiver:
            got = receiver.receive_messages(20)
            assert sorted(str(m) for m in got) == [f"m{i}" for i in range(6)]
            receiver.complete_messages(got)
    assert location.is_empty(f"{ns}/_staging/sink")
