"""The story's incident (stage 4, before each backfill): the window it damages, the live output's
snapshot pinned as the reference, and a buggy deploy's damage to that window (one column off by
one in its first half, its second half lost)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow_provider_kappa.backfill.publish import replace_window
from airflow_provider_kappa.backfill.validate import read_window
from airflow_provider_kappa.demo.options import TAIL, WARMUP, target
from airflow_provider_kappa.exceptions import KappaConfigError, KappaError

#: The column the simulated buggy deploy corrupts, per example job.
CORRUPTED_COLUMN = {"rmi": "attributed_plays", "playback_sessions": "plays"}


def incident_window(lake_start: datetime, lake_end: datetime) -> tuple[datetime, datetime]:
    """The window the simulated incident damages and the backfill repairs: from a warmup's
    length after the lake's start to a tail's length before its end, so the backfill's warmup
    and tail reads around it hold data (the live run read the same landings).

    :param lake_start: first ingestion time of the lake.
    :param lake_end: end of the lake's ingestion range.
    :raises KappaConfigError: the lake is too short to hold a window.
    """
    start, end = lake_start + WARMUP, lake_end - TAIL
    if end <= start:
        raise KappaConfigError(
            f"lake [{lake_start.isoformat()}, {lake_end.isoformat()}) is too short for a warmup of {WARMUP} "
            f"and a tail of {TAIL} around an incident window"
        )
    return start, end


def pin_reference(catalog: Any, job: str) -> int:
    """The live output's snapshot id: the reference the backfill is compared with."""
    table_name, _ = target(job)
    snap = catalog.load_table(table_name).current_snapshot()
    if snap is None:
        raise KappaError(f"{job}: the live run wrote no output to {table_name}; the lake is too small (--hours/--rate)")
    return int(snap.snapshot_id)


def corrupt_window(catalog: Any, job: str, start: datetime, end: datetime) -> int:
    """Corrupt the window like a buggy deploy: the first half's metric is off by one,
    the second half is lost. Returns the rows damaged."""
    import pyarrow as pa
    import pyarrow.compute as pc

    table_name, time_column = target(job)
    table = catalog.load_table(table_name)
    rows = read_window(table, time_column, start, end)
    middle = start + (end - start) / 2
    keep = pc.less(rows[time_column], pa.scalar(middle, type=rows.schema.field(time_column).type))
    kept = rows.filter(keep)
    column = CORRUPTED_COLUMN[job]
    idx = kept.schema.get_field_index(column)
    corrupted = kept.set_column(idx, column, pc.add(kept[column], pa.scalar(1, type=kept.schema.field(column).type)))
    replace_window(table, corrupted, time_column, start, end)
    return int(rows.num_rows)
