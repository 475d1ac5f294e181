"""The report's SVG charts: live vs backfill rows per output window (:func:`window_chart`),
the slices' wall-clock timeline (:func:`timeline_chart`) and horizontal bars per row
(:func:`bar_rows_chart`); also what the demo's report draws with. Axes and label widths:
:mod:`~airflow_provider_kappa.report.axes`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from airflow_provider_kappa.report.axes import (
    LABEL_GAP,
    Label,
    count_axis,
    esc,
    rate_label,
    svg_text,
    text_px,
    time_axis,
)
from airflow_provider_kappa.timeaxis import SECOND, count_label, count_ticks, format_duration_us
from airflow_provider_kappa.timeparse import from_micros, parse_timestamp, to_micros

#: Width of a chart (px) and the colours of its two sides and of their difference.
WIDTH = 1080
LIVE = "#94a3b8"
BACKFILL = "#2563eb"
DIFF = "#dc2626"
BAND = "#fee2e2"
#: Windows drawn with a hover box of their own, at most (beyond, only differing runs have one).
HOVER_WINDOWS = 1200


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


def span_label(start: int, end: int) -> str:
    """``2026-11-01 02:00:00–03:00:00`` (the end's date only when it differs).

    :param start: epoch µs.
    :param end: epoch µs, after ``start`` (exclusive).
    """
    a, b = from_micros(start), from_micros(end)
    same_day = a.date() == (b - timedelta(microseconds=1)).date()
    return f"{a:%Y-%m-%d %H:%M:%S}–{b:%H:%M:%S}" if same_day else f"{a:%Y-%m-%d %H:%M:%S}–{b:%Y-%m-%d %H:%M:%S}"


@dataclass(frozen=True)
class _Frame:
    """Where :func:`window_chart` draws ``w``: the plot from ``top`` down to its zero line ``y0``,
    the difference strip (``s_top``, its middle ``s_mid``, ``strip_h`` high) and the time axis at
    ``axis_y``, between ``left`` and ``right``; ``rounded`` is the count axis' top value and
    ``worst`` the most rows on one side only in a window."""

    w: Windows
    left: float
    right: float
    top: int
    plot_h: int
    y0: int
    s_top: int
    s_mid: float
    strip_h: int
    axis_y: int
    rounded: float
    worst: int

    def x(self, t: int) -> float:
        """The x of ``t`` (epoch µs)."""
        return self.left + (self.right - self.left) * (t - self.w.lo) / max(self.w.hi - self.w.lo, 1)

    def at(self, i: int) -> int:
        """The start of window ``i`` (epoch µs)."""
        return self.w.first + i * self.w.step


def window_chart(w: Windows, title: str, width: int = WIDTH) -> str:
    """Live vs backfill rows per output window over the backfill's window, the windows whose rows
    differ shaded (class ``diff-band``), and a strip below of the rows on one side only (only
    in the backfill up, only live down).

    :param w: the counts.
    :param title: an accessible title (``aria-label``).
    :param width: SVG width in px.
    """
    top_value = max([*w.live, *w.backfill, 1])
    ticks = count_ticks(top_value)
    left = 14 + max(text_px(count_label(t)) for t in ticks)
    right, top, plot_h, gap, strip_h = width - 18, 28, 220, 18, 56
    y0 = top + plot_h
    s_top = y0 + gap
    grid, _, rounded = count_axis(top_value, left, y0, top)
    worst = max([*w.only_live, *w.only_backfill, 1])
    f = _Frame(w, left, right, top, plot_h, y0, s_top, s_top + strip_h / 2, strip_h, s_top + strip_h, rounded, worst)
    height = int(f.axis_y + 44)
    parts = [
        f"<svg class='chart windows' xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
        f"viewBox='0 0 {width} {height}' role='img' aria-label='{esc(title)}'>"
    ]
    parts.extend(_diff_bands(f))
    parts.extend(p.replace("{right}", f"{right:.1f}") for p in grid)
    parts.append(f"<path class='live' d='{_step_path(f, w.live, True)}'/>")
    parts.append(f"<path class='backfill' d='{_step_path(f, w.backfill, False)}'/>")
    parts.append(f"<line class='axis' x1='{left:.1f}' x2='{right:.1f}' y1='{y0:.1f}' y2='{y0:.1f}'/>")
    parts.extend(_diff_strip(f))
    if len(w.live) <= HOVER_WINDOWS:
        parts.extend(_hover_boxes(f))
    axis, _ = time_axis(w.lo, w.hi, left, right, f.axis_y)
    parts.extend(axis)
    parts.append(_window_legend(f))
    parts.append("</svg>")
    return "".join(parts)


def _diff_bands(f: _Frame) -> list[str]:
    """One shaded band (with its hover text) per run of consecutive windows that differ."""
    w, parts = f.w, []
    for i, j in w.runs():
        a, b = f.x(f.at(i)), f.x(f.at(j))
        tip = (
            f"{span_label(f.at(i), f.at(j))}: live {sum(w.live[i:j]):,}, backfill "
            f"{sum(w.backfill[i:j]):,}; rows only live {sum(w.only_live[i:j]):,}, only in the backfill {sum(w.only_backfill[i:j]):,}"
        )
        parts.append(
            f"<rect class='diff-band' data-start='{from_micros(f.at(i)).isoformat()}' "
            f"data-end='{from_micros(f.at(j)).isoformat()}' x='{a:.1f}' y='{f.top}' width='{max(b - a, 1.5):.1f}' "
            f"height='{f.axis_y - f.top:.1f}'><title>{esc(tip)}</title></rect>"
        )
    return parts


def _step_path(f: _Frame, values: Sequence[int], close: bool) -> str:
    """The SVG path of ``values`` as steps, one per window (closed down to the zero line when ``close``)."""
    pts = []
    for i, v in enumerate(values):
        a, b = f.x(f.at(i)), f.x(f.at(i + 1))
        yy = f.y0 - f.plot_h * v / f.rounded
        pts.append(f"{a:.1f},{yy:.1f} {b:.1f},{yy:.1f}")
    if not pts:
        return ""
    d = "M" + " L".join(pts)
    if close:
        d = f"M{f.x(f.w.first):.1f},{f.y0:.1f} L" + " L".join(pts) + f" L{f.x(f.at(len(values))):.1f},{f.y0:.1f} Z"
    return d


def _diff_strip(f: _Frame) -> list[str]:
    """The difference strip: its zero line, a bar up per window for the rows only in the backfill
    and one down for the rows only live, scaled to ``f.worst`` (written at its two ends)."""
    w, left, s_mid = f.w, f.left, f.s_mid
    parts = [f"<line class='axis zero' x1='{left:.1f}' x2='{f.right:.1f}' y1='{s_mid:.1f}' y2='{s_mid:.1f}'/>"]
    for i in range(len(w.live)):
        if not w.differs(i):
            continue
        a, b = f.x(f.at(i)), f.x(f.at(i + 1))
        for n, cls, up in ((w.only_backfill[i], "only-backfill", True), (w.only_live[i], "only-live", False)):
            if n:
                h = max((f.strip_h / 2 - 2) * n / f.worst, 1.0)
                parts.append(
                    f"<rect class='diff-bar {cls}' x='{a:.1f}' y='{s_mid - h if up else s_mid:.1f}' "
                    f"width='{max(b - a - 0.5, 1):.1f}' height='{h:.1f}'/>"
                )
    for text, yy in (
        (f"{count_label(f.worst)} only backfill", f.s_top + 8),
        (f"{count_label(f.worst)} only live", f.s_top + f.strip_h),
    ):
        parts.append(svg_text(Label(text, left + 4, yy, "start"), "tick small"))
    return parts


def _hover_boxes(f: _Frame) -> list[str]:
    """A transparent box per window whose hover text gives its counts."""
    w, parts = f.w, []
    for i, (a_v, b_v) in enumerate(zip(w.live, w.backfill)):
        a, b = f.x(f.at(i)), f.x(f.at(i + 1))
        tip = f"{span_label(f.at(i), f.at(i + 1))}: live {a_v:,}, backfill {b_v:,}"
        if w.differs(i):
            tip += f"; rows only live {w.only_live[i]:,}, only in the backfill {w.only_backfill[i]:,}"
        parts.append(
            f"<rect class='hover' x='{a:.1f}' y='{f.top}' width='{max(b - a, 0.5):.1f}' height='{f.axis_y - f.top:.1f}'>"
            f"<title>{esc(tip)}</title></rect>"
        )
    return parts


def _window_legend(f: _Frame) -> str:
    """The legend above the plot: what the colours mean, the window's size on the right."""
    left, right, w = f.left, f.right, f.w
    return (
        f"<g class='legend'><rect x='{left:.1f}' y='8' width='14' height='10' fill='{LIVE}'/>"
        f"<text x='{left + 20:.1f}' y='17'>live (target now)</text>"
        f"<line x1='{left + 150:.1f}' x2='{left + 166:.1f}' y1='13' y2='13' stroke='{BACKFILL}' stroke-width='2.5'/>"
        f"<text x='{left + 172:.1f}' y='17'>backfill (staged)</text>"
        f"<rect x='{left + 300:.1f}' y='8' width='14' height='10' fill='{BAND}' stroke='{DIFF}' stroke-width='0.6'/>"
        f"<text x='{left + 320:.1f}' y='17'>windows that differ</text>"
        f"<text x='{right:.1f}' y='17' text-anchor='end'>rows per {'window' if w.grid else 'bucket'} of "
        f"{esc(format_duration_us(w.step))}, UTC</text></g>"
    )


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
        f"viewBox='0 0 {width} {height}' role='img' aria-label='{esc(title)}'>"
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
            parts.append(svg_text(Label(b.label, left - 8, y + row / 2 + 4, "end"), "tick rowlabel"))
        if b.start is None or b.end is None:
            if b.note and row >= 12:
                parts.append(
                    f"<text class='note muted' x='{left + 4:.1f}' y='{y + row / 2 + 4:.1f}'>{esc(b.note)}</text>"
                )
            continue
        a, z = xs(b.start), max(xs(b.end), xs(b.start) + 2)
        parts.append(
            f"<rect class='bar {b.cls}' x='{a:.1f}' y='{y + row * 0.18:.1f}' width='{z - a:.1f}' height='{row * 0.64:.1f}'>"
            f"<title>{esc(b.tip or b.note)}</title></rect>"
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
            parts.append(svg_text(note, "note inbar" if inside else "note"))
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
        f"viewBox='0 0 {width} {height}' role='img' aria-label='{esc(title)}'>"
    ]

    def xs(v: float) -> float:
        return left + (right - left) * v / rounded

    for t in ticks:
        parts.append(f"<line class='grid' x1='{xs(t):.1f}' x2='{xs(t):.1f}' y1='{top}' y2='{plot_bottom:.1f}'/>")
        parts.append(svg_text(Label(count_label(t), xs(t), plot_bottom + 16, "middle")))
    parts.append(svg_text(Label(unit, width - 8, plot_bottom + 16, "end"), "tick unit"))
    for i, (lb, v) in enumerate(zip(labels, values)):
        y = top + i * row
        if i % every == 0:
            parts.append(svg_text(Label(lb, left - 8, y + row / 2 + 4, "end"), "tick rowlabel"))
        parts.append(
            f"<rect class='bar run' x='{left:.1f}' y='{y + row * 0.18:.1f}' width='{max(xs(v) - left, 0.5):.1f}' "
            f"height='{row * 0.64:.1f}'><title>{esc(lb)}: {v:,.0f} {esc(unit)}</title></rect>"
        )
        if row >= 12:
            parts.append(
                f"<text class='note' x='{xs(v) + 6:.1f}' y='{y + row / 2 + 4:.1f}'>{esc(rate_label(v))}</text>"
            )
    parts.append(f"<line class='axis' x1='{left:.1f}' x2='{left:.1f}' y1='{top}' y2='{plot_bottom:.1f}'/>")
    parts.append("</svg>")
    return "".join(parts)
