"""The backfill DAG: its shape and Params, parse-time hygiene, trigger-time refusals, and
``dag.test()`` runs of the example playback-sessions DAG with real local Spark replacing a
seeded bad window, in sequential and in parallel mode."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import airflow_env  # noqa: F401  (sets AIRFLOW_HOME before Airflow is imported)
import pytest
from airflow_env import REPO, airflow_db, load_dag_file  # noqa: F401  (fixture)
from lake import INCIDENT_END, INCIDENT_START, create_events_table, seed_sessions_incident, sorted_rows
from paths import EXAMPLES

DAG_FILE = REPO / "dags" / "playback_sessions_backfill.py"
RUN_CONF = {
    "start": INCIDENT_START.isoformat(),
    "end": INCIDENT_END.isoformat(),
    "slice": "2h",
    "warmup": "30min",
    "tail": "45min",
}


def load_dag(path: Path = DAG_FILE) -> Any:
    return load_dag_file(path)


@pytest.fixture()
def lake(lake_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The example configs' ${KAPPA_LAKE} is the test's lake folder (catalog ``lake`` of conftest)."""
    monkeypatch.setenv("KAPPA_LAKE", str(lake_dir))
    return lake_dir


def test_example_dags_have_the_backfill_shape_and_params(lake: Path) -> None:
    for name, sources in (("rmi", ["impressions", "playbacks"]), ("playback_sessions", ["playbacks"])):
        dag = load_dag(REPO / "dags" / f"{name}_backfill.py")
        assert dag.dag_id == f"kappa_backfill_{name}"
        assert dag.schedule is None and dag.max_active_runs == 1
        assert set(dag.task_dict) == {
            "snapshot",
            "plan",
            "mode",
            "slice_sequential",
            "slice_parallel",
            "validate",
            "publish",
            "cleanup",
            "connect_server_start",
            "connect_server_stop",  # engine connect without job.connect: a local server
        }
        assert dag.task_dict["connect_server_start"].is_setup and dag.task_dict["connect_server_stop"].is_teardown
        assert dag.task_dict["connect_server_start"].downstream_task_ids == {
            "slice_sequential",
            "slice_parallel",
            "connect_server_stop",
        }
        assert dag.task_dict["snapshot"].downstream_task_ids == {"plan"}
        assert dag.task_dict["mode"].downstream_task_ids == {"slice_sequential", "slice_parallel"}
        assert dag.task_dict["validate"].upstream_task_ids >= {"slice_sequential", "slice_parallel"}
        assert dag.task_dict["publish"].upstream_task_ids >= {"validate"}
        assert dag.task_dict["cleanup"].upstream_task_ids == {"publish", "connect_server_stop"}
        assert dag.task_dict["cleanup"].trigger_rule == "none_failed"
        assert dag.task_dict["slice_sequential"].max_active_tis_per_dagrun == 1
        assert dag.task_dict["slice_parallel"].max_active_tis_per_dagrun == 4
        assert list(dag.params) == [
            "start",
            "end",
            "sources",
            "slice",
            "max_misalignment_threshold",
            "warmup",
            "tail",
            "mode",
            "dry_run",
            "publish",
            "min_match",
            "allow_open_end",
            "ledger",
        ]
        sources_param = dag.params.get_param("sources")
        assert sources_param.value == sources and sources_param.schema["examples"] == sources
        assert dag.params.get_param("mode").schema["enum"] == ["sequential", "parallel"]


