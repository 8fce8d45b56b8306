"""The entity page's charts, drawn on the server as SVG by matplotlib (a dependency already): the page needs
no chart library, no script and no internet access, and a chart is an image the browser shows as it shows
any other (its markup cannot run)."""
from __future__ import annotations

import io
from datetime import datetime
from typing import Sequence

from .pages import MetricsPointView


def _svg(figure: "object") -> bytes:
    out = io.BytesIO()
    figure.savefig(out, format="svg")  # type: ignore[attr-defined]
    return out.getvalue()


def throughput_svg(points: Sequence[MetricsPointView], title: str, start: datetime, end: datetime) -> bytes:
    """Incoming and outgoing messages per minute from start to end (bars side by side), throttled requests
    marked."""
    from matplotlib import dates, ticker
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 2.8), layout="constrained")
    axis = figure.subplots()
    if points:
        times = [dates.date2num(p.time_utc) for p in points]  # type: ignore[no-untyped-call]
        width = 0.35 / (24 * 60)
        axis.bar([t - width / 2 for t in times], [p.incoming_messages for p in points], width, label="incoming",
                 color="tab:blue")
        axis.bar([t + width / 2 for t in times], [p.outgoing_messages for p in points], width, label="outgoing",
                 color="tab:green")
        throttled = [(t, p.throttled_requests) for t, p in zip(times, points) if p.throttled_requests]
        if throttled:
            axis.scatter([t for t, _ in throttled], [0] * len(throttled), marker="^", color="tab:red",
                         label="throttled", zorder=3)
        axis.set_xlim(dates.date2num(start), dates.date2num(end))  # type: ignore[no-untyped-call]
        axis.xaxis_date()
        axis.xaxis.set_major_formatter(dates.DateFormatter("%H:%M"))  # type: ignore[no-untyped-call]
        axis.legend(loc="upper left", frameon=False, ncol=3)
    else:
        axis.text(0.5, 0.5, "no messages in the last hour", ha="center", va="center", transform=axis.transAxes)
        axis.set_xticks([])
    axis.yaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    axis.set_ylim(bottom=0)
    axis.set_title(title, fontsize=10)
    axis.set_ylabel("messages per minute")
    return _svg(figure)


def partitions_svg(partitions: dict[int, int], title: str) -> bytes:
    """Messages per partition now: how evenly keys spread the backlog."""
    from matplotlib import ticker
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 2.4), layout="constrained")
    axis = figure.subplots()
    ids = sorted(partitions)
    axis.bar([str(p) for p in ids], [partitions[p] for p in ids], color="tab:blue")
    axis.yaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    axis.set_ylim(0, max([*partitions.values(), 1]) * 1.2)
    axis.set_xlabel("partition")
    axis.set_ylabel("messages")
    axis.set_title(title, fontsize=10)
    return _svg(figure)
