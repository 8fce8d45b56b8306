"""Namespaces on object storage: locations, credentials and options, refusing unsafe stores, and what only
an object store needs (deleting by prefix, the cross-machine compaction lease). Tests taking ns_path run on
a local directory and on Azurite (see conftest)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import pytest
from obstore.exceptions import PermissionDeniedError
from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential

import sparkbus
from sparkbus import ServiceBusMessage
from sparkbus.engine import throttle
from sparkbus.spark.datasource import option_root
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
    location.register_options("s3://bucket/ns-locked", {"aws_s3_locking_provider": "dynamodb"})
    with pytest.raises(ValueError, match="locking provider does not cover"):  # direct commits bypass its lock
        location.check_safe("s3://bucket/ns-locked/entities/x")
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


def test_a_store_is_made_once_per_settings_and_again_when_they_change(azurite, monkeypatch):
    root = f"{azurite}/{uuid.uuid4().hex[:12]}"
    location.put(f"{root}/a", b"one")
    first, key = location.store_of(f"{root}/a")
    assert location.store_of(f"{root}/b")[0] is first and key == root.split("/", 3)[3] + "/a"
    location.register_options(f"{root}/wrong", {"account_key": "d3Jvbmc="})  # another key: another store
    assert location.store_of(f"{root}/wrong/x")[0] is not first
    with pytest.raises(PermissionDeniedError, match="403 Forbidden"):
        location.get(f"{root}/wrong/x")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", "d3Jvbmc=")  # the variables object_store reads changed
    assert location.store_of(f"{root}/a")[0] is not first
    with pytest.raises(PermissionDeniedError, match="403 Forbidden"):
        location.get(f"{root}/a")
    monkeypatch.undo()
    assert location.store_of(f"{root}/a")[0] is first and location.get(f"{root}/a") == b"one"


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


OTHER_MACHINE = """
import sys
import sparkbus
with sparkbus.ServiceBusClient(sys.argv[1]) as client:
    print(client._governor.ledger.budget().credits_per_second)
"""


def _other_machine(ns: str, cache: str) -> int:
    """The credits per second a process with its own machine state (cache directory) gets."""
    done = subprocess.run([sys.executable, "-c", OTHER_MACHINE, ns], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "XDG_CACHE_HOME": cache})
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.strip().splitlines()[-1])


def test_machines_on_one_namespace_share_its_budget_through_leases(azurite, tmp_path):
    ns = f"{azurite}/{uuid.uuid4().hex[:12]}/ns"
    sparkbus.create_namespace(ns, credits_per_second=1000)
    admin = sparkbus.ServiceBusAdministrationClient(ns)
    ledger = admin._governor.ledger
    assert ledger.budget().credits_per_second == 1000  # this machine alone
    assert _other_machine(ns, str(tmp_path / "second")) == 500  # its lease and this one's
    admin.update_namespace(credits_per_second=3000)  # renews this machine's share now: two machines
    assert ledger.budget().credits_per_second == 1500
    leases = location.join(location.normalize(ns), throttle.LEASE_DIR)
    now = time.time()
    location.put(location.join(leases, "third"), json.dumps({"expires": now + 60}).encode())
    location.put(location.join(leases, "gone"), json.dumps({"expires": now - 5}).encode())
    forgotten = now - throttle.FORGET_SECONDS - 5
    location.put(location.join(leases, "forgotten"), json.dumps({"expires": forgotten}).encode())
    admin.update_namespace(credits_per_second=3000)
    assert ledger.budget().credits_per_second == 1000  # three live leases; the expired ones count for nothing
    names = sorted(uri.rsplit("/", 1)[1] for uri in location.listing(leases))
    assert "forgotten" not in names and "gone" in names and len(names) == 4
    assert _other_machine(ns, str(tmp_path / "second")) == 1000  # the same machine again, on the new budget


def test_local_namespaces_keep_the_whole_budget_and_write_no_lease(tmp_path):
    ns = str(tmp_path / "ns")
    sparkbus.create_namespace(ns, credits_per_second=700)
    admin = sparkbus.ServiceBusAdministrationClient(ns)
    assert admin._governor.lease is None and admin._governor.ledger.budget().credits_per_second == 700
    assert not os.path.exists(os.path.join(ns, throttle.LEASE_DIR))


def test_source_and_sink_options_carry_storage_options(tmp_path):
    ns = str(tmp_path / "ns")
    root = option_root({"namespace": ns, "entity": "q", "storage.Account_Key": "k1", "other": "x"}, "source")
    assert root == ns and location.options_for(root) == {"account_key": "k1"}
    with pytest.raises(ValueError, match="needs .option\\('namespace'"):
        option_root({"entity": "q"}, "sink")
    with pytest.raises(ValueError, match="S3 needs an atomic put-if-absent"):
        option_root({"namespace": "s3://bucket/ns", "entity": "q"}, "source")
    assert location.options_for(option_root({"namespace": "s3://bucket/ok", "entity": "q",
                                             "storage.conditional_put": "etag"}, "sink")) == {"conditional_put": "etag"}
