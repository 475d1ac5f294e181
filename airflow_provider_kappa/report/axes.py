"""Axis labels that never overlap, and the text measuring they rest on.

A tick step is the shortest round duration (or 1-2-5 count) whose labels, at their widest, fit
between neighbours (:mod:`~airflow_provider_kappa.timeaxis`). Label widths are estimated with
:data:`CHAR_PX` per character at :data:`FONT_PX` (generous for common sans-serif fonts):
:func:`text_px`, and :meth:`Label.box` for a label as drawn. :func:`time_axis` and
:func:`count_axis` draw the axes of the report's charts (:mod:`~airflow_provider_kappa.report.charts`);
:func:`esc` escapes the text of every SVG and HTML part.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from airflow_provider_kappa.timeaxis import SECOND, count_label, count_ticks, date_label, time_label, time_ticks

#: Axis label font size and the width estimated per character (px): wider than DejaVu Sans'
#: digits (0.64 em), so that an estimate never falls short of the drawn label.
FONT_PX = 11
CHAR_PX = 7.2
#: The least gap between two axis labels (px).
LABEL_GAP = 14


def text_px(text: str, font_px: float = FONT_PX) -> float:
    """Estimated drawn width of ``text`` (never less than the real one for usual fonts)."""
    return len(text) * CHAR_PX * font_px / FONT_PX


def rate_label(value: float) -> str:
    """A rate for people: ``0.27``, ``8.5``, ``950``, ``12k``."""
    return f"{value:.2g}" if 0 < abs(value) < 10 else count_label(round(value))


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


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


def svg_text(label: Label, cls: str = "tick") -> str:
    return (
        f"<text class='{cls}' x='{label.x:.1f}' y='{label.y:.1f}' text-anchor='{label.anchor}'>{esc(label.text)}</text>"
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
    parts.extend(svg_text(lb) for lb in labels)
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
    parts.extend(svg_text(lb) for lb in labels)
    return parts, labels, rounded
