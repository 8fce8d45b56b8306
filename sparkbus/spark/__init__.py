"""Spark-specific code (imported lazily: the message API never needs it). This module: the SparkSession
helper (local[*] by default, settings from a spark-defaults style file, Python workers
started with the running interpreter (PySpark otherwise starts `python3` from PATH, which lacks the venv)),
register() for sessions that do not import the "sparkbus" data source at start-up, and (from
sparkbus.spark.workers) WorkerPythonError, what Python workers that cannot import sparkbus raise.
"""
from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Optional

from .workers import WorkerPythonError

__all__ = ["WorkerPythonError", "get_spark", "read_spark_conf", "register"]

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

CONF_ENV = "SPARKBUS_SPARK_CONF"
CONF_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conf")  # spark-defaults.conf, log4j2.properties
DEFAULT_CONF = os.path.join(CONF_DIR, "spark-defaults.conf")


def read_spark_conf(path: str) -> dict[str, str]:
    """'key value' (or 'key=value') lines; '#' starts a comment."""
    settings: dict[str, str] = {}
    with open(path, encoding="utf-8") as handle:
        for number, raw in enumerate(handle, 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split("=", 1) if "=" in line.split()[0] else line.split(None, 1)
            if len(parts) != 2:
                raise ValueError(f"{path}:{number}: expected 'key value', got {raw.strip()!r}")
            settings[parts[0].strip()] = parts[1].strip()
    return settings


def get_spark(app_name: str = "sparkbus", *, master: Optional[str] = None, conf_file: Optional[str] = None,
              settings: Optional[dict[str, str]] = None) -> SparkSession:
    """Get or create the SparkSession.

    Args:
        app_name: The application's name.
        master: The master URL; default: the settings' spark.master, else local[*] (under spark-submit, the
            session keeps its --master).
        conf_file: A spark-defaults style file of settings; default: $SPARKBUS_SPARK_CONF, else the packaged
            spark-defaults.conf (CONF_DIR).
        settings: Settings over those of conf_file.

    Returns:
        The SparkSession.
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    path = conf_file or os.environ.get(CONF_ENV) or DEFAULT_CONF
    # Larger Arrow batches halve the time to bring a DataFrame to the driver (200,000 rows of 1 KiB:
    # 3.1 s with the default 10,000 rows per batch, 1.65 s with 100,000).
    merged = {"spark.sql.session.timeZone": "UTC", "spark.sql.execution.arrow.pyspark.enabled": "true",
              "spark.sql.execution.arrow.maxRecordsPerBatch": "100000"}
    if path:
        merged.update(read_spark_conf(path))
    merged.update(settings or {})
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    elif "spark.master" not in merged and "PYSPARK_GATEWAY_PORT" not in os.environ:
        builder = builder.master("local[*]")  # not under spark-submit, whose --master the session keeps
    if "PYSPARK_GATEWAY_PORT" not in os.environ:  # this process launches the JVM: as `sparkbus submit` does
        if path == DEFAULT_CONF and "SPARK_CONF_DIR" not in os.environ:  # the packaged logging: warnings only
            option = f"-Dlog4j2.configurationFile=file:{os.path.join(CONF_DIR, 'log4j2.properties')}"
            merged["spark.driver.extraJavaOptions"] = f"{merged.get('spark.driver.extraJavaOptions', '')} {option}".strip()
        if (master or merged.get("spark.master", "local")).startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # else a warning that the hostname is loopback
    for k, v in merged.items():
        builder = builder.config(k, v)
    return builder.getOrCreate()


def register(spark: SparkSession) -> None:
    """Make .format("sparkbus") available in a session. Sessions of Spark 4 import it on their own (the
    installed module pyspark_sparkbus; spark.sql.pyspark.dataSource.staticImport.enabled): this serves
    sessions where that import is off.

    Args:
        spark: The session, classic or over Spark Connect.
    """
    from .datasource import SparkbusDataSource

    jvm_session = getattr(spark, "_jsparkSession", None)  # None over Spark Connect: register there
    if jvm_session is not None and jvm_session.sessionState().dataSourceManager().dataSourceExists("sparkbus"):
        return  # registering again works, but logs a warning per query
    spark.dataSource.register(SparkbusDataSource)

