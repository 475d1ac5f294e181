"""Backfill DAG of the example playback-sessions job (per-account sessions, 5-minute gap).

The job's kappa.yaml ships with the package; ``KAPPA_LAKE`` (default /tmp/kappa-lake) is where
its lake lives. Trigger it with a conf such as
``{"start": "2026-11-01T10:00:00+00:00", "end": "2026-11-01T13:00:00+00:00", "mode": "parallel"}``.
"""

from __future__ import annotations

from pathlib import Path

import airflow_provider_kappa
from airflow_provider_kappa.dag import kappa_backfill_dag

CONFIG = Path(airflow_provider_kappa.__file__).parent / "examples" / "playback_sessions" / "kappa.yaml"

dag = kappa_backfill_dag(str(CONFIG), dag_id="kappa_backfill_playback_sessions")
