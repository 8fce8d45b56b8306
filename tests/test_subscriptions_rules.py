"""Subscriptions and rules: $Default, partition count from the topic, faithful rule storage, cascades, quotas."""
from __future__ import annotations

import os
import uuid
from datetime import datetime, timedelta, timezone

import pytest

import sparkbus
from sparkbus import (CorrelationRuleFilter, FalseRuleFilter, InvalidOperationError, MessagingEntityAlreadyExistsError,
                      MessagingEntityNotFoundError, ServiceBusAdministrationClient, ServiceBusQuotaExceededError,
                      SqlRuleAction, SqlRuleFilter, TrueRuleFilter)


@pytest.fixture
def topic(admin):
    admin.create_topic("events", enable_partitioning=True)
    return "events"


def test_subscription_defaults_and_default_rule(admin, topic):
    sub = admin.create_subscription(topic, "all")
    assert isinstance(sub, sparkbus.SubscriptionProperties)
    assert (sub.name, sub.topic_name, sub.partition_count) == ("all", "events", 16)
    assert (sub.lock_duration, sub.max_delivery_count, sub.dead_lettering_on_filter_evaluation_exceptions) == (
        timedelta(minutes=1), 10, True)
    rules = admin.list_rules(topic, "all")
    assert [r.name for r in rules] == ["$Default"] and isinstance(rules[0].filter, TrueRuleFilter)
    assert admin.get_subscription(topic, "ALL") == sub


def test_subscription_options_update_and_immutability(admin, topic):
    admin.create_queue("sink")
    admin.create_subscription(topic, "s", requires_session=True, lock_duration="PT2M", forward_to="sink",
                              dead_lettering_on_message_expiration=True)
    sub = admin.get_subscription(topic, "s")
    assert (sub.requires_session, sub.lock_duration, sub.forward_to) == (True, timedelta(minutes=2), "sink")
    sub.max_delivery_count = 2
    admin.update_subscription(topic, sub, forward_to=None)
    got = admin.get_subscription(topic, "s")
    assert (got.max_delivery_count, got.forward_to) == (2, None)
    with pytest.raises(InvalidOperationError, match="requires_session of subscription"):
        admin.update_subscription(topic, "s", requires_session=False)
    with pytest.raises(TypeError, match="unknown subscription option"):
        admin.update_subscription(topic, "s", enable_partitioning=True)


def test_subscription_errors(admin, topic):
    admin.create_subscription(topic, "s")
    with pytest.raises(MessagingEntityAlreadyExistsError):
        admin.create_subscription(topic, "S")
    with pytest.raises(MessagingEntityNotFoundError, match="topic 'nope' does not exist"):
        admin.create_subscription("nope", "s")
    with pytest.raises(ValueError, match="subscription name"):
        admin.create_subscription(topic, "a/b")
    with pytest.raises(MessagingEntityNotFoundError, match="subscription 'x' of topic 'events'"):
        admin.get_subscription(topic, "x")


def test_subscription_quota(ns_path):
    sparkbus.create_namespace(ns_path, max_subscriptions_per_topic=2)
    admin = ServiceBusAdministrationClient(ns_path)
    admin.create_topic("t")
    admin.create_topic("u")
    admin.create_subscription("t", "a")
    admin.create_subscription("t", "b")
    with pytest.raises(ServiceBusQuotaExceededError, match="2 subscriptions"):
        admin.create_subscription("t", "c")
    assert [s.name for s in admin.list_subscriptions("t")] == ["a", "b"]  # the refused one was not stored
    admin.create_subscription("u", "c")  # the quota is per topic
    assert [s.name for s in admin.list_subscriptions("u")] == ["c"]
    assert admin.get_topic_runtime_properties("u").subscription_count == 1
    admin.delete_subscription("t", "b")
    admin.create_subscription("t", "c")  # a freed place can be taken again
    assert [s.name for s in admin.list_subscriptions("t")] == ["a", "c"]


def test_rules_are_stored_faithfully(admin, topic):
    admin.create_subscription(topic, "s")
    stamp = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)
    ident = uuid.uuid4()
    sql = SqlRuleFilter("color = @c AND quantity > @q AND sys.Label LIKE 'ord%'",
                        parameters={"@c": "blue", "@q": 5, "@when": stamp, "@id": ident, "@ttl": timedelta(hours=1)})
    corr = CorrelationRuleFilter(correlation_id="cid", message_id="mid", to="to", reply_to="rt", subject="sub",
                                 session_id="sess", reply_to_session_id="rts", content_type="application/json",
                                 properties={"region": "eu", "priority": 3, "flag": True, "raw": b"\x01"})
    action = SqlRuleAction("SET priority = @p; REMOVE tmp", parameters={"@p": "high"})
    admin.create_rule(topic, "s", "by-sql", filter=sql, action=action)
    admin.create_rule(topic, "s", "by-corr", filter=corr)
    admin.create_rule(topic, "s", "never", filter=FalseRuleFilter())
    got = {r.name: r for r in admin.list_rules(topic, "s")}
    assert set(got) == {"$Default", "by-sql", "by-corr", "never"}
    assert got["by-sql"].filter == sql and got["by-sql"].action == action
    assert got["by-sql"].filter.parameters["@id"] == ident and got["by-sql"].filter.parameters["@when"] == stamp
    assert got["by-corr"].filter == corr and got["by-corr"].filter.properties["raw"] == b"\x01"
    assert isinstance(got["never"].filter, FalseRuleFilter) and got["never"].action is None
    assert admin.get_rule(topic, "s", "by-corr").filter.label == "sub"


