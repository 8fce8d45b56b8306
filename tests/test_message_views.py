"""Received messages are views of the Arrow rows their receive read and wrote: attributes are read from the
columns when first asked for, and only rows that may not decode are decoded in full at receive time.

These tests hold the views to what a received message was when it was built eagerly from a row dict: every
public attribute is compared with a reference computed here the old way (from the rows read straight from
the entity's Delta tables) and with what was sent; settlement of views (alone, in batches, mixed with
renewed locks), dead-letter sub-queues, peek, RECEIVE_AND_DELETE and data files written before newer
columns existed all behave as before. The vectorised check that lets plain rows skip the full decode is
tested against its guarantee: a row it lets through always decodes."""
from __future__ import annotations

import os
import uuid
from datetime import datetime, timedelta, timezone
from typing import Optional

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import stored_messages
from deltalake import DeltaTable, write_deltalake
from hypothesis import HealthCheck, given, settings, strategies as st

from sparkbus import (MessageAlreadySettled, ServiceBusClient, ServiceBusMessage, ServiceBusReceivedMessage,
                      ServiceBusReceiveMode, ServiceBusSubQueue, storage)
from sparkbus.amqp import AmqpAnnotatedMessage, AmqpMessageBodyType
from sparkbus.core import records
from sparkbus.core import amqp
from sparkbus.core.forwarding import DEAD_LETTER_DESCRIPTION_PROPERTY, DEAD_LETTER_REASON_PROPERTY
from sparkbus.core.values import check_properties, decode_properties, encode_properties
from sparkbus.engine.delivery import DECODE_ERRORS
from sparkbus.exceptions import InvalidOperationError
from sparkbus.receiver import (_FEW_ROWS, _LONGEST_TTL_MS, _PLAIN_PROPERTIES, _SHORTEST_TTL_MS,
                               ServiceBusMessageState, _needs_check, _plain_properties)
from sparkbus.core.schemas import MESSAGES

UTC = timezone.utc
INDIA = timezone(timedelta(hours=5, minutes=30))
COLUMN_FIELDS = ("message_id", "session_id", "partition_key", "correlation_id", "content_type", "subject", "to",
                 "reply_to", "reply_to_session_id", "sequence_number", "enqueued_time_utc",
                 "scheduled_enqueue_time_utc", "expires_at_utc")
PUBLIC = (*COLUMN_FIELDS, "str_application_properties", "application_properties", "time_to_live", "state",
          "delivery_count", "lock_token", "locked_until_utc", "dead_letter_reason", "dead_letter_error_description",
          "dead_letter_source", "size_in_bytes", "body_bytes", "body_type", "enqueued_sequence_number")

# Property values of every type, plain (the vectorised check lets them through) and not (decoded in full).
PLAIN_PROPERTIES = {"text": "order ü ☃ \"quoted\" \\ /", "empty": "", "int": -5, "long": 2**59, "float": 1.5,
                    "tiny": 5e-324, "inf": float("inf"), "nan": float("nan"), "flag": True, "off": False, "none": None,
                    "bytes": b"\x00\xff\x10", "empty bytes": b"", "when": datetime(2024, 3, 31, 23, 59, 59, 1, INDIA),
                    "utc": datetime(2025, 1, 28, tzinfo=UTC), "id": uuid.UUID("12345678-1234-5678-1234-567812345678")}
CHECKED_PROPERTIES = {"emoji": "😀", "leap": datetime(2024, 2, 29, tzinfo=UTC), "digits": 1234567890123456789,
                      "minimum": -2**63}


