"""Property-based tests (hypothesis) of what a value can do to an entity: arbitrary Python values as
application property keys and values, as rule parameters, correlation properties and action parameters.
Every call either succeeds, and the message then round-trips exactly (through a queue, and through a
topic's fan-out, also to a subscription whose rule reads the property), or raises ValueError/TypeError and
writes nothing. Either way the entity goes on delivering normal messages: no value poisons it. No Spark
(fan-out runs through sparkbus.engine.fanout.drain); slow (each example commits and walks the namespace)."""
from __future__ import annotations

import math
import uuid
from datetime import datetime, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sparkbus
from sparkbus import ServiceBusMessage, ServiceBusReceiveMode, ServiceBusSubQueue
from sparkbus.engine import fanout
from sparkbus.engine.catalog import Catalog
from sparkbus.management import CorrelationRuleFilter, SqlRuleAction, SqlRuleFilter
from sparkbus.storage.location import normalize
from conftest import files_under

# any code point, lone surrogates included (hypothesis' text() leaves them out whatever its alphabet)
TEXT = st.lists(st.characters() | st.characters(categories=["Cs"]), max_size=12).map("".join)
SCALARS = (st.integers() | st.integers(min_value=-2**64, max_value=2**64) | st.floats() | TEXT
           | st.binary(max_size=12) | st.booleans() | st.none() | st.uuids()
           | st.datetimes(timezones=st.none() | st.just(timezone.utc)))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                                            max_size=3), max_leaves=6)
KEYS = TEXT | st.integers() | st.binary(max_size=4) | st.none()
REFUSED = (ValueError, TypeError)
NORMAL = "normal"


def same(sent: object, got: object) -> bool:
    """Equal as a message carries it: nan equals nan, a naive datetime is UTC."""
    if isinstance(sent, float) and isinstance(got, float) and math.isnan(sent):
        return math.isnan(got)
    if isinstance(sent, datetime) and isinstance(got, datetime):
        return (sent if sent.tzinfo else sent.replace(tzinfo=timezone.utc)) == got
    if isinstance(sent, dict) and isinstance(got, dict):
        return sent.keys() == got.keys() and all(same(v, got[k]) for k, v in sent.items())
    return type(sent) is type(got) and sent == got


def comparable(value: object) -> bool:
    """A value for which `p = @v` is true when p holds the same value (SQL: not NULL, not NaN)."""
    return (isinstance(value, (str, bool, int)) or (isinstance(value, float) and not math.isnan(value)))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    ns = str(tmp_path_factory.mktemp("values") / "ns")
    sparkbus.create_namespace(ns, credits_per_second=None)
    admin = sparkbus.ServiceBusAdministrationClient(ns)
    admin.create_queue("q")
    admin.create_topic("t")
    admin.create_subscription("t", "all")  # $Default: every message
    admin.create_subscription("t", "reads")
    admin.delete_rule("t", "reads", "$Default")
    admin.create_rule("t", "reads", "p", filter=SqlRuleFilter("p IS NOT NULL OR sys.Label = 'normal'"))
    admin.create_subscription("t", "ruled")  # the drawn rule of each example, or none
    admin.delete_rule("t", "ruled", "$Default")
    client = sparkbus.ServiceBusClient(ns)
    yield ns, admin, client, Catalog(normalize(ns))
    client.close()


def receive_all(client, entity: tuple[str, ...]) -> list:
    receive = client.get_queue_receiver if len(entity) == 1 else client.get_subscription_receiver
    # max_wait_time=0: every send and fan-out has committed before this reads (an empty entity answers at once)
    with receive(*entity, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE, max_wait_time=0) as receiver:
        return receiver.receive_messages(100)


def still_delivers(world) -> None:
    """A normal message goes through the queue and through the topic to every subscription that takes it."""
    ns, admin, client, catalog = world
    for sender in (client.get_queue_sender("q"), client.get_topic_sender("t")):
        with sender:
            sender.send_messages(ServiceBusMessage(NORMAL, subject=NORMAL))
    fanout.drain(catalog, "t")
    for entity in (("q",), ("t", "all"), ("t", "reads")):
        assert [str(m) for m in receive_all(client, entity)] == [NORMAL], entity
    assert receive_all(client, ("t", "ruled")) == []


@pytest.mark.slow
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(st.dictionaries(KEYS, VALUES, max_size=4), VALUES)
def test_a_property_is_refused_at_send_or_round_trips_exactly_through_a_queue_and_a_topic(world, props, p):
    ns, admin, client, catalog = world
    sent = {**props, "p": p} if all(isinstance(k, str) for k in props) else {**props}
    before = files_under(ns)
    try:
        message = ServiceBusMessage("drawn", application_properties=sent)
    except REFUSED:
        message = None
    if message is not None:
        message.application_properties = sent  # the send checks what the message holds then, too
        try:
            with client.get_queue_sender("q") as sender:
                sender.send_messages(message)
            with client.get_topic_sender("t") as sender:
                sender.send_messages(message)
        except REFUSED:
            message = None
    if message is None:
        assert files_under(ns) == before, f"a refused send of {sent!r} wrote to the namespace"
        still_delivers(world)
        return
    fanout.drain(catalog, "t")
    entities = [("q",), ("t", "all")] + ([("t", "reads")] if sent.get("p") is not None else [])
    for entity in entities:
        got = receive_all(client, entity)
        assert len(got) == 1, entity
        assert same(sent, got[0].str_application_properties), (entity, sent, got[0].str_application_properties)
    assert receive_all(client, ("t", "reads")) == []
    still_delivers(world)


@pytest.mark.slow
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(VALUES, st.sampled_from(["sql", "correlation", "action"]))
def test_a_rule_value_is_refused_at_creation_or_selects_and_sets_exactly_and_never_stops_fan_out(world, value, kind):
    ns, admin, client, catalog = world
    name = "r" + uuid.uuid4().hex[:8]
    before = files_under(ns)
    try:
        if kind == "sql":
            rule = dict(filter=SqlRuleFilter("p = @v", parameters={"@v": value}))
        elif kind == "correlation":
            rule = dict(filter=CorrelationRuleFilter(properties={"p": value}))
        else:
            rule = dict(filter=SqlRuleFilter("sys.Label = 'drawn'"),
                        action=SqlRuleAction("SET q = @v", parameters={"@v": value}))
        admin.create_rule("t", "ruled", name, **rule)
    except REFUSED:
        assert files_under(ns) == before, f"a refused {kind} rule with {value!r} wrote to the namespace"
        still_delivers(world)
        return
    try:
        drawn = ServiceBusMessage("drawn", subject="drawn", application_properties={"p": value})
        with client.get_topic_sender("t") as sender:
            sender.send_messages(drawn)
        sent = True
    except REFUSED:  # the rule holds a value a message cannot carry as a property (e.g. nested in an action)
        sent = False
    fanout.drain(catalog, "t")
    got = receive_all(client, ("t", "ruled"))
    if sent and kind == "action":
        assert len(got) == 1 and same(value, got[0].str_application_properties.get("q")), (value, got)
    elif sent and comparable(value):
        assert len(got) == 1 and str(got[0]) == "drawn", (kind, value, got)
    with client.get_subscription_receiver("t", "ruled", sub_queue=ServiceBusSubQueue.DEAD_LETTER,
                                          max_wait_time=0) as receiver:
        assert receiver.peek_messages(10) == [], f"an accepted {kind} rule with {value!r} dead-lettered a copy"
    receive_all(client, ("t", "all"))
    receive_all(client, ("t", "reads"))
    admin.delete_rule("t", "ruled", name)
    still_delivers(world)
