"""Sending Spark DataFrames: one atomic commit, placement by the UDF, numbering, duplicates, limits."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest
from chispa import assert_df_equality
from hypothesis import given, settings
from hypothesis import strategies as st
from conftest import stored_messages

from sparkbus import InvalidOperationError, MessageSizeExceededError, ServiceBusClient
from sparkbus.core.partitioning import partition_of
from sparkbus.core.values import decode_properties

pytestmark = pytest.mark.spark
LOW = (1 << 48) - 1


@pytest.fixture
def sender(spark, admin, ns_path):
    admin.create_queue("q", enable_partitioning=True)
    return ServiceBusClient(ns_path, spark=spark).get_queue_sender("q")


def test_dataframe_rows_become_messages(spark, admin, sender):
    when = datetime(2030, 1, 1, tzinfo=timezone.utc)
    df = spark.createDataFrame(
        [("hello", "s1", "corr", {"n": "1"}, timedelta(minutes=5), None),
         ("world", None, None, None, None, when)],
        "body string, subject string, correlation_id string, application_properties map<string,string>, "
        "time_to_live interval day to second, scheduled_enqueue_time_utc timestamp")
    result = sender.send_dataframe(df)
    assert (result.message_count, result.duplicate_count) == (2, 0)
    rows = stored_messages(admin, "q").to_pylist()
    by_body = {r["body"]: r for r in rows}
    hello, world = by_body[b"hello"], by_body[b"world"]
    assert (hello["subject"], hello["correlation_id"]) == ("s1", "corr")
    assert decode_properties(hello["application_properties"]) == {"n": "1"}
    assert hello["time_to_live_ms"] == 300_000 and hello["expires_at_utc"] - hello["enqueued_time_utc"] == timedelta(minutes=5)
    assert world["scheduled_enqueue_time_utc"] == when and len(world["message_id"]) == 32
    assert admin.get_queue_runtime_properties("q").scheduled_message_count == 1


def test_keyed_rows_are_placed_by_the_udf_and_numbered_gap_free(spark, admin, sender):
    data = [(f"m{i}", f"key{i % 7}") for i in range(700)] + [(f"n{i}", None) for i in range(160)]
    df = spark.createDataFrame(data, "body string, partition_key string").repartition(3)
    result = sender.send_dataframe(df)
    assert result.message_count == 860
    stored = stored_messages(admin, "q")
    got = spark.createDataFrame(stored.select(["body", "partition_key", "partition_id"]).to_pandas())
    expected_rows = [(f"m{i}".encode(), f"key{i % 7}", partition_of(f"key{i % 7}", 16)) for i in range(700)]
    keyed = got.where("partition_key IS NOT NULL")
    expected = spark.createDataFrame(expected_rows, keyed.schema)
    assert_df_equality(keyed, expected, ignore_row_order=True, ignore_nullable=True)
    keyless = [p for p, k in zip(stored["partition_id"].to_pylist(), stored["partition_key"].to_pylist()) if k is None]
    assert len(keyless) == 160 and len(set(keyless)) == 1  # keyless rows of a send: runs of KEYLESS_RUN
    for pid, (first, last) in result.partitions.items():
        numbers = sorted(n & LOW for n, p in zip(stored["sequence_number"].to_pylist(), stored["partition_id"].to_pylist())
                         if p == pid)
        assert numbers == list(range(1, len(numbers) + 1)) and (first & LOW, last & LOW) == (1, len(numbers))


def test_duplicates_within_a_dataframe_and_against_history(spark, admin, ns_path):
    admin.create_queue("dd", enable_partitioning=True, requires_duplicate_detection=True)
    sender = ServiceBusClient(ns_path, spark=spark).get_queue_sender("dd")
    first = sender.send_dataframe(spark.createDataFrame([("a", "1"), ("b", "2"), ("a-again", "1")], "body string, message_id string"))
    second = sender.send_dataframe(spark.createDataFrame([("c", "3"), ("b-again", "2")], "body string, message_id string"))
    assert (first.message_count, first.duplicate_count, second.message_count, second.duplicate_count) == (2, 1, 1, 1)
    rows = stored_messages(admin, "dd")
    assert sorted(zip(rows["message_id"].to_pylist(), rows["body"].to_pylist())) == [("1", b"a"), ("2", b"b"), ("3", b"c")]
    assert all(p == partition_of(m, 16) for m, p in zip(rows["message_id"].to_pylist(), rows["partition_id"].to_pylist()))


def test_bad_dataframes_write_nothing(spark, admin, sender):
    big = "x" * 300_000
    df = spark.createDataFrame([("ok", "id-ok"), (big, "id-big")], "body string, message_id string")
    with pytest.raises(MessageSizeExceededError, match=r"positions \[1\] \(message_id \['id-big'\]\)"):
        sender.send_dataframe(df)
    with pytest.raises(ValueError, match="needs a 'body' column"):
        sender.send_dataframe(spark.createDataFrame([("x",)], "text string"))
    with pytest.raises(ValueError, match="unknown message column"):
        sender.send_dataframe(spark.createDataFrame([("x", 1)], "body string, priority int"))
    with pytest.raises(TypeError, match="column 'subject' has type int"):
        sender.send_dataframe(spark.createDataFrame([("x", 1)], "body string, subject int"))
    mismatch = spark.createDataFrame([("x", "s", "k")], "body string, session_id string, partition_key string")
    with pytest.raises(InvalidOperationError, match="must be identical"):
        sender.send_dataframe(mismatch)
    assert stored_messages(admin, "q").num_rows == 0


def test_binary_bodies(spark, admin, sender):
    df = spark.createDataFrame(pa.table({"body": pa.array([b"\x00\x01", b"\xff"], pa.binary())}).to_pandas())
    sender.send_dataframe(df)
    assert sorted(stored_messages(admin, "q")["body"].to_pylist()) == [b"\x00\x01", b"\xff"]


def test_row_order_is_kept_across_spark_partitions(spark, admin, sender):
    df = spark.createDataFrame([(f"{i:04d}", "k") for i in range(500)], "body string, partition_key string").repartition(7)
    expected = [r.body.encode() for r in df.collect()]
    sender.send_dataframe(df)
    assert stored_messages(admin, "q")["body"].to_pylist() == expected  # numbered in the DataFrame's order


@pytest.mark.local_only  # an object store has no file to fill in place: there the rows are staged and written again
def test_executors_write_each_row_once_as_the_tables_own_files(spark, admin, ns_path, sender):
    import os

    from conftest import files_under

    df = spark.range(0, 2_000, 1, 4).selectExpr("concat('b', id) AS body")
    before = datetime.now(timezone.utc)
    result = sender.send_dataframe(df)
    assert result.message_count == 2_000
    table = admin.get_entity_tables("q")["messages"]
    data = [path for path in files_under(table) if path.endswith(".parquet") and not path.startswith("_delta_log")]
    assert len(data) == 4  # one file per Spark partition (its keyless rows), none rewritten by the committer
    assert not any(files for _, _, files in os.walk(os.path.join(ns_path, "_staging")))  # nothing staged is left
    stored = stored_messages(admin, "q")
    assert len(set(stored["enqueued_time_utc"].to_pylist())) == 1 and stored["enqueued_time_utc"][0].as_py() >= before
    for partition in set(stored["partition_id"].to_pylist()):
        numbers = [n & LOW for n, p in zip(stored["sequence_number"].to_pylist(), stored["partition_id"].to_pylist())
                   if p == partition]
        assert sorted(numbers) == list(range(1, len(numbers) + 1))
    assert sorted(stored["body"].to_pylist()) == sorted(f"b{i}".encode() for i in range(2_000))


def test_a_csv_dataset_sends_typed_properties_and_fields_that_rules_select(spark, admin, ns_path, tmp_path, capsys):
    """send-batch with --property-columns: CSV columns become typed application properties (a rule comparing
    a number selects them), --field maps message fields to columns, a null cell is no property."""
    from sparkbus.cli import main
    from sparkbus.management import SqlRuleFilter
    from sparkbus.streaming import fanout_once

    data = tmp_path / "orders.csv"
    data.write_text("id,region,amount,customer,ttl\n1,eu,150,c1,60\n2,eu,50,c2,60\n3,us,500,c1,\n4,eu,101.5,c3,30\n")
    admin.create_topic("orders")
    admin.create_subscription("orders", "big-eu")
    admin.delete_rule("orders", "big-eu", "$Default")
    admin.create_rule("orders", "big-eu", "big", filter=SqlRuleFilter("region = 'eu' AND amount > 100"))
    assert main(["send-batch", "--namespace", ns_path, "--entity", "orders", "--input", str(data), "--format", "csv",
                 "--body-column", "id", "--property-columns", "region,amount", "--field", "session_id=customer",
                 "--field", "time_to_live=ttl", "--json"]) == 0
    assert '{"sent": 4}' in capsys.readouterr().out
    fanout_once(spark, ns_path, "orders")
    with ServiceBusClient(ns_path).get_subscription_receiver("orders", "big-eu") as receiver:
        got = sorted(receiver.receive_messages(10, max_wait_time=0), key=str)
    assert [str(m) for m in got] == ["1", "4"]
    assert [m.application_properties for m in got] == [{b"region": b"eu", b"amount": 150},
                                                        {b"region": b"eu", b"amount": 101.5}]
    assert [(m.session_id, m.time_to_live) for m in got] == [("c1", timedelta(seconds=60)), ("c3", timedelta(seconds=30))]


def test_dataset_columns_as_properties_and_fields(spark, admin, sender):
    from sparkbus.spark.dataframes import ALL_COLUMNS, messages_from_dataset

    df = spark.createDataFrame([("a", "eu", 3, True, None, "2031-01-01T00:00:00Z")],
                               "body string, region string, n long, flag boolean, note string, due string")
    sender.send_dataframe(messages_from_dataset(df, property_columns=ALL_COLUMNS,
                                                field_columns={"scheduled_enqueue_time_utc": "due"}))
    [row] = stored_messages(admin, "q").to_pylist()
    assert decode_properties(row["application_properties"]) == {"region": "eu", "n": 3, "flag": True}
    assert row["scheduled_enqueue_time_utc"] == datetime(2031, 1, 1, tzinfo=timezone.utc)
    with pytest.raises(ValueError, match=r"no column\(s\) \['nope'\]"):
        messages_from_dataset(df, property_columns=["nope"])
    with pytest.raises(ValueError, match=r"no message field\(s\) \['colour'\]"):
        messages_from_dataset(df, field_columns={"colour": "region"})
    nested = spark.createDataFrame([("a", [1])], "body string, xs array<int>")
    with pytest.raises(TypeError, match="application property column 'xs' has type array<int>"):
        sender.send_dataframe(messages_from_dataset(nested, property_columns=["xs"]))
    listed = spark.createDataFrame([("a", {"k": [1]})], "body string, application_properties map<string,array<int>>")
    with pytest.raises(TypeError, match=r"application_properties has type map<string,array<int>>; a map of "
                                        r"properties has string keys and values of one type"):
        sender.send_dataframe(listed)
    assert len(stored_messages(admin, "q")) == 1


def test_each_distinct_set_of_properties_is_encoded_as_on_its_own():
    """complete_batch encodes a property set once for all the rows that repeat it: every row's text is what
    encoding it alone gives, whether the set repeats, differs in one value or type, is empty or null."""
    from sparkbus.core.values import encode_properties
    from sparkbus.spark.dataframes import complete_batch

    sets = [{"kind": "a"}, {"kind": "a"}, {"kind": "b"}, None, {}, {"kind": "a", "n": "1"}, {"kind": "a"}]
    maps = pa.array([None if s is None else list(s.items()) for s in sets], pa.map_(pa.string(), pa.string()))
    structs = pa.array([{"flag": True, "n": 1, "x": float("nan")}, {"flag": True, "n": 1, "x": None},
                        {"flag": False, "n": 1, "x": 2.5}, {"flag": True, "n": 1, "x": None}, None, None, None],
                       pa.struct([("flag", pa.bool_()), ("n", pa.int64()), ("x", pa.float64())]))
    for column, expected in ((maps, [None if s is None else encode_properties(s) for s in sets]),
                             (structs, [None if s is None else encode_properties({k: v for k, v in s.items() if v is not None})
                                        for s in structs.to_pylist()])):
        batch = pa.RecordBatch.from_pydict({"body": pa.array([b"x"] * len(sets)), "application_properties": column})
        assert complete_batch(batch, False, 4)["application_properties"].to_pylist() == expected
    signed = pa.array([[("x", 0.0)], [("x", -0.0)], [("x", 0.0)]], pa.map_(pa.string(), pa.float64()))  # equal, apart
    batch = pa.RecordBatch.from_pydict({"body": pa.array([b"x"] * 3), "application_properties": signed})
    assert complete_batch(batch, False, 4)["application_properties"].to_pylist() == [
        encode_properties({"x": 0.0}), encode_properties({"x": -0.0}), encode_properties({"x": 0.0})]
    assert encode_properties({"x": 0.0}) != encode_properties({"x": -0.0})


_FLOATS = st.sampled_from([0.0, -0.0, 1.5, float("nan"), float("inf"), None])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.none(), st.lists(st.tuples(st.sampled_from("abc"), _FLOATS), max_size=3)), max_size=12),
       st.lists(st.one_of(st.none(), st.tuples(st.sampled_from([True, False, None]), st.sampled_from([1, 2, None]),
                                               _FLOATS, st.sampled_from(["", "x", None]))), max_size=12),
       st.integers(0, 3))
def test_rows_that_share_a_code_share_a_set_of_properties(maps, structs, skip):
    """Whatever the rows (repeated, differing in one value, type or float sign, null, empty, a slice of a
    longer array), each row's stored text is the one encoding that row alone gives."""
    from sparkbus.core.values import encode_properties
    from sparkbus.spark.dataframes import _encoded_properties

    def alone(cell, struct):
        if cell is None:
            return None
        return encode_properties({k: v for k, v in cell.items() if v is not None} if struct else dict(cell))

    struct_type = pa.struct([("flag", pa.bool_()), ("n", pa.int64()), ("x", pa.float64()), ("s", pa.string())])
    columns = (pa.array(maps, pa.map_(pa.string(), pa.float64())),
               pa.array([None if s is None else dict(zip(("flag", "n", "x", "s"), s)) for s in structs], struct_type))
    for column in columns:
        column = column.slice(min(skip, len(column)))
        struct = pa.types.is_struct(column.type)
        texts = _encoded_properties(column).to_pylist()
        assert texts == [alone(cell, struct) for cell in column.to_pylist()]
