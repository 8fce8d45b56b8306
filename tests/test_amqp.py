"""AMQP bodies and sections: the pure codec, AmqpAnnotatedMessage through a queue, a topic and forwarding, and
ServiceBusReceivedMessage.from_bytes."""
from __future__ import annotations

import os
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings, strategies as st

import sparkbus
from sparkbus import ServiceBusMessage, ServiceBusReceivedMessage
from sparkbus.amqp import AmqpAnnotatedMessage, AmqpMessageBodyType, AmqpMessageHeader, AmqpMessageProperties
from sparkbus.core import amqp
from sparkbus.engine import fanout, forwarding
from sparkbus.engine.catalog import Catalog

# Values as they come back from the codec: strings as bytes, no tuples, no datetimes (ms integers).
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(allow_nan=False),
                     st.binary(max_size=300), st.uuids())
_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(st.one_of(st.binary(max_size=8), st.integers(0, 9)), inner,
                                                 max_size=4)), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(_values)
def test_codec_round_trips_every_value(value):
    assert amqp.decode(amqp.encode(value)) == value


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_decoding_random_bytes_gives_a_value_or_value_error(data):
    try:
        amqp.decode_message(data)
    except ValueError:
        pass


def test_codec_reads_the_wire_forms_and_refuses_what_amqp_cannot_carry():
    assert amqp.decode(b"\xa1\x03abc") == b"abc"  # str8 comes back as bytes, as azure-servicebus decodes it
    assert amqp.decode(b"\xb3\x00\x00\x00\x01x") == b"x"  # sym32
    assert amqp.decode(b"\xe0\x07\x03\x54\x01\x02\x03") == [1, 2, 3]  # array8 of smallint
    assert amqp.wire_form({"k": ["v", datetime(1970, 1, 1, 0, 0, 1, tzinfo=timezone.utc)]}) == {b"k": [b"v", 1000]}
    with pytest.raises(TypeError, match="AMQP cannot carry a value of type set"):
        amqp.encode({1, 2})
    with pytest.raises(ValueError, match="does not fit in 64 bits"):
        amqp.encode(2**64)
    with pytest.raises(ValueError, match="truncated"):
        amqp.decode(b"\xa0\x05ab")
    with pytest.raises(ValueError, match="left over"):
        amqp.decode(b"\x40\x40")
    with pytest.raises(ValueError, match="out of order"):
        amqp.decode_message(amqp.section(amqp.PROPERTIES, []) + amqp.section(amqp.HEADER, []) + amqp.encode_body("data", [b"x"]))
    with pytest.raises(ValueError, match="exactly one kind"):
        amqp.decode_message(amqp.encode_body("data", [b"x"]) + amqp.encode_body("value", 1))
    big = [b"x" * 300, list(range(100)), {b"k" * 300: None}]  # the four-byte size and count forms
    assert amqp.decode(amqp.encode(big)) == big


def test_annotated_message_validation():
    with pytest.raises(ValueError, match="one and only one"):
        AmqpAnnotatedMessage(data_body=b"a", value_body=1)
    with pytest.raises(ValueError, match="one and only one"):
        AmqpAnnotatedMessage()
    with pytest.raises(TypeError, match="unexpected keyword arguments"):
        AmqpAnnotatedMessage(body=b"a")
    with pytest.raises(TypeError, match="AMQP cannot carry"):
        AmqpAnnotatedMessage(value_body=object())
    message = AmqpAnnotatedMessage(sequence_body=[1, "two"], header={"priority": 5}, properties={"subject": "s"})
    assert message.body_type == AmqpMessageBodyType.SEQUENCE and list(message.body) == [[1, "two"]]
    assert message.header["priority"] == 5 and message.properties.get("subject") == "s"
    assert str(AmqpAnnotatedMessage(data_body=["a", b"b"])) == "ab"


