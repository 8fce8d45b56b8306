"""Security: entity names cannot reach outside the namespace, filter text cannot read tables, call functions
outside the rule grammar or run code, and a namespace whose files are read-only answers writes with clear
errors and corrupts nothing."""
from __future__ import annotations

import os
import re
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sparkbus
from sparkbus import PartitionUnavailableError, ServiceBusClient, ServiceBusMessage, StorageError
from sparkbus.engine.availability import DETECTED_SECONDS
from sparkbus.management import CorrelationRuleFilter, SqlRuleAction, SqlRuleFilter
from sparkbus.storage import location

NAME_PARTS = st.sampled_from(["..", ".", "/", "\\", "a", "B", "%2e", "~", "$", "\n", " ", "-", "_", "\0", "é",
                              "Subscriptions", "entities", "_catalog"])


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    ns = str(tmp_path_factory.mktemp("security") / "ns")
    sparkbus.create_namespace(ns, credits_per_second=None)
    admin = sparkbus.ServiceBusAdministrationClient(ns)
    admin.create_topic("t")
    admin.create_subscription("t", "s")
    return ns, admin


@settings(max_examples=60, deadline=None)
@given(st.lists(NAME_PARTS, min_size=1, max_size=6).map("".join) | st.text(max_size=12))
def test_no_entity_name_reaches_outside_the_namespace(shared, name):
    ns, admin = shared
    before = set(os.listdir(os.path.dirname(ns)))
    try:
        admin.create_queue(name)
    except (ValueError, TypeError, sparkbus.MessagingEntityAlreadyExistsError):
        assert set(os.listdir(os.path.dirname(ns))) == before
        return
    tables = admin.get_entity_tables(name)
    entities = location.join(ns, "entities") + os.sep
    assert all(re.fullmatch(r"[0-9a-f]{32}/(messages|locks|sessions)", uri[len(entities):]) and uri.startswith(entities)
               for uri in tables.values())  # a uuid directory: the name is never part of a path
    assert set(os.listdir(os.path.dirname(ns))) == before  # nothing beside the namespace
    admin.delete_queue(name)


HOSTILE_FILTERS = [
    "1=1; DROP TABLE messages", "color = (SELECT body FROM messages)", "EXISTS(SELECT * FROM locks)",
    "__import__('os').system('touch PWNED')", "exec('import os')", "eval('1')", "open('/etc/passwd') IS NOT NULL",
    "LOWER(color) = 'a'", "read_parquet('x') = 1", "a = b /* c */", "`x` = 1",
    "color = 'a' UNION SELECT 1", "sys.Label = 'x' OR 1=1)",
]


@pytest.mark.parametrize("text", HOSTILE_FILTERS)
def test_filter_and_action_text_cannot_reach_outside_the_rule_grammar(shared, text, tmp_path):
    ns, admin = shared
    os.chdir(tmp_path)
    for make in (lambda: admin.create_rule("t", "s", "r", filter=SqlRuleFilter(text)),
                 lambda: admin.create_rule("t", "s", "r", action=SqlRuleAction(f"SET x = {text}"))):
        with pytest.raises(ValueError, match="syntax error|not"):
            make()
    assert [r.name for r in admin.list_rules("t", "s")] == ["$Default"]
    assert not os.path.exists(tmp_path / "PWNED")


def test_property_names_that_look_like_tables_or_code_are_only_property_names(shared):
    ns, admin = shared
    admin.create_rule("t", "s", "looks", filter=SqlRuleFilter("messages = 'x' AND [__import__] = 1"))
    admin.create_rule("t", "s", "exact", filter=CorrelationRuleFilter(properties={"locks": "1=1; DROP"}))
    admin.delete_rule("t", "s", "$Default")
    try:
        client = ServiceBusClient(ns)
        client.get_topic_sender("t").send_messages([
            ServiceBusMessage("match", application_properties={"messages": "x", "__import__": 1}),
            ServiceBusMessage("literal", application_properties={"locks": "1=1; DROP"}),
            ServiceBusMessage("neither", application_properties={"messages": "y"})])
        from sparkbus.engine import fanout
        from sparkbus.engine.namespace import open_catalog
        fanout.drain(open_catalog(ns), "t")
        with client.get_subscription_receiver("t", "s", max_wait_time=1) as receiver:
            assert sorted(str(m) for m in receiver.receive_messages(10)) == ["literal", "match"]
    finally:
        for name in ("looks", "exact"):
            admin.delete_rule("t", "s", name)
        admin.create_rule("t", "s", "$Default")


@pytest.mark.slow
@pytest.mark.local_only
def test_a_read_only_namespace_refuses_writes_clearly_and_corrupts_nothing(tmp_path, clock):
    """chattr +i makes files and directories immutable even for root (the suite's user here)."""
    ns = str(tmp_path / "ns")
    sparkbus.create_namespace(ns, credits_per_second=None)
    admin = sparkbus.ServiceBusAdministrationClient(ns)
    admin.create_queue("q", enable_partitioning=True)
    ServiceBusClient(ns).get_queue_sender("q").send_messages([ServiceBusMessage(f"m{i}") for i in range(32)])
    subprocess.run(["chattr", "-R", "+i", ns], check=True)
    try:
        with pytest.raises(PartitionUnavailableError, match="could not be written"):
            ServiceBusClient(ns).get_queue_sender("q").send_messages(ServiceBusMessage("refused"))
        with pytest.raises(StorageError, match="storage"):
            sparkbus.ServiceBusAdministrationClient(ns).create_queue("new")
        with pytest.raises(StorageError, match="storage"):
            sparkbus.ServiceBusAdministrationClient(ns).update_queue("q", max_delivery_count=3)
    finally:
        subprocess.run(["chattr", "-R", "-i", ns], check=True)
    clock.advance(DETECTED_SECONDS + 0.5)  # this process avoids the partitions it found faulty this long
    fresh = sparkbus.ServiceBusAdministrationClient(ns)
    assert [q.name for q in fresh.list_queues()] == ["q"] and fresh.get_queue("q").max_delivery_count == 10
    with ServiceBusClient(ns).get_queue_receiver("q", receive_mode="receiveanddelete", max_wait_time=1) as r:
        got = []
        while batch := r.receive_messages(100):
            got += batch
    assert sorted(str(m) for m in got) == sorted(f"m{i}" for i in range(32))  # all there, nothing more
