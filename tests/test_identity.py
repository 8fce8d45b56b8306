"""Entity and namespace identity: a transaction belongs to one namespace, a namespace path is created by
exactly one of the callers racing for it, and a name is checked as written before it is folded (a name
create refuses reaches nothing anywhere)."""
from __future__ import annotations

import os
import threading
import uuid

import pytest
from pyspark.sql.types import StringType, StructField, StructType

import sparkbus
from sparkbus import (InvalidOperationError, MessagingEntityAlreadyExistsError, ServiceBusMessage,
                      ServiceBusTransaction)
from sparkbus.core.connection import parse_connection_string
from sparkbus.core.names import checked_name, key
from sparkbus.engine.catalog import NAMESPACE_KEY, Catalog, Row
from sparkbus.engine.registry import resolve
from sparkbus.management import SqlRuleFilter
from sparkbus.sender import ServiceBusSender
from sparkbus.spark.datasource import SparkbusDataSource
from sparkbus.storage import location
from conftest import files_under, run_spawned, stored_messages



# ---- transactions belong to one namespace ----------------------------------------------------------------

@pytest.fixture
def two_namespaces(tmp_path):
    """Two namespaces with a queue "q" each, and a client of each."""
    clients = []
    for name in ("a", "b"):
        path = str(tmp_path / name)
        sparkbus.create_namespace(path, credits_per_second=None)
        sparkbus.ServiceBusAdministrationClient(path).create_queue("q")
        clients.append(sparkbus.ServiceBusClient(path))
    return str(tmp_path / "a"), str(tmp_path / "b"), clients[0], clients[1]


def bodies(client: sparkbus.ServiceBusClient) -> list[str]:
    return [str(m) for m in client.get_queue_receiver("q").peek_messages(max_message_count=10)]


def test_a_transaction_refuses_a_sender_of_another_namespace_and_nothing_is_written(two_namespaces):
    path_a, path_b, client_a, client_b = two_namespaces
    before = {path_a: files_under(path_a), path_b: files_under(path_b)}
    with pytest.raises(InvalidOperationError, match="a transaction belongs to one namespace"):
        with client_a.transaction() as txn:
            client_a.get_queue_sender("q").send_messages(ServiceBusMessage("for a"), transaction=txn)
            client_b.get_queue_sender("q").send_messages(ServiceBusMessage("for b"), transaction=txn)
    assert bodies(client_a) == [] and bodies(client_b) == []
    assert {path_a: files_under(path_a), path_b: files_under(path_b)} == before


def test_a_transaction_of_one_client_refuses_another_namespace_even_first(two_namespaces):
    """Bound to its client's namespace when it starts: a first send through another namespace's sender is
    refused too, and the transaction still serves its own namespace."""
    path_a, path_b, client_a, client_b = two_namespaces
    with client_a.transaction() as txn:
        with pytest.raises(InvalidOperationError, match=f"started for {path_a!r}"):
            client_b.get_queue_sender("q").send_messages(ServiceBusMessage("for b"), transaction=txn)
        client_a.get_queue_sender("Q").send_messages(ServiceBusMessage("for a"), transaction=txn)
    assert bodies(client_a) == ["for a"] and bodies(client_b) == []


def test_a_refused_send_leaves_the_held_messages_in_their_own_namespace(two_namespaces):
    path_a, path_b, client_a, client_b = two_namespaces
    with client_b.transaction() as txn:
        client_b.get_queue_sender("q").send_messages([ServiceBusMessage("b1"), ServiceBusMessage("b2")],
                                                     transaction=txn)
        with pytest.raises(InvalidOperationError, match="one namespace"):
            client_a.get_queue_sender("q").send_messages(ServiceBusMessage("a1"), transaction=txn)
    assert bodies(client_a) == [] and bodies(client_b) == ["b1", "b2"]
    assert stored_messages(sparkbus.ServiceBusAdministrationClient(path_a), "q").num_rows == 0


def test_a_transaction_made_without_a_client_belongs_to_the_namespace_of_its_first_send(two_namespaces):
    path_a, path_b, client_a, client_b = two_namespaces
    txn = ServiceBusTransaction()
    client_b.get_queue_sender("q").send_messages(ServiceBusMessage("b"), transaction=txn)
    with pytest.raises(InvalidOperationError, match="one namespace"):
        client_a.get_queue_sender("q").send_messages(ServiceBusMessage("a"), transaction=txn)
    txn.commit()
    assert bodies(client_a) == [] and bodies(client_b) == ["b"]


