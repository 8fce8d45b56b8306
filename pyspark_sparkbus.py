"""Spark 4 imports installed modules named pyspark_* at session start and registers their DefaultSource:
this one makes spark.read / readStream / writeStream .format("sparkbus") work with no registration call."""
from sparkbus.spark.datasource import SparkbusDataSource as DefaultSource

__all__ = ["DefaultSource"]
