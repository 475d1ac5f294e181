"""A DAG downstream of the playback-sessions backfill: scheduled on the asset of the backfill's
target table, it runs after every backfill that published a new window of it.

The publish task of ``kappa_backfill_playback_sessions`` records one asset event per target
table, ``iceberg://<catalog>/<namespace>/<table>``; its extra holds the window (``start``,
``end``), the published ``snapshot_id`` and the ``backfill_id``. A real downstream job would
recompute what it derives from that window (a daily report, an export) at that snapshot.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import DAG, task

from airflow_provider_kappa.operators.publish import target_asset

#: iceberg://lake/prod/playback_sessions: catalog ``lake``, table ``prod.playback_sessions`` of
#: the example job's kappa.yaml.
SESSIONS = target_asset("lake", "prod.playback_sessions")

with DAG(
    "playback_sessions_downstream",
    schedule=[SESSIONS],
    catchup=False,
    tags=["kappa", "example", "downstream"],
    description="Runs after each backfill of prod.playback_sessions; reads the window it replaced",
    doc_md=__doc__,
) as dag:

    @task
    def windows_replaced(triggering_asset_events: Any = None) -> list[dict[str, Any]]:
        """The windows the triggering backfills replaced (one per asset event)."""
        windows = []
        for event in (triggering_asset_events or {}).get(SESSIONS, []):
            extra = dict(event.extra or {})
            print(
                f"{SESSIONS.uri}: backfill {extra.get('backfill_id')} replaced "
                f"[{extra.get('start')}, {extra.get('end')}) at snapshot {extra.get('snapshot_id')}"
            )
            windows.append(extra)
        return windows

    windows_replaced()
