"""The SparkSession helper and Spark over namespace metadata (one shared session)."""
from __future__ import annotations

import os
import sys

import pyarrow as pa
import pytest
from chispa import assert_df_equality

from sparkbus.cli import namespace_rows
from sparkbus.definitions import apply_definition, load_definition
from sparkbus.spark import DEFAULT_CONF, read_spark_conf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_read_spark_conf(tmp_path):
    conf = tmp_path / "spark.conf"
    conf.write_text("# comment\nspark.a  1\nspark.b=two words\n\nspark.c value # trailing\n")
    assert read_spark_conf(str(conf)) == {"spark.a": "1", "spark.b": "two words", "spark.c": "value"}
    conf.write_text("lonely\n")
    with pytest.raises(ValueError, match="spark.conf:1: expected 'key value'"):
        read_spark_conf(str(conf))
    assert "spark.sql.session.timeZone" in read_spark_conf(DEFAULT_CONF)  # the packaged settings


@pytest.mark.spark
def test_session_uses_this_interpreter(spark):
    assert os.environ["PYSPARK_PYTHON"] == sys.executable
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.conf.get("spark.ui.enabled") == "false"
    executables = spark.sparkContext.parallelize([0], 1).map(lambda _: __import__("sys").executable).collect()
    assert executables == [sys.executable]


@pytest.mark.spark
def test_spark_sql_over_namespace_rows(spark, ns_path):
    apply_definition(load_definition(os.path.join(ROOT, "conf", "namespace.toml")), ns_path)
    from sparkbus import ServiceBusAdministrationClient

    rows = namespace_rows(ServiceBusAdministrationClient(ns_path))
    frame = spark.createDataFrame(pa.Table.from_pylist(rows).to_pandas())
    frame.createOrReplaceTempView("entities")
    got = spark.sql("SELECT kind, CAST(count(*) AS INT) AS n, CAST(sum(partitions) AS INT) AS p "
                    "FROM entities GROUP BY kind ORDER BY kind")
    expected = spark.createDataFrame([("queue", 3, 18), ("subscription", 4, 64), ("topic", 1, 16)], "kind string, n int, p int")
    assert_df_equality(got, expected, ignore_nullable=True)
