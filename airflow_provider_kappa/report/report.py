"""The report of a backfill: one self-contained HTML page (inline CSS and SVG; no script, no
font or file from elsewhere), written beside the backfill's checkpoints by the validate step
that ``kappa backfill`` and the DAG's validate task both run.

Where: ``<checkpoint_root>/<job>/backfill/<backfill_id>/report.html`` (:func:`report_file`),
on any filesystem the checkpoints live on. What:

- the match rate of each sink, staged (backfill) and target (live, the table as it is now)
  rows, the ``min_match`` gate;
- live vs backfill rows per output window across the whole window (``ValidationReport.windows``),
  the windows whose counts differ shaded, with a strip of the difference under it: the incident
  is what stands out;
- the slice timeline: one bar per slice run on the wall clock, its duration and the watermark
  it reached; throughput (rows read per second) per slice; a table with every number;
- samples of rows found on one side only.

Axis labels never overlap: a tick step is the shortest round duration (or 1-2-5 count) whose
labels, at their widest, fit between neighbours (:mod:`~airflow_provider_kappa.timeaxis`).
Label widths are estimated with :data:`CHAR_PX` per character at :data:`FONT_PX` (generous for
common sans-serif fonts). The drawing helpers (:func:`window_chart`, :func:`timeline_chart`,
:func:`bar_rows_chart`, :func:`page`) are also what the demo's report draws with.
"""

from __future__ import annotations

import html
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from airflow_provider_kappa.timeaxis import (
    SECOND,
    count_label,
    count_ticks,
    date_label,
    format_duration_us,
    time_label,
    time_ticks,
)
from airflow_provider_kappa.timeparse import from_micros, parse_timestamp, to_micros

if TYPE_CHECKING:
    from airflow_provider_kappa.backfill.backfill import Backfill
    from airflow_provider_kappa.backfill.plan import BackfillPlan
    from airflow_provider_kappa.backfill.validate import ValidationReport
    from airflow_provider_kappa.job.checkpoints import CheckpointStore

log = logging.getLogger(__name__)

#: File name of the report in the backfill's checkpoint folder.
#: Axis label font size and the width estimated per character (px): wider than DejaVu Sans'
#: digits (0.64 em), so that an estimate never falls short of the drawn label.
FONT_PX = 11
CHAR_PX = 7.2
#: The least gap between two axis labels (px).
LABEL_GAP = 14
WIDTH = 1080
LIVE = "#94a3b8"
BACKFILL = "#2563eb"
DIFF = "#dc2626"
BAND = "#fee2e2"
#: Windows drawn with a hover box of their own, at most (beyond, only differing runs have one).
HOVER_WINDOWS = 1200


def text_px(text: str, font_px: float = FONT_PX) -> float:
    """Estimated drawn width of ``text`` (never less than the real one for usual fonts)."""
    return len(text) * CHAR_PX * font_px / FONT_PX


def rate_label(value: float) -> str:
    """A rate for people: ``0.27``, ``8.5``, ``950``, ``12k``."""
    return f"{value:.2g}" if 0 < abs(value) < 10 else count_label(round(value))


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


# --------------------------------------------------------------------------- axes


@dataclass(frozen=True)
class Label:
    """An axis label as drawn: its text, anchor point and anchor (for tests and the page)."""

    text: str
    x: float
    y: float
    anchor: str  # start | middle | end

    def box(self, font_px: float = FONT_PX) -> tuple[float, float]:
        """Estimated horizontal extent ``(left, right)``."""
        w = text_px(self.text, font_px)
        left = {"start": self.x, "middle": self.x - w / 2, "end": self.x - w}[self.anchor]
        return left, left + w


def _svg_text(label: Label, cls: str = "tick") -> str:
    return (
        f"<text class='{cls}' x='{label.x:.1f}' y='{label.y:.1f}' text-anchor='{label.anchor}'>{_e(label.text)}</text>"
    )


def time_axis(lo: int, hi: int, x0: float, x1: float, y: float) -> tuple[list[str], list[Label]]:
    """A UTC time axis from ``lo`` to ``hi`` (epoch µs) drawn from ``x0`` to ``x1`` at ``y``:
    grid lines are the caller's (the returned tick positions), labels never overlap.

    :returns: SVG parts (tick marks and labels) and the labels.
    """
    widest = max(text_px("00:00:00"), text_px("Mon 00"))
    step, ticks = time_ticks(lo, hi, x1 - x0, widest + LABEL_GAP)
    labels: list[Label] = []
    parts: list[str] = []
    previous_day = None
    for t in ticks:
        x = x0 + (x1 - x0) * (t - lo) / max(hi - lo, 1)
        parts.append(f"<line class='tickmark' x1='{x:.1f}' x2='{x:.1f}' y1='{y:.1f}' y2='{y + 4:.1f}'/>")
        main = Label(time_label(t, step), x, y + 16, "middle")
        labels.append(main)
        day = date_label(t)
        if step < 24 * 3600 * SECOND and day != previous_day:
            labels.append(Label(day, x, y + 30, "middle"))
        previous_day = day
    labels = _keep_inside(labels, x0, x1)
    parts.extend(_svg_text(lb) for lb in labels)
    return parts, labels


