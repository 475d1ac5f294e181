"""Scheduled repair of the example playback-sessions job: one Kappa backfill per day.

With a ``schedule``, a run whose ``start`` and ``end`` are empty replaces its data interval, so
Airflow drives Kappa backfills interval by interval:

- each night, the day before is recomputed from the lake (late events included) and replaced;
- ``airflow backfill create --dag-id kappa_repair_playback_sessions --from-date 2026-11-01
  --to-date 2026-11-03`` (or the Backfill dialog of the UI) repairs those days one run after the
  other (``max_active_runs=1``; the backfill lock refuses overlapping windows anyway).

A run triggered by hand may still give ``start`` and ``end``: they win over the interval.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import airflow_provider_kappa
from airflow_provider_kappa.dag import kappa_backfill_dag

CONFIG = Path(airflow_provider_kappa.__file__).parent / "examples" / "playback_sessions" / "kappa.yaml"

dag = kappa_backfill_dag(
    str(CONFIG),
    dag_id="kappa_repair_playback_sessions",
    schedule="@daily",  # data intervals of one day, [00:00, 24:00) UTC
    start_date=datetime(2026, 11, 1, tzinfo=timezone.utc),
    catchup=False,
)
