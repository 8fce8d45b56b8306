"""Spark-specific code (imported lazily: the message API never needs it). This module: the SparkSession
helper (local[*] by default, settings from a spark-defaults style file, Python workers
started with the running interpreter (PySpark otherwise starts `python3` from PATH, which lacks the venv)),
register() for sessions that do not import the "sparkbus" data source at start-up, and workers_checked,
which turns the error of Python workers that cannot import sparkbus into one that says why.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
from typing import TYPE_CHECKING, Iterator, Optional

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
    """Get or create the SparkSession; conf_file defaults to $SPARKBUS_SPARK_CONF, else the packaged
    spark-defaults.conf (CONF_DIR)."""
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
    sessions where that import is off."""
    from .datasource import SparkbusDataSource

    jvm_session = getattr(spark, "_jsparkSession", None)  # None over Spark Connect: register there
    if jvm_session is not None and jvm_session.sessionState().dataSourceManager().dataSourceExists("sparkbus"):
        return  # registering again works, but logs a warning per query
    spark.dataSource.register(SparkbusDataSource)


class WorkerPythonError(RuntimeError):
    """Spark's Python workers could not import a module sparkbus runs there (sparkbus itself, pyarrow):
    they run another Python than the driver's, one without sparkbus's packages."""


_MISSING_MODULE = re.compile(r"No module named '([\w.]+)'")


@contextlib.contextmanager
def workers_checked(spark: "SparkSession") -> Iterator[None]:
    """Run Spark work whose Python runs on workers; an error of theirs that a module could not be imported
    becomes WorkerPythonError naming the workers' Python and PYSPARK_PYTHON, instead of a JVM traceback
    that ends in "No module named 'sparkbus'" (a script run with a virtualenv's python without activating
    it: workers then start python3 from PATH). Other errors pass as they are."""
    try:
        yield
    except Exception as error:
        missing = _MISSING_MODULE.findall(str(error))
        if not missing or not type(error).__module__.startswith(("pyspark", "py4j")):
            raise
        context = getattr(spark, "sparkContext", None) if getattr(spark, "_jsparkSession", None) else None
        python = getattr(context, "pythonExec", None) or os.environ.get("PYSPARK_PYTHON") or "python3"
        raise WorkerPythonError(
            f"Spark's Python workers could not import {missing[-1]!r}: they run {python}, not this interpreter "
            f"({sys.executable}), and it lacks sparkbus's packages. Set PYSPARK_PYTHON={sys.executable} before "
            "the SparkSession starts (activating the virtualenv does it too; sparkbus.spark.get_spark sets it)"
        ) from None