def _keep_inside(labels: list[Label], x0: float, x1: float) -> list[Label]:
    """Labels shifted (anchored at their end or start) so that none sticks out of ``[x0 - 20, x1 + 20]``."""
    out = []
    for lb in labels:
        left, right = lb.box()
        if left < x0 - 20:
            lb = Label(lb.text, max(lb.x, x0 - 20), lb.y, "start")
        elif right > x1 + 20:
            lb = Label(lb.text, min(lb.x, x1 + 20), lb.y, "end")
        out.append(lb)
    # a shifted label may now touch its neighbour on the same line: drop the neighbour
    kept: list[Label] = []
    for lb in out:
        same_line = [k for k in kept if k.y == lb.y]
        if same_line and lb.box()[0] < same_line[-1].box()[1] + LABEL_GAP / 2:
            if lb.anchor == "end":
                kept.remove(same_line[-1])
            else:
                continue
        kept.append(lb)
    return kept


def count_axis(top: float, x: float, y0: float, y1: float) -> tuple[list[str], list[Label], float]:
    """A count axis (0 at ``y0``, bottom; ``top`` rounded up at ``y1``, top) with labels right of ``x``
    aligned; horizontal grid lines are returned as SVG parts too (from ``x``).

    :returns: parts, labels, the axis' rounded top value.
    """
    ticks = count_ticks(top)
    rounded = ticks[-1]
    parts, labels = [], []
    for v in ticks:
        yy = y0 - (y0 - y1) * v / rounded
        parts.append(f"<line class='grid' x1='{x:.1f}' x2='{{right}}' y1='{yy:.1f}' y2='{yy:.1f}'/>")
        labels.append(Label(count_label(v), x - 6, yy + 4, "end"))
    parts.extend(_svg_text(lb) for lb in labels)
    return parts, labels, rounded


# --------------------------------------------------------------------------- charts


@dataclass
class Windows:
    """Counts per output window of one sink, live (the target now) vs the backfill (staged)."""

    first: int  # epoch µs
    step: int  # µs
    live: list[int]
    backfill: list[int]
    lo: int  # the backfill window, epoch µs
    hi: int
    grid: bool = True
    only_live: list[int] = field(default_factory=list)  # rows on one side only; default: the count's excess
    only_backfill: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.only_live and not self.only_backfill:
            self.only_live = [max(0, a - b) for a, b in zip(self.live, self.backfill)]
            self.only_backfill = [max(0, b - a) for a, b in zip(self.live, self.backfill)]

    @classmethod
    def from_report(cls, report: Mapping[str, Any]) -> Windows | None:
        """From ``ValidationReport.to_dict()`` (None when it has no window counts)."""
        w = report.get("windows")
        if not w:
            return None
        return cls(
            first=to_micros(parse_timestamp(w["first"], "windows.first")),
            step=round(float(w["step_seconds"]) * SECOND),
            live=[int(v) for v in w["target"]],
            backfill=[int(v) for v in w["staged"]],
            lo=to_micros(parse_timestamp(report["window_start"], "window_start")),
            hi=to_micros(parse_timestamp(report["window_end"], "window_end")),
            grid=bool(w.get("grid", True)),
            only_live=[int(v) for v in w.get("only_target") or []],
            only_backfill=[int(v) for v in w.get("only_staged") or []],
        )

    def differs(self, i: int) -> bool:
        """Whether window ``i`` has rows on one side only."""
        return bool(self.only_live[i] or self.only_backfill[i])

    def runs(self) -> list[tuple[int, int]]:
        """Runs ``[i, j)`` of consecutive windows whose rows differ."""
        out: list[tuple[int, int]] = []
        for i in range(len(self.live)):
            if not self.differs(i):
                continue
            if out and out[-1][1] == i:
                out[-1] = (out[-1][0], i + 1)
            else:
                out.append((i, i + 1))
        return out


def _span_label(start: int, end: int) -> str:
    a, b = from_micros(start), from_micros(end)
    same_day = a.date() == (b - timedelta(microseconds=1)).date()
    return f"{a:%Y-%m-%d %H:%M:%S}–{b:%H:%M:%S}" if same_day else f"{a:%Y-%m-%d %H:%M:%S}–{b:%Y-%m-%d %H:%M:%S}"


