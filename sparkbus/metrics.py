"""Namespace metrics for people and notebooks: the persisted per-minute rows as an Arrow table (for Spark:
spark.createDataFrame(metrics_table(ns).to_pandas())), a text report, and a PNG plot of throughput and
throttled requests. The counts themselves: ServiceBusAdministrationClient.get_namespace_metrics() and
get_entity_metrics(path) (sparkbus.engine.metrics says how they are counted and persisted).
"""
from __future__ import annotations

from datetime import datetime
from typing import Optional

import pyarrow as pa

from .engine import metrics
from .engine.metrics import Metrics
from .engine.namespace import open_catalog
from .storage.schemas import METRICS_COUNTERS


def metrics_table(namespace: str) -> pa.Table:
    """Every persisted metrics row of the namespace (one per minute, entity and process), with this
    process's counts not yet persisted; columns as sparkbus.storage.schemas.METRICS."""
    root = open_catalog(namespace).root
    return metrics.all_rows(root, metrics.known(root))


def format_metrics(report: Metrics) -> str:
    """Totals and one line per minute, as `sparkbus metrics` prints them."""
    scope = report.entity or "namespace"
    lines = [f"{scope}: " + "  ".join(f"{name}={getattr(report, name)}" for name in METRICS_COUNTERS)]
    if report.cpu_percent is not None:
        lines[0] += f"  cpu_percent={report.cpu_percent:.1f}  memory_percent={report.memory_percent:.1f}"
    header = ("minute (UTC)", "requests", "successful", "throttled", "in msgs", "out msgs", "credits", "cpu %", "mem %")
    rows = [header]
    for p in report.points:
        rows.append((p.time_utc.strftime("%Y-%m-%d %H:%M"), p.incoming_requests, p.successful_requests,
                     p.throttled_requests, p.incoming_messages, p.outgoing_messages, p.credits_used,
                     "" if p.cpu_percent is None else f"{p.cpu_percent:.1f}",
                     "" if p.memory_percent is None else f"{p.memory_percent:.1f}"))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(header))]
    lines += ["  ".join(str(v).rjust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


def plot_metrics(report: Metrics, path: str, *, title: Optional[str] = None) -> str:
    """Render a report as a PNG at path: messages per second in and out (top), throttled requests and
    credits used per minute (bottom). Returns path."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed on a cluster or in CI
    from matplotlib import pyplot

    times: list[datetime] = [p.time_utc for p in report.points]
    figure, (top, bottom) = pyplot.subplots(2, 1, sharex=True, figsize=(9, 6))
    top.plot(times, [p.incoming_messages / 60 for p in report.points], marker="o", label="incoming messages/s")
    top.plot(times, [p.outgoing_messages / 60 for p in report.points], marker="o", label="outgoing messages/s")
    top.set_ylabel("messages per second")
    top.legend(loc="upper left")
    bottom.bar(times, [p.throttled_requests for p in report.points], width=0.0005, color="tab:red",
               label="throttled requests")
    bottom.set_ylabel("throttled requests per minute")
    credits = bottom.twinx()
    credits.plot(times, [p.credits_used for p in report.points], color="tab:gray", marker=".", label="credits used")
    credits.set_ylabel("credits per minute")
    bottom.legend(loc="upper left")
    credits.legend(loc="upper right")
    figure.suptitle(title or f"sparkbus metrics: {report.entity or 'namespace'}")
    figure.autofmt_xdate()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
    return path
