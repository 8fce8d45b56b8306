"""Values without a wire form, deep input and out-of-range numbers are refused at the boundary.

Pure tests (no namespace) check every rule of sparkbus.core.wire where it is applied: application
properties (ints beyond the signed 64-bit range, lone surrogates in keys and values), every string field of
a message, changes made to a message after it was constructed (checked again at send), AMQP bodies and
headers, from_bytes, the rule parser (nesting, chains, string literals, id-setting actions), correlation
filters, durations, retry settings and sequence numbers. The end-to-end tests then check, on a real local
namespace, that a refused send, schedule, rule, session state, dead-letter or update writes no file, and
that the entity goes on delivering a normal message afterwards."""
from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone

import pytest

import sparkbus
from sparkbus import ServiceBusMessage, ServiceBusMessageBatch, ServiceBusReceivedMessage, ServiceBusReceiveMode
from sparkbus.amqp import AmqpAnnotatedMessage, AmqpMessageHeader
from sparkbus.core import amqp, wire
from sparkbus.core.durations import MAX_DURATION, MAX_DURATION_TEXT, parse_duration
from sparkbus.core.encoding import STRING_PROPERTIES, suspect_rows
from sparkbus.core.filters import check_action, check_filter
from sparkbus.core.language import compile_correlation, condition, parse_action, parse_filter
from sparkbus.core.language.syntax import Binary
from sparkbus.engine import fanout
from sparkbus.engine.catalog import Catalog
from sparkbus.engine.retry import RetryPolicy
from sparkbus.management import CorrelationRuleFilter, SqlRuleAction, SqlRuleFilter
from sparkbus.message import to_outgoing
from sparkbus.storage.location import normalize
from conftest import files_under

OUT_OF_RANGE_INTS = [2**63, -2**63 - 1, 2**64, 2**100, -10**30]
IN_RANGE_INTS = [2**63 - 1, -2**63, 10**18, 0]
# a lone high surrogate, a lone low one, a high one followed by a non-surrogate, and a pair written as two
# escapes (two lone code points in Python, not one character)
LONE = ["\ud800", "ab\udfff", "\udbffA", "\ud83d\ude00"]
ID_FIELDS = ("message_id", "session_id", "partition_key", "reply_to_session_id")


def nested(levels: int, leaf: object = 1) -> object:
    """leaf inside `levels` lists, built without recursion."""
    for _ in range(levels):
        leaf = [leaf]
    return leaf


# ---- application properties -----------------------------------------------------------------------------

@pytest.mark.parametrize("value", OUT_OF_RANGE_INTS)
def test_property_ints_outside_the_signed_64_bit_range_are_refused_naming_key_and_range(value):
    with pytest.raises(ValueError) as raised:
        ServiceBusMessage("x", application_properties={"a": value})
    text = str(raised.value)
    assert text.startswith("application_properties['a'] = ") and str(value) in text
    assert "-9223372036854775808..9223372036854775807" in text


def test_a_property_int_too_long_to_print_is_described_by_its_size():
    with pytest.raises(ValueError, match="an int of 16610 bits is outside the signed 64-bit range"):
        ServiceBusMessage("x", application_properties={"a": 10**5000})


@pytest.mark.parametrize("value", IN_RANGE_INTS)
def test_property_ints_at_the_edges_of_the_range_are_sent(value):
    rows = to_outgoing([ServiceBusMessage("x", application_properties={"a": value, "f": float("nan")})])
    assert '"a":["int",%d]' % value in rows["application_properties"][0].as_py()


@pytest.mark.parametrize("text", LONE)
def test_lone_surrogates_in_property_keys_and_values_are_refused(text):
    index = next(i for i, c in enumerate(text) if "\ud800" <= c <= "\udfff")
    with pytest.raises(ValueError) as raised:
        ServiceBusMessage("x", application_properties={"k": text})
    assert str(raised.value).startswith("application_properties['k'] holds a lone surrogate")
    assert f"at index {index}" in str(raised.value) and "valid Unicode" in str(raised.value)
    with pytest.raises(ValueError, match="the application_properties key .* holds a lone surrogate"):
        ServiceBusMessage("x", application_properties={text: 1})