def test_three_body_kinds_round_trip_through_a_queue(admin, client):
    admin.create_queue("q")
    sent = [AmqpAnnotatedMessage(data_body=[b"aa", b"bb", b"cc"], application_properties={"body_type": "data"}),
            AmqpAnnotatedMessage(sequence_body=[b"message", 123.456, True], properties={"subject": "sequence",
                                                                                       "message_id": "seq-1"}),
            AmqpAnnotatedMessage(value_body={b"key": [-123, b"data", False], "when": datetime(2026, 1, 1)},
                                 header={"time_to_live": 60_000}, annotations={"x-opt-partition-key": "pk"}),
            ServiceBusMessage([b"one", "two"]),
            ServiceBusMessage("plain", application_properties={"color": "red", "n": 3,
                                                               "at": datetime(2026, 1, 1, tzinfo=timezone.utc)})]
    with client.get_queue_sender("q") as sender:
        sender.send_messages(sent)
    with client.get_queue_receiver("q") as receiver:
        got = sorted(receiver.receive_messages(10, max_wait_time=2), key=lambda m: m.sequence_number)
        assert [m.body_type for m in got] == ["data", "sequence", "value", "data", "data"]
        assert list(got[0].body) == [b"aa", b"bb", b"cc"] and str(got[0]) == "aabbcc"
        assert got[0].application_properties == {b"body_type": b"data"}
        assert list(got[1].body) == [[b"message", 123.456, True]]
        assert (got[1].subject, got[1].message_id) == ("sequence", "seq-1")
        assert got[2].body == {b"key": [-123, b"data", False], b"when": 1767225600000}
        assert got[2].time_to_live == timedelta(minutes=1) and got[2].partition_key == "pk"
        assert list(got[3].body) == [b"one", b"two"]
        plain = got[4]
        assert plain.body == b"plain" and list(plain.body) == [b"plain"] and plain.body_bytes == b"plain"
        assert plain.application_properties == {b"color": b"red", b"n": 3, b"at": 1767225600000}
        assert plain.str_application_properties == {"color": "red", "n": 3,
                                                    "at": datetime(2026, 1, 1, tzinfo=timezone.utc)}
        raw = got[2].raw_amqp_message
        assert raw.body_type == AmqpMessageBodyType.VALUE and raw.header.time_to_live == 60_000
        assert raw.annotations[b"x-opt-sequence-number"] == got[2].sequence_number
        assert raw.annotations[b"x-opt-partition-key"] == b"pk" and raw.header.delivery_count == 1
        assert raw.annotations[b"x-opt-locked-until"] > raw.annotations[b"x-opt-enqueued-time"]
        # what a received message carries can be sent again as it is (bytes keys included)
        with client.get_queue_sender("q") as sender:
            sender.send_messages(ServiceBusMessage(plain.body, application_properties=plain.application_properties))
        receiver.complete_messages(got)
        again = receiver.receive_messages(1, max_wait_time=2)[0]
        assert again.str_application_properties == {"color": b"red", "n": 3, "at": 1767225600000}
        receiver.complete_message(again)


def test_bodies_survive_fan_out_and_forwarding(admin, client, ns_path):
    admin.create_queue("dest")
    admin.create_topic("t")
    admin.create_subscription("t", "s", forward_to="dest")
    with client.get_topic_sender("t") as sender:
        sender.send_messages(AmqpAnnotatedMessage(value_body=[1, {b"a": None}]))
    catalog = Catalog(os.path.abspath(ns_path))
    fanout.drain(catalog, "t")
    forwarding.forward_all(catalog)
    with client.get_queue_receiver("dest") as receiver:
        got = receiver.receive_messages(1, max_wait_time=5)
        assert [(m.body_type, m.body) for m in got] == [("value", [1, {b"a": None}])]
        receiver.complete_messages(got)


