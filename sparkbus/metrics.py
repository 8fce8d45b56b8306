"""Namespace metrics for people and notebooks: the persisted rows (one per ten seconds) as an Arrow table (for Spark:
spark.createDataFrame(metrics_table(ns).to_pandas())), a text report, and a PNG plot of throughput and
throttled requests. The counts themselves: ServiceBusAdministrationClient.get_namespace_metrics() and
get_entity_metrics(path) (sparkbus.engine.metrics says how they are counted and persisted).

The backlog (Azure Monitor's message-count metrics: active, scheduled, dead-lettered, per entity) is read
now rather than persisted: namespace_backlog() per entity and partition, plot_backlog() as a PNG.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Optional, Sequence, Union

import pyarrow as pa

from .core.entities import QueueRuntimeProperties, SubscriptionRuntimeProperties, TopicRuntimeProperties
from .engine import context, metrics
from .engine.metrics import BUCKET_SECONDS, MINUTE, Metrics
from .engine.namespace import open_catalog
from .management import ServiceBusAdministrationClient
from .core.schemas import METRICS_COUNTERS, PROCESSING_COUNTERS

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


FINE = timedelta(seconds=BUCKET_SECONDS)
FINE_UP_TO = timedelta(minutes=10)  # a report spanning at most this reads best per ten seconds


def period_name(period: timedelta) -> str:
    """'10 s', 'minute', '5 min', 'hour', '2 h': the period as axis labels and headers say it."""
    seconds = int(period.total_seconds())
    if seconds < 60 or seconds % 60:
        return f"{seconds} s"
    minutes = seconds // 60
    if minutes % 60:
        return "minute" if minutes == 1 else f"{minutes} min"
    return "hour" if minutes == 60 else f"{minutes // 60} h"


def parse_period(text: str) -> timedelta:
    """'10s', '30s', '1m', '5m', '1h' (a number and s, m or h) as a timedelta; raises ValueError for anything
    else or a period that is not a multiple of ten seconds."""
    unit = {"s": 1, "m": 60, "h": 3600}.get(text[-1:].lower())
    if unit is None or not text[:-1].isdigit():
        raise ValueError(f"a metrics period is a whole number and s, m or h (10s, 1m, 1h), not {text!r}")
    period = timedelta(seconds=int(text[:-1]) * unit)
    metrics.check_period(period)
    return period


def fitting_period(report: Metrics) -> timedelta:
    """Ten seconds for a report spanning at most FINE_UP_TO (a short run in detail), else a minute."""
    times = [p.time_utc for p in report.points]
    return FINE if times and max(times) - min(times) <= FINE_UP_TO else MINUTE


def metrics_table(namespace: str) -> pa.Table:
    """Every persisted metrics row of the namespace (one per ten seconds, entity and process), with this
    process's counts not yet persisted; columns as sparkbus.core.schemas.METRICS."""
    root = open_catalog(namespace).root
    return metrics.all_rows(root, context.recorder(root))