def test_valid_unicode_outside_the_basic_plane_is_sent():
    message = ServiceBusMessage("x", subject="\U0001F600", application_properties={"\U0001F600": "\U0001F600 ok"})
    rows = to_outgoing([message])
    assert rows["subject"][0].as_py() == "\U0001F600"


# ---- string fields ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("field", STRING_PROPERTIES)
@pytest.mark.parametrize("text", LONE)
def test_a_lone_surrogate_in_any_string_field_is_a_value_error_naming_the_field(field, text):
    with pytest.raises(ValueError) as raised:
        ServiceBusMessage("x", **{field: text})
    assert str(raised.value).startswith(f"{field} holds a lone surrogate")


@pytest.mark.parametrize("field", ID_FIELDS)
@pytest.mark.parametrize("length", [129, 200, 10_000])
def test_ids_longer_than_128_characters_are_refused(field, length):
    with pytest.raises(ValueError, match=f"{field} must be 1 to 128 characters, got {length}"):
        ServiceBusMessage("x", **{field: "i" * length})
    assert getattr(ServiceBusMessage("x", **{field: "i" * 128}), field) == "i" * 128


# ---- checked again at send --------------------------------------------------------------------------------

@pytest.mark.parametrize("change,error,says", [
    (lambda m: m.application_properties.update(a=2**70), ValueError, "['a'] = 1180591620717411303424 is outside"),
    (lambda m: m.application_properties.update(a=-2**63 - 1), ValueError, "outside the signed 64-bit range"),
    (lambda m: m.application_properties.update(a="\udc00"), ValueError, "application_properties['a'] holds a lone"),
    (lambda m: m.application_properties.update({"\ud800": 1}), ValueError, "key '\\ud800' holds a lone surrogate"),
    (lambda m: m.application_properties.update({1: "one"}), TypeError, "keys must be str, got int"),
    (lambda m: m.application_properties.update(a=[1]), TypeError, "application_properties['a'] has type list"),
    (lambda m: setattr(m, "application_properties", [1]), TypeError, "must be a dict"),
    (lambda m: setattr(m, "subject", "\ud800"), ValueError, "subject holds a lone surrogate"),
    (lambda m: setattr(m, "session_id", "s" * 129), ValueError, "session_id must be 1 to 128 characters"),
    (lambda m: setattr(m, "reply_to_session_id", ""), ValueError, "reply_to_session_id must be 1 to 128"),
    (lambda m: setattr(m, "message_id", 5), TypeError, "message_id must be a str"),
    (lambda m: setattr(m, "time_to_live", 5), TypeError, "time_to_live must be a timedelta"),
])
def test_a_message_changed_after_construction_is_checked_again_at_send(change, error, says):
    for count in (1, 3):
        messages = [ServiceBusMessage(f"m{i}", application_properties={"ok": i}) for i in range(count)]
        change(messages[-1])
        with pytest.raises(error) as raised:
            to_outgoing(messages)
        assert says in str(raised.value)
        if count > 1:
            assert str(raised.value).startswith(f"message {count - 1} of {count}: ")
    batch = ServiceBusMessageBatch(10 ** 6)  # a batch checks what changed since construction too
    with pytest.raises(error) as raised:
        batch.add_message(messages[-1])
    assert says in str(raised.value) and len(batch) == 0


def test_the_fast_check_flags_suspect_rows_only_and_the_exact_check_passes_valid_ones():
    plain = [ServiceBusMessage("x", application_properties={"n": 1, "s": "text"}) for _ in range(3)]
    valid_but_suspect = [ServiceBusMessage("x", application_properties={"e": "\U0001F600"}),
                         ServiceBusMessage("x", application_properties={"n": 2**63 - 1}),
                         ServiceBusMessage("x", application_properties={"s": "1234567890123456789012"})]
    rows = to_outgoing(plain + valid_but_suspect)  # the flagged rows pass the exact check
    assert suspect_rows(rows).tolist() == [3, 4, 5]
    assert suspect_rows(to_outgoing(plain)).tolist() == []


# ---- AMQP bodies, headers and payloads -------------------------------------------------------------------