def every_kind() -> list[ServiceBusMessage]:
    """Messages with every system property, property type and body kind (AMQP bodies are checked in full)."""
    system = dict(partition_key="pk", correlation_id="corr", content_type="application/json", subject="subj",
                  to="dest", reply_to="back", reply_to_session_id="rs", time_to_live=timedelta(hours=1, milliseconds=7))
    return [
        ServiceBusMessage(b"plain", message_id="plain", application_properties=PLAIN_PROPERTIES, **system),
        ServiceBusMessage("checked", message_id="checked", application_properties={**PLAIN_PROPERTIES,
                                                                                     **CHECKED_PROPERTIES}),
        ServiceBusMessage(None, message_id="bare"),
        ServiceBusMessage(b"old", message_id="scheduled",
                          scheduled_enqueue_time_utc=datetime.now(UTC) - timedelta(minutes=1)),
        ServiceBusMessage("forwarded", message_id="forwarded",
                          application_properties={DEAD_LETTER_REASON_PROPERTY: "why",
                                                  DEAD_LETTER_DESCRIPTION_PROPERTY: "what"}),
        ServiceBusMessage.from_amqp(AmqpAnnotatedMessage(data_body=[b"a", b"b"], properties={"message_id": "data"})),
        ServiceBusMessage.from_amqp(AmqpAnnotatedMessage(sequence_body=[[1, "two"]],
                                                         properties={"message_id": "sequence"})),
        ServiceBusMessage.from_amqp(AmqpAnnotatedMessage(value_body={"k": [1, b"x", None]},
                                                         properties={"message_id": "value"})),
    ]


def stored_state_rows(admin, entity: str) -> dict[int, dict]:
    table = storage.open_table(admin.get_entity_tables(entity)["locks"])
    return {row["sequence_number"]: row for row in records.as_rows(storage.query("SELECT * FROM locks", locks=table))}


def reference(row: dict, state_row: dict, state: ServiceBusMessageState) -> dict:
    """A received message's public attributes as the eager constructor computed them from row dicts."""
    properties = decode_properties(row["application_properties"])
    ttl = row["time_to_live_ms"]
    return {**{name: row[name] for name in COLUMN_FIELDS}, "str_application_properties": properties,
            "application_properties": amqp.wire_form(properties),
            "time_to_live": None if ttl is None else timedelta(milliseconds=ttl), "state": state,
            "delivery_count": state_row.get("delivery_count", row.get("prior_deliveries", 0)) or 0,
            "lock_token": state_row.get("lock_token"), "locked_until_utc": state_row.get("locked_until_utc"),
            "dead_letter_reason": state_row.get("dead_letter_reason") or properties.get(DEAD_LETTER_REASON_PROPERTY),
            "dead_letter_error_description": (state_row.get("dead_letter_error_description")
                                              or properties.get(DEAD_LETTER_DESCRIPTION_PROPERTY)),
            "dead_letter_source": state_row.get("dead_letter_source") or row.get("dead_letter_source_entity"),
            "size_in_bytes": row["body_size"] + row["header_size"], "body_bytes": bytes(row["body"]),
            "body_type": amqp.DATA if row["body_type"] is None else row["body_type"],
            "enqueued_sequence_number": row["sequence_number"]}


def same(a, b) -> bool:
    """Equal, NaN equal to NaN, and of the same type (inside dicts too)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    return type(a) is type(b) and a == b


def body_of(message) -> object:
    body = message.body
    return body if message.body_type.value == "value" else [bytes(s) if isinstance(s, (bytes, memoryview)) else s
                                                             for s in body]


def raw(message: ServiceBusReceivedMessage) -> tuple:
    amqp_message = message.raw_amqp_message
    return (amqp_message.body_type, body_of(amqp_message), dict(amqp_message.header.items()),
            dict(amqp_message.properties.items()) if amqp_message.properties else None,
            amqp_message.application_properties, amqp_message.annotations)


def assert_as_reference(message: ServiceBusReceivedMessage, row: dict, state_row: dict) -> None:
    expected = reference(row, state_row, message.state)
    for name in PUBLIC:
        got = getattr(message, name)
        if name == "body_type":
            got = got.value
        assert same(got, expected[name]), (name, got, expected[name])
    old = ServiceBusReceivedMessage(row, state_row, message.state)  # the eager constructor, from row dicts
    assert body_of(message) == body_of(old)
    assert str(message) == str(old) and repr(message) == repr(old)
    assert raw(message) == raw(old)


# ---- the vectorised check --------------------------------------------------------------------------------

def rows_with(texts: list, **columns) -> pa.Table:
    n = len(texts)
    return pa.table({"application_properties": pa.array(texts, pa.string()),
                     "time_to_live_ms": columns.get("ttl", pa.nulls(n, pa.int64())),
                     "body_type": columns.get("body_type", pa.nulls(n, pa.string())),
                     "body_size": columns.get("body_size", pa.array([1] * n, pa.int64())),
                     "header_size": columns.get("header_size", pa.array([1] * n, pa.int64()))})


def decodes(text: str) -> bool:
    """What a receive's full decode of the properties does: decode, check, wire form."""
    try:
        properties = decode_properties(text)
        check_properties(properties, "application_properties")
        amqp.wire_form(properties)
    except DECODE_ERRORS:
        return False
    return True


