"""Continuous verification (dags/playback_sessions_verify.py, ``kappa_verify_dag``): a scheduled
``dag.test()`` run replays its data interval (the day before) with real local Spark over a real
sqlite-catalog lake, publishes nothing, and compares the replay with the live output in the
target. Live output corrupted in one session window is flagged, that window exactly: the run
fails and the drift asset event lists it; clean live output passes with no event."""

from __future__ import annotations

import runpy
from datetime import timedelta
from pathlib import Path
from typing import Any

import airflow_env  # noqa: F401  (sets AIRFLOW_HOME before Airflow is imported)
import pytest
from airflow_env import REPO, airflow_db, load_dag_file, write_job_config  # noqa: F401  (fixture)
from lake import T0, append_events, create_events_table, create_sessions_table, event, expected_sessions, sorted_rows

DAG_FILE = REPO / "dags" / "playback_sessions_verify.py"
DRIFT_URI = "kappa://playback_sessions/drift"
#: The day verified: the data interval of the run whose logical date is its end (``@daily``).
DAY = (T0, T0 + timedelta(days=1))
#: The day's events end at 03:50: ``allow_open_end`` verifies what the landed data closes, [00:00, 03:15).
CONF = {"slice": "6h", "warmup": "30min", "tail": "45min", "allow_open_end": True}
#: The live session corrupted: account 2's session from minute 101 (its first play's event time),
#: the only session starting in its 1-minute output window.
CORRUPTED_START = T0 + timedelta(minutes=101, seconds=-1)


