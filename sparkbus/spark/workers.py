"""Spark's Python workers and the error they give when they cannot import what sparkbus runs on them."""
from __future__ import annotations

import contextlib
import os
import re
import sys
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


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