def engines_agree(text: Optional[str]) -> bool:
    """Python's re (a few distinct texts) and Arrow's RE2 (more) take the same view of text, which is
    matched once however many rows repeat it."""
    alone = _plain_properties(pa.chunked_array([pa.array([text], pa.string())])).tolist()
    others = [encode_properties({"n": i}) for i in range(_FEW_ROWS + 1)]  # distinct, plain
    many = _plain_properties(pa.chunked_array([pa.array([text] + others, pa.string())])).tolist()
    repeated = _plain_properties(pa.chunked_array([pa.array([text] * (_FEW_ROWS + 1), pa.string())])).tolist()
    return alone == many[:1] == repeated[:1] and all(many[1:]) and len(set(repeated)) == 1


def test_plain_properties_of_every_type_skip_the_full_decode_and_the_others_do_not():
    texts = [encode_properties(PLAIN_PROPERTIES), None, "{}", encode_properties({"a": "x"})]
    assert _needs_check(rows_with(texts)).tolist() == [False] * 4
    checked = [encode_properties({name: value}) for name, value in CHECKED_PROPERTIES.items()] + [
        "", '{"a": ["str","x"]}', '{"a":["str",5]}', '{"a":["timedelta","PT1S"]}', '{"a":["list",[1]]}',
        '{"a":["bytes","AB="]}', '{"a":["datetime","2024-02-30T00:00:00+00:00"]}',
        '{"a":["datetime","2024-01-01T00:00:00"]}', '{"a":["uuid","x"]}', '["str","x"]', '{"a":["str","x"]}x']
    assert _needs_check(rows_with(checked)).tolist() == [True] * len(checked)
    # most of them decode: the check is only cautious
    assert [decodes(t) for t in checked] == [True] * 7 + [False] * 4 + [True, False, False, False]


def test_rows_that_other_columns_make_undecodable_are_checked():
    n = 6
    table = rows_with([None] * n, ttl=pa.array([None, _LONGEST_TTL_MS, _SHORTEST_TTL_MS, 1, 1, 1], pa.int64()),
                      body_type=pa.array([None, None, None, "value", None, None]),
                      body_size=pa.array([1, 1, 1, 1, None, 1], pa.int64()),
                      header_size=pa.array([1, 1, 1, 1, 1, None], pa.int64()))
    assert _needs_check(table).tolist() == [False, True, True, True, True, True]
    assert _needs_check(rows_with([])).tolist() == []


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.from_regex(_PLAIN_PROPERTIES, fullmatch=True, alphabet=st.characters(codec="utf-8")))
def test_every_text_of_the_plain_grammar_decodes(text):
    assert _needs_check(rows_with([text])).tolist() == [False]
    assert engines_agree(text), text
    assert decodes(text), text


_EDITS = st.lists(st.tuples(st.integers(0, 200), st.sampled_from(list('"\\[]{},:0123456789-+.eEtfnu=/AaZz T\x01\nü'))),
                  max_size=4)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.text(max_size=5), st.one_of(
    st.text(max_size=8), st.integers(-2**63, 2**63 - 1), st.floats(), st.booleans(), st.none(), st.binary(max_size=8),
    st.datetimes(timezones=st.sampled_from([UTC, INDIA])), st.uuids())), _EDITS)
def test_texts_the_check_lets_through_always_decode(properties, edits):
    text = encode_properties(properties)
    for at, character in edits:  # damaged the way another tool might
        text = (text or "")[:at] + character + (text or "")[at + 1:]
    assert engines_agree(text), text
    if _needs_check(rows_with([text])).tolist() == [False]:
        assert text is None or decodes(text), text