def window_chart(w: Windows, title: str, width: int = WIDTH) -> str:
    """Live vs backfill rows per output window over the backfill's window, the windows whose rows
    differ shaded (class ``diff-band``), and a strip below of the rows on one side only (only
    in the backfill up, only live down).

    :param w: the counts.
    :param title: an accessible title (``aria-label``).
    :param width: SVG width in px.
    """
    top_value = max([*w.live, *w.backfill, 1])
    worst = max([*w.only_live, *w.only_backfill, 1])
    ticks = count_ticks(top_value)
    left = 14 + max(text_px(count_label(t)) for t in ticks)
    right, top, plot_h, gap, strip_h = width - 18, 28, 220, 18, 56
    y0 = top + plot_h
    s_top = y0 + gap
    s_mid = s_top + strip_h / 2
    axis_y = s_top + strip_h
    height = int(axis_y + 44)

    def xs(t: int) -> float:
        return left + (right - left) * (t - w.lo) / max(w.hi - w.lo, 1)

    parts = [
        f"<svg class='chart windows' xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
        f"viewBox='0 0 {width} {height}' role='img' aria-label='{_e(title)}'>"
    ]
    for i, j in w.runs():
        a, b = xs(w.first + i * w.step), xs(w.first + j * w.step)
        tip = (
            f"{_span_label(w.first + i * w.step, w.first + j * w.step)}: live {sum(w.live[i:j]):,}, backfill "
            f"{sum(w.backfill[i:j]):,}; rows only live {sum(w.only_live[i:j]):,}, only in the backfill {sum(w.only_backfill[i:j]):,}"
        )
        parts.append(
            f"<rect class='diff-band' data-start='{from_micros(w.first + i * w.step).isoformat()}' "
            f"data-end='{from_micros(w.first + j * w.step).isoformat()}' x='{a:.1f}' y='{top}' width='{max(b - a, 1.5):.1f}' "
            f"height='{axis_y - top:.1f}'><title>{_e(tip)}</title></rect>"
        )
    grid, _, rounded = count_axis(top_value, left, y0, top)
    parts.extend(p.replace("{right}", f"{right:.1f}") for p in grid)

    def step_path(values: Sequence[int], close: bool) -> str:
        pts = []
        for i, v in enumerate(values):
            a, b = xs(w.first + i * w.step), xs(w.first + (i + 1) * w.step)
            yy = y0 - plot_h * v / rounded
            pts.append(f"{a:.1f},{yy:.1f} {b:.1f},{yy:.1f}")
        if not pts:
            return ""
        d = "M" + " L".join(pts)
        if close:
            d = (
                f"M{xs(w.first):.1f},{y0:.1f} L"
                + " L".join(pts)
                + f" L{xs(w.first + len(values) * w.step):.1f},{y0:.1f} Z"
            )
        return d

    parts.append(f"<path class='live' d='{step_path(w.live, True)}'/>")
    parts.append(f"<path class='backfill' d='{step_path(w.backfill, False)}'/>")
    parts.append(f"<line class='axis' x1='{left:.1f}' x2='{right:.1f}' y1='{y0:.1f}' y2='{y0:.1f}'/>")
    # the difference strip
    parts.append(f"<line class='axis zero' x1='{left:.1f}' x2='{right:.1f}' y1='{s_mid:.1f}' y2='{s_mid:.1f}'/>")
    for i in range(len(w.live)):
        if not w.differs(i):
            continue
        a, b = xs(w.first + i * w.step), xs(w.first + (i + 1) * w.step)
        for n, cls, up in ((w.only_backfill[i], "only-backfill", True), (w.only_live[i], "only-live", False)):
            if n:
                h = max((strip_h / 2 - 2) * n / worst, 1.0)
                parts.append(
                    f"<rect class='diff-bar {cls}' x='{a:.1f}' y='{s_mid - h if up else s_mid:.1f}' "
                    f"width='{max(b - a - 0.5, 1):.1f}' height='{h:.1f}'/>"
                )
    for text, yy in (
        (f"{count_label(worst)} only backfill", s_top + 8),
        (f"{count_label(worst)} only live", s_top + strip_h),
    ):
        parts.append(_svg_text(Label(text, left + 4, yy, "start"), "tick small"))
    if len(w.live) <= HOVER_WINDOWS:
        for i, (a_v, b_v) in enumerate(zip(w.live, w.backfill)):
            a, b = xs(w.first + i * w.step), xs(w.first + (i + 1) * w.step)
            tip = f"{_span_label(w.first + i * w.step, w.first + (i + 1) * w.step)}: live {a_v:,}, backfill {b_v:,}"
            if w.differs(i):
                tip += f"; rows only live {w.only_live[i]:,}, only in the backfill {w.only_backfill[i]:,}"
            parts.append(
                f"<rect class='hover' x='{a:.1f}' y='{top}' width='{max(b - a, 0.5):.1f}' height='{axis_y - top:.1f}'>"
                f"<title>{_e(tip)}</title></rect>"
            )
    axis, _ = time_axis(w.lo, w.hi, left, right, axis_y)
    parts.extend(axis)
    parts.append(
        f"<g class='legend'><rect x='{left:.1f}' y='8' width='14' height='10' fill='{LIVE}'/>"
        f"<text x='{left + 20:.1f}' y='17'>live (target now)</text>"
        f"<line x1='{left + 150:.1f}' x2='{left + 166:.1f}' y1='13' y2='13' stroke='{BACKFILL}' stroke-width='2.5'/>"
        f"<text x='{left + 172:.1f}' y='17'>backfill (staged)</text>"
        f"<rect x='{left + 300:.1f}' y='8' width='14' height='10' fill='{BAND}' stroke='{DIFF}' stroke-width='0.6'/>"
        f"<text x='{left + 320:.1f}' y='17'>windows that differ</text>"
        f"<text x='{right:.1f}' y='17' text-anchor='end'>rows per {'window' if w.grid else 'bucket'} of "
        f"{_e(format_duration_us(w.step))}, UTC</text></g>"
    )
    parts.append("</svg>")
    return "".join(parts)