def test_rule_update_and_delete(admin, topic):
    admin.create_subscription(topic, "s")
    rule = admin.get_rule(topic, "s", "$Default")
    rule.filter = SqlRuleFilter("a = 1")
    rule.action = SqlRuleAction("SET b = 2")
    admin.update_rule(topic, "s", rule)
    got = admin.get_rule(topic, "s", "$Default")
    assert (got.filter, got.action) == (SqlRuleFilter("a = 1"), SqlRuleAction("SET b = 2"))
    admin.delete_rule(topic, "s", "$Default")
    assert admin.list_rules(topic, "s") == []
    with pytest.raises(MessagingEntityNotFoundError, match="rule '\\$Default'"):
        admin.get_rule(topic, "s", "$Default")


def test_rule_validation(admin, topic):
    admin.create_subscription(topic, "s")
    with pytest.raises(MessagingEntityAlreadyExistsError):
        admin.create_rule(topic, "s", "$default")
    with pytest.raises(TypeError, match="filter must be a SqlRuleFilter"):
        admin.create_rule(topic, "s", "r", filter="a = 1")
    with pytest.raises(ValueError, match="at least one"):
        CorrelationRuleFilter()
    with pytest.raises(ValueError, match="1 to 1024 characters"):
        SqlRuleFilter("x" * 1025)
    with pytest.raises(ValueError, match="start with '@'"):
        SqlRuleFilter("a = @b", parameters={"b": 1})
    with pytest.raises(TypeError, match="has type list"):
        CorrelationRuleFilter(properties={"a": [1]})
    with pytest.raises(ValueError, match="rule name"):
        admin.create_rule(topic, "s", "bad/name")
    with pytest.raises(MessagingEntityNotFoundError):
        admin.create_rule(topic, "missing", "r")
    assert [r.name for r in admin.list_rules(topic, "s")] == ["$Default"]


def test_filter_quotas_per_topic(ns_path):
    sparkbus.create_namespace(ns_path, max_sql_filters_per_topic=2, max_correlation_filters_per_topic=1)
    admin = ServiceBusAdministrationClient(ns_path)
    admin.create_topic("t")
    admin.create_subscription("t", "a")
    admin.create_subscription("t", "b")
    admin.create_rule("t", "a", "s1", filter=SqlRuleFilter("x = 1"))
    admin.create_rule("t", "b", "s2", filter=SqlRuleFilter("x = 2"))
    with pytest.raises(ServiceBusQuotaExceededError, match="2 SQL filters"):
        admin.create_rule("t", "b", "s3", filter=SqlRuleFilter("x = 3"))
    admin.create_rule("t", "a", "c1", filter=CorrelationRuleFilter(subject="x"))
    with pytest.raises(ServiceBusQuotaExceededError, match="1 correlation filters"):
        admin.create_rule("t", "b", "c2", filter=CorrelationRuleFilter(subject="y"))
    with pytest.raises(ServiceBusQuotaExceededError, match="SQL filters"):
        admin.update_rule("t", "a", "$Default", filter=SqlRuleFilter("x = 9"))
    admin.create_rule("t", "a", "t1", filter=TrueRuleFilter())  # True/False filters count toward neither
    admin.create_rule("t", "b", "f1", filter=FalseRuleFilter())
    rules = {(sub, r.name): r.filter for sub in ("a", "b") for r in admin.list_rules("t", sub)}
    assert set(rules) == {("a", "$Default"), ("a", "s1"), ("a", "c1"), ("a", "t1"),
                          ("b", "$Default"), ("b", "s2"), ("b", "f1")}  # nothing refused was stored
    assert isinstance(rules[("a", "$Default")], TrueRuleFilter)  # the refused update left it unchanged
    assert isinstance(rules[("a", "t1")], TrueRuleFilter) and isinstance(rules[("b", "f1")], FalseRuleFilter)
    counts = admin.get_topic_runtime_properties("t")
    assert (counts.sql_filter_count, counts.correlation_filter_count) == (2, 1)


def test_delete_topic_cascades(admin, topic, ns_path):
    admin.create_subscription(topic, "a")
    admin.create_subscription(topic, "b")
    admin.create_rule(topic, "a", "r", filter=SqlRuleFilter("x = 1"))
    tables = [admin.get_entity_tables(f"{topic}/Subscriptions/{s}") for s in ("a", "b")]
    tables.append(admin.get_entity_tables(topic))
    admin.delete_topic(topic)
    assert admin.list_topics() == []
    assert all(not os.path.exists(uri) for t in tables for uri in t.values())
    snapshot = admin._catalog.snapshot()
    assert [r.kind for r in snapshot.rows.values()] == ["namespace"]
    admin.create_topic(topic)
    assert admin.list_subscriptions(topic) == []


def test_delete_subscription(admin, topic):
    admin.create_subscription(topic, "a")
    tables = admin.get_entity_tables("events/Subscriptions/a")
    admin.delete_subscription(topic, "a")
    assert admin.list_subscriptions(topic) == [] and not os.path.exists(tables["messages"])
    with pytest.raises(MessagingEntityNotFoundError):
        admin.list_rules(topic, "a")


def test_get_entity_tables(admin, topic):
    admin.create_subscription(topic, "a")
    sub = admin.get_entity_tables("Events/Subscriptions/A")
    assert set(sub) == {"messages", "locks", "sessions"} and sub != admin.get_entity_tables("events")
    with pytest.raises(MessagingEntityNotFoundError):
        admin.get_entity_tables("events/Subscriptions/zzz")
    with pytest.raises(MessagingEntityNotFoundError):
        admin.get_entity_tables("nothing")
