"""Each slice's file list comes from one list per source for the whole backfill, read from
manifests once: the same list a slice would have built alone (sqlite catalog, no Spark)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import airflow_env  # noqa: F401  (sets AIRFLOW_HOME before Airflow is imported)
import pytest
from airflow_env import write_job_config
from lake import INCIDENT_END, INCIDENT_START, seed_sessions_incident

from airflow_provider_kappa.backfill import backfill as backfills
from airflow_provider_kappa.backfill import plan as planning
from airflow_provider_kappa.backfill import slices as slice_steps
from airflow_provider_kappa.backfill.snapshot import snapshot
from airflow_provider_kappa.job.config import load_config
from airflow_provider_kappa.spark.source import file_list, manifests
from airflow_provider_kappa.timeparse import to_micros


@pytest.mark.parametrize("mode", ["sequential", "parallel"])
def test_slices_file_lists_are_cut_from_one_backfill_list(
    tmp_path: Path, catalog_props: dict[str, str], catalog: Any, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    seed_sessions_incident(catalog)
    cfg = load_config(write_job_config(tmp_path, catalog_props))
    params = {
        "start": INCIDENT_START.isoformat(),
        "end": INCIDENT_END.isoformat(),
        "slice": "1h",
        "warmup": "30min",
        "tail": "45min",
        "mode": mode,
    }
    bf = backfills.Backfill.create(cfg, params)
    plan = planning.plan(bf, snapshot(bf))
    assert len(plan.slices) >= 2
    reads: list[object] = []
    real = manifests.file_spans
    monkeypatch.setattr(manifests, "file_spans", lambda *a, **k: reads.append(a[2:]) or real(*a, **k))
    lists = [slice_steps.write_file_lists(bf, sp) for sp in plan.slices]
    assert len(reads) == 1  # manifests read once for the whole backfill
    table = catalog.load_table("raw.playbacks")
    for sp, written in zip(plan.slices, lists):
        alone = file_list.build(
            table,
            sp.snapshot_ids["backfill-playbacks"],
            "ingestion_ts",
            to_micros(sp.read_start),
            to_micros(sp.read_end),
        )
        assert file_list.read(written["backfill-playbacks"]) == alone
    # a rerun of a slice reads the kept list, and a damaged copy is rebuilt
    kept = next(Path(bf.store().root, "plans", slice_steps.WHOLE_BACKFILL).iterdir())
    kept.write_text("{")
    reads.clear()
    again = slice_steps.write_file_lists(bf, plan.slices[1])
    assert len(reads) == 1 and file_list.read(again["backfill-playbacks"]) == file_list.read(
        lists[1]["backfill-playbacks"]
    )