def test_parsing_the_dag_files_imports_no_spark_or_iceberg_and_does_no_io(lake: Path) -> None:
    code = (
        "import runpy, sys, time\n"
        "t = time.monotonic()\n"
        f"for f in {[str(REPO / 'dags' / n) for n in ('rmi_backfill.py', 'playback_sessions_backfill.py')]!r}:\n"
        "    runpy.run_path(f)\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'pyiceberg', 'pyarrow'))\n"
        "print(heavy, round(time.monotonic() - t, 2))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    heavy = out.stdout.strip().splitlines()[-1]
    assert heavy.startswith("[] "), heavy
    assert sorted(p.name for p in lake.rglob("*")) == ["warehouse"]  # no catalog opened, no folder made


def test_trigger_with_bad_values_is_refused_with_the_reason(lake: Path, airflow_db: None) -> None:  # noqa: F811
    from airflow.exceptions import ParamValidationError

    dag = load_dag()
    for change, reason in (
        ({"sources": ["clicks"]}, "Invalid input for param sources: 'clicks' is not one of ['playbacks']"),
        (
            {"max_misalignment_threshold": "0s"},
            "Invalid input for param max_misalignment_threshold: '0s' does not match",
        ),
        ({"start": "2026-11-01T01:00:00"}, "Invalid input for param start: '2026-11-01T01:00:00' does not match"),
        ({"mode": "fast"}, "Invalid input for param mode: 'fast' is not one of ['sequential', 'parallel']"),
        ({"min_match": 150}, "Invalid input for param min_match: 150 is greater than the maximum of 100"),
    ):
        with pytest.raises(ParamValidationError) as err:
            dag.test(run_conf={**RUN_CONF, **change})
        assert reason in str(err.value)


def test_end_before_start_fails_the_first_task_before_any_spark_run(
    lake: Path,
    catalog: Any,
    airflow_db: None,
    capfd: pytest.CaptureFixture[str],  # noqa: F811
) -> None:
    create_events_table(catalog, "raw.playbacks")
    dag = load_dag()
    dr = dag.test(run_conf={**RUN_CONF, "start": INCIDENT_END.isoformat(), "end": INCIDENT_START.isoformat()})
    states = {ti.task_id: ti.state for ti in dr.get_task_instances()}
    assert dr.state == "failed"
    assert states["snapshot"] == "failed"
    assert {
        states[t]
        for t in ("plan", "mode", "slice_sequential", "slice_parallel", "validate", "publish", "connect_server_start")
    } == {"upstream_failed"}
    out = capfd.readouterr().out
    assert "backfill parameter end: '2026-11-01T01:00:00+00:00' is not after start '2026-11-01T03:00:00+00:00'" in out
    assert not (lake / "checkpoints").exists()


@pytest.mark.parametrize("mode", ["sequential", "parallel"])
def test_dag_run_replaces_the_bad_window_with_the_correct_rows(
    mode: str,
    lake: Path,
    catalog: Any,
    catalog_props: dict[str, str],
    airflow_db: None,
    capfd: pytest.CaptureFixture[str],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    """The example DAG as shipped in [sequential] (engine connect, no job.connect: the run's own local
    server, its setup and teardown tasks, and its recycling between slice tasks); [parallel] runs the
    same DAG on the tests' shared server (its subject is the parallel slices, not the server's life)."""
    from airflow_env import write_job_config

    from airflow_provider_kappa.engine.shared_server import RECYCLE_ENV

    own_server = mode == "sequential"
    if own_server:
        monkeypatch.setenv(RECYCLE_ENV, "1")  # the slice tasks recycle the setup task's server after every session
        dag = load_dag()
    else:
        url = request.getfixturevalue("connect_server").url
        dag = load_dag_file(DAG_FILE, write_job_config(lake, catalog_props, connect_url=url))
        assert "connect_server_start" not in dag.task_dict  # a given server: no setup/teardown tasks
    expected = seed_sessions_incident(catalog)
    before = sorted_rows(catalog.load_table("prod.playback_sessions"))
    outside = [r for r in before if not INCIDENT_START <= r[1] < INCIDENT_END]
    dr = dag.test(run_conf={**RUN_CONF, "mode": mode})
    out = capfd.readouterr().out
    states = {(ti.task_id, ti.map_index): ti.state for ti in dr.get_task_instances()}
    assert dr.state == "success", states
    ran, skipped = (
        ("slice_sequential", "slice_parallel") if mode == "sequential" else ("slice_parallel", "slice_sequential")
    )
    assert [states[(ran, i)] for i in range(2)] == ["success", "success"]
    assert states[(skipped, -1)] == "skipped"
    after = sorted_rows(catalog.load_table("prod.playback_sessions"))
    assert after == sorted_rows(_arrow(expected))
    assert [r for r in after if not INCIDENT_START <= r[1] < INCIDENT_END] == outside  # untouched
    # progress people can see: per slice and the final summary
    assert "micro-batches" in out and "watermark" in out
    assert "sink sessions: published snapshot" in out and "match rate" in out
    if not own_server:
        return
    # engine connect (the example's default): one local server for the run, stopped by the teardown
    assert states[("connect_server_start", -1)] == "success" and states[("connect_server_stop", -1)] == "success"
    assert "local Spark Connect server sc://localhost:" in out
    assert not list(lake.rglob("connect/server.json")) and not list(lake.rglob("connect/sessions.json"))
    # the second slice task found the first one's session done and the count reached: a new server
    assert "the slice tasks recycled it 1 time(s)" in out


def _arrow(rows: list[dict[str, Any]]) -> Any:
    import pyarrow as pa
    from lake import sessions_arrow

    return pa.Table.from_pylist(rows, schema=sessions_arrow())


def test_serialized_params_are_what_the_api_server_and_form_use(lake: Path) -> None:
    """The API server (trigger form, REST trigger) sees the DAG deserialized: every Param keeps
    its JSON schema and description, and an unset start/end is refused."""
    from airflow.exceptions import ParamValidationError
    from airflow.serialization.serialized_objects import DagSerialization

    from airflow_provider_kappa.backfill.params import param_schemas
    from airflow_provider_kappa.job.config import load_config

    served = DagSerialization.from_dict(DagSerialization.to_dict(load_dag())).params
    schemas = param_schemas(load_config(EXAMPLES / "playback_sessions" / "kappa.yaml"))
    for name, schema in schemas.items():
        param = served.get_param(name)
        assert param.schema == {k: v for k, v in schema.items() if k not in ("default", "description")}
        assert param.description == schema["description"]
    with pytest.raises(ParamValidationError, match="Invalid input for param start: No value passed"):
        served.deep_merge({"end": RUN_CONF["end"]}).validate()
    assert served.deep_merge(RUN_CONF).validate()["slice"] == "2h"


def test_a_failed_sequential_slice_stops_the_slices_after_it(
    lake: Path,
    catalog: Any,
    tmp_path: Path,
    catalog_props: dict[str, str],
    airflow_db: None,  # noqa: F811
    connect_server: Any,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Slice 0 fails for good (its job exits with a message and the slice has no retries left): slice 1
    never runs Spark and fails naming slice 0, whether Airflow picked it before (it waits) or after.
    Engine connect on the tests' shared server (the slices' order is the subject, not the server's life)."""
    from airflow_env import write_job_config

    from airflow_provider_kappa.dag import kappa_backfill_dag

    seed_sessions_incident(catalog)
    path = write_job_config(tmp_path, catalog_props, connect_url=connect_server.url)
    path.write_text(path.read_text().replace(str(EXAMPLES), str(tmp_path / "broken")))
    app = tmp_path / "broken" / "playback_sessions" / "playback_sessions.py"
    app.parent.mkdir(parents=True)
    app.write_text('raise SystemExit("kappa test: this job fails on purpose")\n')
    dag = kappa_backfill_dag(str(path), dag_id="kappa_backfill_playback_sessions", slice_retries=0)
    for task in dag.tasks:
        if task.task_id == "slice_sequential":
            task.partial_kwargs["wait_interval"] = 2.0  # type: ignore[attr-defined]
    dr = dag.test(run_conf=RUN_CONF)
    states = {(ti.task_id, ti.map_index): ti.state for ti in dr.get_task_instances()}
    assert dr.state == "failed"
    assert states[("slice_sequential", 0)] == "failed" and states[("slice_sequential", 1)] == "failed"
    assert states[("validate", -1)] == "upstream_failed" and states[("publish", -1)] == "upstream_failed"
    assert not list((tmp_path / "checkpoints").rglob("done/*.json"))
    labels = sorted(ti.rendered_map_index for ti in dr.get_task_instances() if ti.task_id == "slice_sequential")
    assert labels == ["s0000 [2026-11-01 00:30, 2026-11-01 02:00)", "s0001 [2026-11-01 02:00, 2026-11-01 03:45)"]
    out = capfd.readouterr().out
    assert "kappa test: this job fails on purpose" in out  # the job's own error, from the slice log
    assert "sequential slice s0001 cannot start: slice s0000 (map index 0) is failed" in out


def test_a_scheduled_run_backfills_its_data_interval_and_publish_records_the_asset_event(
    lake: Path,
    catalog: Any,
    catalog_props: dict[str, str],
    airflow_db: None,  # noqa: F811
    connect_server: Any,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Scheduled repair (dags/playback_sessions_repair.py, ``@daily``): a run without start and
    end replaces its data interval, the day (the same backfill, same id, as explicit start and
    end), and the publish task's asset event carries the window, the published snapshot and the
    backfill id. The repair DAG on the tests' shared server (the interval is the subject, not the
    server's life: the example DAG's run on its own server is the [sequential] test above)."""
    from datetime import timedelta

    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from airflow_env import write_job_config
    from lake import T0
    from sqlalchemy import select

    from airflow_provider_kappa.backfill.backfill import Backfill
    from airflow_provider_kappa.job.config import load_config

    expected = seed_sessions_incident(catalog)
    repair = REPO / "dags" / "playback_sessions_repair.py"
    config = write_job_config(lake, catalog_props, connect_url=connect_server.url)
    dag = load_dag_file(repair, config)  # the shipped file's DAG (id, @daily), on the shared server
    assert dag.dag_id == "kappa_repair_playback_sessions"
    assert dag.params.get_param("start").value is None and dag.params.get_param("end").value is None
    # the day's data ends at 03:50: end + tail lies past it, so the run allows an open end and
    # publishes what the landed data closes ([00:00, 03:15)), keeping the target's rows after it
    conf = {"slice": "6h", "warmup": "30min", "tail": "45min", "allow_open_end": True}
    day = (T0, T0 + timedelta(days=1))
    dr = dag.test(logical_date=day[1], run_conf=conf)  # its data interval: the day before
    states = {(ti.task_id, ti.map_index): ti.state for ti in dr.get_task_instances()}
    assert dr.state == "success", states
    assert (dr.data_interval_start, dr.data_interval_end) == day
    # the incident is repaired (sessions still open when the lake's data ends, after 03:00, are
    # never closed by a watermark: a real day has the next day's events within its tail)
    in_incident = lambda rows: [r for r in rows if INCIDENT_START <= r[1] < INCIDENT_END]  # noqa: E731
    after = sorted_rows(catalog.load_table("prod.playback_sessions"))
    assert in_incident(after) == in_incident(sorted_rows(_arrow(expected))) != []
    backfill_id = Backfill.create(
        load_config(config), {**conf, "start": day[0].isoformat(), "end": day[1].isoformat()}
    ).id
    out = capfd.readouterr().out
    assert f"backfill {backfill_id}: parameters" in out
    published_end = T0 + timedelta(hours=3, minutes=15)  # what the landed data closes (its end minus the tail)
    assert f"validated and published [{day[0].isoformat()}, {published_end.isoformat()})" in out
    with create_session() as session:
        events = session.scalars(
            select(AssetEvent)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .where(
                AssetModel.uri == "iceberg://lake/prod/playback_sessions",
                AssetEvent.source_dag_id == dag.dag_id,
                AssetEvent.source_run_id == dr.run_id,
            )
        ).all()
        assert [(e.source_task_id, e.extra) for e in events] == [
            (
                "publish",
                {
                    "backfill_id": backfill_id,
                    "job": "playback_sessions",
                    "sink": "sessions",
                    "table": "prod.playback_sessions",
                    "start": day[0].isoformat(),
                    "end": published_end.isoformat(),  # clipped by the open end, not the day's end
                    "snapshot_id": catalog.load_table("prod.playback_sessions").current_snapshot().snapshot_id,
                },
            )
        ]
