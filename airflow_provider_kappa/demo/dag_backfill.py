"""The story's backfill via ``dag.test()`` (stage 4): one mode's backfill of the incident window
through the job's Airflow DAG (a real Airflow run of snapshot, plan, one task per slice, validate,
publish), its slices' statistics from the backfill's checkpoints, and its outcome against live."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from airflow_provider_kappa.backfill.backfill import Backfill
from airflow_provider_kappa.demo.comparison import JobOutcome, compare_window, explained_by, nodata_boundaries
from airflow_provider_kappa.demo.options import TAIL, target
from airflow_provider_kappa.demo.report import SliceStat
from airflow_provider_kappa.exceptions import KappaError
from airflow_provider_kappa.job.config import load_config
from airflow_provider_kappa.timeparse import format_duration


def backfill_and_compare(
    job: str,
    mode: str,
    config: Path,
    catalog: Any,
    reference: int,
    start: datetime,
    end: datetime,
    slice_: str,
    threshold: str,
    say: Callable[[str], None],
    *,
    tail: timedelta = TAIL,
    ledger: bool = False,
) -> JobOutcome:
    """Backfill ``[start, end)`` of ``job`` in ``mode`` through its DAG's ``dag.test()`` and
    compare the published window with the live ``reference`` snapshot."""
    from airflow_provider_kappa.dag import kappa_backfill_dag  # loads Airflow: after the demo set AIRFLOW_HOME

    conf = {
        "start": start.isoformat(),
        "end": end.isoformat(),
        "mode": mode,
        "slice": slice_,
        "max_misalignment_threshold": threshold,
        "warmup": "30min",
        "tail": format_duration(tail),
        "min_match": 0,
    }
    dag = kappa_backfill_dag(str(config))  # the same DAG the demo's DAG file defines
    began = time.monotonic()
    run = dag.test(run_conf=conf)
    seconds = time.monotonic() - began
    state = str(getattr(run, "state", ""))
    if not state.endswith("success"):
        raise KappaError(f"{job} ({mode}): the backfill DAG run ended {state!r}; see the task logs above")
    replayed = (Backfill.create(load_config(config), conf).store().pinned("ledger") or {}).get("ledger")
    if ledger and not replayed:  # ledger auto (the default): live's ledger covers the window, so it is replayed
        raise KappaError(f"{job} ({mode}): the backfill did not replay the live ledger; see its plan task's log")
    slices = slice_stats(config, conf, f"{job}/{mode}/")
    table_name, time_column = target(job)
    outcome = compare_window(catalog, table_name, time_column, reference, start, end)
    progress = slice_progress(config, conf)
    boundaries = nodata_boundaries(progress, mode, sorted(progress))
    differing = outcome["only_live"] + outcome["only_backfill"]
    unexplained = sum(1 for row in differing if explained_by(row, job, boundaries) is None)
    say(
        f"      {job} ({mode}): {len(slices)} slices, {sum(s.rows_read for s in slices):,} rows read, "
        f"{seconds:.0f}s; published window vs live: {outcome['match_rate']:.3f}% match"
        + (f" ({len(differing)} differing rows, {unexplained} not explained; see the report)" if differing else "")
    )
    return JobOutcome(
        job=job,
        mode=mode,
        seconds=seconds,
        slices=slices,
        match_rate=outcome["match_rate"],
        reference_rows=outcome["reference_rows"],
        published_rows=outcome["published_rows"],
        only_live=outcome["only_live"],
        only_backfill=outcome["only_backfill"],
        hours=outcome["hours"],
        state_rows=max((int(m.get("peak_state_rows", 0)) for m in slice_metrics(config, conf)), default=0),
        boundaries=boundaries,
        unexplained=unexplained,
    )


def slice_progress(config: Path, conf: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Slice id -> the Spark progress records the backfill kept for it."""
    return Backfill.create(load_config(config), conf).store().progress()


def slice_metrics(config: Path, conf: dict[str, Any]) -> list[dict[str, Any]]:
    """The metrics the backfill kept for each slice it ran."""
    return Backfill.create(load_config(config), conf).store().done_all()


def slice_stats(config: Path, conf: dict[str, Any], label: str) -> list[SliceStat]:
    """The report's row per slice of the backfill, its id prefixed by ``label``."""
    return [
        SliceStat(
            slice_id=label + str(m.get("slice_id")),
            rows_read=int(m.get("rows_read", 0)),
            seconds=float(m.get("seconds", 0.0)),
            batches=int(m.get("batches", 0)),
            watermark=m.get("watermark"),
        )
        for m in slice_metrics(config, conf)
    ]