@pytest.fixture()
def lake(lake_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The example config's ${KAPPA_LAKE} is the test's lake folder (catalog ``lake`` of conftest)."""
    monkeypatch.setenv("KAPPA_LAKE", str(lake_dir))
    return lake_dir


def _live_lake(catalog: Any) -> list[dict[str, Any]]:
    """Landed playbacks 00:00-03:50 and the sessions live wrote for them (the sessionizer's rows)."""
    import pyarrow as pa
    from lake import sessions_arrow

    minutes = {7: list(range(0, 231, 10)), 1: [70, 72, 74, 140, 141], 2: [101, 104, 160, 162], 3: [117, 121]}
    events = [
        event(1000 * a + m, T0 + timedelta(minutes=m), account=a, show=a) for a, ms in minutes.items() for m in ms
    ]
    append_events(create_events_table(catalog, "raw.playbacks"), events)
    sessions = expected_sessions(events)
    create_sessions_table(catalog, "prod.playback_sessions").append(
        pa.Table.from_pylist(sessions, schema=sessions_arrow())
    )
    return sessions


def _corrupt_one_session(catalog: Any) -> None:
    """After live wrote it: account 2's session at CORRUPTED_START gets a wrong play count (one
    delete and one append, as a buggy writer would leave it; its window keeps one row)."""
    import pyarrow as pa
    from lake import sessions_arrow
    from pyiceberg.expressions import EqualTo

    table = catalog.load_table("prod.playback_sessions")
    row = [
        r for r in table.scan(row_filter=EqualTo("session_start", CORRUPTED_START.isoformat())).to_arrow().to_pylist()
    ]
    assert len(row) == 1 and row[0]["account_id"] == 2
    table.delete(EqualTo("session_start", CORRUPTED_START.isoformat()))
    table.append(pa.Table.from_pylist([dict(row[0], plays=99)], schema=sessions_arrow()))


def _drift_events(dag_id: str, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        events = session.scalars(
            select(AssetEvent)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .where(AssetModel.uri == DRIFT_URI, AssetEvent.source_dag_id == dag_id, AssetEvent.source_run_id == run_id)
        ).all()
        return [(e.source_task_id, dict(e.extra)) for e in events]


@pytest.mark.parametrize("corrupt", [False, True], ids=["clean", "one_window_corrupted"])
def test_verify_run_flags_exactly_the_corrupted_window_and_publishes_nothing(
    corrupt: bool,
    lake: Path,
    catalog: Any,
    catalog_props: dict[str, str],
    airflow_db: None,  # noqa: F811
    connect_server: Any,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """The verify DAG file's DAG on the tests' shared Connect server (the verification is the subject,
    not the server's life: test_dag's [sequential] run covers a DAG's own local server)."""
    _live_lake(catalog)
    if corrupt:
        _corrupt_one_session(catalog)
    target = catalog.load_table("prod.playback_sessions")
    before, snapshot = sorted_rows(target), target.current_snapshot().snapshot_id
    dag = load_dag_file(DAG_FILE, write_job_config(lake, catalog_props, connect_url=connect_server.url))
    dr = dag.test(logical_date=DAY[1], run_conf=CONF)  # its data interval: the day before
    states = {(ti.task_id, ti.map_index): ti.state for ti in dr.get_task_instances()}
    out = capfd.readouterr().out
    assert (dr.data_interval_start, dr.data_interval_end) == DAY
    # nothing published: the target is as live left it, and no lock was taken
    target = catalog.load_table("prod.playback_sessions")
    assert sorted_rows(target) == before and target.current_snapshot().snapshot_id == snapshot
    assert not [k for k in target.properties if k.startswith("kappa.backfill.lock")]
    assert states[("verify", -1)] == "success" and states[("cleanup", -1)] == "success"
    verify = next(ti for ti in dr.get_task_instances() if ti.task_id == "verify")
    summary = verify.xcom_pull(task_ids="verify")
    report = verify.xcom_pull(task_ids="verify", key="kappa_links")["Backfill report"]
    assert report.startswith("file://") and report.endswith("/report.html") and Path(report[7:]).is_file()
    assert summary["report"] == report and summary["min_match"] == 100.0
    assert (summary["start"], summary["end"]) == (DAY[0].isoformat(), (T0 + timedelta(hours=3, minutes=15)).isoformat())
    sink = summary["sinks"]["sessions"]
    assert sink["live_rows"] == sink["replayed_rows"] > 10
    events = _drift_events(dag.dag_id, dr.run_id)
    if not corrupt:
        assert dr.state == "success", states
        assert states[("drift", -1)] == "skipped" and states[("verify_gate", -1)] == "success"
        assert not summary["drift"] and sink["match_rate"] == 100.0 and sink["windows"] == []
        assert events == []
        assert "no drift" in out
        return
    assert dr.state == "failed", states
    assert states[("drift", -1)] == "success" and states[("verify_gate", -1)] == "failed"
    window = {
        "start": CORRUPTED_START.isoformat(),
        "end": (CORRUPTED_START + timedelta(minutes=1)).isoformat(),  # the sessions' grid: 1 minute
        "live_rows": 1,
        "replayed_rows": 1,
        "only_live": 1,
        "only_replayed": 1,
    }
    assert summary["drift"] and sink["drift"] and sink["drifting_windows"] == 1 and sink["windows"] == [window]
    assert sink["match_rate"] == pytest.approx(100.0 * (sink["live_rows"] - 1) / sink["live_rows"])
    assert [task for task, _ in events] == ["drift"]
    extra = events[0][1]
    assert extra == summary and extra["sinks"]["sessions"]["windows"] == [window]
    assert f"[{window['start']}, {window['end']})  live 1  replayed 1  only live 1  only replayed 1" in out
    assert "live output drifts from the replay" in out


def test_the_verify_dag_shares_the_backfill_tasks_never_publishes_and_parses_light(
    lake: Path,
    airflow_db: None,  # noqa: F811
) -> None:
    import subprocess
    import sys

    from airflow.exceptions import ParamValidationError

    dag = runpy.run_path(str(DAG_FILE))["dag"]
    assert dag.dag_id == "kappa_verify_playback_sessions" and dag.max_active_runs == 1
    backfill = runpy.run_path(str(REPO / "dags" / "playback_sessions_backfill.py"))["dag"]
    shared = set(backfill.task_dict) - {"validate", "publish"}  # snapshot, plan, mode, slices, server, cleanup
    assert set(dag.task_dict) == shared | {"wait_for_landing", "verify", "drift", "verify_gate"}
    landed = dag.task_dict["wait_for_landing"]  # a run starts when its day ends, before its tail is landed
    assert landed.downstream_task_ids == {"snapshot"} and landed.mode == "reschedule" and landed.timeout == 6 * 3600
    for task in shared - {"cleanup"}:
        assert dag.task_dict[task].downstream_task_ids == {
            {"validate": "verify"}.get(t, t) for t in backfill.task_dict[task].downstream_task_ids if t != "publish"
        }  # plan's XCom feeds verify (validate and publish in a backfill)
    assert dag.task_dict["verify"].upstream_task_ids >= {"slice_sequential", "slice_parallel"}
    assert dag.task_dict["drift"].upstream_task_ids == {"verify"}
    assert [a.uri for a in dag.task_dict["drift"].outlets] == [DRIFT_URI]
    assert dag.task_dict["verify_gate"].upstream_task_ids == {"verify", "drift"}
    assert dag.task_dict["verify_gate"].trigger_rule == "none_failed"
    assert dag.task_dict["cleanup"].upstream_task_ids == {"drift", "connect_server_stop"}
    assert not dag.task_dict["verify"].outlets  # the event comes from drift alone
    assert dag.params.get_param("publish").value is False
    assert dag.params.get_param("start").value is None and dag.params.get_param("end").value is None
    with pytest.raises(ParamValidationError, match="Invalid input for param publish: True is not one of"):
        dag.test(logical_date=DAY[1], run_conf={**CONF, "publish": True})
    code = (
        "import runpy, sys\n"
        f"runpy.run_path({str(DAG_FILE)!r})\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'pyiceberg', 'pyarrow')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip().splitlines()[-1] == "[]"
    assert sorted(p.name for p in lake.rglob("*")) == ["warehouse"]  # no catalog opened, no folder made