def test_values_near_the_limits_of_the_grammar():
    limits = {'{"a":["int",999999999999999999]}': False, '{"a":["int",1000000000000000000]}': True,
              '{"a":["float",999999999999999999]}': False, '{"a":["float",12345678901234567890123]}': True,
              '{"a":["float",12345678901234567890123.5]}': False, '{"a":["float",1e99999]}': False,
              '{"a":["str","\\uffff\\ud7ff\\u0000"]}': False, '{"a":["str","\\ud800"]}': True,
              '{"\\udfff":["str","x"]}': True, '{"a":["str","\\ud83d\\ude00"]}': True,
              '{"a":["datetime","0001-01-01T00:00:00+23:59"]}': False,
              '{"a":["datetime","9999-12-31T23:59:59.999999-23:59:59.999999"]}': False,
              '{"a":["datetime","2023-02-29T00:00:00+00:00"]}': True,
              '{"a":["datetime","2024-04-31T00:00:00+00:00"]}': True, '{"a":["str","x"]}\n': True}
    assert _needs_check(rows_with(list(limits))).tolist() == list(limits.values())
    assert _needs_check(rows_with(list(limits) * _FEW_ROWS)).tolist() == list(limits.values()) * _FEW_ROWS
    assert all(decodes(text) for text, checked in limits.items() if not checked)
    assert [decodes(text) for text, checked in limits.items() if checked] == [True, False, False, False, True, False,
                                                                             False, True]
    assert "\\ud83d" in encode_properties({"a": "😀"})  # written ASCII-escaped: a pair is checked in full


# ---- received views ----------------------------------------------------------------------------------------

def test_received_views_have_every_attribute_as_the_eager_message_had(admin, client):
    admin.create_queue("q", max_delivery_count=5)
    sent = every_kind()
    with client.get_queue_sender("q") as sender:
        sender.send_messages(sent)
    with client.get_queue_receiver("q") as receiver:
        got = receiver.receive_messages(len(sent), max_wait_time=5)
        assert len(got) == len(sent)
        rows = {row["sequence_number"]: row for row in records.as_rows(stored_messages(admin, "q"))}
        states = stored_state_rows(admin, "q")
        for message in got:
            assert_as_reference(message, rows[message.sequence_number], states[message.sequence_number])
        by_id = {m.message_id: m for m in got}
        # independent of the stored rows: what was sent
        plain = by_id["plain"]
        assert same(plain.str_application_properties, PLAIN_PROPERTIES)
        assert plain.application_properties[b"text"] == PLAIN_PROPERTIES["text"].encode()
        assert plain.application_properties[b"when"] == round(PLAIN_PROPERTIES["when"].timestamp() * 1000)
        assert (plain.partition_key, plain.correlation_id, plain.content_type, plain.subject, plain.to,
                plain.reply_to, plain.reply_to_session_id) == ("pk", "corr", "application/json", "subj", "dest",
                                                              "back", "rs")
        assert plain.time_to_live == timedelta(hours=1, milliseconds=7)
        assert plain.expires_at_utc == plain.enqueued_time_utc + plain.time_to_live
        assert bytes(plain.body) == b"plain" and str(plain) == "plain" and plain.session_id is None
        checked = by_id["checked"].str_application_properties
        assert same({k: checked[k] for k in CHECKED_PROPERTIES}, CHECKED_PROPERTIES)
        assert by_id["bare"].str_application_properties == {} and by_id["bare"].application_properties == {}
        assert by_id["bare"].body_bytes == b"" and by_id["bare"].time_to_live is None
        assert by_id["scheduled"].scheduled_enqueue_time_utc is not None
        assert (by_id["forwarded"].dead_letter_reason, by_id["forwarded"].dead_letter_error_description) == \
            ("why", "what")
        # AMQP bodies as after a round trip on the wire (text as UTF-8 bytes)
        assert list(by_id["data"].body) == [b"a", b"b"] and list(by_id["sequence"].body) == [[1, b"two"]]
        assert by_id["value"].body == {b"k": [1, b"x", None]}
        for message in got:
            assert (message.delivery_count, message.state) == (1, ServiceBusMessageState.ACTIVE)
            assert isinstance(message.lock_token, str) and message.locked_until_utc > datetime.now(UTC)
            assert message.dead_letter_source is None
        receiver.complete_messages(got)
    assert admin.get_queue_runtime_properties("q").total_message_count == 0