def test_settlements_take_no_transaction(two_namespaces):
    """Settling is not part of a transaction (azure-servicebus' receivers take none): a transaction= given
    to a settlement is refused by the signature, and the message stays locked for its receiver."""
    path_a, path_b, client_a, client_b = two_namespaces
    client_b.get_queue_sender("q").send_messages(ServiceBusMessage("b"))
    receiver = client_b.get_queue_receiver("q", max_wait_time=5)
    message = receiver.receive_messages(1)[0]
    with client_a.transaction() as txn:
        with pytest.raises(TypeError):
            receiver.complete_message(message, transaction=txn)
    assert bodies(client_b) == ["b"]
    receiver.complete_message(message)
    assert bodies(client_b) == []


# ---- a namespace path is created once ----------------------------------------------------------------

def namespace_row(root: str, tier: str) -> Row:
    return Row(key=NAMESPACE_KEY, kind="namespace", path=root, properties={"tier": tier})


def catalog_files(root: str) -> list[str]:
    return sorted(os.path.relpath(p, root) for p in location.listing(location.join(root, "_catalog")))


def test_version_zero_of_a_catalog_is_claimed_once_and_the_loser_leaves_nothing(tmp_path):
    root = str(tmp_path / "ns")
    Catalog(root).create(namespace_row(root, "standard"))
    written = catalog_files(root)
    with pytest.raises(FileExistsError):
        Catalog(root).create(namespace_row(root, "premium"))  # as a creator that passed every check at once
    assert catalog_files(root) == written
    snap = Catalog(root).snapshot()
    assert snap.version == 0 and list(snap.rows) == [NAMESPACE_KEY]
    assert snap.rows[NAMESPACE_KEY].properties["tier"] == "standard"


@pytest.mark.slow
def test_version_zero_of_a_catalog_on_an_object_store_is_claimed_once(azurite):
    root = f"{azurite}/{uuid.uuid4().hex[:12]}/ns"
    Catalog(root).create(namespace_row(root, "premium"))
    written = sorted(location.listing(root))
    with pytest.raises(FileExistsError):
        Catalog(root).create(namespace_row(root, "standard"))
    assert sorted(location.listing(root)) == written
    assert Catalog(root).snapshot().rows[NAMESPACE_KEY].properties["tier"] == "premium"


def test_a_directory_holding_only_a_dead_creators_catalog_file_can_be_created(tmp_path):
    """A creator that died before its claim leaves at most an unreferenced file in _catalog: the path is
    not taken (anything else there still is refused)."""
    root = tmp_path / "ns"
    (root / "_catalog").mkdir(parents=True)
    (root / "_catalog" / "part-00000-left-behind.parquet").write_bytes(b"not referenced")
    assert sparkbus.create_namespace(str(root), tier="premium").tier == "premium"
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not an empty directory"):
        sparkbus.create_namespace(str(other))


def create_all(paths: list[str], tier: str, barrier) -> list[tuple[str, str]]:
    """For each path: wait for the other creator, then create it with `tier`: [(path, "won" / "lost" /
    any other error)]."""
    outcomes = []
    for path in paths:
        barrier.wait(timeout=120)
        try:
            sparkbus.create_namespace(path, tier=tier, credits_per_second=None)
            outcomes.append((path, "won"))
        except MessagingEntityAlreadyExistsError:
            outcomes.append((path, "lost"))
        except Exception as error:  # reported, not raised: the other creator must not wait for this one
            outcomes.append((path, repr(error)))
    return outcomes


def create_each(paths: list[str], tier: str, barrier, results) -> None:
    """Spawned creator: puts (tier, create_all(...))."""
    results.put((tier, create_all(paths, tier, barrier)))


def check_one_winner_each(outcomes: dict[str, list[tuple[str, str]]], paths: list[str]) -> None:
    """Per path: one creator won, the other got MessagingEntityAlreadyExistsError, and the namespace is the
    winner's (its tier, one namespace row at version 0) and works."""
    for i, path in enumerate(paths):
        results = {tier: dict(found)[path] for tier, found in outcomes.items()}
        assert sorted(results.values()) == ["lost", "won"], (path, results)
        winner = next(tier for tier, result in results.items() if result == "won")
        admin = sparkbus.ServiceBusAdministrationClient(path)
        assert admin.get_namespace_properties().tier == winner
        snap = Catalog(location.normalize(path)).snapshot()
        assert snap.version == 0 and list(snap.rows) == [NAMESPACE_KEY]
        data_files = [f for f in location.listing(location.join(path, "_catalog")) if f.endswith(".parquet")]
        assert len(data_files) == 1, data_files  # the loser's copy is gone
        if i == 0:
            admin.create_queue("q")
            sparkbus.ServiceBusClient(path).get_queue_sender("q").send_messages(ServiceBusMessage("ok"))
            assert admin.get_queue_runtime_properties("q").active_message_count == 1