@pytest.mark.parametrize("body,says", [
    ("\ud800", "value_body holds a lone surrogate '\\ud800' at index 0"),
    ({"k": ["ok", "a\udfff"]}, "value_body['k'][1] holds a lone surrogate"),
    ({"\udc00": 1}, "value_body key '\\udc00' holds a lone surrogate"),
    ([1, 2**64], "value_body[1] holds the int 18446744073709551616, which does not fit in 64 bits"),
    (nested(65), "is nested deeper than 64 levels of lists and maps"),
    (nested(5000), "is nested deeper than 64 levels of lists and maps"),
])
def test_a_value_body_without_an_amqp_encoding_is_a_value_error_saying_where(body, says):
    with pytest.raises(ValueError) as raised:
        AmqpAnnotatedMessage(value_body=body)
    assert says in str(raised.value)


def test_a_self_referencing_or_later_changed_body_is_refused_at_send():
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError, match="nested deeper than 64"):
        AmqpAnnotatedMessage(value_body=loop)
    body = [1]
    message = AmqpAnnotatedMessage(value_body=body)
    body.append("\ud800")  # the caller's list, changed after construction
    with pytest.raises(ValueError, match=r"value_body\[1\] holds a lone surrogate"):
        ServiceBusMessage.from_amqp(message)
    with pytest.raises(ValueError, match=r"sequence_body\[0\]\[0\] holds a lone surrogate"):
        AmqpAnnotatedMessage(sequence_body=[["\ud800"]])


def test_a_body_64_levels_deep_is_sent_and_read_back():
    body = nested(64, "leaf")
    message = ServiceBusMessage.from_amqp(AmqpAnnotatedMessage(value_body=body))
    assert message.body == amqp.wire_form(body)  # strings come back as bytes, as over the wire
    assert ServiceBusReceivedMessage.from_bytes(amqp.encode_body("value", body)).body == amqp.wire_form(body)


@pytest.mark.parametrize("data", [
    b"\x00\x53\x77" + b"\xc0\x02\x01" * 5000 + b"\x40",                          # lists in lists
    b"\x00\x53\x77" + b"\xc1\x03\x02\x40" * 5000 + b"\x40",                      # maps in maps
    b"\x00" * 5000 + b"\x40",                                                   # described in described
    b"\x00\x53\x77\xe0" + b"\x03\x01\xe0" * 5000 + b"\x02\x00\x40",               # arrays of arrays
])
def test_from_bytes_of_deeply_nested_data_is_a_value_error(data):
    with pytest.raises(ValueError, match="nested deeper than 64 levels"):
        ServiceBusReceivedMessage.from_bytes(data)
    with pytest.raises(ValueError, match="nested deeper than 64 levels"):
        amqp.decode(data[3:] if data.startswith(b"\x00\x53") else data)


def test_from_bytes_of_an_array_claiming_billions_of_empty_elements_is_refused_at_once():
    for element in (0x40, 0x41, 0x45):
        data = b"\x00\x53\x77\xf0\x00\x00\x00\x05\xff\xff\xff\xff" + bytes((element,))
        with pytest.raises(ValueError, match="an AMQP array of 4294967295 elements cannot fit"):
            ServiceBusReceivedMessage.from_bytes(data)


@pytest.mark.parametrize("header", [
    amqp.section(amqp.HEADER, [None, None, 2**64 - 1]),
    amqp.section(amqp.HEADER, [None, None, 2**32]),
    amqp.section(amqp.MESSAGE_ANNOTATIONS, {b"x-opt-locked-until": 2**63 - 1}),
    amqp.section(amqp.MESSAGE_ANNOTATIONS, {b"x-opt-enqueued-time": -2**63}),
])
def test_from_bytes_with_out_of_range_times_is_a_value_error(header):
    with pytest.raises(ValueError, match="not a valid AMQP 1.0 message payload"):
        ServiceBusReceivedMessage.from_bytes(header + amqp.encode_body("data", [b"x"]))


@pytest.mark.parametrize("ttl", [2**32, 2**70, -1])
def test_an_amqp_header_time_to_live_outside_the_uint_range_is_refused(ttl):
    message = AmqpAnnotatedMessage(value_body=1, header=AmqpMessageHeader(time_to_live=ttl))
    with pytest.raises(ValueError, match=r"header time_to_live = .* ms is outside the AMQP uint range 0..4294967295"):
        ServiceBusMessage.from_amqp(message)


