"""A real backfill DAG run (dag.test(), real local Spark on the tests' Spark Connect server) whose
``cleanup`` task applies ``job.retention: 0s``: the staging tables, checkpoints, plan files and
tags of the run's published backfill and of an older unpublished one go; a backfill holding a
lock stays; every data file the target reads stays."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import airflow_env  # noqa: F401  (sets AIRFLOW_HOME before Airflow is imported)
import yaml
from airflow_env import airflow_db, write_job_config  # noqa: F401  (fixture)
from lake import INCIDENT_END, INCIDENT_START, T0, seed_sessions_incident, sessions_arrow, sorted_rows

from airflow_provider_kappa.backfill.backfill import tag_name
from airflow_provider_kappa.backfill.lock import take_lock
from airflow_provider_kappa.job.checkpoints import backfill_root
from airflow_provider_kappa.spark.staging import ensure_staging_table, staging_backfills, staging_table_name

TARGET, SOURCE = "prod.playback_sessions", "raw.playbacks"


def test_the_dag_cleans_up_after_publishing_and_the_target_keeps_its_files(
    tmp_path: Path,
    catalog_props: dict[str, str],
    catalog: Any,
    airflow_db: None,
    connect_server: Any,  # noqa: F811
) -> None:
    from datetime import timedelta

    import pyarrow as pa

    from airflow_provider_kappa.dag import kappa_backfill_dag

    config = write_job_config(tmp_path, catalog_props, engine="connect", connect_url=connect_server.url)
    raw = yaml.safe_load(config.read_text())
    raw["job"]["retention"] = "0s"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    expected = seed_sessions_incident(catalog)
    checkpoints = tmp_path / "checkpoints" / "playback_sessions" / "backfill"
    # leftovers of two earlier backfills of the job: a dry run (unpublished), one still holding its lock
    source = catalog.load_table(SOURCE)
    for old in ("bf_old_dry_run", "bf_holding_lock"):
        ensure_staging_table(catalog, TARGET, staging_table_name(TARGET, old, "s0000"))
        (checkpoints / old / "plans" / "s0000").mkdir(parents=True)
        (checkpoints / old / "plans" / "s0000" / "playbacks.json").write_text("{}")
        source.manage_snapshots().create_tag(source.current_snapshot().snapshot_id, tag_name(old)).commit()
    take_lock(
        catalog.load_table(TARGET),
        "bf_holding_lock",
        "playback_sessions",
        T0 + timedelta(hours=20),
        T0 + timedelta(hours=21),
        retention=timedelta(days=7),
    )

    dag = kappa_backfill_dag(
        str(config), dag_id="kappa_backfill_playback_sessions", slice_retries=0, step_retries=0
    )  # a serialized dag id
    dr = dag.test(
        run_conf={
            "start": INCIDENT_START.isoformat(),
            "end": INCIDENT_END.isoformat(),
            "slice": "2h",
            "warmup": "30min",
            "tail": "45min",
        }
    )
    states = {(ti.task_id, ti.map_index): ti.state for ti in dr.get_task_instances()}
    assert dr.state == "success", states
    assert states[("publish", -1)] == "success" and states[("cleanup", -1)] == "success"
    backfill_id = dr.get_task_instance("snapshot").xcom_pull(task_ids="snapshot")["backfill_id"]

    target = catalog.load_table(TARGET)
    assert sorted_rows(target) == sorted_rows(pa.Table.from_pylist(expected, schema=sessions_arrow()))
    files = [t.file.file_path.removeprefix("file://") for t in target.scan().plan_files()]
    assert files and all(Path(f).is_file() for f in files)  # the published (by reference) files stay
    published = {s.summary.get("kappa.backfill-id") for s in target.snapshots() if s.summary is not None}
    assert backfill_id in published  # the run did publish by reference from staging tables it then dropped
    assert list(staging_backfills(catalog, TARGET)) == ["bf_holding_lock"]
    refs = catalog.load_table(SOURCE).metadata.refs
    assert (
        tag_name(backfill_id) not in refs
        and tag_name("bf_old_dry_run") not in refs
        and tag_name("bf_holding_lock") in refs
    )
    assert sorted(p.name for p in checkpoints.iterdir()) == ["bf_holding_lock"]
    assert not Path(backfill_root(str(tmp_path / "checkpoints"), "playback_sessions", backfill_id)).exists()
    removed = {d["backfill_id"]: d["removed"] for d in dr.get_task_instance("cleanup").xcom_pull(task_ids="cleanup")}
    assert removed == {backfill_id: True, "bf_old_dry_run": True, "bf_holding_lock": False}
