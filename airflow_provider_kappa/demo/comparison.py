"""The story's comparison (stage 4, after each backfill): one job's outcome in one mode
(:class:`JobOutcome`, and back from its JSON), the published window against the live reference
as multisets of rows, and which differing rows a sequential backfill's no-data micro-batch
explains."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from airflow_provider_kappa.backfill.compare import compare_rows, hourly_counts
from airflow_provider_kappa.backfill.validate import window_filter
from airflow_provider_kappa.demo.report import HourCount, SliceStat

#: Per example job: the output row's time span (start and end columns) and how far before its
#: start an input event can still change it (rmi: a play joins impressions up to 30 minutes older).
ROW_SPAN = {"rmi": ("window_start", "window_end"), "playback_sessions": ("session_start", "session_end")}
REACH = {"rmi": timedelta(minutes=30), "playback_sessions": timedelta(0)}
#: Differing rows listed in full at most (report and report.json).
LIST_ROWS = 200


@dataclass
class JobOutcome:
    """One job's backfill in one mode, compared with live."""

    job: str
    mode: str
    seconds: float
    slices: list[SliceStat]
    match_rate: float
    reference_rows: int
    published_rows: int
    only_live: list[dict[str, Any]] = field(default_factory=list)
    only_backfill: list[dict[str, Any]] = field(default_factory=list)
    hours: list[HourCount] = field(default_factory=list)
    state_rows: int = 0
    boundaries: list[dict[str, Any]] = field(default_factory=list)
    unexplained: int = 0
    #: Wall-clock (epoch seconds) start and end of this mode's backfill and comparison.
    started: float = 0.0
    ended: float = 0.0


def outcome_from_json(data: dict[str, Any]) -> JobOutcome:
    """A :class:`JobOutcome` back from its JSON (written by
    :func:`~airflow_provider_kappa.demo.job_story.story_main`).

    :param data: ``dataclasses.asdict`` of an outcome, decoded with its datetimes.
    """
    fields = dict(data)
    fields["slices"] = [SliceStat(**s) for s in data["slices"]]
    fields["hours"] = [HourCount(**h) for h in data["hours"]]
    return JobOutcome(**fields)


def compare_window(
    catalog: Any, table_name: str, time_column: str, reference: int, start: datetime, end: datetime
) -> dict[str, Any]:
    """Published window vs the live reference snapshot, as multisets of rows."""
    table = catalog.load_table(table_name)
    row_filter = window_filter(table.schema(), time_column, start, end)
    published = table.scan(row_filter=row_filter).to_arrow()
    live = table.scan(row_filter=row_filter, snapshot_id=reference).to_arrow()
    matched, only_backfill, only_live, _, _ = compare_rows(published, live, LIST_ROWS)
    denominator = max(published.num_rows, live.num_rows)
    hours = [
        HourCount(hour=str(h.hour), live=int(h.target), backfill=int(h.staged))
        for h in hourly_counts(published, live, time_column)
    ]
    return {
        "match_rate": 100.0 * matched / denominator if denominator else 100.0,
        "reference_rows": live.num_rows,
        "published_rows": published.num_rows,
        "only_live": only_live,
        "only_backfill": only_backfill,
        "hours": hours,
    }


def nodata_boundaries(
    progress: dict[str, list[dict[str, Any]]], mode: str, slice_ids: list[str]
) -> list[dict[str, Any]]:
    """Where a sequential backfill ran a micro-batch live never ran: a non-last slice whose
    run ended with a no-data micro-batch (Spark's ``availableNow`` runs one to apply the
    watermark its last landing advanced, from ``from`` to ``to``). The next slice's first
    micro-batch then drops as late the events with event time in ``(from, to]`` landed after
    the boundary; live, whose next micro-batch still had ``from`` as its lateness bound,
    accepted them.

    :param progress: slice id -> the slice run's Spark progress records.
    :param mode: the backfill mode (only ``sequential`` carries state across slices).
    :param slice_ids: the slices in order.
    :returns: ``{"slice", "from", "to"}`` per such boundary (ISO-8601 watermarks).
    """
    if mode != "sequential":
        return []

    def read_rows(sid: str) -> int:
        return sum(int(src.get("numInputRows") or 0) for r in progress.get(sid, []) for src in r.get("sources") or [])

    out = []
    for i, sid in enumerate(slice_ids[:-1]):
        if not any(read_rows(later) for later in slice_ids[i + 1 :]):
            break  # nothing read after it (slices past the lake's end): live ended the same way
        records = progress.get(sid, [])
        if len(records) < 2:
            continue
        last, before = records[-1], records[-2]
        if sum(int(src.get("numInputRows") or 0) for src in last.get("sources") or []) != 0:
            continue
        lo, hi = (before.get("eventTime") or {}).get("watermark"), (last.get("eventTime") or {}).get("watermark")
        if lo and hi and lo != hi:
            out.append({"slice": sid, "from": lo, "to": hi})
    return out


def explained_by(row: dict[str, Any], job: str, boundaries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The boundary of :func:`nodata_boundaries` whose dropped events could have changed
    ``row``: an event with event time in ``(from, to]`` feeds output rows whose span
    (:data:`ROW_SPAN`) reaches past ``from - REACH[job]`` and starts by ``to``.

    :param row: an output row of ``job`` (aware datetimes).
    :param job: the example job.
    :param boundaries: from :func:`nodata_boundaries`.
    """
    start_col, end_col = ROW_SPAN[job]
    for b in boundaries:
        lo = datetime.fromisoformat(b["from"].replace("Z", "+00:00"))
        hi = datetime.fromisoformat(b["to"].replace("Z", "+00:00"))
        if row[end_col] > lo - REACH[job] and row[start_col] <= hi:
            return b
    return None
