"""The demo's report: a short text for the terminal and an HTML page with inline SVG plots.

No plotting dependency: the charts are small hand-drawn SVGs (bars and a line).
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence


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
        """Write the HTML page (facts, two charts, notes) and return its path."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        facts = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in self.facts)
        throughput = bar_chart(
            [s.slice_id for s in self.slices],
            [[s.rows_per_second for s in self.slices]],
            ["rows/s"],
            "Per-slice throughput (rows read per second)",
        )
        hours = bar_chart(
            [h.hour[11:16] if len(h.hour) >= 16 else h.hour for h in self.hours],
            [[float(h.live) for h in self.hours], [float(h.backfill) for h in self.hours]],
            ["live reference", "backfill"],
            "Output rows per hour: live vs backfill",
        )
        marks = [s.watermark or "" for s in self.slices]
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in self.notes)
        target.write_text(
            "<!doctype html><html><head><meta charset='utf-8'>"
            f"<title>{html.escape(self.title)}</title>"
            "<style>body{font-family:sans-serif;margin:2em;max-width:1000px}"
            "th{text-align:left;padding-right:1em}td{font-family:monospace}</style></head><body>"
            f"<h1>{html.escape(self.title)}</h1><table>{facts}</table>"
            f"<h2>Slices</h2>{throughput}"
            f"<p>Watermark at the end of each slice: {html.escape(', '.join(m for m in marks if m)) or '-'}</p>"
            f"<h2>Live vs backfill</h2>{hours}<ul>{notes}</ul></body></html>"
        )
        return target


def bar_chart(labels: Sequence[str], series: Sequence[Sequence[float]], names: Sequence[str], title: str) -> str:
    """A grouped bar chart as inline SVG.

    :param labels: one label per group (x axis).
    :param series: one list of values per series, each as long as ``labels``.
    :param names: series names (legend).
    :param title: chart title.
    """
    colors = ["#4472c4", "#ed7d31", "#70ad47"]
    width, height, pad = 900, 260, 40
    n = max(len(labels), 1)
    top = max((v for s in series for v in s), default=0.0) or 1.0
    group = (width - 2 * pad) / n
    bar = group * 0.8 / max(len(series), 1)
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height + 60}'>"]
    parts.append(f"<text x='{pad}' y='16' font-size='14'>{html.escape(title)} (max {top:,.0f})</text>")
    for si, values in enumerate(series):
        for i, v in enumerate(values):
            h = (height - pad) * v / top
            x = pad + i * group + si * bar
            parts.append(
                f"<rect x='{x:.1f}' y='{height - h:.1f}' width='{bar:.1f}' height='{h:.1f}' "
                f"fill='{colors[si % len(colors)]}'><title>{html.escape(labels[i])}: {v:,.0f}</title></rect>"
            )
    step = max(1, n // 12)
    for i in range(0, len(labels), step):
        x = pad + i * group
        parts.append(f"<text x='{x:.1f}' y='{height + 15}' font-size='10'>{html.escape(labels[i])}</text>")
    for si, name in enumerate(names):
        parts.append(
            f"<rect x='{pad + si * 150}' y='{height + 30}' width='12' height='12' fill='{colors[si % len(colors)]}'/>"
            f"<text x='{pad + si * 150 + 16}' y='{height + 41}' font-size='12'>{html.escape(name)}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)
