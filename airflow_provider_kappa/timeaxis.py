"""Round steps of time and of counts: how validate buckets output windows and where a chart
puts its ticks so that their labels never overlap, whatever the length of the window.

Pure Python (no pyarrow): every time is epoch microseconds, UTC.
"""

from __future__ import annotations

import math

from airflow_provider_kappa.timeparse import from_micros

SECOND = 1_000_000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE
DAY = 24 * HOUR

#: Round durations, shortest first: bucket widths and time-axis tick steps.
STEPS: tuple[int, ...] = (
    1 * SECOND,
    2 * SECOND,
    5 * SECOND,
    10 * SECOND,
    15 * SECOND,
    30 * SECOND,
    1 * MINUTE,
    2 * MINUTE,
    5 * MINUTE,
    10 * MINUTE,
    15 * MINUTE,
    30 * MINUTE,
    1 * HOUR,
    2 * HOUR,
    3 * HOUR,
    6 * HOUR,
    12 * HOUR,
    1 * DAY,
    2 * DAY,
    7 * DAY,
    14 * DAY,
    28 * DAY,
)


def round_step(at_least: float) -> int:
    """The shortest round duration (:data:`STEPS`, then whole multiples of 28 days) of at least
    ``at_least`` microseconds.

    :param at_least: the smallest acceptable step, in microseconds.
    """
    for step in STEPS:
        if step >= at_least:
            return step
    return 28 * DAY * math.ceil(at_least / (28 * DAY))


def floor_to(micros: int, step: int, origin: int = 0) -> int:
    """The largest ``origin + k * step`` not after ``micros``.

    :param micros: a time, epoch microseconds.
    :param step: the grid step, microseconds.
    :param origin: a point of the grid (default the epoch).
    """
    return origin + (micros - origin) // step * step


def format_duration_us(micros: float) -> str:
    """A short human duration: ``0.4 s``, ``45 s``, ``4 min 26 s``, ``5 min``, ``1 h 30 min``, ``2 d``.

    :param micros: the duration, microseconds.
    """
    seconds = micros / SECOND
    if seconds < 10:
        return f"{seconds:.1f}".rstrip("0").rstrip(".") + " s"
    if seconds < 60:
        return f"{round(seconds)} s"
    if seconds < 3600:
        minutes, rest = divmod(round(seconds), 60)
        return f"{minutes} min" + (f" {rest} s" if rest else "")
    hours, rest = divmod(round(seconds / 60), 60)
    if hours < 48:
        return f"{hours} h" + (f" {rest} min" if rest else "")
    return f"{hours / 24:.3g} d"


def time_label(micros: int, step: int) -> str:
    """A tick's main label for ticks ``step`` apart: ``HH:MM:SS``, ``HH:MM`` or ``Mon DD``."""
    at = from_micros(micros)
    if step < MINUTE:
        return at.strftime("%H:%M:%S")
    if step < DAY:
        return at.strftime("%H:%M")
    return at.strftime("%b %d")


def date_label(micros: int) -> str:
    """The date context shown under the first tick and where the day changes: ``Nov 01``."""
    return from_micros(micros).strftime("%b %d")


def time_ticks(lo: int, hi: int, width_px: float, min_spacing_px: float) -> tuple[int, list[int]]:
    """Tick step and ticks (multiples of the step from the epoch, UTC) in ``[lo, hi]`` whose
    neighbours are at least ``min_spacing_px`` apart on an axis ``width_px`` wide.

    :param lo: axis start, epoch microseconds.
    :param hi: axis end, after ``lo``.
    :param width_px: the axis length in pixels.
    :param min_spacing_px: the widest label plus a gap, in pixels.
    """
    span = max(hi - lo, 1)
    step = round_step(span * min_spacing_px / max(width_px, 1.0))
    first = -(-lo // step) * step
    return step, list(range(first, hi + 1, step))


def count_ticks(top: float, target: int = 4) -> list[float]:
    """Round ticks ``0, s, 2s, …`` (s = 1, 2, 2.5 or 5 times a power of ten) covering ``top``.

    :param top: the largest value shown (0 or less gives ``[0, 1]``).
    :param target: about how many steps.
    """
    if top <= 0:
        return [0.0, 1.0]
    raw = top / target
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    n = math.ceil(top / step - 1e-9)
    return [i * step for i in range(n + 1)]


def count_label(value: float) -> str:
    """A compact count: ``950``, ``12k``, ``1.5M``, ``2.5``."""
    for size, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:.3g}{unit}"
    return f"{value:.3g}" if value != int(value) else str(int(value))
