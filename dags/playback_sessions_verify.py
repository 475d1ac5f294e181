"""Continuous verification of the example playback-sessions job: each night, yesterday replayed
and compared with what live wrote, publishing nothing.

Each run (``@daily``: its data interval is the day before, ``[00:00, 24:00)`` UTC) replays that
day from the lake with ``publish: false`` and compares the replay with the live output in
``prod.playback_sessions``. When the match rate falls below ``min_match`` (unset: 100; exact
with the live ledger, ``ledger: auto``), the ``drift`` task records an asset event on
``kappa://playback_sessions/drift`` whose extra lists the drifting session windows (start, end,
live rows, replayed rows), and ``verify_gate`` fails the run. The ``verify`` task links the report.

The replay reads ``tail`` past the day's end, and a run starts when its day ends: its first task,
``wait_for_landing``, waits (up to 6 hours, reschedule mode) for the landed data to pass
``end + tail``.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import airflow_provider_kappa
from airflow_provider_kappa.dag import kappa_verify_dag

CONFIG = Path(airflow_provider_kappa.__file__).parent / "examples" / "playback_sessions" / "kappa.yaml"

dag = kappa_verify_dag(
    str(CONFIG),
    dag_id="kappa_verify_playback_sessions",
    schedule="@daily",  # each run verifies its data interval: the day before
    start_date=datetime(2026, 11, 1, tzinfo=timezone.utc),
)