def test_the_largest_amqp_ttl_is_sent_and_a_longer_time_to_live_is_given_as_it():
    top = AmqpAnnotatedMessage(value_body=1, header=AmqpMessageHeader(time_to_live=wire.MAX_AMQP_TTL_MS))
    assert ServiceBusMessage.from_amqp(top).time_to_live == timedelta(milliseconds=wire.MAX_AMQP_TTL_MS)
    raw = ServiceBusMessage("x", time_to_live=timedelta(days=100)).raw_amqp_message
    assert raw.header.time_to_live == wire.MAX_AMQP_TTL_MS
    assert ServiceBusMessage.from_amqp(raw).time_to_live == timedelta(milliseconds=wire.MAX_AMQP_TTL_MS)


def test_a_scheduled_time_annotation_beyond_year_9999_is_a_value_error():
    message = AmqpAnnotatedMessage(value_body=1, annotations={b"x-opt-scheduled-enqueue-time": 2**62})
    with pytest.raises(ValueError, match="x-opt-scheduled-enqueue-time = 4611686018427387904 ms .* years 1 to 9999"):
        ServiceBusMessage.from_amqp(message)


# ---- the rule language ------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,position", [
    ("(" * 65 + "a = 1" + ")" * 65, 64),
    ("(" * 500 + "a = 1" + ")" * 500, 64),
    ("a = " + "-" * 1000 + "1", 68),
    ("a = " + "+" * 65 + "1", 68),
    ("NOT " * 65 + "a = 1", 256),
    ("a = " + "-(" * 40 + "1" + ")" * 40, 68),
    ("property(" * 65 + "'a'" + ")" * 65 + " = 1", 576),
])
def test_expressions_nested_deeper_than_the_limit_are_refused_with_the_position(text, position):
    with pytest.raises(ValueError) as raised:
        parse_filter(text)
    assert f"position {position}: the expression is nested deeper than 64 levels" in str(raised.value)


@pytest.mark.parametrize("text", [
    "a = " + " + ".join(["1"] * 65),
    "a = " + " * ".join(["2"] * 100),
    "a = (" + " + ".join(["1"] * 40) + ")" + " - 1" * 30,
])
def test_operator_chains_deeper_than_the_limit_are_refused(text):
    with pytest.raises(ValueError, match="nested deeper than 64 levels of operators"):
        parse_filter(text)


def test_nesting_up_to_the_limit_parses_and_long_and_or_chains_stay_shallow():
    parse_filter("(" * 64 + "a = 1" + ")" * 64)
    parse_filter("a = " + "-" * 63 + "1")
    parse_filter("a = " + " + ".join(["1"] * 63))
    tree = parse_filter(" OR ".join(f"a={i}" for i in range(100)))  # 100 comparisons: a balanced tree
    depth, stack = 0, [(tree, 1)]
    while stack:
        node, level = stack.pop()
        depth = max(depth, level)
        if isinstance(node, Binary):
            stack += [(node.left, level + 1), (node.right, level + 1)]
    assert depth <= 10


def view_of(*properties: dict):
    """A MessageView of messages with these application properties (what a filter evaluates)."""
    import pyarrow as pa
    from sparkbus.core.language import MessageView

    rows = to_outgoing([ServiceBusMessage(f"m{i}", application_properties=p) for i, p in enumerate(properties)])
    return MessageView(rows.append_column("sequence_number", pa.array(range(len(properties)), pa.int64())))


@pytest.mark.parametrize("op", ["AND", "OR"])
def test_a_balanced_and_or_chain_evaluates_as_the_left_to_right_one(op):
    """Matches, unknowns (NULL) and evaluation errors (a str compared with an int) come out the same."""
    terms = ["a = 1", "b > 2", "c IS NULL", "a = 'x'", "NOT (b = 5)", "d LIKE 'y%'", "a + 1 = 2"]
    view = view_of({"a": 1, "b": 3, "d": "yes"}, {"a": "x", "b": 5}, {}, {"a": 2, "b": 1, "c": 0, "d": None},
                   {"a": None, "b": "s"})
    left_to_right = parse_filter(terms[0])
    for term in terms[1:]:
        left_to_right = Binary(op.lower(), left_to_right, parse_filter(term))
    balanced = parse_filter(f" {op} ".join(terms))
    assert balanced != left_to_right  # a different shape...
    got, expected = condition(balanced, view, {}), condition(left_to_right, view, {})
    assert [a.tolist() for a in got[:2]] == [a.tolist() for a in expected[:2]]  # ...the same matches and errors
    assert got[2] == expected[2]


