"""Rows with a null ingestion time are counted and reported, not dropped silently (issue 18 item 7):
no slice reads them (a row without an ingestion time belongs to no ingestion range), and
``kappa plan`` says how many there are per source, from manifest statistics only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import airflow_env  # noqa: F401  (sets AIRFLOW_HOME before Airflow is imported)
import pytest
from airflow_env import write_job_config
from lake import INCIDENT_END, INCIDENT_START, T0, append_events, create_events_table, event

from airflow_provider_kappa.cli import main
from airflow_provider_kappa.spark.source.manifests import null_ingestion_rows


def test_null_ingestion_rows_are_counted_from_manifests(catalog: Any) -> None:
    table = create_events_table(catalog, "raw.playbacks")
    assert null_ingestion_rows(table, None, "ingestion_ts") == 0
    append_events(table, [event(i, T0) for i in range(5)])
    append_events(table, [{**event(10 + i, T0), "ingestion_ts": None} for i in range(3)])
    first = table.metadata.snapshots[0].snapshot_id
    assert null_ingestion_rows(table, None, "ingestion_ts") == 3
    assert null_ingestion_rows(table, first, "ingestion_ts") == 0


def test_kappa_plan_reports_rows_without_ingestion_time(
    tmp_path: Path,
    catalog_props: dict[str, str],
    catalog: Any,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    config = write_job_config(tmp_path, catalog_props)
    table = create_events_table(catalog, "raw.playbacks")
    append_events(table, [event(i, INCIDENT_START + (INCIDENT_END - INCIDENT_START) * i / 20) for i in range(20)])
    append_events(table, [{**event(100 + i, INCIDENT_START), "ingestion_ts": None} for i in range(4)])
    code = main(
        ["plan", "--config", str(config), "--start", INCIDENT_START.isoformat(), "--end", INCIDENT_END.isoformat()]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert (
        "source backfill-playbacks: 4 row(s) of raw.playbacks have a null ingestion_ts; no slice reads them"
        in " ".join(out.split())
    ), out