def test_views_of_one_receive_are_independent_and_their_attributes_can_be_set(admin, client):
    admin.create_queue("q")
    with client.get_queue_sender("q") as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", application_properties={"i": i}) for i in range(3)])
    with client.get_queue_receiver("q") as receiver:
        first, second, third = receiver.receive_messages(3, max_wait_time=5)
        first.str_application_properties["i"] = 99
        first.application_properties[b"extra"] = 1
        assert second.str_application_properties == {"i": 1} and second.application_properties == {b"i": 1}
        assert first.application_properties == {b"i": 0, b"extra": 1}  # each is its own dict, kept
        for name in PUBLIC:
            if name not in ("size_in_bytes", "body_bytes", "body_type", "enqueued_sequence_number"):
                setattr(third, name, f"set {name}")
                assert getattr(third, name) == f"set {name}"
        assert second.subject is None and second.message_id != third.message_id
        receiver.complete_messages([first, second])


def test_views_of_ordinary_bodies_know_their_body_type_without_reading_it(admin, client):
    """A receive whose rows all hold ordinary (one-section data) bodies gives views that start knowing it,
    so reading a body reads one column; a receive with any other body reads each message's type."""
    admin.create_queue("q")
    with client.get_queue_sender("q") as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(3)])
    with client.get_queue_receiver("q") as receiver:
        got = receiver.receive_messages(3, max_wait_time=5)
        assert all("_body_type" in vars(m) for m in got)
        assert [bytes(m.body) for m in got] == [b"m0", b"m1", b"m2"]
        assert {m.body_type for m in got} == {AmqpMessageBodyType.DATA}
        receiver.complete_messages(got)
        with client.get_queue_sender("q") as sender:
            sender.send_messages([ServiceBusMessage("plain"),
                                  ServiceBusMessage.from_amqp(AmqpAnnotatedMessage(sequence_body=[[1, 2]]))])
        plain, sequence = sorted(receiver.receive_messages(2, max_wait_time=5), key=lambda m: m.sequence_number)
        assert "_body_type" not in vars(plain)  # read from its row when asked
        assert (plain.body_type, bytes(plain.body)) == (AmqpMessageBodyType.DATA, b"plain")
        assert sequence.body_type == AmqpMessageBodyType.SEQUENCE and list(sequence.body) == [[1, 2]]
        mixed = [plain, sequence]
        receiver.complete_messages(mixed)