def race(spawn, paths: list[str]) -> None:
    outcomes = run_spawned(spawn, create_each, [(paths, "standard"), (paths, "premium")])
    check_one_winner_each(dict(outcomes), paths)


def test_processes_creating_one_namespace_path_at_once_have_one_winner(spawn, tmp_path):
    race(spawn, [str(tmp_path / f"ns{i}") for i in range(16)])


@pytest.mark.slow
def test_processes_creating_one_namespace_path_on_an_object_store_have_one_winner(spawn, azurite):
    base = f"{azurite}/{uuid.uuid4().hex[:12]}"
    race(spawn, [f"{base}/ns{i}" for i in range(6)])


def test_threads_creating_one_namespace_path_at_once_have_one_winner(tmp_path):
    paths = [str(tmp_path / f"ns{i}") for i in range(10)]
    barrier, outcomes = threading.Barrier(2), {}

    def creator(tier: str) -> None:
        outcomes[tier] = create_all(paths, tier, barrier)

    threads = [threading.Thread(target=creator, args=(tier,)) for tier in ("standard", "premium")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    check_one_winner_each(outcomes, paths)


# ---- names are checked as written, before they are folded -----------------------------------------------

# Each folds (str.lower, str.upper or casefold) to ASCII or looks like ASCII: never a name, on any path.
FOLDING = ["\u212a", "\u212aq", "\u017f", "\u0130", "\u0131", "\ufb01", "\uff2b", "q\u200b", "\u212a/x"]


@pytest.fixture
def named(tmp_path):
    """A namespace whose entities the FOLDING names would fold to: queues k, s, i, fi, kq; topic k with
    subscriptions k and s; rule k on subscription k."""
    ns = str(tmp_path / "ns")
    sparkbus.create_namespace(ns, credits_per_second=None)
    admin = sparkbus.ServiceBusAdministrationClient(ns)
    for name in ("k", "s", "i", "fi", "kq", "q"):
        admin.create_queue(name)
    admin.create_topic("t")
    admin.create_subscription("t", "k")
    admin.create_subscription("t", "s")
    admin.create_rule("t", "k", "k", filter=SqlRuleFilter("1=1"))
    client = sparkbus.ServiceBusClient(ns)
    client.get_queue_sender("k").send_messages(ServiceBusMessage("kept"))
    return ns, admin, client


def lookups(ns: str, admin, client, bad: str) -> list:
    """Every public path that takes a name, given `bad` where a name goes."""
    schema = StructType([StructField("body", StringType())])
    source = SparkbusDataSource({"namespace": ns, "entity": bad})
    sink = SparkbusDataSource({"namespace": ns, "entity": bad, "checkpointLocation": os.path.join(ns, "..", "cp")})
    conn = f"Endpoint=sparkbus://{ns}"
    return [
        lambda: admin.get_queue(bad), lambda: admin.get_queue_runtime_properties(bad),
        lambda: admin.update_queue({"name": bad}, max_delivery_count=3), lambda: admin.delete_queue(bad),
        lambda: admin.get_topic(bad), lambda: admin.get_topic_runtime_properties(bad),
        lambda: admin.update_topic({"name": bad}, max_size_in_megabytes=2048), lambda: admin.delete_topic(bad),
        lambda: admin.list_subscriptions(bad), lambda: admin.list_subscriptions_runtime_properties(bad),
        lambda: admin.create_subscription(bad, "new"), lambda: admin.get_subscription("t", bad),
        lambda: admin.get_subscription(bad, "k"), lambda: admin.get_subscription_runtime_properties("t", bad),
        lambda: admin.update_subscription("t", {"name": bad}, max_delivery_count=3),
        lambda: admin.delete_subscription("t", bad), lambda: admin.delete_subscription(bad, "k"),
        lambda: admin.create_rule("t", bad, "new"), lambda: admin.get_rule("t", "k", bad),
        lambda: admin.get_rule("t", bad, "k"), lambda: admin.list_rules("t", bad),
        lambda: admin.update_rule("t", "k", bad, filter=SqlRuleFilter("2=2")), lambda: admin.delete_rule("t", "k", bad),
        lambda: admin.get_entity_tables(bad), lambda: admin.get_entity_metrics(bad),
        lambda: admin.set_partition_availability(bad, 0, False),
        lambda: admin.create_queue("new", forward_to=bad), lambda: admin.update_queue("q", forward_to=bad),
        lambda: admin.create_subscription("t", "new", forward_dead_lettered_messages_to=bad),
        lambda: client.get_queue_sender(bad), lambda: client.get_topic_sender(bad),
        lambda: client.get_queue_receiver(bad), lambda: client.get_subscription_receiver("t", bad),
        lambda: client.get_subscription_receiver(bad, "k"), lambda: client.list_queue_sessions(bad),
        lambda: client.list_subscription_sessions("t", bad),
        lambda: ServiceBusSender._from_connection_string(conn, queue_name=bad).send_messages(ServiceBusMessage("x")),
        lambda: sparkbus.ServiceBusClient.from_connection_string(f"{conn};EntityPath={bad}"),
        lambda: sparkbus.ServiceBusClient.from_connection_string(f"{conn};EntityPath=k").get_queue_sender(bad),
        lambda: resolve(Catalog(ns).root, Catalog(ns).snapshot(), bad, ("queue", "topic", "subscription")),
        lambda: source.reader(source.schema()), lambda: sink.streamWriter(schema, False),
    ]


@pytest.mark.parametrize("bad", FOLDING, ids=[n.encode("unicode_escape").decode() for n in FOLDING])
def test_a_name_create_refuses_reaches_nothing_on_any_path(named, bad):
    ns, admin, client = named
    with pytest.raises(ValueError, match="invalid queue name"):
        admin.create_queue(bad)
    before = files_under(ns)
    for number, call in enumerate(lookups(ns, admin, client, bad)):
        with pytest.raises(ValueError, match=r"invalid [\w ]+ name") as raised:
            call()
        assert repr(bad) in str(raised.value) or bad in str(raised.value), (number, raised.value)
        assert files_under(ns) == before, f"lookup {number} wrote to the namespace"
    assert [q.name for q in admin.list_queues()] == ["fi", "i", "k", "kq", "q", "s"]
    assert [str(m) for m in client.get_queue_receiver("k").peek_messages(5)] == ["kept"]
    assert [r.name for r in admin.list_rules("t", "k")] == ["$Default", "k"]


def test_ascii_names_are_compared_case_insensitively_on_every_path(named):
    ns, admin, client = named
    assert admin.get_queue("K").name == "k" and admin.get_subscription("T", "S").name == "s"
    assert admin.get_rule("T", "K", "K").name == "k" and admin.get_rule("t", "k", "$DEFAULT").name == "$Default"
    client.get_queue_sender("K").send_messages(ServiceBusMessage("upper"))
    with client.get_queue_receiver("k", max_wait_time=5) as receiver:
        got = receiver.receive_messages(5, max_wait_time=5)
        assert sorted(str(m) for m in got) == ["kept", "upper"]
        for message in got:
            receiver.complete_message(message)
    connected = sparkbus.ServiceBusClient.from_connection_string(f"Endpoint=sparkbus://{ns};EntityPath=K")
    connected.get_queue_sender("k").send_messages(ServiceBusMessage("via EntityPath"))
    assert admin.get_queue_runtime_properties("K").active_message_count == 1
    admin.delete_queue("K")
    assert "k" not in [q.name for q in admin.list_queues()]


def test_names_with_the_allowed_characters_only_are_folded():
    assert key("Orders/EU-1_x.y") == "orders/eu-1_x.y"
    assert key("T/Subscriptions/S/Rules/$Default") == "t/subscriptions/s/rules/$default"
    assert checked_name("$default", "rule") == "$default"
    for bad in FOLDING + ["", "a b", "a\n", "$other", "K\u212a"]:
        with pytest.raises(ValueError, match="invalid rule name"):
            key(bad, "rule")
    with pytest.raises(TypeError, match="queue name must be a str"):
        key(5, "queue")
    with pytest.raises(ValueError, match="invalid EntityPath name"):
        parse_connection_string("Endpoint=sparkbus:///tmp/ns;EntityPath=\u212a")