@dataclass
class Bar:
    """One row of a timeline: a bar from ``start`` to ``end`` (epoch µs) and its annotation."""

    label: str
    start: int | None
    end: int | None
    note: str = ""
    tip: str = ""
    cls: str = "run"


def _row_layout(n: int) -> tuple[float, int]:
    """Row height and every how many rows a label is drawn (labels need 14 px)."""
    row = max(8.0, min(26.0, 640.0 / max(n, 1)))
    every = max(1, -(-14 // int(row)))
    return row, every


def timeline_chart(bars: Sequence[Bar], title: str, width: int = WIDTH) -> str:
    """A wall-clock timeline (UTC): one row per bar, its note right of it (or inside/left when
    the bar ends near the right edge).

    :param bars: the rows.
    :param title: accessible title.
    :param width: SVG width.
    """
    timed = [b for b in bars if b.start is not None and b.end is not None]
    row, every = _row_layout(len(bars))
    left = 16 + max([text_px(b.label) for b in bars] + [30])
    right, top = width - 18, 10
    plot_bottom = top + row * len(bars)
    height = int(plot_bottom + 46)
    parts = [
        f"<svg class='chart timeline' xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
        f"viewBox='0 0 {width} {height}' role='img' aria-label='{_e(title)}'>"
    ]
    if not timed:
        parts.append(f"<text x='{left}' y='{top + 14}'>no slice has run</text></svg>")
        return "".join(parts)
    lo = min(b.start for b in timed if b.start is not None)
    hi = max(b.end for b in timed if b.end is not None)
    hi = max(hi, lo + SECOND)

    def xs(t: int) -> float:
        return left + (right - left) * (t - lo) / (hi - lo)

    axis, _ = time_axis(lo, hi, left, right, plot_bottom)
    for i, b in enumerate(bars):
        y = top + i * row
        if i % 2 == 0:
            parts.append(f"<rect class='stripe' x='0' y='{y:.1f}' width='{width}' height='{row:.1f}'/>")
        if i % every == 0:
            parts.append(_svg_text(Label(b.label, left - 8, y + row / 2 + 4, "end"), "tick rowlabel"))
        if b.start is None or b.end is None:
            if b.note and row >= 12:
                parts.append(
                    f"<text class='note muted' x='{left + 4:.1f}' y='{y + row / 2 + 4:.1f}'>{_e(b.note)}</text>"
                )
            continue
        a, z = xs(b.start), max(xs(b.end), xs(b.start) + 2)
        parts.append(
            f"<rect class='bar {b.cls}' x='{a:.1f}' y='{y + row * 0.18:.1f}' width='{z - a:.1f}' height='{row * 0.64:.1f}'>"
            f"<title>{_e(b.tip or b.note)}</title></rect>"
        )
        if b.note and row >= 12:
            w = text_px(b.note)
            if z + 6 + w <= right + 16:
                note = Label(b.note, z + 6, y + row / 2 + 4, "start")
            elif a - 6 - w >= left:
                note = Label(b.note, a - 6, y + row / 2 + 4, "end")
            else:  # no room beside the bar: inside it, at its right end
                note = Label(b.note, z - 6, y + row / 2 + 4, "end")
            inside = note.box()[0] >= a and note.box()[1] <= z
            parts.append(_svg_text(note, "note inbar" if inside else "note"))
    parts.extend(axis)
    parts.append(f"<line class='axis' x1='{left:.1f}' x2='{right:.1f}' y1='{plot_bottom:.1f}' y2='{plot_bottom:.1f}'/>")
    parts.append("</svg>")
    return "".join(parts)


def bar_rows_chart(labels: Sequence[str], values: Sequence[float], unit: str, title: str, width: int = WIDTH) -> str:
    """Horizontal bars, one row per label, the value written at the bar's end.

    :param labels: row labels.
    :param values: one value per label.
    :param unit: what the values count (axis title), e.g. ``rows/s``.
    :param title: accessible title.
    :param width: SVG width.
    """
    row, every = _row_layout(len(labels))
    left = 16 + max([text_px(lb) for lb in labels] + [30])
    right, top = width - 90, 10
    plot_bottom = top + row * len(labels)
    height = int(plot_bottom + 40)
    top_value = max([*values, 1.0])
    ticks = count_ticks(top_value, target=max(2, min(8, int((right - left) // (text_px("000k") + 3 * LABEL_GAP)))))
    rounded = ticks[-1]
    parts = [
        f"<svg class='chart bars' xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
        f"viewBox='0 0 {width} {height}' role='img' aria-label='{_e(title)}'>"
    ]

    def xs(v: float) -> float:
        return left + (right - left) * v / rounded

    for t in ticks:
        parts.append(f"<line class='grid' x1='{xs(t):.1f}' x2='{xs(t):.1f}' y1='{top}' y2='{plot_bottom:.1f}'/>")
        parts.append(_svg_text(Label(count_label(t), xs(t), plot_bottom + 16, "middle")))
    parts.append(_svg_text(Label(unit, width - 8, plot_bottom + 16, "end"), "tick unit"))
    for i, (lb, v) in enumerate(zip(labels, values)):
        y = top + i * row
        if i % every == 0:
            parts.append(_svg_text(Label(lb, left - 8, y + row / 2 + 4, "end"), "tick rowlabel"))
        parts.append(
            f"<rect class='bar run' x='{left:.1f}' y='{y + row * 0.18:.1f}' width='{max(xs(v) - left, 0.5):.1f}' "
            f"height='{row * 0.64:.1f}'><title>{_e(lb)}: {v:,.0f} {_e(unit)}</title></rect>"
        )
        if row >= 12:
            parts.append(f"<text class='note' x='{xs(v) + 6:.1f}' y='{y + row / 2 + 4:.1f}'>{_e(rate_label(v))}</text>")
    parts.append(f"<line class='axis' x1='{left:.1f}' x2='{left:.1f}' y1='{top}' y2='{plot_bottom:.1f}'/>")
    parts.append("</svg>")
    return "".join(parts)


# --------------------------------------------------------------------------- page

CSS = f"""
:root {{ --ink:#0f172a; --muted:#64748b; --line:#e2e8f0; --good:#15803d; --bad:{DIFF}; }}
* {{ box-sizing: border-box; }}
body {{ font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: var(--ink);
  margin: 0; background: #f8fafc; }}
main {{ max-width: {WIDTH + 74}px; margin: 0 auto; padding: 28px 24px 48px; }}
h1 {{ font-size: 22px; margin: 0 0 4px; }} h2 {{ font-size: 17px; margin: 32px 0 8px; }}
h3 {{ font-size: 14px; margin: 18px 0 6px; color: var(--muted); font-weight: 600; }}
.sub {{ color: var(--muted); margin: 0 0 18px; }}
.cards {{ display: flex; flex-wrap: wrap; gap: 12px; margin: 12px 0; }}
.card {{ background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 10px 14px; min-width: 150px; }}
.card .v {{ font-size: 22px; font-weight: 650; font-variant-numeric: tabular-nums; }}
.card .k {{ color: var(--muted); font-size: 12px; }}
.card.good .v {{ color: var(--good); }} .card.bad .v {{ color: var(--bad); }}
.panel {{ background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 12px; overflow-x: auto; }}
svg {{ display: block; font-family: inherit; max-width: 100%; height: auto; }}
svg text {{ font-size: {FONT_PX}px; fill: #334155; }}
svg .legend text {{ font-size: 12px; }}
svg .small {{ font-size: 10px; fill: var(--muted); }}
svg .grid {{ stroke: #eef2f7; }} svg .axis {{ stroke: #94a3b8; }} svg .tickmark {{ stroke: #94a3b8; }}
svg .zero {{ stroke-dasharray: 3 3; }}
svg .live {{ fill: {LIVE}; fill-opacity: .55; stroke: {LIVE}; }}
svg .backfill {{ fill: none; stroke: {BACKFILL}; stroke-width: 1.8; }}
svg .diff-band {{ fill: {BAND}; }} svg .only-backfill {{ fill: {BACKFILL}; }} svg .only-live {{ fill: {DIFF}; }}
svg .hover {{ fill: transparent; }} svg .hover:hover {{ fill: rgba(37,99,235,.08); }}
svg .stripe {{ fill: #f8fafc; }} svg .bar.run {{ fill: {BACKFILL}; }} svg .bar.skipped {{ fill: #cbd5e1; }}
svg .note {{ fill: #334155; }} svg .note.inbar {{ fill: #fff; }} svg .muted {{ fill: var(--muted); }}
table {{ border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; background: #fff; }}
th, td {{ text-align: left; padding: 4px 8px; border-bottom: 1px solid var(--line); white-space: nowrap; font-size: 13px; }}
td.n, th.n {{ text-align: right; }}
tr.diff td {{ background: #fff5f5; }}
.scroll {{ overflow-x: auto; border: 1px solid var(--line); border-radius: 8px; }}
.muted {{ color: var(--muted); }}
.warning {{ background: #fffbeb; border: 1px solid #fde68a; border-radius: 6px; padding: 6px 10px; }}
"""


def page(title: str, subtitle: str, body: Iterable[str]) -> str:
    """A whole HTML page around ``body`` (already-safe HTML parts).

    :param title: the page's title and heading (text).
    :param subtitle: one line under it (text).
    :param body: HTML parts.
    """
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body><main>"
        f"<h1>{_e(title)}</h1><p class='sub'>{_e(subtitle)}</p>" + "".join(body) + "</main></body></html>"
    )


def cards(items: Iterable[tuple[str, str, str]]) -> str:
    """Key figures: ``(value, caption, class)`` with class ``good``, ``bad`` or empty."""
    return (
        "<div class='cards'>"
        + "".join(
            f"<div class='card {_e(c)}'><div class='v'>{_e(v)}</div><div class='k'>{_e(k)}</div></div>"
            for v, k, c in items
        )
        + "</div>"
    )


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], numeric: Sequence[bool] | None = None) -> str:
    """An HTML table (escaped cells); ``numeric`` right-aligns columns."""
    numeric = numeric or [False] * len(headers)
    head = "".join(f"<th class='{'n' if n else ''}'>{_e(h)}</th>" for h, n in zip(headers, numeric))
    body = []
    for r in rows:
        cells = "".join(f"<td class='{'n' if n else ''}'>{_e(c)}</td>" for c, n in zip(r, numeric))
        body.append(f"<tr>{cells}</tr>")
    return f"<div class='scroll'><table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"


# --------------------------------------------------------------------------- the backfill's report


@dataclass
class SliceRun:
    """A slice of the plan and what its last run did (from the checkpoint store)."""

    slice_id: str
    read_start: str
    read_end: str
    owns_start: str
    owns_end: str
    done: bool = False
    skipped: bool = False
    rows_read: int = 0
    rows_written: int = 0
    batches: int = 0
    seconds: float = 0.0
    watermark: str | None = None
    peak_state_rows: int = 0
    started: int | None = None  # epoch µs
    ended: int | None = None

    @property
    def rows_per_second(self) -> float:
        """Rows read per second of the run's wall-clock time."""
        return self.rows_read / self.seconds if self.seconds > 0 else 0.0


def slice_runs(store: CheckpointStore, plan: BackfillPlan) -> list[SliceRun]:
    """Every slice of ``plan`` with the metrics of its last successful run and when it ran:
    it ended at the end of its last micro-batch (the Spark progress records' ``timestamp`` and
    ``batchDuration``) and started ``seconds`` (its wall-clock duration) before.

    :param store: the backfill's checkpoint store.
    :param plan: its plan.
    """
    progress = store.progress()
    out = []
    for sp in plan.slices:
        run = SliceRun(
            sp.slice_id,
            sp.read_start.isoformat(),
            sp.read_end.isoformat(),
            sp.owns_start.isoformat(),
            sp.owns_end.isoformat(),
        )
        done = store.done(sp.slice_id)
        if done is not None:
            run.done, run.skipped = True, bool(done.get("skipped"))
            run.rows_read, run.rows_written = int(done.get("rows_read", 0)), int(done.get("rows_written", 0))
            run.batches, run.seconds = int(done.get("batches", 0)), float(done.get("seconds", 0.0))
            run.watermark, run.peak_state_rows = done.get("watermark"), int(done.get("peak_state_rows", 0))
            ends = [_batch_end(p) for p in progress.get(sp.slice_id, [])]
            ended = max((e for e in ends if e is not None), default=None)
            if ended is not None:
                run.ended, run.started = ended, ended - round(run.seconds * SECOND)
        out.append(run)
    return out


def _batch_end(progress: Mapping[str, Any]) -> int | None:
    stamp = progress.get("timestamp")
    if not isinstance(stamp, str):
        return None
    try:
        at = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    if at.tzinfo is None:
        at = at.replace(tzinfo=timezone.utc)
    return to_micros(at) + int(float(progress.get("batchDuration") or 0) * 1000)


@dataclass
class BackfillReportPage:
    """What the page shows: the backfill, each sink's validation and the slice runs."""

    backfill_id: str
    job: str
    window_start: str
    window_end: str
    mode: str
    slice: str
    min_match: float
    publishes: bool
    sinks: dict[str, dict[str, Any]] = field(default_factory=dict)
    slices: list[SliceRun] = field(default_factory=list)
    generated: str = ""

    def render(self) -> str:
        """The HTML page."""
        body: list[str] = []
        ran = [s for s in self.slices if s.done and not s.skipped]
        rows = sum(s.rows_read for s in ran)
        spark = sum(s.seconds for s in ran)
        figures: list[tuple[str, str, str]] = []
        for name, rep in self.sinks.items():
            rate = float(rep["match_rate"])
            ok = rate >= self.min_match and not (rep["staged_rows"] == 0 and rep["target_rows"] > 0)
            figures.append(
                (f"{rate:.3f}%", f"match rate, sink {name}", "good" if rate >= 100.0 else ("" if ok else "bad"))
            )
            windows = Windows.from_report(rep)
            if windows is not None:
                n = sum(1 for i in range(len(windows.live)) if windows.differs(i))
                kind = "windows" if windows.grid else "buckets"
                figures.append((f"{n:,} / {len(windows.live):,}", f"{kind} differing, {name}", "bad" if n else "good"))
        figures.append((f"{sum(1 for s in self.slices if s.done)}/{len(self.slices)}", "slices done", ""))
        figures.append((f"{rows:,}", "rows read", ""))
        figures.append((rate_label(rows / spark) if spark else "-", "rows/s (all slices)", ""))
        figures.append((format_duration_us(spark * SECOND) if spark else "-", "Spark time", ""))
        body.append(cards(figures))
        gate = "publishes" if self.publishes else "does not publish (dry run or publish off)"
        body.append(
            f"<p class='muted'>min_match {self.min_match:g}%; this backfill {gate}. Live is the target table as it "
            "is now (what the backfill replaces); backfill is the staged output of the slices.</p>"
        )
        for name, rep in self.sinks.items():
            body.append(self._sink_section(name, rep))
        body.append(self._slices_section())
        sub = (
            f"job {self.job} · window [{self.window_start}, {self.window_end}) · mode {self.mode} · slice {self.slice}"
            + (f" · written {self.generated}" if self.generated else "")
        )
        return page(f"Backfill {self.backfill_id}", sub, body)

    def _sink_section(self, name: str, rep: Mapping[str, Any]) -> str:
        parts = [f"<section class='sink' data-sink='{_e(name)}'><h2>Sink {_e(name)}: {_e(rep['target_table'])}</h2>"]
        parts.append(
            cards(
                [
                    (f"{rep['target_rows']:,}", "live rows (target now)", ""),
                    (f"{rep['staged_rows']:,}", "backfill rows (staged)", ""),
                    (f"{rep['matched_rows']:,}", "rows equal on both sides", ""),
                    (f"{rep['only_target_rows']:,}", "rows only live", "bad" if rep["only_target_rows"] else ""),
                    (
                        f"{rep['only_staged_rows']:,}",
                        "rows only in the backfill",
                        "bad" if rep["only_staged_rows"] else "",
                    ),
                ]
            )
        )
        windows = Windows.from_report(rep)
        if windows is not None:
            parts.append(f"<h3>Rows per output window on {_e(rep['time_column'])}: live vs backfill</h3>")
            parts.append(f"<div class='panel'>{window_chart(windows, f'rows per window, sink {name}')}</div>")
            runs = windows.runs()
            if runs:
                listed = []
                for i, j in runs[:30]:
                    live, back = sum(windows.live[i:j]), sum(windows.backfill[i:j])
                    listed.append(
                        (
                            _span_label(windows.first + i * windows.step, windows.first + j * windows.step),
                            j - i,
                            f"{live:,}",
                            f"{back:,}",
                            f"{sum(windows.only_live[i:j]):,}",
                            f"{sum(windows.only_backfill[i:j]):,}",
                        )
                    )
                shown = ", first 30" if len(runs) > 30 else ""
                parts.append(f"<h3>Windows that differ ({len(runs)} run(s) of consecutive windows{shown})</h3>")
                parts.append(
                    table(
                        ["windows (UTC)", "windows", "live rows", "backfill rows", "only live", "only backfill"],
                        listed,
                        [False] + [True] * 5,
                    )
                )
        for warning in rep.get("warnings") or []:
            parts.append(f"<p class='warning'>warning: {_e(warning)}</p>")
        if rep.get("staged_outside_window"):
            parts.append(
                f"<p><b>{rep['staged_outside_window']:,}</b> staged rows lie outside the window (publish refuses them).</p>"
            )
        sides = (
            ("only live (in the target, not in the backfill)", "only_target_sample"),
            ("only in the backfill", "only_staged_sample"),
        )
        for side, key in sides:
            sample = rep.get(key) or []
            if sample:
                columns = [c for c in sample[0] if c != "_count"] + ["_count"]
                parts.append(f"<h3>Sample of rows {side}</h3>")
                parts.append(table(columns, [[_cell(r.get(c)) for c in columns] for r in sample]))
        parts.append("</section>")
        return "".join(parts)

    def _slices_section(self) -> str:
        parts = ["<section class='slices'><h2>Slices</h2>"]
        bars = []
        for s in self.slices:
            if not s.done:
                bars.append(Bar(s.slice_id, None, None, "not run", cls="missing"))
                continue
            if s.skipped:
                bars.append(Bar(s.slice_id, None, None, "skipped: no input", cls="skipped"))
                continue
            wm = f" · watermark {_short_time(s.watermark)}" if s.watermark else ""
            bars.append(
                Bar(
                    s.slice_id,
                    s.started,
                    s.ended,
                    f"{s.seconds:.1f} s{wm}",
                    tip=f"{s.slice_id}: read [{s.read_start}, {s.read_end}), {s.rows_read:,} rows, {s.batches} micro-batches, "
                    f"{s.seconds:.1f} s, watermark {s.watermark or '-'}",
                )
            )
        parts.append("<h3>Timeline (wall clock, UTC): duration and the watermark each slice reached</h3>")
        parts.append(f"<div class='panel'>{timeline_chart(bars, 'slice timeline')}</div>")
        ran = [s for s in self.slices if s.done and not s.skipped]
        if ran:
            parts.append("<h3>Throughput per slice (rows read per second)</h3>")
            parts.append(
                "<div class='panel'>"
                + bar_rows_chart(
                    [s.slice_id for s in ran], [s.rows_per_second for s in ran], "rows/s", "throughput per slice"
                )
                + "</div>"
            )
        parts.append("<h3>Every slice</h3>")
        parts.append(
            table(
                [
                    "slice",
                    "reads (ingestion time)",
                    "owns",
                    "rows read",
                    "rows to sink",
                    "micro-batches",
                    "seconds",
                    "rows/s",
                    "watermark",
                    "peak state rows",
                ],
                [
                    [
                        s.slice_id,
                        _range(s.read_start, s.read_end),
                        _range(s.owns_start, s.owns_end),
                        f"{s.rows_read:,}",
                        f"{s.rows_written:,}",
                        s.batches,
                        f"{s.seconds:.1f}",
                        rate_label(s.rows_per_second),
                        _short_time(s.watermark) if s.watermark else _no_watermark(s),
                        f"{s.peak_state_rows:,}",
                    ]
                    for s in self.slices
                ],
                [False, False, False, True, True, True, True, True, False, True],
            )
        )
        parts.append("</section>")
        return "".join(parts)


def _cell(value: object) -> object:
    return json.dumps(value) if isinstance(value, (dict, list)) else value


def _no_watermark(s: SliceRun) -> str:
    return "skipped" if s.skipped else ("-" if s.done else "not run")


def _range(start: str, end: str) -> str:
    """``2026-11-01 00:00 → 01:00`` (the end's date only when it differs)."""
    a, b = _short_time(start)[:16], _short_time(end)[:16]
    return f"{a} → {b[11:] if a[:10] == b[:10] else b}"


def _short_time(value: str | None) -> str:
    if not value:
        return "-"
    try:
        at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return value
    if at.tzinfo is not None:
        at = at.astimezone(timezone.utc)
    return at.strftime("%Y-%m-%d %H:%M:%S")


def report_page(
    bf: Backfill, plan: BackfillPlan, reports: Mapping[str, ValidationReport | Mapping[str, Any]]
) -> BackfillReportPage:
    """The page of ``bf``: its validation reports and the slice runs kept in its checkpoint store.

    :param bf: the backfill.
    :param plan: its plan.
    :param reports: sink name -> validation report (object or ``to_dict()``).
    """
    p = bf.params
    return BackfillReportPage(
        backfill_id=bf.id,
        job=bf.cfg.job.name,
        window_start=p.start.isoformat(),
        window_end=p.end.isoformat(),
        mode=p.mode,
        slice=str(p.to_dict()["slice"]),
        min_match=float(p.min_match),
        publishes=bool(p.publishes),
        sinks={name: (dict(r) if isinstance(r, Mapping) else r.to_dict()) for name, r in reports.items()},
        slices=slice_runs(bf.store(), plan),
        generated=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
    )


def write_report(bf: Backfill, plan: BackfillPlan, reports: Mapping[str, ValidationReport | Mapping[str, Any]]) -> str:
    """Write the report of ``bf`` to its checkpoint folder (:meth:`~airflow_provider_kappa.job.checkpoints.CheckpointStore.report_file`; replacing an earlier one); return where.

    :param bf: the backfill.
    :param plan: its plan.
    :param reports: sink name -> validation report.
    """
    from airflow_provider_kappa.spark.storage import filesystem, write_text

    uri = bf.store().report_file()
    fs, path = filesystem(uri, "backfill report")
    write_text(fs, path, report_page(bf, plan, reports).render())
    log.info("backfill %s: report written to %s", bf.id, uri)
    return uri