@pytest.mark.parametrize("text,position", [
    ("a = '\ud800'", 5), ("[\udc00] = 1", 1), ("a = 'ok' AND b = 'x\udfff'", 19), ("\"q\ud800\" IS NULL", 2),
])
def test_a_lone_surrogate_in_rule_text_is_refused_with_its_position(text, position):
    with pytest.raises(ValueError, match=f"position {position}: lone surrogate"):
        parse_filter(text)
    with pytest.raises(ValueError, match=f"position {position + 4}: lone surrogate"):
        parse_action("SET " + text)


@pytest.mark.parametrize("make", [
    lambda v: SqlRuleFilter("a = @p", parameters={"@p": v}),
    lambda v: SqlRuleAction("SET a = @p", parameters={"@p": v}),
    lambda v: CorrelationRuleFilter(properties={"a": v}),
])
@pytest.mark.parametrize("value", [2**63, -2**63 - 1, 2**100, "\ud800", "x\udfff"])
def test_rule_parameters_and_correlation_properties_without_a_wire_form_are_refused(make, value):
    with pytest.raises(ValueError, match="outside the signed 64-bit range|holds a lone surrogate"):
        make(value)


@pytest.mark.parametrize("value", [timedelta(seconds=-1), timedelta.min, timedelta.max, MAX_DURATION + timedelta(1)])
def test_duration_parameters_outside_0_to_timespan_max_are_refused(value):
    with pytest.raises(ValueError, match=r"parameters\['@p'\] = .* is outside the durations a rule parameter holds"):
        SqlRuleFilter("a = @p", parameters={"@p": value})


def test_duration_parameters_up_to_timespan_max_are_kept_and_longer_stored_ones_still_read():
    from sparkbus.core.values import decode_properties, encode_properties

    for value in (timedelta(0), timedelta(hours=1), MAX_DURATION):
        assert decode_properties(encode_properties(SqlRuleFilter("a = @p", parameters={"@p": value}).parameters)) \
            == {"@p": value}
    # what an older version stored for timedelta.max reads as TimeSpan.MaxValue, as it did
    assert decode_properties('{"@p":["timedelta","P999999999DT23H59M59.999999S"]}') == {"@p": MAX_DURATION}


def test_rule_values_changed_after_construction_are_checked_at_create_and_update():
    sql = SqlRuleFilter("a = @p", parameters={"@p": 1})
    sql.parameters["@p"] = 2**64
    correlation = CorrelationRuleFilter(properties={"a": 1})
    correlation.properties["a"] = "\ud800"
    action = SqlRuleAction("SET a = @p", parameters={"@p": 1})
    action.parameters["@p"] = -2**63 - 1
    with pytest.raises(ValueError, match="outside the signed 64-bit range"):
        check_filter(sql)
    with pytest.raises(ValueError, match="holds a lone surrogate"):
        check_filter(correlation)
    with pytest.raises(ValueError, match="outside the signed 64-bit range"):
        check_action(action)


@pytest.mark.parametrize("field", ["correlation_id", "message_id", "to", "reply_to", "subject", "session_id",
                                   "reply_to_session_id", "content_type"])
def test_a_lone_surrogate_in_a_correlation_filter_field_is_refused_naming_it(field):
    with pytest.raises(ValueError, match=f"CorrelationRuleFilter {field} holds a lone surrogate"):
        CorrelationRuleFilter(**{field: "\ud800"})


@pytest.mark.parametrize("text,says", [
    ("SET sys.MessageId = '" + "m" * 129 + "'", "sys.MessageId is 1 to 128 characters; this string has 129"),
    ("SET sys.MessageId = '" + "m" * 200 + "'", "position 20"),
    ("SET sys.ReplyToSessionId = ''", "sys.ReplyToSessionId is 1 to 128 characters; this string has 0"),
    ("SET a = 1, sys.MessageId = '" + "m" * 300 + "'", "this string has 300"),
])
def test_an_action_setting_an_id_to_a_literal_outside_1_to_128_characters_is_refused(text, says):
    with pytest.raises(ValueError, match=says):
        parse_action(text)


