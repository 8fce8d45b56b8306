"""Defence in depth: a stored row or rule that cannot be decoded or evaluated (written by an older version
or by another tool, which the boundary checks of this version would refuse) never stops an entity for
everyone. Receive dead-letters such a message (reason MessageDecodeError) and returns the others; peek and
the dead-letter sub-queue show it; fan-out dead-letters the copies a rule cannot evaluate (reason
FilterEvaluationException), exactly once, skips and logs a rule that cannot be evaluated at all, and ends
with MessagingEntityNotFoundError when its topic is deleted. The poisoned rows are written straight into
the entities' real Delta tables, as another tool would; no Spark."""
from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time

import numpy as np
import pyarrow as pa
import pytest
from conftest import stored_messages

from sparkbus import (CorrelationRuleFilter, ServiceBusMessage, ServiceBusReceiveMode, ServiceBusSubQueue,
                      SqlRuleAction, SqlRuleFilter)
from sparkbus import storage
from sparkbus.core.language import MessageView, compile_sql, select
from sparkbus.core.language.compiled import _isolating
from sparkbus.engine import fanout
from sparkbus.engine.catalog import Catalog, Change
from sparkbus.engine.registry import resolve_current
from sparkbus.exceptions import MessagingEntityNotFoundError
from sparkbus.storage.location import normalize
from sparkbus.core.schemas import MESSAGES
from sparkbus.streaming import start_fanout

# Stored forms no check of this version lets through, as SQL literals for a Delta UPDATE of one row.
BIG_INT = """'{"a":["int",1267650600228229401496703205376]}'"""      # 2**100: no AMQP long
SURROGATE_VALUE = """'{"a":["str","\\ud800"]}'"""                    # a lone surrogate: not UTF-8 text
SURROGATE_KEY = """'{"\\udfff":["str","x"],"a":["str","x"]}'"""
NOT_JSON = """'{"a":["str"'"""                                       # cut short by another tool
BAD_VALUE_BODY = {"body_type": "'value'", "body": "X'00537705ff'"}    # a value section that does not decode

POISONS = {"big-int": {"application_properties": BIG_INT},
           "surrogate-value": {"application_properties": SURROGATE_VALUE},
           "surrogate-key": {"application_properties": SURROGATE_KEY},
           "not-json": {"application_properties": NOT_JSON},
           "bad-body": BAD_VALUE_BODY}


def poison(admin, entity: str, message_id: str, updates: dict[str, str]) -> None:
    """Rewrite one stored message row of the entity in place, the way another tool writing the table would."""
    table = storage.open_table(resolve_current(admin._catalog, entity, ("queue", "topic", "subscription"))
                               .tables["messages"])
    table.update(updates=updates, predicate=f"message_id = '{message_id}'")


def messages(ids, **properties):
    return [ServiceBusMessage(f"body {i}", message_id=i, application_properties={"a": "x", **properties})
            for i in ids]


def receive_all(client, entity, **kwargs):
    with client.get_queue_receiver(entity, **kwargs) as receiver:
        got = receiver.receive_messages(50, max_wait_time=0.3)
        if receiver.receive_mode is ServiceBusReceiveMode.PEEK_LOCK:
            receiver.complete_messages(got)
    return got