def format_metrics(report: Metrics) -> str:
    """Totals and one line per period (a minute unless the report was read per another), as `sparkbus
    metrics` prints them; cpu % and mem % only where a premium namespace measures them, and processors' and
    lock renewers' counts only where there are some."""
    scope = report.entity or "namespace"
    shown = [name for name in METRICS_COUNTERS if name not in PROCESSING_COUNTERS or getattr(report, name)]
    lines = [f"{scope}: " + "  ".join(f"{name}={getattr(report, name)}" for name in shown)]
    if report.cpu_percent is not None:
        lines[0] += f"  cpu_percent={report.cpu_percent:.1f}  memory_percent={report.memory_percent:.1f}"
    fine = report.period.total_seconds() % 60 != 0
    header = ("time (UTC)" if fine else "minute (UTC)", "requests", "successful", "throttled", "in msgs", "out msgs", "credits", "cpu %", "mem %")
    rows: list[tuple[Union[str, int], ...]] = [header]
    for p in report.points:
        rows.append((p.time_utc.strftime("%Y-%m-%d %H:%M:%S" if fine else "%Y-%m-%d %H:%M"), p.incoming_requests, p.successful_requests,
                     p.throttled_requests, p.incoming_messages, p.outgoing_messages, p.credits_used,
                     "" if p.cpu_percent is None else f"{p.cpu_percent:.1f}",
                     "" if p.memory_percent is None else f"{p.memory_percent:.1f}"))
    if all(p.cpu_percent is None and p.memory_percent is None for p in report.points):
        rows = [r[:-2] for r in rows]
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines += ["  ".join(str(v).rjust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


def plot_metrics(report: Metrics, path: str, *, title: Optional[str] = None, namespace: Optional[str] = None) -> str:
    """Render a report as a PNG at path: messages in and out per period (bars, top), throttled requests and
    credits used per period (bottom), the period being the report's (read a short run per ten seconds:
    fitting_period). Axes start at zero and leave room above the tallest bar, so a run of a few minutes or
    a single throttled request reads as what it is. The title names the entity, the namespace and the
    period. Returns path."""
    from matplotlib import dates, ticker
    from matplotlib.figure import Figure  # not pyplot: a notebook's backend and figures are left alone

    figure = Figure(figsize=(9, 6))
    top, bottom = figure.subplots(2, 1, sharex=True)
    _draw(report, top, bottom)
    for axis in (top, bottom):
        # matplotlib.dates has no type hints
        axis.xaxis.set_major_locator(dates.AutoDateLocator(minticks=3, maxticks=10))  # type: ignore[no-untyped-call]
        axis.xaxis.set_major_formatter(
            dates.DateFormatter("%H:%M" if report.period >= MINUTE else "%H:%M:%S"))  # type: ignore[no-untyped-call]
    bottom.yaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    scope = report.entity or "all entities"
    where = f" in {namespace}" if namespace else ""
    figure.suptitle(title or f"sparkbus metrics: {scope}{where} (per {period_name(report.period)}, UTC)")
    figure.autofmt_xdate()
    figure.savefig(path, dpi=100)
    return path


def _draw(report: Metrics, top: Axes, bottom: Axes) -> None:
    """The bars of plot_metrics: one group per period, zero-based axes with headroom."""
    from matplotlib import dates

    points, per = report.points, f"per {period_name(report.period)}"
    starts = [dates.date2num(p.time_utc) for p in points]  # type: ignore[no-untyped-call]  # untyped in matplotlib
    width = report.period / timedelta(days=1) * 0.4  # in days (matplotlib's date unit): two bars side by side
    incoming = [p.incoming_messages for p in points]
    outgoing = [p.outgoing_messages for p in points]
    top.bar([m - width / 2 for m in starts], incoming, width=width, label="incoming messages")
    top.bar([m + width / 2 for m in starts], outgoing, width=width, label="outgoing messages")
    top.set_ylabel(f"messages {per}")
    top.set_ylim(0, _headroom(incoming + outgoing))
    top.legend(loc="upper left")
    throttled = [p.throttled_requests for p in points]
    bottom.bar(starts, throttled, width=width, color="tab:red", label="throttled requests")
    bottom.set_ylabel(f"throttled requests {per}")
    bottom.set_ylim(0, _headroom(throttled, floor=5))
    credits = bottom.twinx()
    used = [p.credits_used for p in points]
    credits.plot(starts, used, color="tab:gray", marker="o", label="credits used")
    credits.set_ylabel(f"credits {per}")
    credits.set_ylim(0, _headroom(used))
    bottom.legend(loc="upper left")
    credits.legend(loc="upper right")
    if points:  # three quarters of a period of margin either side, so one period is a bar, not a sliver at the edge
        low, high = min(p.time_utc for p in points), max(p.time_utc for p in points)
        margin = report.period * 0.75
        bottom.set_xlim(dates.date2num(low - margin),  # type: ignore[no-untyped-call]  # untyped in matplotlib
                        dates.date2num(high + margin))  # type: ignore[no-untyped-call]


def _headroom(values: Sequence[float], floor: float = 1) -> float:
    """An axis top a quarter above the largest value, at least floor (all zero: 0 to floor, not -0.04..0.04)."""
    return max([floor, *(v * 1.25 for v in values)])


@dataclass(frozen=True)
class Backlog:
    """The messages one entity holds now, by state, and per partition (partition -> messages in it; a
    partition that cannot be read is missing). awaiting_fanout: a topic's messages no fan-out has delivered."""

    kind: str  # "queue", "topic" or "subscription"
    path: str  # subscriptions as '<topic>/Subscriptions/<name>'
    active: int
    scheduled: int
    dead_letter: int
    transfer: int  # waiting to be forwarded, or dead-lettered while forwarding
    partitions: dict[int, int]
    awaiting_fanout: Optional[int] = None


def namespace_backlog(namespace: Union[str, ServiceBusAdministrationClient]) -> list[Backlog]:
    """The backlog of every queue, topic and subscription of the namespace (a path, URI or administration
    client), in the order `sparkbus show` lists them."""
    admin = namespace if isinstance(namespace, ServiceBusAdministrationClient) else \
        ServiceBusAdministrationClient(namespace)
    found: list[Backlog] = []

    def add(kind: str, path: str,
            runtime: Union[QueueRuntimeProperties, TopicRuntimeProperties, SubscriptionRuntimeProperties],
            awaiting: Optional[int] = None) -> None:
        transfer = getattr(runtime, "transfer_message_count", 0) + \
            getattr(runtime, "transfer_dead_letter_message_count", 0)
        found.append(Backlog(kind, path, runtime.active_message_count, runtime.scheduled_message_count,
                             runtime.dead_letter_message_count, transfer, admin.get_partition_message_counts(path),
                             awaiting))

    for queue in admin.list_queues():
        add("queue", queue.name, admin.get_queue_runtime_properties(queue.name))
    for topic in admin.list_topics():
        add("topic", topic.name, admin.get_topic_runtime_properties(topic.name),
            admin.get_topic_awaiting_fanout(topic.name))
        for sub in admin.list_subscriptions(topic.name):
            add("subscription", f"{topic.name}/Subscriptions/{sub.name}",
                admin.get_subscription_runtime_properties(topic.name, sub.name))
    return found


_STATES = (("active", "tab:blue"), ("scheduled", "tab:purple"), ("dead_letter", "tab:red"), ("transfer", "tab:gray"))


def plot_backlog(backlog: Sequence[Backlog], path: str, *, namespace: Optional[str] = None) -> str:
    """Render the backlog (backlog_figure) as a PNG at path. Returns path."""
    backlog_figure(backlog, namespace=namespace).savefig(path, dpi=100)
    return path


def backlog_figure(backlog: Sequence[Backlog], *, namespace: Optional[str] = None) -> Figure:
    """The backlog as a figure: one stacked bar per entity by state (left), and each entity's messages per
    partition as a grid of counts shaded by the partition's share of the entity (right; a partition the
    entity does not have is blank). The states' legend sits under both, where it covers no bar."""
    from matplotlib.figure import Figure

    rows = max(len(backlog), 1)
    figure = Figure(figsize=(12, 1.5 + 0.45 * rows), layout="constrained")
    bars, grid = figure.subplots(1, 2, width_ratios=(1, 1.3))
    _draw_backlog(backlog, bars, grid)
    figure.legend(*bars.get_legend_handles_labels(), loc="outside lower left", ncol=len(_STATES), frameon=False)
    where = f" in {namespace}" if namespace else ""
    figure.suptitle(f"sparkbus backlog{where}")
    return figure


def _draw_backlog(backlog: Sequence[Backlog], bars: Axes, grid: Axes) -> None:
    """The two panels of plot_backlog."""
    import numpy as np
    from matplotlib import ticker

    names = [f"{b.path} (awaiting fan-out: {b.awaiting_fanout})" if b.awaiting_fanout else b.path for b in backlog]
    positions = np.arange(len(backlog))
    left = np.zeros(len(backlog))
    for state, color in _STATES:
        values = np.array([getattr(b, state) for b in backlog], dtype=float)
        bars.barh(positions, values, left=left, color=color, label=state.replace("_", "-"))
        left += values
    bars.set_yticks(positions, names)
    bars.invert_yaxis()
    bars.set_xlim(0, _headroom(list(left)))
    bars.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    bars.set_xlabel("messages")
    bars.set_title("messages by state")
    width = max([max(b.partitions, default=0) + 1 for b in backlog] or [1])
    shares = np.full((len(backlog), width), np.nan)
    for row, b in enumerate(backlog):
        total = sum(b.partitions.values())
        for partition, count in b.partitions.items():
            shares[row, partition] = count / total if total else 0.0
            grid.text(partition, row, str(count), ha="center", va="center", fontsize=8,
                      color="white" if shares[row, partition] > 0.5 else "black")
    grid.imshow(shares, aspect="auto", cmap="Blues", vmin=0, vmax=1, interpolation="nearest")
    grid.set_yticks(positions, [b.path for b in backlog])
    grid.set_xticks(range(width))
    grid.set_xlabel("partition")
    grid.set_title("messages per partition (shade: share of the entity's)")