def test_an_action_setting_an_id_to_a_long_parameter_is_refused_and_128_characters_are_fine():
    parse_action("SET sys.MessageId = '" + "m" * 128 + "'")
    check_action(SqlRuleAction("SET sys.MessageId = @m", parameters={"@m": "m" * 128}))
    with pytest.raises(ValueError, match="sets sys.MessageId to @M, which has 129 characters"):
        check_action(SqlRuleAction("SET sys.MessageId = @M", parameters={"@m": "m" * 129}))
    with pytest.raises(ValueError, match="sys.ReplyToSessionId is 1 to 128"):
        check_action(SqlRuleAction("SET sys.ReplyToSessionId = @r", parameters={"@r": ""}))


def test_a_correlation_filter_with_a_thousand_properties_evaluates():
    rule = compile_correlation("r", {}, {f"p{i}": i for i in range(1000)})
    view = view_of({f"p{i}": i for i in range(1000)}, {"p0": 0})
    matched, failed, _ = condition(rule.condition, view, rule.parameters)
    assert matched.tolist() == [True, False] and not failed.any()


# ---- durations, retry settings, sequence numbers, dead-letter text ----------------------------------------

@pytest.mark.parametrize("text", ["P99999999999D", "P10675200D", "P10675199DT2H48M5.4775808S", "PT" + "9" * 400 + "S",
                                  "P" + "9" * 5000 + "D"])
def test_durations_longer_than_timespan_max_are_a_value_error_naming_field_and_maximum(text):
    with pytest.raises(ValueError) as raised:
        parse_duration(text, "lock_duration")
    assert str(raised.value).startswith("lock_duration=") and MAX_DURATION_TEXT in str(raised.value)


def test_timespan_max_itself_parses_to_max_duration():
    assert parse_duration(MAX_DURATION_TEXT, "x") == MAX_DURATION
    assert parse_duration("P10675199DT2H48M5.47758S", "x") == MAX_DURATION
    assert parse_duration("PT0.0000004S", "x") == timedelta(0)


@pytest.mark.parametrize("keywords,error,says", [
    ({"total": float("inf")}, TypeError, "retry_total must be an int"),
    ({"total": float("nan")}, TypeError, "retry_total must be an int"),
    ({"total": 3.0}, TypeError, "retry_total must be an int"),
    ({"total": -1}, ValueError, "retry_total must be an int >= 0"),
    ({"backoff_factor": float("inf")}, ValueError, "retry_backoff_factor must be a finite number of seconds >= 0"),
    ({"backoff_factor": float("nan")}, ValueError, "retry_backoff_factor must be a finite"),
    ({"backoff_factor": -0.5}, ValueError, "retry_backoff_factor must be a finite"),
    ({"backoff_max": float("inf")}, ValueError, "retry_backoff_max must be a finite"),
    ({"backoff_max": float("nan")}, ValueError, "retry_backoff_max must be a finite"),
    ({"backoff_max": "10"}, TypeError, "retry_backoff_max must be a number"),
])
def test_retry_settings_out_of_range_are_refused(keywords, error, says):
    with pytest.raises(error, match=says):
        RetryPolicy(**keywords)


def test_the_backoff_of_a_very_late_retry_is_the_maximum():
    policy = RetryPolicy(total=10**9, backoff_factor=1e300, backoff_max=5)
    assert 4 <= policy.backoff(10**8) <= 6
    assert 0.4 <= RetryPolicy(total=10**9, backoff_factor=1e-6, backoff_max=0.5).backoff(5000) <= 0.6


@pytest.mark.parametrize("numbers,error", [
    (2**63, ValueError), ([1, -1], ValueError), ([2**64], ValueError), (-(2**63), ValueError),
    ([True], TypeError), (["1"], TypeError), ("12", TypeError), (1.0, TypeError), ([None], TypeError),
])
def test_sequence_numbers_outside_0_to_2_63_minus_1_are_refused(numbers, error):
    with pytest.raises(error) as raised:
        wire.check_sequence_numbers(numbers)
    if error is ValueError:
        assert "0..9223372036854775807" in str(raised.value)
    assert wire.check_sequence_numbers(2**63 - 1) == [2**63 - 1]
    assert wire.check_sequence_numbers(iter([0, 5])) == [0, 5]


