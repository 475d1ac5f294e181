"""The admission grid of bounded reads: where aligned tables may hold rows (:class:`Presence`)
and where each micro-batch ends (:func:`grid_batch_end`, :func:`capped_batch_end`).

Batch ends lie on multiples of ``max_misalignment_threshold`` from the epoch; empty stretches
are folded into the batch that follows them. The reader and the backfill's planner both use
these, so they compute the very same batch boundaries. Pure Python.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from airflow_provider_kappa.spark.source.file_index import FileSpan


class Presence:
    """Where in ingestion time any of several tables may hold rows: the union of their files'
    closed ranges, clipped to ``[start, end)``, as sorted disjoint intervals."""

    def __init__(self, spans: Iterable[FileSpan], start_micros: int, end_micros: int) -> None:
        intervals = []
        for s in spans:
            lo = start_micros if s.lower_micros is None else max(s.lower_micros, start_micros)
            hi = end_micros - 1 if s.upper_micros is None else min(s.upper_micros, end_micros - 1)
            if lo <= hi:
                intervals.append((lo, hi))
        intervals.sort()
        merged: list[list[int]] = []
        for lo, hi in intervals:
            if merged and lo <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        self.lowers = [m[0] for m in merged]
        self.uppers = [m[1] for m in merged]

    def first_at_or_after(self, pos: int) -> int | None:
        """The first ingestion instant ``>= pos`` that may hold rows, or ``None``."""
        i = bisect.bisect_left(self.uppers, pos)
        if i == len(self.uppers):
            return None
        return max(self.lowers[i], pos)

    def __len__(self) -> int:
        return len(self.lowers)


def grid_batch_end(pos: int, presence: Presence, max_misalignment_threshold_micros: int, end_micros: int) -> int | None:
    """The end of the next micro-batch starting at ``pos``: the grid line (a multiple of the
    threshold from the epoch) after the first instant ``>= pos`` holding data, capped at
    ``end_micros``. Empty stretches are skipped in the same batch. ``None`` when no data is left.

    :param pos: where the batch starts (the previous batch's end).
    :param presence: where data may be (the union over every aligned table).
    :param max_misalignment_threshold_micros: the grid step.
    :param end_micros: the exclusive end of the read range.
    """
    if pos >= end_micros:
        return None
    first = presence.first_at_or_after(pos)
    if first is None or first >= end_micros:
        return None
    return min((first // max_misalignment_threshold_micros + 1) * max_misalignment_threshold_micros, end_micros)


def capped_batch_end(
    candidates: Sequence[FileSpan],
    pos: int,
    grid_end: int,
    *,
    max_files: int | None = None,
    max_rows: int | None = None,
    max_bytes: int | None = None,
) -> int:
    """Where a batch starting at ``pos`` must end so that it reads at most ``max_files`` files
    (``max_rows`` rows, ``max_bytes`` bytes), admitting whole files in lower-bound order and
    never going past ``grid_end``.

    Files are grouped by their effective start ``max(lower, pos)`` (files straddling ``pos``
    all start at ``pos``); at least the first group is admitted so the stream always advances.
    The batch ends at the effective start of the first group not admitted.

    :param candidates: the spans intersecting ``[pos, grid_end)`` (see :meth:`~.file_index.SpanIndex.between`).
    :param pos: the batch start.
    :param grid_end: the uncapped batch end (:func:`grid_batch_end`).
    """
    if max_files is None and max_rows is None and max_bytes is None:
        return grid_end
    groups: dict[int, list[FileSpan]] = {}
    for s in candidates:
        start = pos if s.lower_micros is None else max(s.lower_micros, pos)
        groups.setdefault(start, []).append(s)
    files = rows = size = 0
    for i, start in enumerate(sorted(groups)):
        members = groups[start]
        files += len(members)
        rows += sum(s.record_count for s in members)
        size += sum(s.file_size_in_bytes for s in members)
        over = (
            (max_files is not None and files > max_files)
            or (max_rows is not None and rows > max_rows)
            or (max_bytes is not None and size > max_bytes)
        )
        if over and i > 0:
            return start
    return grid_end