def test_from_bytes_reads_payloads_with_and_without_broker_sections():
    minimal = ServiceBusReceivedMessage.from_bytes(b"\x00Su\xa0\x0fminimal payload")
    assert str(minimal) == "minimal payload" and list(minimal.body) == [b"minimal payload"]
    assert (minimal.sequence_number, minimal.lock_token, minimal.enqueued_time_utc) == (None, None, None)
    token = uuid.uuid4()
    payload = amqp.encode_message(amqp.Sections(
        body_type="value", body={b"k": 1},
        header={"delivery_count": 2, "time_to_live": 5000},
        delivery_annotations={b"x-opt-lock-token": token},
        annotations={b"x-opt-sequence-number": 42, b"x-opt-enqueued-time": 1767225600000,
                     b"x-opt-partition-key": b"pk", b"custom": b"kept"},
        properties={"message_id": b"m-1", "subject": b"hello", "group_id": b"s-1"},
        application_properties={b"color": b"red"}, footer={b"f": 1}))
    m = ServiceBusReceivedMessage.from_bytes(payload)
    assert (m.sequence_number, m.delivery_count, m.lock_token, m.message_id, m.subject, m.session_id,
            m.partition_key) == (42, 2, str(token), "m-1", "hello", "s-1", "pk")
    assert m.enqueued_time_utc == datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert m.expires_at_utc == m.enqueued_time_utc + timedelta(seconds=5)
    assert m.body == {b"k": 1} and m.application_properties == {b"color": b"red"}
    raw = m.raw_amqp_message
    assert raw.annotations[b"custom"] == b"kept" and raw.footer == {b"f": 1}
    assert raw.delivery_annotations == {b"x-opt-lock-token": token}
    with pytest.raises(TypeError, match="must be bytes"):
        ServiceBusReceivedMessage.from_bytes("text")
    for bad in (b"", b"\x00Su", b"\x40", b"\x00Sw\x40\x00Sw\x40"):
        with pytest.raises(ValueError):
            ServiceBusReceivedMessage.from_bytes(bad)


def test_a_from_bytes_message_cannot_be_settled(admin, client):
    admin.create_queue("q")
    m = ServiceBusReceivedMessage.from_bytes(b"\x00Su\xa0\x01x")
    with client.get_queue_receiver("q") as receiver:
        with pytest.raises(sparkbus.InvalidOperationError, match="from_bytes has no receiver"):
            receiver.complete_message(m)


def test_a_from_bytes_message_without_a_lock_end_is_not_registered_for_renewal(admin, client):
    """A payload with a lock token but no x-opt-locked-until: the renewer has no lock end to renew before."""
    admin.create_queue("q")
    payload = amqp.encode_message(amqp.Sections(body_type="value", body=b"x",
                                                delivery_annotations={b"x-opt-lock-token": uuid.uuid4()}))
    m = ServiceBusReceivedMessage.from_bytes(payload)
    assert m.lock_token is not None and m.locked_until_utc is None
    with client.get_queue_receiver("q") as receiver, sparkbus.AutoLockRenewer() as renewer:
        with pytest.raises(ValueError, match="no locked_until_utc"):
            renewer.register(receiver, m)


def test_service_bus_message_exposes_its_amqp_form():
    m = ServiceBusMessage("hi", subject="s", session_id="sess", partition_key="sess", application_properties={b"k": 1},
                          time_to_live=timedelta(seconds=3))
    assert m.application_properties == {"k": 1} and m.body_type == AmqpMessageBodyType.DATA
    raw = m.raw_amqp_message
    assert list(raw.body) == [b"hi"] and raw.properties.group_id == "sess" and raw.header.time_to_live == 3000
    assert isinstance(raw.properties, AmqpMessageProperties) and isinstance(raw.header, AmqpMessageHeader)
    again = ServiceBusMessage.from_amqp(raw)
    assert (str(again), again.subject, again.session_id, again.time_to_live) == ("hi", "s", "sess", timedelta(seconds=3))