# ---- receive ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", [ServiceBusReceiveMode.PEEK_LOCK, ServiceBusReceiveMode.RECEIVE_AND_DELETE])
def test_undecodable_queue_messages_are_dead_lettered_and_the_others_received(admin, client, mode):
    admin.create_queue("q")
    with client.get_queue_sender("q") as sender:
        sender.send_messages(messages(["ok-1", *POISONS, "ok-2"]))
    for name, updates in POISONS.items():
        poison(admin, "q", name, updates)

    got = receive_all(client, "q", receive_mode=mode)
    assert [m.message_id for m in got] == ["ok-1", "ok-2"]
    assert all(m.str_application_properties == {"a": "x"} for m in got)
    with client.get_queue_receiver("q", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as receiver:
        assert {m.delivery_count for m in receiver.peek_messages(20)} == {0}   # never delivered
    dead = {m.message_id: m for m in receive_all(client, "q", sub_queue=ServiceBusSubQueue.DEAD_LETTER)}
    assert sorted(dead) == sorted(POISONS)
    assert {m.dead_letter_reason for m in dead.values()} == {"MessageDecodeError"}
    described = {name: m.dead_letter_error_description for name, m in dead.items()}
    assert "application_properties['a']" in described["big-int"] and "64-bit" in described["big-int"]
    assert "lone surrogate" in described["surrogate-value"]
    assert "application_properties['a']" in described["surrogate-value"]
    assert "lone surrogate" in described["surrogate-key"] and "key" in described["surrogate-key"]
    assert "application_properties do not decode" in described["not-json"]
    assert "value body does not decode" in described["bad-body"]
    # the dead-letter sub-queue shows what can be shown: the properties that decode
    assert dead["surrogate-key"].str_application_properties == {"a": "x"}
    assert dead["surrogate-value"].str_application_properties == {}
    assert dead["bad-body"].body_bytes == bytes.fromhex("00537705ff")
    with pytest.raises(ValueError):
        dead["bad-body"].body
    assert receive_all(client, "q") == [] and receive_all(client, "q", sub_queue=ServiceBusSubQueue.DEAD_LETTER) == []


def test_peek_shows_undecodable_messages_without_what_does_not_decode(admin, client):
    admin.create_queue("q")
    with client.get_queue_sender("q") as sender:
        sender.send_messages(messages(["ok-1", *POISONS, "ok-2"]))
    for name, updates in POISONS.items():
        poison(admin, "q", name, updates)
    with client.get_queue_receiver("q") as receiver:
        peeked = {m.message_id: m for m in receiver.peek_messages(20)}
    assert sorted(peeked) == sorted(["ok-1", "ok-2", *POISONS])
    assert peeked["ok-1"].application_properties == {b"a": b"x"}
    assert peeked["surrogate-key"].str_application_properties == {"a": "x"}   # the undecodable key left out
    assert peeked["not-json"].str_application_properties == {}
    assert peeked["big-int"].str_application_properties == {"a": 2**100}      # Python has a form for it
    assert receive_all(client, "q")[0].message_id == "ok-1"                   # peeking moved nothing


def test_undecodable_messages_do_not_take_the_place_of_the_one_a_receive_asks_for(admin, client):
    admin.create_queue("q")
    bad = [f"bad-{i:02}" for i in range(40)]                           # more than one look ahead covers
    with client.get_queue_sender("q") as sender:
        sender.send_messages(messages([*bad, "ok"]))
    for message_id in bad:
        poison(admin, "q", message_id, POISONS["surrogate-value"])
    with client.get_queue_receiver("q") as receiver:
        [message] = receiver.receive_messages(1)                       # the next one in the bad ones' place
        assert message.message_id == "ok"
        receiver.complete_message(message)
    assert len(receive_all(client, "q", sub_queue=ServiceBusSubQueue.DEAD_LETTER)) == 40


def test_undecodable_deferred_message_is_dead_lettered_and_the_others_returned(admin, client):
    admin.create_queue("q")
    with client.get_queue_sender("q") as sender:
        sender.send_messages(messages(["ok", "bad"]))
    with client.get_queue_receiver("q") as receiver:
        for m in receiver.receive_messages(2, max_wait_time=0.3):
            receiver.defer_message(m)
    numbers = [m.sequence_number for m in client.get_queue_receiver("q").peek_messages(2)]
    poison(admin, "q", "bad", POISONS["big-int"])
    with client.get_queue_receiver("q") as receiver:
        got = receiver.receive_deferred_messages(numbers)
        assert [m.message_id for m in got] == ["ok"]
        receiver.complete_message(got[0])
    [dead] = receive_all(client, "q", sub_queue=ServiceBusSubQueue.DEAD_LETTER)
    assert dead.message_id == "bad" and dead.dead_letter_reason == "MessageDecodeError"


# ---- fan-out ---------------------------------------------------------------------------------------------

def drain(admin, topic="t"):
    return fanout.drain(admin._catalog, topic)


def received(client, sub, *, dead_letter=False, topic="t"):
    kwargs = {"sub_queue": ServiceBusSubQueue.DEAD_LETTER} if dead_letter else {}
    with client.get_subscription_receiver(topic, sub, **kwargs) as receiver:
        got = receiver.receive_messages(50, max_wait_time=0.3)
        receiver.complete_messages(got)
    return got


def only_rules(admin, sub, rules, topic="t", **options):
    admin.create_subscription(topic, sub, **options)
    admin.delete_rule(topic, sub, "$Default")
    for name, rule_filter, action in rules:
        admin.create_rule(topic, sub, name, filter=rule_filter, action=action)


@pytest.fixture
def poisoned_topic(admin, client):
    """Topic t: subscription all ($Default), reads (a rule reading property a), keep (the same, but not
    dead-lettering evaluation errors), corr (a correlation filter on a); five messages, two poisoned."""
    admin.create_topic("t")
    admin.create_subscription("t", "all")
    only_rules(admin, "reads", [("r", SqlRuleFilter("a = 'x'"), None)])
    only_rules(admin, "keep", [("r", SqlRuleFilter("a = 'x'"), None)],
               dead_lettering_on_filter_evaluation_exceptions=False)
    only_rules(admin, "corr", [("c", CorrelationRuleFilter(properties={"a": "x"}), None)])
    with client.get_topic_sender("t") as sender:
        sender.send_messages(messages(["ok-1", "big-int", "surrogate-value", "ok-2", "ok-3"]))
    poison(admin, "t", "big-int", POISONS["big-int"])
    poison(admin, "t", "surrogate-value", POISONS["surrogate-value"])
    return admin


def test_a_poisoned_topic_message_is_dead_lettered_where_a_rule_reads_it_and_the_rest_delivered(poisoned_topic,
                                                                                                 client):
    admin = poisoned_topic
    result = drain(admin)
    assert drain(admin).messages == 0                                          # nothing left, nothing stuck
    good = ["ok-1", "ok-2", "ok-3"]
    for sub in ("reads", "keep", "corr"):
        assert [m.message_id for m in received(client, sub)] == good
    dead = {m.message_id: m for m in received(client, "reads", dead_letter=True)}
    assert sorted(dead) == ["big-int", "surrogate-value"]
    assert {m.dead_letter_reason for m in dead.values()} == {"FilterEvaluationException"}
    assert all("rule 'r'" in m.dead_letter_error_description and "'a'" in m.dead_letter_error_description
               for m in dead.values())
    assert received(client, "keep", dead_letter=True) == []                    # not dead-lettering: no copy
    assert received(client, "corr", dead_letter=True) == []                    # a correlation filter misses
    assert result.dead_lettered["t/Subscriptions/reads"] == 2 and result.copies["t/Subscriptions/reads"] == 3


def test_all_copies_of_a_poisoned_topic_reach_the_subscription_that_reads_nothing(poisoned_topic, client):
    drain(poisoned_topic)
    assert [m.message_id for m in received(client, "all")] == ["ok-1", "ok-2", "ok-3"]
    dead = received(client, "all", dead_letter=True)
    assert sorted(m.message_id for m in dead) == ["big-int", "surrogate-value"]
    assert {m.dead_letter_reason for m in dead} == {"MessageDecodeError"}


def test_poisoned_copies_are_stored_once_when_fan_out_runs_again(poisoned_topic, client):
    admin = poisoned_topic
    drain(admin)
    stored = {sub: stored_messages(admin, f"t/Subscriptions/{sub}").num_rows for sub in ("all", "reads", "keep")}
    topic = resolve_current(admin._catalog, "t", ("topic",))
    replay = fanout.read_ranges(topic, {0: (0, 2**48)})                       # every row still in the topic
    fanout.deliver(admin._catalog, topic, replay)                              # a replay after a crash
    drain(admin)
    assert {sub: stored_messages(admin, f"t/Subscriptions/{sub}").num_rows for sub in stored} == stored
    assert stored == {"all": 5, "reads": 5, "keep": 3}
    assert len(received(client, "reads", dead_letter=True)) == 2


def _fan_out_dying_before_dead_lettering(root):
    def die(target, built, states):
        if states:
            os.kill(os.getpid(), signal.SIGKILL)   # the copies are committed, their dead-letter states are not

    fanout._dead_letter = die
    fanout.drain(Catalog(root), "t")


@pytest.mark.slow
def test_a_crash_before_poisoned_copies_are_dead_lettered_is_repaired_once(poisoned_topic, client, ns_path, spawn):
    process = spawn.Process(target=_fan_out_dying_before_dead_lettering, args=(normalize(ns_path),))
    process.start()
    process.join(120)
    assert process.exitcode == -signal.SIGKILL
    drain(poisoned_topic)                                                      # the replay repairs it
    drain(poisoned_topic)
    assert stored_messages(poisoned_topic, "t/Subscriptions/reads").num_rows == 5
    assert [m.message_id for m in received(client, "reads")] == ["ok-1", "ok-2", "ok-3"]
    dead = received(client, "reads", dead_letter=True)
    assert sorted(m.message_id for m in dead) == ["big-int", "surrogate-value"]
    assert {m.dead_letter_reason for m in dead} == {"FilterEvaluationException"}


def test_a_message_whose_properties_do_not_decode_is_dead_lettered_by_an_action_rule(admin, client):
    admin.create_topic("t")
    only_rules(admin, "act", [("tag", SqlRuleFilter("1=1"), SqlRuleAction("SET b = 'tagged'"))])
    with client.get_topic_sender("t") as sender:
        sender.send_messages(messages(["ok-1", "not-json", "ok-2"]))
    poison(admin, "t", "not-json", POISONS["not-json"])
    drain(admin)
    got = received(client, "act")
    assert [m.message_id for m in got] == ["ok-1", "ok-2"]
    assert all(m.str_application_properties == {"a": "x", "b": "tagged", "RuleName": "tag"} for m in got)
    [dead] = received(client, "act", dead_letter=True)
    assert dead.message_id == "not-json" and dead.dead_letter_reason == "FilterEvaluationException"
    assert "rule 'tag'" in dead.dead_letter_error_description


def store_rule_change(admin, rule_suffix: str, change) -> None:
    """Rewrite a stored rule in the catalog, as an older version could have stored it."""
    catalog = admin._catalog
    row = next(r for r in catalog.snapshot().of_kind("rule") if r.path.endswith(rule_suffix))
    catalog.transact(lambda snap: Change(upserts=[row.updated(change(dict(row.properties)))]))


@pytest.mark.parametrize("breakage", ["does not parse", "unusable parameter"])
def test_a_stored_rule_that_cannot_be_evaluated_is_logged_and_skipped(admin, client, caplog, breakage):
    admin.create_topic("t")
    only_rules(admin, "s", [("broken", SqlRuleFilter("a = @p", {"@p": "x"}), None),
                            ("fine", SqlRuleFilter("a = 'x'"), SqlRuleAction("SET b = 1"))])
    admin.create_subscription("t", "other")
    if breakage == "does not parse":
        store_rule_change(admin, "/broken", lambda p: {**p, "filter": p["filter"].replace("a = @p", "a = = @p")})
    else:
        def unusable(properties: dict) -> dict:  # the parameter 2**100, stored before checks refused it
            stored = json.loads(properties["filter"])
            stored["parameters"] = json.dumps({"@p": ["int", 2**100]}, separators=(",", ":"))
            return {**properties, "filter": json.dumps(stored)}
        store_rule_change(admin, "/broken", unusable)
    with client.get_topic_sender("t") as sender:
        sender.send_messages(messages(["m1", "m2"]))
    with caplog.at_level(logging.WARNING, logger="sparkbus.fanout"):
        drain(admin)
    got = received(client, "s")
    assert [(m.message_id, m.str_application_properties.get("RuleName")) for m in got] == [("m1", "fine"),
                                                                                            ("m2", "fine")]
    assert received(client, "s", dead_letter=True) == []
    assert [m.message_id for m in received(client, "other")] == ["m1", "m2"]
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    text = warning.getMessage()
    assert "'t'" in text and "'s'" in text and "'broken'" in text
    assert ("does not parse" in text) if breakage == "does not parse" else ("parameter @p" in text and "64-bit" in text)


def test_an_action_giving_a_message_id_over_128_characters_dead_letters_that_copy(admin, client):
    admin.create_topic("t")
    pad = "x" * 124
    only_rules(admin, "s", [("grow", SqlRuleFilter("1=1"), SqlRuleAction("SET sys.MessageId = sys.MessageId + @pad",
                                                                         {"@pad": pad}))])
    with client.get_topic_sender("t") as sender:
        sender.send_messages(messages(["id1", "long-id-2", "id3"]))          # 3 + 124 fits; 9 + 124 does not
    drain(admin)
    assert [m.message_id for m in received(client, "s")] == ["id1" + pad, "id3" + pad]
    [dead] = received(client, "s", dead_letter=True)
    assert dead.message_id == "long-id-2"                                     # the message as sent
    assert dead.dead_letter_reason == "FilterEvaluationException"
    assert "sys.MessageId" in dead.dead_letter_error_description and "128" in dead.dead_letter_error_description


# ---- deletion during fan-out -----------------------------------------------------------------------------

def test_fanning_out_a_deleted_topic_ends_with_entity_not_found(admin, client):
    admin.create_topic("t")
    admin.create_subscription("t", "s")
    with client.get_topic_sender("t") as sender:
        sender.send_messages(messages(["m1", "m2"]))
    topic = resolve_current(admin._catalog, "t", ("topic",))
    rows = fanout.pending(topic)
    admin.delete_topic("t")
    with pytest.raises(MessagingEntityNotFoundError):
        fanout.deliver(admin._catalog, topic, rows)
    with pytest.raises(MessagingEntityNotFoundError):
        fanout.deliver_ranges(admin._catalog, topic, {0: (1, 2)})
    with pytest.raises(MessagingEntityNotFoundError):
        fanout.deliver_scheduled(admin._catalog, topic)
    with pytest.raises(MessagingEntityNotFoundError):
        drain(admin)


def test_a_subscription_deleted_during_fan_out_is_skipped(admin, client):
    admin.create_topic("t")
    admin.create_subscription("t", "gone")
    admin.create_subscription("t", "stays")
    with client.get_topic_sender("t") as sender:
        sender.send_messages(messages(["m1", "m2"]))
    catalog = admin._catalog
    topic = resolve_current(catalog, "t", ("topic",))
    rows = fanout.pending(topic).select(MESSAGES.names).cast(MESSAGES)
    found = {t.info.path: t for t in fanout.targets(catalog.root, catalog.snapshot(), topic)}
    admin.delete_subscription("t", "gone")                                     # after the batch's targets were read
    gone = found["t/Subscriptions/gone"]
    assert fanout._unless_deleted(catalog, gone, MessageView(rows), fanout._batch_plan(fanout.batch_ends(rows))) \
        == fanout.FanoutResult()
    assert not os.path.exists(os.path.join(normalize(admin._catalog.root), gone.info.incarnation))
    drain(admin)
    assert [m.message_id for m in received(client, "stays")] == ["m1", "m2"]


def test_deleting_a_topic_while_it_fans_out_never_surfaces_a_storage_error(admin, client):
    for attempt in range(4):
        admin.create_topic("t")
        for sub in ("a", "b", "c"):
            admin.create_subscription("t", sub)
        with client.get_topic_sender("t") as sender:
            sender.send_messages(messages([f"m{i}" for i in range(50)]))
        outcome = []

        def fan_out():
            try:
                outcome.append(drain(admin))
            except MessagingEntityNotFoundError as error:
                outcome.append(error)
            except Exception as error:  # what must not happen: recorded, failed below
                outcome.append(error)

        worker = threading.Thread(target=fan_out)
        worker.start()
        admin.delete_topic("t")
        worker.join(120)
        assert len(outcome) == 1
        assert isinstance(outcome[0], (fanout.FanoutResult, MessagingEntityNotFoundError)), repr(outcome[0])


# ---- the isolation itself (pure) -------------------------------------------------------------------------

def test_isolating_finds_exactly_the_rows_that_raise_in_few_runs():
    runs = []

    def run(rows):
        runs.append(len(rows))
        if {3, 700} & set(rows.tolist()):
            raise ValueError("poison")
        return rows.sum()

    rows = np.arange(1000)
    done, raised = _isolating(run, rows, ValueError("poison"))
    assert sorted(raised) == [3, 700] and all("ValueError: poison" in text for text in raised.values())
    assert sorted(np.concatenate([part for part, _ in done]).tolist()) == sorted(set(range(1000)) - {3, 700})
    assert all(result == part.sum() for part, result in done)
    assert len(runs) <= 2 * 2 * 10                                       # about 2 log2(n) runs per bad row


def test_select_dead_letters_only_the_message_that_makes_a_rule_raise():
    rows = pa.table({"application_properties": pa.array([None] * 4, pa.string())})
    view = MessageView(rows, [{"a": "x"}, ["not", "a", "dict"], {"a": "x"}, {"a": "y"}])
    copies = select([compile_sql("r", "a = 'x'", {})], view, np.ones(4, dtype=bool))
    assert copies.plain.tolist() == [True, False, True, False]
    assert copies.dead_letter.tolist() == [False, True, False, False]
    assert copies.reasons[1].startswith("rule 'r': the message cannot be evaluated:") and copies.skipped == []


def test_select_skips_a_rule_that_raises_for_no_message_at_all():
    view = MessageView(pa.table({"application_properties": pa.array(['{"a":["int",1]}'] * 3)}))
    broken = compile_sql("broken", "a = @p", {"@p": 2**70})
    copies = select([broken, compile_sql("fine", "a = 1", {})], view, np.ones(3, dtype=bool))
    assert copies.plain.tolist() == [True] * 3 and not copies.dead_letter.any()
    [(name, error)] = copies.skipped
    assert name == "broken" and "parameter @p" in error and "64-bit" in error


# ---- the fan-out query (Spark) ---------------------------------------------------------------------------

def wait_for(client, topic, sub, ids, seconds=60):
    """Copies received from the subscription until the ids came (or seconds passed), as message ids."""
    deadline, got = time.monotonic() + seconds, []
    while time.monotonic() < deadline and sorted(got) != sorted(ids):
        with client.get_subscription_receiver(topic, sub, max_wait_time=0.5) as receiver:
            found = receiver.receive_messages(50)
            receiver.complete_messages(found)
        got += [m.message_id for m in found]
    return got


@pytest.mark.slow
@pytest.mark.spark
def test_the_fan_out_query_goes_on_past_poisoned_messages_and_deleted_topics(spark, admin, client, ns_path):
    admin.create_topic("t")
    only_rules(admin, "reads", [("r", SqlRuleFilter("a = 'x'"), None)])
    with client.get_topic_sender("t") as sender:
        sender.send_messages(messages(["ok-1", "bad"]))
    poison(admin, "t", "bad", POISONS["surrogate-value"])
    query = start_fanout(spark, ns_path, trigger={"processingTime": "200 milliseconds"})
    try:
        assert wait_for(client, "t", "reads", ["ok-1"]) == ["ok-1"]
        for _ in range(3):                                                    # topics deleted under the query
            admin.create_topic("doomed")
            for sub in ("a", "b"):
                admin.create_subscription("doomed", sub)
            with client.get_topic_sender("doomed") as sender:
                sender.send_messages(messages([f"d{i}" for i in range(30)]))
            time.sleep(0.3)                                                   # let a batch start on it
            admin.delete_topic("doomed")
        with client.get_topic_sender("t") as sender:
            sender.send_messages(messages(["ok-2"]))
        assert wait_for(client, "t", "reads", ["ok-2"]) == ["ok-2"]
        assert query.isActive and query.exception() is None
    finally:
        query.stop()
    [dead] = received(client, "reads", dead_letter=True)
    assert dead.message_id == "bad" and dead.dead_letter_reason == "FilterEvaluationException"


def test_a_dead_letter_copy_is_not_active_before_its_state_row_is_written(admin, client, ns_path):
    """Fan-out commits a dead-letter copy, then its dead-lettered state row (another table, a second commit).
    In between, as here with the state row taken away again, the copy's own row keeps it from receivers of
    the active queue (a receiver polling a local namespace sees the copy within milliseconds) and a
    dead-letter receiver finds it with its reason."""
    admin.create_topic("t")
    only_rules(admin, "reads", [("r", SqlRuleFilter("a = 'x'"), None)])
    with client.get_topic_sender("t") as sender:
        sender.send_messages(messages(["bad", "ok"]))
    poison(admin, "t", "bad", POISONS["surrogate-value"])
    fanout.drain(Catalog(normalize(ns_path)), "t")
    subscription = resolve_current(admin._catalog, "t/Subscriptions/reads", ("subscription",))
    storage.open_table(subscription.tables["locks"]).delete()  # as before fan-out's second commit
    with client.get_subscription_receiver("t", "reads") as receiver:
        assert [m.message_id for m in receiver.receive_messages(10, max_wait_time=0)] == ["ok"]
        assert receiver.receive_messages(10, max_wait_time=0) == []
    with client.get_subscription_receiver("t", "reads", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dead_letters:
        [dead] = dead_letters.receive_messages(10, max_wait_time=0)
        assert (dead.message_id, dead.dead_letter_reason) == ("bad", "FilterEvaluationException")
        assert "rule 'r'" in dead.dead_letter_error_description
