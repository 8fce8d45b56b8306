"""Namespaces on object storage: locations, credentials and options, refusing unsafe stores, a store's refusals
as the SDK's errors, and what only an object store needs (deleting by prefix, the cross-machine compaction
lease). Tests taking ns_path run on a local directory, on Azurite and on S3 (see conftest)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import pytest
from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential

import sparkbus
from sparkbus import ServiceBusMessage
from sparkbus.engine import registry, throttle
from sparkbus.spark.datasource import option_root
from sparkbus.storage import location, maintenance
from fault_proxy import FaultProxy

# the PUT that creates a log entry of an entity's messages table (If-None-Match: put-if-absent)
ENTRY_CREATE = r"^PUT [^ ]*/messages/_delta_log/\d+\.json[^ ]* .*\r\nif-none-match: \*"


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


def test_s3_commits_with_conditional_writes_by_default_and_turning_them_off_is_refused(monkeypatch):
    for name in ("AWS_CONDITIONAL_PUT", "CONDITIONAL_PUT"):
        monkeypatch.delenv(name, raising=False)
    location.check_safe("s3://bucket/ns-default/entities/x")  # nothing configured: object_store's etag default
    location.register_options("s3://bucket/ns-etag", {"conditional_put": "etag"})
    location.check_safe("s3://bucket/ns-etag/entities/x")
    location.register_options("s3://bucket/ns-off", {"aws_conditional_put": "disabled"})
    with pytest.raises(ValueError, match="conditional_put is 'disabled'.*remove the setting"):
        location.check_safe("s3://bucket/ns-off/entities/x")
    monkeypatch.setenv("AWS_CONDITIONAL_PUT", "disabled")
    with pytest.raises(ValueError, match="concurrent commits can be lost"):
        sparkbus.create_namespace("s3://bucket/ns-unsafe")


def test_a_namespace_on_s3_through_the_environment_options_and_a_connection_string(s3, monkeypatch):
    """The standard AWS variables (the fixture's), or storage_options alone with every AWS variable unset
    (allow_http included: an http endpoint), or a connection string: no conditional-put setting needed."""
    from s3server import ACCESS_KEY, REGION, SECRET_KEY

    ns = f"{s3}/{uuid.uuid4().hex[:12]}/ns"
    sparkbus.create_namespace(ns, credits_per_second=None)
    sparkbus.ServiceBusAdministrationClient(ns).create_queue("q", enable_partitioning=True)
    conn = f"Endpoint=sparkbus+{ns};SharedAccessKeyName=k;SharedAccessKey=v"
    with sparkbus.ServiceBusClient.from_connection_string(conn) as client:
        client.get_queue_sender("q").send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    for name in [name for name in os.environ if name.startswith("AWS_")]:
        monkeypatch.delenv(name)
    options = {"endpoint": endpoint, "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY, "region": REGION,
               "allow_http": "true", "timeout": "30s"}
    other = f"{s3}/{uuid.uuid4().hex[:12]}/ns"
    sparkbus.create_namespace(other, credits_per_second=None, storage_options=options)
    with sparkbus.ServiceBusClient(ns, storage_options=options) as client:
        with client.get_queue_receiver("q", max_wait_time=2) as receiver:
            got = receiver.receive_messages(5)
            assert sorted(str(m) for m in got) == ["a", "b"]
            receiver.complete_messages(got)
    admin = sparkbus.ServiceBusAdministrationClient(ns, storage_options=options)
    assert admin.get_queue_runtime_properties("q").total_message_count == 0
    tables = admin.get_entity_tables("q")
    admin.delete_queue("q")
    assert all(location.is_empty(uri) for uri in tables.values())


@pytest.mark.parametrize("server", ["s3", "azurite"])
def test_a_wrong_credential_is_an_authentication_error_and_writes_nothing(server, request, monkeypatch):
    base = request.getfixturevalue(server)
    ns = f"{base}/{uuid.uuid4().hex[:12]}/ns"
    wrong = ({"AWS_SECRET_ACCESS_KEY": "not-the-secret"} if server == "s3" else
             {"AZURE_STORAGE_ACCOUNT_KEY": "d3Jvbmc="})
    refused = sparkbus.ServiceBusAuthenticationError
    with monkeypatch.context() as changed:
        for name, value in wrong.items():
            changed.setenv(name, value)
        with pytest.raises(refused, match="did not accept the credential.*check"):
            sparkbus.create_namespace(ns)
        with pytest.raises(refused):
            sparkbus.ServiceBusClient(ns)
    assert location.is_empty(ns)  # nothing was written
    sparkbus.create_namespace(ns, credits_per_second=None)  # the right one: the same location is usable
    sparkbus.ServiceBusAdministrationClient(ns).create_queue("q")
    with monkeypatch.context() as changed:
        for name, value in wrong.items():
            changed.setenv(name, value)
        with pytest.raises(refused):
            sparkbus.ServiceBusAdministrationClient(ns).create_queue("q2")
    assert [q.name for q in sparkbus.ServiceBusAdministrationClient(ns).list_queues()] == ["q"]


def test_a_credential_without_write_permission_is_an_authorization_error(s3, monkeypatch):
    from s3server import READER_KEY, READER_SECRET

    ns = f"{s3}/{uuid.uuid4().hex[:12]}/ns"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", READER_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", READER_SECRET)
    with pytest.raises(sparkbus.ServiceBusAuthorizationError, match="not allowed.*permissions"):
        sparkbus.create_namespace(ns)
    monkeypatch.undo()
    assert location.is_empty(ns)


def test_store_settings_that_cannot_be_used_are_value_errors_and_a_panic_never_reaches_the_user(s3):
    prefix = f"{s3}/{uuid.uuid4().hex[:12]}"
    with pytest.raises(ValueError, match=r'storage option cannot be used \(failed to parse "maybe" as boolean\)'):
        sparkbus.create_namespace(f"{prefix}/ns", storage_options={"allow_http": "maybe"})
    assert location.is_empty(prefix)  # (the options given stay registered for the namespace's own location)
    from obstore.store import from_url

    from sparkbus.storage import errors

    # obstore panics when a client setting is given as a store setting (what storage_options once did)
    with pytest.raises(sparkbus.StorageError, match="could not handle the request.*storage_options"):
        errors.guarded(from_url)("s3://bucket", allow_http="true")


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
    with pytest.raises(sparkbus.ServiceBusAuthenticationError, match="403 Forbidden"):
        location.get(f"{root}/wrong/x")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", "d3Jvbmc=")  # the variables object_store reads changed
    assert location.store_of(f"{root}/a")[0] is not first
    with pytest.raises(sparkbus.ServiceBusAuthenticationError, match="403 Forbidden"):
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


def _entries(admin, queue: str) -> list[str]:
    return sorted(uri for uri in location.listing(admin.get_entity_tables(queue)["messages"] + "/_delta_log")
                  if uri.endswith(".json"))


@pytest.mark.parametrize("mode", ["answer", "request"])
def test_a_commit_whose_connection_broke_is_tried_again_and_lands_exactly_once(azurite, monkeypatch, mode):
    """The store's client never retries a conditional PUT. Its connection reset after the store wrote the
    entry ("answer") or before it reached the store ("request"), twice in a row: the commit tries again,
    tells its own entry from another writer's, and the message is stored once, in one log entry."""
    ns = f"{azurite}/{uuid.uuid4().hex[:12]}/ns"
    sparkbus.create_namespace(ns, credits_per_second=None)
    admin = sparkbus.ServiceBusAdministrationClient(ns)
    admin.create_queue("q")
    before = _entries(admin, "q")
    proxy = FaultProxy(os.environ["AZURITE_BLOB_STORAGE_URL"], ENTRY_CREATE, mode, faults=2)
    monkeypatch.setenv("AZURITE_BLOB_STORAGE_URL", f"http://127.0.0.1:{proxy.start()}")
    try:
        with sparkbus.ServiceBusClient(ns, retry_total=0) as client:
            client.get_queue_sender("q").send_messages(ServiceBusMessage("once", message_id="m1"))
            assert proxy.broken() == 2
            after = _entries(admin, "q")
            assert len(after) == len(before) + 1 and after[:-1] == before
            with client.get_queue_receiver("q", max_wait_time=1) as receiver:
                got = receiver.receive_messages(10, max_wait_time=1)
                assert [(str(m), m.message_id) for m in got] == [("once", "m1")]
                receiver.complete_messages(got)
    finally:
        proxy.stop()


CATALOG_ENTRY_CREATE = r"^PUT [^ ]*/_catalog/_delta_log/\d+\.json[^ ]* .*\r\nif-none-match: \*"


@pytest.mark.parametrize("mode", ["answer", "request"])
def test_a_catalog_change_whose_connection_broke_is_made_exactly_once(azurite, monkeypatch, mode):
    """delta-rs does not retry the catalog MERGE's conditional PUT either. Its connection reset after the
    store wrote the entry ("answer") or before ("request"): the change finds its own entry in the log, or
    tries again; either way the queue is created once, in one more catalog entry, and the create returns."""
    ns = f"{azurite}/{uuid.uuid4().hex[:12]}/ns"
    sparkbus.create_namespace(ns, credits_per_second=None)
    catalog_log = location.join(ns, "_catalog", "_delta_log")
    before = [uri for uri in location.listing(catalog_log) if uri.endswith(".json")]
    proxy = FaultProxy(os.environ["AZURITE_BLOB_STORAGE_URL"], CATALOG_ENTRY_CREATE, mode, faults=1)
    monkeypatch.setenv("AZURITE_BLOB_STORAGE_URL", f"http://127.0.0.1:{proxy.start()}")
    try:
        admin = sparkbus.ServiceBusAdministrationClient(ns)
        admin.create_queue("q")
        assert proxy.broken() == 1
    finally:
        proxy.stop()
    monkeypatch.undo()
    after = [uri for uri in location.listing(catalog_log) if uri.endswith(".json")]
    assert len(after) == len(before) + 1
    admin = sparkbus.ServiceBusAdministrationClient(ns)
    assert [q.name for q in admin.list_queues()] == ["q"]
    with sparkbus.ServiceBusClient(ns) as client:
        client.get_queue_sender("q").send_messages(ServiceBusMessage("m"))
    assert admin.get_queue_runtime_properties("q").active_message_count == 1


def test_a_commit_that_never_reaches_the_store_is_a_communication_error_and_writes_no_entry(azurite,
                                                                                            monkeypatch):
    ns = f"{azurite}/{uuid.uuid4().hex[:12]}/ns"
    sparkbus.create_namespace(ns, credits_per_second=None)
    admin = sparkbus.ServiceBusAdministrationClient(ns)
    admin.create_queue("q")
    before = _entries(admin, "q")
    proxy = FaultProxy(os.environ["AZURITE_BLOB_STORAGE_URL"], ENTRY_CREATE, "request", faults=1000)
    monkeypatch.setenv("AZURITE_BLOB_STORAGE_URL", f"http://127.0.0.1:{proxy.start()}")
    try:
        with sparkbus.ServiceBusClient(ns, retry_total=0) as client:
            with pytest.raises(sparkbus.ServiceBusCommunicationError, match="could not be reached"):
                client.get_queue_sender("q").send_messages(ServiceBusMessage("never"))
            assert proxy.broken() == location.CREATE_ATTEMPTS
    finally:
        proxy.stop()
    monkeypatch.undo()
    assert _entries(admin, "q") == before
    assert admin.get_queue_runtime_properties("q").active_message_count == 0


def test_a_sender_of_a_deleted_queue_is_told_so_when_the_store_fails_its_removal(azurite, monkeypatch):
    """A send that finds its queue deleted removes what it wrote and raises not found. When the store fails
    that removal (the connection of every batch delete reset), the send still raises not found, never the
    store's error: the delete's own removals take the directory."""
    ns = f"{azurite}/{uuid.uuid4().hex[:12]}/ns"
    sparkbus.create_namespace(ns, credits_per_second=None)
    admin = sparkbus.ServiceBusAdministrationClient(ns)
    admin.create_queue("x")
    proxy = FaultProxy(os.environ["AZURITE_BLOB_STORAGE_URL"], r"^(POST|DELETE) [^ ]*comp=batch", "request",
                       faults=1000)
    direct, proxied = os.environ["AZURITE_BLOB_STORAGE_URL"], f"http://127.0.0.1:{proxy.start()}"
    monkeypatch.setenv("AZURITE_BLOB_STORAGE_URL", proxied)
    try:
        with sparkbus.ServiceBusClient(ns) as client, client.get_queue_sender("x") as sender:
            sender.send_messages(ServiceBusMessage("before"))
            monkeypatch.setenv("AZURITE_BLOB_STORAGE_URL", direct)
            admin.delete_queue("x")
            monkeypatch.setenv("AZURITE_BLOB_STORAGE_URL", proxied)
            with pytest.raises(sparkbus.MessagingEntityNotFoundError, match="'x'"):
                sender.send_messages(ServiceBusMessage("lost"))
            assert proxy.broken() > 0
    finally:
        proxy.stop()
    monkeypatch.undo()
    assert registry.wait_removed(timeout=60)
    assert not [uri for uri in location.listing(ns) if "/entities/" in uri]


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
    with pytest.raises(ValueError, match="need its conditional writes"):
        option_root({"namespace": "s3://bucket/ns", "entity": "q", "storage.conditional_put": "disabled"}, "source")
    assert location.options_for(option_root({"namespace": "s3://bucket/ok", "entity": "q",
                                             "storage.conditional_put": "etag"}, "sink")) == {"conditional_put": "etag"}


@pytest.fixture
def no_links_mount(tmp_path):
    """A FUSE mount without hard links (tests/nolinkfs.py) over a directory of the test's; unmounted and
    stopped by its process id afterwards."""
    backing, mount = tmp_path / "backing", tmp_path / "mount"
    backing.mkdir()
    mount.mkdir()
    server = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "nolinkfs.py"), str(backing),
                               str(mount)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not os.path.ismount(mount):
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            pytest.fail(f"the FUSE file system did not mount: {server.stderr.read().decode()[-2000:]}")
        time.sleep(0.05)
    yield mount, backing
    subprocess.run(["fusermount3", "-u", str(mount)], check=False)
    server.terminate()
    server.wait(30)


def test_a_local_path_without_hard_links_is_refused_naming_the_store_forms(no_links_mount):
    mount, backing = no_links_mount
    with open(mount / "probe", "wb") as f:  # the mount works: files are written through it
        f.write(b"x")
    with pytest.raises(ValueError, match="cannot hard-link files.*FUSE mount.*abfss://.*s3://"):
        sparkbus.create_namespace(str(mount / "ns"))
    assert sorted(os.listdir(backing)) == ["probe"]  # nothing written (the probe's own files removed)