def test_dead_letter_text_is_at_most_4096_characters_of_valid_unicode():
    assert wire.check_dead_letter_text("r" * 4096, "reason") == "r" * 4096
    assert wire.check_dead_letter_text(None, "reason") is None
    with pytest.raises(ValueError, match="error_description must be at most 4096 characters, got 4097"):
        wire.check_dead_letter_text("d" * 4097, "error_description")
    with pytest.raises(ValueError, match="reason holds a lone surrogate"):
        wire.check_dead_letter_text("\ud800", "reason")
    with pytest.raises(TypeError, match="reason must be a str"):
        wire.check_dead_letter_text(b"r", "reason")


# ---- end to end: refused means nothing written, and the entity still works -------------------------------

@pytest.fixture
def world(admin, ns_path):
    admin.create_queue("q")
    admin.create_queue("sq", requires_session=True)
    admin.create_topic("t")
    admin.create_subscription("t", "all")
    admin.create_subscription("t", "reads")
    admin.create_rule("t", "reads", "p", filter=SqlRuleFilter("p = 1"))
    admin.delete_rule("t", "reads", "$Default")
    client = sparkbus.ServiceBusClient(ns_path)
    yield ns_path, admin, client
    client.close()


def receive_all(client, *entity: str) -> list:
    receive = client.get_queue_receiver if len(entity) == 1 else client.get_subscription_receiver
    with receive(*entity, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE, max_wait_time=0.2) as receiver:
        return [str(m) for m in receiver.receive_messages(50)]


def still_delivers(ns: str, client) -> None:
    """A normal message goes through the queue and through the topic, also to the subscription whose rule
    reads the property p."""
    for sender in (client.get_queue_sender("q"), client.get_topic_sender("t")):
        with sender:
            sender.send_messages(ServiceBusMessage("normal", application_properties={"p": 1}))
    fanout.drain(Catalog(normalize(ns)), "t")
    assert receive_all(client, "q") == ["normal"]
    assert receive_all(client, "t", "all") == ["normal"]
    assert receive_all(client, "t", "reads") == ["normal"]


def changed(message: ServiceBusMessage, **attributes: object) -> ServiceBusMessage:
    for name, value in attributes.items():
        if name == "application_properties":
            message.application_properties.update(value)
        else:
            setattr(message, name, value)
    return message


def unsendable_messages() -> list:
    """Messages and batches whose construction succeeded but whose send must be refused."""
    return [
        changed(ServiceBusMessage("x"), application_properties={"p": 2**63}),
        changed(ServiceBusMessage("x"), application_properties={"p": -2**63 - 1}),
        changed(ServiceBusMessage("x"), application_properties={"p": "\ud800"}),
        changed(ServiceBusMessage("x"), application_properties={"\udfff": 1}),
        changed(ServiceBusMessage("x"), subject="\ud800"),
        changed(ServiceBusMessage("x"), message_id="\udc00"),
        changed(ServiceBusMessage("x"), reply_to_session_id="r" * 200),
        [ServiceBusMessage("fine")] * 50 + [changed(ServiceBusMessage("x"), application_properties={"p": 2**100})],
        AmqpAnnotatedMessage(value_body=1, header=AmqpMessageHeader(time_to_live=2**70)),
    ]


def test_a_refused_send_or_schedule_writes_nothing_and_the_entities_still_deliver(world):
    ns, admin, client = world
    before = files_under(ns)
    when = datetime.now(timezone.utc) + timedelta(minutes=5)
    with client.get_queue_sender("q") as queue, client.get_topic_sender("t") as topic:
        for message in unsendable_messages():
            for sender in (queue, topic):
                with pytest.raises(ValueError):
                    sender.send_messages(message)
                with pytest.raises(ValueError):
                    sender.schedule_messages(message, when)
                with pytest.raises(ValueError):
                    sender.cancel_scheduled_messages([2**63])
    assert files_under(ns) == before
    still_delivers(ns, client)