def test_views_settle_as_received_messages_did(admin, client):
    admin.create_queue("q", enable_partitioning=True, max_delivery_count=3)
    with client.get_queue_sender("q") as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", partition_key=f"k{i % 4}") for i in range(40)])
    with client.get_queue_receiver("q") as receiver:
        got = []
        while len(got) < 40:
            got += receiver.receive_messages(40 - len(got), max_wait_time=5)
        assert len({m.sequence_number >> 48 for m in got}) > 1  # one settlement spans partitions
        abandoned, deferred, dead, renewed, rest = got[0], got[1], got[2], got[3:6], got[6:]
        receiver.abandon_message(abandoned)
        receiver.defer_message(deferred)
        receiver.dead_letter_message(dead, reason="bad", error_description="very")
        before = [m.locked_until_utc for m in renewed]
        for message in renewed:
            assert receiver.renew_message_lock(message) >= before[renewed.index(message)]
            assert message.locked_until_utc == message._state_row["locked_until_utc"]
        assert receiver.complete_messages(renewed + rest) == 37  # renewed (dict rows) and views together
        with pytest.raises(MessageAlreadySettled):
            receiver.complete_message(rest[0])
        again = receiver.receive_messages(5, max_wait_time=5)
        assert [(m.sequence_number, m.delivery_count) for m in again] == [(abandoned.sequence_number, 2)]
        receiver.complete_messages(again)
        [back] = receiver.receive_deferred_messages([deferred.sequence_number])
        assert (back.state, back.delivery_count, back.message_id) == (ServiceBusMessageState.DEFERRED, 2,
                                                                      deferred.message_id)
        receiver.complete_message(back)
    with client.get_queue_receiver("q", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as receiver:
        [shown] = receiver.receive_messages(5, max_wait_time=5)
        assert (shown.message_id, shown.dead_letter_reason, shown.dead_letter_error_description) == \
            (dead.message_id, "bad", "very")
        rows = {row["sequence_number"]: row for row in records.as_rows(stored_messages(admin, "q"))}
        assert_as_reference(shown, rows[shown.sequence_number], stored_state_rows(admin, "q")[shown.sequence_number])
        receiver.complete_message(shown)
    assert admin.get_queue_runtime_properties("q").total_message_count == 0


def test_views_received_and_deleted_and_peeked_match(admin, client):
    admin.create_queue("q")
    with client.get_queue_sender("q") as sender:
        sender.send_messages(every_kind())
    with client.get_queue_receiver("q") as receiver:
        peeked = {m.sequence_number: m for m in receiver.peek_messages(20)}
    with client.get_queue_receiver("q", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as receiver:
        got = receiver.receive_messages(20, max_wait_time=5)
        assert len(got) == len(peeked)
        for message in got:
            assert (message.lock_token, message.locked_until_utc, message._state_row) == (None, None, None)
            assert message.delivery_count == 1
            seen = peeked[message.sequence_number]
            for name in PUBLIC:
                if name not in ("delivery_count", "state"):
                    assert same(getattr(message, name), getattr(seen, name)), name
            with pytest.raises(InvalidOperationError):
                receiver.complete_message(message)
    assert admin.get_queue_runtime_properties("q").total_message_count == 0


def test_a_batch_mixing_plain_checked_and_undecodable_rows(admin, client):
    admin.create_queue("q")
    with client.get_queue_sender("q") as sender:
        sender.send_messages([ServiceBusMessage("x", message_id=f"m{i}", application_properties={
            "i": i, **(CHECKED_PROPERTIES if i % 3 == 0 else {})}) for i in range(30)])
    table = storage.open_table(admin.get_entity_tables("q")["messages"])
    table.update(updates={"application_properties": """'{"a":["str","\\ud800"]}'"""}, predicate="message_id = 'm4'")
    table.update(updates={"application_properties": """'{ "a" : ["str", "spaced"] }'"""},
                 predicate="message_id = 'm5'")  # another tool's JSON: checked in full, and fine
    with client.get_queue_receiver("q") as receiver:
        got = receiver.receive_messages(30, max_wait_time=5)
        assert [m.message_id for m in got] == [f"m{i}" for i in range(30) if i != 4]
        rows = {row["sequence_number"]: row for row in records.as_rows(stored_messages(admin, "q"))}
        states = stored_state_rows(admin, "q")
        for message in got:
            assert_as_reference(message, rows[message.sequence_number], states[message.sequence_number])
        assert got[4].str_application_properties == {"a": "spaced"}
        receiver.complete_messages(got)
    with client.get_queue_receiver("q", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as receiver:
        [dead] = receiver.receive_messages(5, max_wait_time=5)
        assert (dead.message_id, dead.dead_letter_reason, dead.str_application_properties) == \
            ("m4", "MessageDecodeError", {})
        receiver.complete_message(dead)


def test_rows_of_data_files_written_before_newer_columns_read_the_same(admin, client, ns_path):
    """A namespace of an older version: its messages table's first data file lacks the columns added since
    (as the namespace upgrade leaves it: storage.add_missing_columns); a receive batch spans both files."""
    newer = ("transfer_hop_count", "dead_letter_source_entity", "body_type")
    admin.create_queue("scratch")
    admin.create_queue("q")
    old_messages = [ServiceBusMessage(f"old {i}", message_id=f"old{i}", subject="s",
                                      application_properties={"i": i, "when": datetime(2024, 1, 1, tzinfo=UTC)})
                    for i in range(3)]
    with client.get_queue_sender("scratch") as sender:
        sender.send_messages(old_messages)
    old_rows = stored_messages(admin, "scratch").drop_columns(list(newer))
    uri = admin.get_entity_tables("q")["messages"]
    configuration = DeltaTable(uri).metadata().configuration
    storage.remove_tree(uri)  # the queue's table, made again as an older version made it
    old_schema = pa.schema([f for f in MESSAGES if f.name not in newer])
    DeltaTable.create(uri, schema=old_schema, partition_by=["partition_id"], configuration=configuration)
    write_deltalake(uri, old_rows.select(old_schema.names).cast(old_schema), mode="append")
    assert storage.add_missing_columns(uri, MESSAGES) == list(newer)
    [old_file] = [os.path.join(d, f) for d, _, files in os.walk(uri) for f in files if f.endswith(".parquet")]
    assert not set(newer) & set(pq.read_schema(old_file).names)

    client = ServiceBusClient(ns_path)
    with client.get_queue_sender("q") as sender:
        sender.send_messages([ServiceBusMessage(b"new", message_id="new", subject="s",
                                                application_properties={"i": 3})])
    with client.get_queue_receiver("q") as receiver:
        got = receiver.receive_messages(10, max_wait_time=5)
        assert [m.message_id for m in got] == ["old0", "old1", "old2", "new"]
        rows = {row["sequence_number"]: row for row in records.as_rows(stored_messages(admin, "q"))}
        states = stored_state_rows(admin, "q")
        for message in got:
            assert_as_reference(message, rows[message.sequence_number], states[message.sequence_number])
            assert message.dead_letter_source is None and message.body_type.value == "data"
        assert [str(m) for m in got] == ["old 0", "old 1", "old 2", "new"]
        assert got[0].str_application_properties == {"i": 0, "when": datetime(2024, 1, 1, tzinfo=UTC)}
        receiver.complete_messages(got)
    assert admin.get_queue_runtime_properties("q").total_message_count == 0


def test_columns_read_a_table_as_as_rows_does_and_fail_where_as_rows_fails():
    when = datetime(2024, 5, 6, 7, 8, 9, 10, UTC)
    table = pa.table({"n": pa.array([1, None], pa.int64()), "s": pa.array(["a", None]),
                      "t": pa.array([when, None], pa.timestamp("us", tz="UTC"))})
    columns = records.Columns(table)
    assert [dict(records.Row(columns, i)) for i in range(2)] == records.as_rows(table)
    row = records.Row(columns, 0)
    assert (row["t"], row.get("missing", 5), len(row), list(row)) == (when, 5, 3, ["n", "s", "t"])
    with pytest.raises(KeyError):
        row["missing"]
    assert dict(records.Row(records.Columns.of_rows([{"x": 1}]), 0)) == {"x": 1}
    not_utf8 = pa.table({"s": pa.array([b"\xed\xa0\x80"], pa.binary()).view(pa.string())})  # as a Parquet file may hold
    beyond = pa.table({"t": pa.array([2**62], pa.int64()).cast(pa.timestamp("us", tz="UTC"))})
    for bad, error in ((not_utf8, UnicodeDecodeError), (beyond, OverflowError)):
        with pytest.raises(error):
            records.as_rows(bad)
        with pytest.raises(error):
            records.Columns(bad)


def test_session_views(admin, client):
    admin.create_queue("q", requires_session=True)
    with client.get_queue_sender("q") as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", session_id="s1", application_properties={"i": i})
                              for i in range(5)])
    with client.get_queue_receiver("q", session_id="s1") as receiver:
        got = receiver.receive_messages(5, max_wait_time=5)
        rows = {row["sequence_number"]: row for row in records.as_rows(stored_messages(admin, "q"))}
        states = stored_state_rows(admin, "q")
        for message in got:
            assert_as_reference(message, rows[message.sequence_number], states[message.sequence_number])
        assert [(m.session_id, m.str_application_properties) for m in got] == [("s1", {"i": i}) for i in range(5)]
        receiver.session.renew_lock()  # rewrites the state rows the views were locked with
        receiver.complete_messages(got)
    assert admin.get_queue_runtime_properties("q").total_message_count == 0
