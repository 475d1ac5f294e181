"""The demo's report: a short text for the terminal and an HTML page with inline SVG plots.

No plotting dependency: the page and its charts are those of a backfill's report
(:mod:`airflow_provider_kappa.report.report`): one definition of the drawing.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from airflow_provider_kappa.report.charts import Windows, bar_rows_chart, window_chart
from airflow_provider_kappa.report.page import page, table
from airflow_provider_kappa.timeaxis import HOUR
from airflow_provider_kappa.timeparse import parse_timestamp, to_micros


@dataclass(frozen=True)
class SliceStat:
    """What one slice run did."""

    slice_id: str
    rows_read: int
    seconds: float
    batches: int
    watermark: str | None = None

    @property
    def rows_per_second(self) -> float:
        return self.rows_read / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class HourCount:
    """Output rows per hour of the sink's time column, live reference vs backfill."""

    hour: str
    live: int
    backfill: int


@dataclass
class DemoReport:
    """Everything the demo shows at the end."""

    title: str
    facts: list[tuple[str, str]] = field(default_factory=list)
    slices: list[SliceStat] = field(default_factory=list)
    hours: list[HourCount] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: counts per output window (finer than ``hours``), e.g. ``Windows.from_report(report.to_dict())``
    #: of :func:`airflow_provider_kappa.backfill.validate.build_report`; default: ``hours``
    windows: Windows | None = None

    def to_text(self) -> str:
        """The terminal version."""
        width = max((len(k) for k, _ in self.facts), default=0)
        lines = [self.title, "=" * len(self.title)]
        lines += [f"{k.ljust(width)}  {v}" for k, v in self.facts]
        if self.slices:
            lines.append("")
            lines.append(f"{'slice':<22}{'rows':>10}{'batches':>9}{'seconds':>9}{'rows/s':>10}  watermark")
            for s in self.slices:
                lines.append(
                    f"{s.slice_id:<22}{s.rows_read:>10}{s.batches:>9}{s.seconds:>9.1f}{s.rows_per_second:>10.0f}  "
                    f"{s.watermark or '-'}"
                )
        if self.hours:
            lines.append("")
            lines.append(f"{'hour':<27}{'live':>8}{'backfill':>10}")
            for h in self.hours:
                lines.append(f"{h.hour:<27}{h.live:>8}{h.backfill:>10}")
        lines += [""] + self.notes if self.notes else []
        return "\n".join(lines)

    def write_html(self, path: str | Path) -> Path:
        """Write the HTML page (facts, live vs backfill per window, slice throughput, notes),
        drawn by the backfill report's code (:mod:`airflow_provider_kappa.report.report`),
        and return its path."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        body = [table(["", ""], self.facts)]
        windows = self.windows or _hour_windows(self.hours)
        if windows is not None:
            body.append("<h2>Live reference vs backfill, rows per window</h2>")
            body.append(f"<div class='panel'>{window_chart(windows, 'live reference vs backfill')}</div>")
        if self.slices:
            body.append("<h2>Slices: throughput (rows read per second)</h2>")
            chart = bar_rows_chart(
                [s.slice_id for s in self.slices],
                [s.rows_per_second for s in self.slices],
                "rows/s",
                "throughput per slice",
            )
            body.append(f"<div class='panel'>{chart}</div>")
            body.append(
                table(
                    ["slice", "rows read", "micro-batches", "seconds", "rows/s", "watermark"],
                    [
                        [
                            s.slice_id,
                            f"{s.rows_read:,}",
                            s.batches,
                            f"{s.seconds:.1f}",
                            f"{s.rows_per_second:,.0f}",
                            s.watermark or "-",
                        ]
                        for s in self.slices
                    ],
                    [False, True, True, True, True, False],
                )
            )
        if self.notes:
            body.append("<h2>Notes</h2><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in self.notes) + "</ul>")
        target.write_text(
            page(self.title, "live reference (the unchanged job run live) vs the published backfill", body)
        )
        return target


def _hour_windows(hours: Sequence[HourCount]) -> Windows | None:
    """Hourly counts as the shared chart's windows (one window per hour, the hours in between empty)."""
    starts = [to_micros(parse_timestamp(h.hour, "hour")) for h in hours if h.hour != "null"]
    if not starts:
        return None
    first, last = min(starts), max(starts)
    n = (last - first) // HOUR + 1
    live, backfill = [0] * n, [0] * n
    for h, at in zip((h for h in hours if h.hour != "null"), starts):
        live[(at - first) // HOUR] += h.live
        backfill[(at - first) // HOUR] += h.backfill
    return Windows(first=first, step=HOUR, live=live, backfill=backfill, lo=first, hi=first + n * HOUR)