@pytest.mark.parametrize("rule", [
    dict(filter=SqlRuleFilter("p = '\ud800'")),
    dict(filter=SqlRuleFilter("(" * 300 + "p = 1" + ")" * 300)),
    dict(filter=SqlRuleFilter("p = " + "-" * 1000 + "1")),
    dict(filter=SqlRuleFilter("p = " + " + ".join(["1"] * 100))),
    dict(filter=changed(SqlRuleFilter("p = @v", parameters={"@v": 1}), parameters={"@v": 2**100})),
    dict(filter=changed(CorrelationRuleFilter(properties={"p": 1}), properties={"p": "\ud800"})),
    dict(action=changed(SqlRuleAction("SET p = @v", parameters={"@v": 1}), parameters={"@v": 2**63})),
    dict(action=SqlRuleAction("SET sys.MessageId = '" + "m" * 200 + "'")),
])
def test_a_refused_rule_writes_nothing_and_the_topic_still_delivers(world, rule):
    ns, admin, client = world
    before = files_under(ns)
    with pytest.raises(ValueError):
        admin.create_rule("t", "all", "bad", **rule)
    stored = admin.get_rule("t", "reads", "p")
    stored.filter = rule.get("filter", stored.filter)
    stored.action = rule.get("action")
    with pytest.raises(ValueError):
        admin.update_rule("t", "reads", stored)
    assert files_under(ns) == before
    still_delivers(ns, client)


def test_a_refused_dead_letter_deferred_receive_or_session_state_writes_nothing(world):
    ns, admin, client = world
    with client.get_queue_sender("q") as sender, client.get_queue_sender("sq") as session_sender:
        sender.send_messages(ServiceBusMessage("locked"))
        session_sender.send_messages(ServiceBusMessage("in session", session_id="s1"))
    receiver = client.get_queue_receiver("q", max_wait_time=2)
    session_receiver = client.get_queue_receiver("sq", session_id="s1", max_wait_time=2)
    [message] = receiver.receive_messages(1)
    session_receiver.receive_messages(1)
    before = files_under(ns)
    for reason, description in (("x" * 100_000, None), ("r\ud800", None), (None, "d" * 4097), (None, "\udfff")):
        with pytest.raises(ValueError):
            receiver.dead_letter_message(message, reason=reason, error_description=description)
    for numbers in (2**63, [1, 2**64], [-1]):
        with pytest.raises(ValueError):
            receiver.receive_deferred_messages(numbers)
    with pytest.raises(ValueError, match="0..9223372036854775807"):
        receiver.peek_messages(1, sequence_number=2**63)
    for state in ("\ud800", "ok\udfff"):
        with pytest.raises(ValueError, match="session state holds a lone surrogate"):
            session_receiver.session.set_state(state)
    assert files_under(ns) == before
    receiver.dead_letter_message(message, reason="r" * 4096, error_description="d" * 4096)
    with client.get_queue_receiver("q", sub_queue=sparkbus.ServiceBusSubQueue.DEAD_LETTER, max_wait_time=2) as dlq:
        [dead] = dlq.receive_messages(1)
        assert (dead.dead_letter_reason, dead.dead_letter_error_description) == ("r" * 4096, "d" * 4096)
        dlq.complete_message(dead)
    session_receiver.session.set_state("fine \U0001F600")
    assert session_receiver.session.get_state() == "fine \U0001F600".encode("utf-8")
    session_receiver.close()
    receiver.close()
    still_delivers(ns, client)


def test_an_out_of_range_credit_budget_or_duration_writes_nothing(world, tmp_path):
    ns, admin, client = world
    before = files_under(ns)
    for credits in (2**70, 10**9 + 1, 2**63):
        with pytest.raises(ValueError, match="credits_per_second must be between 1 and 1000000000"):
            admin.update_namespace(credits_per_second=credits)
        with pytest.raises(ValueError, match="between 1 and 1000000000"):
            sparkbus.create_namespace(str(tmp_path / "other"), credits_per_second=credits)
    for option in ("lock_duration", "default_message_time_to_live", "auto_delete_on_idle",
                   "duplicate_detection_history_time_window"):
        with pytest.raises(ValueError, match=f"{option}='P99999999999D' is longer than the longest duration"):
            admin.create_queue("x", **{option: "P99999999999D"})
    with pytest.raises(TypeError, match="retry_total must be an int"):
        sparkbus.ServiceBusClient(ns, retry_total=float("inf"))
    assert files_under(ns) == before
    assert not os.path.exists(tmp_path / "other")
    admin.update_namespace(credits_per_second=10**9)
    assert admin.get_namespace_properties().credits_per_second == 10**9
    still_delivers(ns, client)
