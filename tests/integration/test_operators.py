"""The backfill operators on a real file-backed sqlite catalog.

Only the spark-submit process is replaced (``SparkSubmitHook.submit``): a stand-in plays the
job's part from what a real Spark run receives (the properties file and the catalogs file
it names), appending rows to the staging table, advancing the checkpoint and writing a Spark
event log. Spark itself is exercised end to end in tests/integration/test_dag.py and tests/integration/test_cli.py.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from datetime import timedelta
from pathlib import Path
from typing import Any

import airflow_env  # noqa: F401  (sets AIRFLOW_HOME before Airflow is imported)
import pytest
import yaml
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk.execution_time.context import OutletEventAccessors
from airflow_env import PLANTED_SECRET, write_job_config
from lake import T0, append_events, create_events_table, create_sessions_table, event, sessions_arrow, sorted_rows

from airflow_provider_kappa.compat.airflow import (
    AirflowException,
    AirflowFailException,
    AirflowRescheduleException,
    AirflowSkipException,
)
from airflow_provider_kappa.engine.progress import PROGRESS_EVENT
from airflow_provider_kappa.operators.plan import KappaModeBranchOperator, KappaPlanOperator
from airflow_provider_kappa.operators.publish import KappaPublishOperator, target_asset
from airflow_provider_kappa.operators.slice_run import KappaSliceRunOperator
from airflow_provider_kappa.operators.snapshot import KappaSnapshotOperator
from airflow_provider_kappa.operators.validate import KappaValidateOperator

TARGET = "prod.playback_sessions"


def at(h: int, m: int = 0) -> Any:
    return T0 + timedelta(hours=h, minutes=m)


def props_of(path: str) -> dict[str, str]:
    out = {}
    for line in Path(path).read_text().splitlines():
        key, _, value = line.partition(" ")
        out[key] = value
    return out


class FakeSparkSubmit:
    """Stands in for the spark-submit process: does what the job would, from its inputs only."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[dict[str, Any]] = []
        self.fail = fail

    def __call__(self, hook: SparkSubmitHook, application: str = "", **_: Any) -> None:
        import pyarrow as pa
        from pyiceberg.catalog import load_catalog

        props_file = hook._properties_file
        conf = props_of(props_file)
        catalogs_file = conf["spark.kappa.catalogs.file"]
        self.calls.append(
            {
                "command": " ".join(hook._build_spark_submit_command(application)),
                "properties": Path(props_file).read_text(),
                "properties_mode": stat.S_IMODE(os.stat(props_file).st_mode),
                "catalogs": Path(catalogs_file).read_text(),
                "catalogs_mode": stat.S_IMODE(os.stat(catalogs_file).st_mode),
                "catalogs_file": catalogs_file,
                "conf": conf,
            }
        )
        if self.fail:
            raise AirflowException("Cannot execute: spark-submit exited with code 1")
        catalog = load_catalog("lake", **json.loads(Path(catalogs_file).read_text())["lake"])
        write_table = conf["spark.kappa.sink.sessions.write_table"]
        owns = (conf["spark.kappa.sink.sessions.owns.start"], conf["spark.kappa.sink.sessions.owns.end"])
        start = conf["spark.kappa.read.start"]
        from airflow_provider_kappa.timeparse import parse_timestamp

        s = parse_timestamp(start, "x")
        if parse_timestamp(owns[0], "x") <= s < parse_timestamp(owns[1], "x"):
            row = {
                "account_id": 1,
                "session_start": s,
                "session_end": s + timedelta(minutes=5),
                "plays": 2,
                "last_play_ts": s,
            }
            catalog.load_table(write_table).append(pa.Table.from_pylist([row], schema=sessions_arrow()))
        commits = Path(conf["spark.kappa.checkpoint"]) / "sessions" / "commits"
        commits.mkdir(parents=True, exist_ok=True)
        (commits / str(len(list(commits.iterdir())))).write_text(conf["spark.kappa.sink.sessions.slice"])
        events = Path(conf["spark.eventLog.dir"].removeprefix("file://")) / "local-1"
        progress = [
            {
                "name": "q",
                "batchId": b,
                "batchDuration": 1500,
                "sink": {"numOutputRows": 1},
                "sources": [{"description": "PythonMicroBatchStream", "numInputRows": 5}],
                "eventTime": {"watermark": f"2026-11-01T0{b}:00:00.000Z"},
            }
            for b in (1, 2)
        ]
        events.write_text("\n".join(json.dumps({"Event": PROGRESS_EVENT, "progress": p}) for p in progress) + "\n")


class FakeTI:
    """The few RuntimeTaskInstance members the operators use."""

    dag_id = "kappa_backfill_playback_sessions"
    run_id = "manual__1"

    def __init__(self, task_id: str, states: dict[str, str] | None = None) -> None:
        self.task_id = task_id
        self.states = states or {}
        self.pushed: dict[str, Any] = {}  # XCom pushed by the task (its extra links' URLs)

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value

    def get_task_states(self, dag_id: str, task_ids: list[str], run_ids: list[str]) -> dict[str, Any]:
        assert (dag_id, task_ids, run_ids) == (self.dag_id, [self.task_id], [self.run_id])
        return {self.run_id: self.states}


@pytest.fixture()
def job(tmp_path: Path, catalog: Any, catalog_props: dict[str, str]) -> Path:
    """A playback_sessions job on the test lake, with a secret planted in its catalog properties."""
    raw = create_events_table(catalog, "raw.playbacks")
    append_events(raw, [event(i, at(0, 10 * i), account=1 + i % 2) for i in range(24)])  # 00:00 .. 03:50
    create_sessions_table(catalog, TARGET)
    # engine submit: the stand-in replaces the spark-submit process (SparkSubmitHook.submit), the process boundary
    return write_job_config(
        tmp_path, catalog_props, engine="submit", extra_catalog_props={"s3.secret-access-key": PLANTED_SECRET}
    )


PARAMS = {"start": at(1).isoformat(), "end": at(3).isoformat(), "slice": "1h", "warmup": "30min", "tail": "15min"}


def run_op(op: Any, params: dict[str, Any] | None = None, ti: Any = None, **context_extra: Any) -> Any:
    context: dict[str, Any] = {"params": dict(params or PARAMS), "ti": ti or FakeTI(op.task_id), **context_extra}
    return op.execute(context)


def publish_op(job: Path, slices: Any, report: Any) -> KappaPublishOperator:
    """The publish task as the DAG builds it: the target table's asset as its outlet."""
    return KappaPublishOperator(
        task_id="publish", config_path=str(job), plan=slices, report=report, outlets=[target_asset("lake", TARGET)]
    )


def test_snapshot_pins_tags_and_reuses_on_rerun(job: Path, catalog: Any) -> None:
    op = KappaSnapshotOperator(task_id="snapshot", config_path=str(job), tag_retention="2d")
    first = run_op(op)
    table = catalog.load_table("raw.playbacks")
    ref = table.metadata.refs[first["tag"]]
    assert first["snapshot_ids"] == {"backfill-playbacks": table.current_snapshot().snapshot_id}
    assert (ref.snapshot_id, ref.snapshot_ref_type.value, ref.max_ref_age_ms) == (
        first["snapshot_ids"]["backfill-playbacks"],
        "tag",
        2 * 86_400_000,
    )
    assert first["tag"] == f"kappa-{first['backfill_id']}" and first["params"]["mode"] == "sequential"
    append_events(table, [event(99, at(2, 5))])  # ingestion goes on during the backfill
    again = run_op(op)
    assert again == first  # same parameters: same backfill, same pinned snapshot
    assert PLANTED_SECRET not in json.dumps(first)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"end": at(0).isoformat()}, "backfill parameter end: '2026-11-01T00:00:00+00:00' is not after start"),
        ({"max_misalignment_threshold": "2h"}, "max_misalignment_threshold: 2h exceeds slice 1h"),
        ({"slice": "6h"}, "backfill parameter slice: 6h is larger than the range read"),
        ({"sources": ["clicks"]}, "unknown source(s) ['clicks']"),
    ],
)
def test_snapshot_fails_fast_on_bad_parameters_and_writes_nothing(
    job: Path, catalog: Any, change: dict[str, Any], reason: str
) -> None:
    op = KappaSnapshotOperator(task_id="snapshot", config_path=str(job))
    with pytest.raises(AirflowFailException) as err:
        run_op(op, {**PARAMS, **change})
    assert reason in str(err.value) and str(err.value).startswith("snapshot: backfill parameters: KappaConfigError:")
    assert not [r for r in catalog.load_table("raw.playbacks").metadata.refs if r.startswith("kappa-")]


def test_snapshot_refuses_a_missing_target_or_application_without_retry_and_writes_nothing(
    job: Path, catalog: Any
) -> None:
    catalog.drop_table(TARGET)
    op = KappaSnapshotOperator(task_id="snapshot", config_path=str(job))
    with pytest.raises(
        AirflowFailException, match=r"snapshot: inputs: KappaSinkError: sink sessions: target .*prod.playback_sessions"
    ):
        run_op(op)
    create_sessions_table(catalog, TARGET)
    cfg = yaml.safe_load(job.read_text())
    cfg["job"]["application"] = str(job.parent / "missing_job.py")
    job.write_text(yaml.safe_dump(cfg))
    with pytest.raises(
        AirflowFailException,
        match=r"snapshot: inputs: KappaConfigError: job.application: .*missing_job.py' does not exist",
    ):
        run_op(op)
    assert not [r for r in catalog.load_table("raw.playbacks").metadata.refs if r.startswith("kappa-")]
    assert not [k for k in catalog.load_table(TARGET).properties if k.startswith("kappa.backfill.lock.")]


def test_snapshot_refused_by_an_overlapping_backfill_fails_without_retry(job: Path, catalog: Any) -> None:
    first = run_op(KappaSnapshotOperator(task_id="snapshot", config_path=str(job)))
    assert [k for k in catalog.load_table(TARGET).properties if k.startswith("kappa.backfill.lock.")] == [
        f"kappa.backfill.lock.{first['backfill_id']}"
    ]
    overlapping = {**PARAMS, "start": at(2).isoformat(), "end": at(3, 30).isoformat()}
    with pytest.raises(
        AirflowFailException, match=rf"KappaConcurrencyError: .*locked by running backfill {first['backfill_id']}"
    ):
        run_op(KappaSnapshotOperator(task_id="snapshot", config_path=str(job)), overlapping)


def test_plan_returns_json_slices_and_checks_its_snapshot(job: Path) -> None:
    snap = run_op(KappaSnapshotOperator(task_id="snapshot", config_path=str(job)))
    slices = run_op(KappaPlanOperator(task_id="plan", config_path=str(job), snapshot=snap))
    assert json.loads(json.dumps(slices)) == slices
    assert [(s["slice_id"], s["read_start"], s["read_end"]) for s in slices] == [
        ("s0000", at(0, 30).isoformat(), at(1).isoformat()),
        ("s0001", at(1).isoformat(), at(2).isoformat()),
        ("s0002", at(2).isoformat(), at(3).isoformat()),
        ("s0003", at(3).isoformat(), at(3, 15).isoformat()),
    ]
    # hourly files of 6 rows (00:00..00:50 etc.): slices cutting a file get a share by time
    assert [s["stats"][0]["rows"] for s in slices] == [2, 6, 6, 2]
    other = {**snap, "backfill_id": "bf_other"}
    with pytest.raises(AirflowFailException, match="the snapshot is of backfill 'bf_other'"):
        run_op(KappaPlanOperator(task_id="plan", config_path=str(job), snapshot=other))
    with pytest.raises(AirflowFailException, match="snapshot must be the snapshot task's XCom"):
        run_op(KappaPlanOperator(task_id="plan", config_path=str(job), snapshot="not an xcom"))


def test_plan_refuses_a_window_outside_the_data(job: Path) -> None:
    params = {
        **PARAMS,
        "start": (at(0) - timedelta(hours=6)).isoformat(),
        "end": (at(0) - timedelta(hours=4)).isoformat(),
    }
    # a window before the data is refused by the snapshot task's pre-flight, before any lock or tag
    with pytest.raises(AirflowFailException, match="is outside the tables' data"):
        run_op(KappaSnapshotOperator(task_id="snapshot", config_path=str(job)), params)
    # so is a window after the data
    after = {**PARAMS, "start": at(10).isoformat(), "end": at(12).isoformat()}
    with pytest.raises(AirflowFailException, match="past the landed data.*is outside the tables' data"):
        run_op(KappaSnapshotOperator(task_id="snapshot", config_path=str(job)), after)


def test_mode_branch_follows_the_mode(job: Path) -> None:
    op = KappaModeBranchOperator(task_id="mode", config_path=str(job))
    assert op.choose_branch({"params": PARAMS}) == "slice_sequential"  # type: ignore[arg-type]
    assert op.choose_branch({"params": {**PARAMS, "mode": "parallel"}}) == "slice_parallel"  # type: ignore[arg-type]


@pytest.fixture()
def fake_spark(monkeypatch: pytest.MonkeyPatch) -> FakeSparkSubmit:
    fake = FakeSparkSubmit()
    monkeypatch.setattr(SparkSubmitHook, "submit", lambda hook, application="", **kw: fake(hook, application, **kw))
    return fake


def planned(job: Path, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    snap = run_op(KappaSnapshotOperator(task_id="snapshot", config_path=str(job)), params)
    return run_op(KappaPlanOperator(task_id="plan", config_path=str(job), snapshot=snap), params)  # type: ignore[no-any-return]


def slice_op(job: Path, sp: dict[str, Any]) -> KappaSliceRunOperator:
    return KappaSliceRunOperator(task_id="slice_sequential", config_path=str(job), slice_plan=sp)


def test_sequential_slices_share_a_checkpoint_kept_at_each_boundary(
    job: Path, catalog: Any, fake_spark: FakeSparkSubmit
) -> None:
    from airflow_provider_kappa.job.checkpoints import CheckpointStore

    slices = planned(job)
    bid = slices[0]["backfill_id"]
    root = job.parent / "checkpoints" / "playback_sessions" / "backfill" / bid
    store = CheckpointStore(str(root))

    def commits(slice_id: str) -> list[str]:
        """The commits in the checkpoint the slice's current attempt ran with (its own folder)."""
        folder = Path(store.attempt(slice_id, store.current_epoch(slice_id) or "")) / "sessions" / "commits"
        return sorted(p.read_text() for p in folder.iterdir())

    first = run_op(slice_op(job, slices[0]))
    assert (first["rows_read"], first["batches"], first["rows_written"], first["watermark"]) == (
        10,
        2,
        2,
        "2026-11-01T02:00:00.000Z",
    )
    assert fake_spark.calls[0]["conf"]["spark.kappa.checkpoint"] == store.attempt(
        "s0000", store.current_epoch("s0000") or ""
    )
    kept = store.kept_boundary("s0001")  # boundaries/s0001/<s0000's epoch>/, complete
    assert (
        kept == f"{root}/boundaries/s0001/{store.current_epoch('s0000')}" and (Path(kept) / "_KAPPA_BOUNDARY").exists()
    )
    run_op(slice_op(job, slices[1]))
    run_op(slice_op(job, slices[2]))
    assert commits("s0002") == ["s0000", "s0001", "s0002"]  # the state flowed slice to slice
    # clearing slice 1 reruns it from the checkpoint kept at its start, with its staging emptied
    staging = catalog.load_table(
        f"kappa_staging.{[t for t in catalog.list_tables('kappa_staging') if t[1].endswith('s0001')][0][1]}"
    )
    before = sorted_rows(staging)
    epoch = store.current_epoch("s0001")
    run_op(slice_op(job, slices[1]))
    assert store.current_epoch("s0001") != epoch  # a new attempt, on its own folder
    assert commits("s0001") == ["s0000", "s0001"]
    assert sorted_rows(catalog.load_table(".".join(staging.name()))) == before and len(before) == 1
    # the rerun of slice 1 rewrote the boundary of slice 2: slice 2 reruns from it
    run_op(slice_op(job, slices[2]))
    assert commits("s0002") == ["s0000", "s0001", "s0002"]


def test_a_sequential_slice_waits_for_the_one_before_and_fails_if_it_failed(
    job: Path, fake_spark: FakeSparkSubmit
) -> None:
    slices = planned(job)
    op = slice_op(job, slices[2])
    with pytest.raises(AirflowRescheduleException):
        run_op(op, ti=FakeTI(op.task_id, {"slice_sequential_1": "up_for_retry"}))
    with pytest.raises(AirflowFailException, match=r"slice s0001 \(map index 1\) is failed; clear it"):
        run_op(op, ti=FakeTI(op.task_id, {"slice_sequential_1": "failed"}))
    assert fake_spark.calls == []


def test_credentials_stay_in_the_0600_catalogs_file(
    job: Path, fake_spark: FakeSparkSubmit, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    slices = planned(job)
    xcom = run_op(slice_op(job, slices[0]))
    call = fake_spark.calls[0]
    assert PLANTED_SECRET in call["catalogs"] and call["catalogs_mode"] == 0o600
    assert call["properties_mode"] == 0o600
    assert PLANTED_SECRET not in call["properties"]
    assert PLANTED_SECRET not in call["command"] and "--properties-file" in call["command"]
    assert PLANTED_SECRET not in json.dumps(slices) + json.dumps(xcom)
    assert PLANTED_SECRET not in caplog.text
    assert not Path(call["catalogs_file"]).exists()  # the private folder is removed after the run


def test_parallel_slices_get_fresh_own_checkpoints(job: Path, fake_spark: FakeSparkSubmit) -> None:
    params = {**PARAMS, "mode": "parallel"}
    slices = planned(job, params)
    assert [(s["owns_start"], s["owns_end"]) for s in slices] == [
        (at(1).isoformat(), at(2).isoformat()),
        (at(2).isoformat(), at(3).isoformat()),
    ]
    op = KappaSliceRunOperator(task_id="slice_parallel", config_path=str(job), slice_plan=slices[1])
    run_op(op, params)
    run_op(op, params)
    first, own = (Path(c["conf"]["spark.kappa.checkpoint"]) for c in fake_spark.calls)
    assert (
        own.parent.name == "s0001" and own.parent.parent.name == "attempts" and own != first
    )  # a fresh folder per attempt
    assert [p.read_text() for p in (own / "sessions" / "commits").iterdir()] == ["s0001"]  # nothing of the first run
    assert not first.exists()  # the older attempt's folder is removed when the rerun succeeds
    assert fake_spark.calls[1]["conf"]["spark.kappa.read.start"] == at(1, 30).isoformat()


def test_a_failed_spark_submit_is_retryable_and_leaves_no_done_record(
    job: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeSparkSubmit(fail=True)
    monkeypatch.setattr(SparkSubmitHook, "submit", lambda hook, application="", **kw: fake(hook, application, **kw))
    slices = planned(job)
    with pytest.raises(AirflowException) as err:
        run_op(slice_op(job, slices[0]))
    assert not isinstance(err.value, AirflowFailException)
    done = job.parent / "checkpoints" / "playback_sessions" / "backfill" / slices[0]["backfill_id"] / "done"
    assert not (done / "s0000.json").exists()


def test_validate_gates_and_publish_replaces_the_window(job: Path, catalog: Any, fake_spark: FakeSparkSubmit) -> None:
    import pyarrow as pa

    target = catalog.load_table(TARGET)
    outside = {
        "account_id": 5,
        "session_start": at(0, 5),
        "session_end": at(0, 10),
        "plays": 1,
        "last_play_ts": at(0, 5),
    }
    bad = {"account_id": 6, "session_start": at(1, 5), "session_end": at(1, 10), "plays": 9, "last_play_ts": at(1, 5)}
    target.append(pa.Table.from_pylist([outside, bad], schema=sessions_arrow()))
    slices = planned(job)
    for sp in slices:
        run_op(slice_op(job, sp))
    strict = {**PARAMS, "min_match": 100}
    with pytest.raises(AirflowFailException, match=r"match rate 0.000% is below min_match 100"):
        run_op(KappaValidateOperator(task_id="validate", config_path=str(job), plan=slices), strict)
    report = run_op(KappaValidateOperator(task_id="validate", config_path=str(job), plan=slices))
    assert (report["sessions"]["staged_rows"], report["sessions"]["target_rows"]) == (2, 1)
    dry = {**PARAMS, "dry_run": True}
    asset = target_asset("lake", TARGET)
    for skipped in (dry, {**PARAMS, "publish": False}):
        events = OutletEventAccessors()
        with pytest.raises(AirflowSkipException, match="dry_run is on|publish is off"):
            run_op(publish_op(job, slices, report), skipped, outlet_events=events)
        assert not events._dict  # type: ignore[attr-defined]  # no asset event extra: nothing published
    assert len(sorted_rows(catalog.load_table(TARGET))) == 2
    events = OutletEventAccessors()
    result = run_op(publish_op(job, slices, report), outlet_events=events)
    assert (result["sessions"]["rows_deleted"], result["sessions"]["rows_added"]) == (1, 2)
    assert events[asset].extra == {
        "backfill_id": slices[0]["backfill_id"],
        "job": "playback_sessions",
        "sink": "sessions",
        "table": TARGET,
        "start": PARAMS["start"],
        "end": PARAMS["end"],
        "snapshot_id": catalog.load_table(TARGET).current_snapshot().snapshot_id,
    }
    rows = sorted_rows(catalog.load_table(TARGET))
    assert sorted(r[1] for r in rows if r[0] == 1) == [at(1), at(2)]
    assert tuple(outside.values()) in rows and tuple(bad.values()) not in rows


def test_publish_refuses_while_a_slice_has_not_completed(job: Path, fake_spark: FakeSparkSubmit) -> None:
    slices = planned(job)
    for sp in slices[:2]:
        run_op(slice_op(job, sp))
    report = {"sessions": {}}
    with pytest.raises(AirflowFailException, match=r"slice\(s\) \['s0002', 's0003'\] have not completed"):
        run_op(KappaPublishOperator(task_id="publish", config_path=str(job), plan=slices, report=report))


def test_template_fields_render(job: Path) -> None:
    op = KappaSliceRunOperator(
        task_id="slice",
        config_path="{{ params.folder }}/kappa.yaml",
        slice_plan={"slice_id": "{{ params.sid }}"},
        backfill_params={"start": "{{ params.start }}", "end": "{{ params.end }}"},
        spark_conn_id="{{ params.conn }}",
    )
    assert op.config_path == "{{ params.folder }}/kappa.yaml"  # assigned verbatim, rendered at run time
    op.render_template_fields(
        {
            "params": {
                "folder": str(job.parent),
                "sid": "s0001",
                "start": PARAMS["start"],
                "end": PARAMS["end"],
                "conn": "spark_x",
            }
        }  # type: ignore[arg-type]
    )
    assert op.config_path == str(job)
    assert op.slice_plan == {"slice_id": "s0001"}
    assert op.backfill_params == {"start": PARAMS["start"], "end": PARAMS["end"]}
    assert op.spark_conn_id == "spark_x"
    for cls in (KappaSnapshotOperator, KappaPlanOperator, KappaValidateOperator, KappaPublishOperator):
        assert {"config_path", "backfill_params"} <= set(cls.template_fields)


def test_progress_is_summed_from_spark_event_log_records(tmp_path: Path) -> None:
    """Records as Spark 4 writes them to the event log (trimmed from a real slice run)."""
    from airflow_provider_kappa.engine.progress import read_progress, summarize

    def record(batch: int, rows: int, out: int, watermark: str, ms: int) -> dict[str, Any]:
        return {
            "batchDuration": ms,
            "batchId": batch,
            "name": "kappa_playback_sessions_sessions",
            "eventTime": {"max": "2026-11-01T00:39:59.000Z", "watermark": watermark},
            "sink": {"description": "PythonTable", "numOutputRows": out},
            "sources": [
                {
                    "description": "PythonMicroBatchStreamWithTriggerAvailableNow",
                    "numInputRows": rows,
                    "endOffset": '{"pos": 1793493900000000}',
                }
            ],
            "stateOperators": [{"operatorName": "sessionWindowStateStoreSaveExec", "numRowsTotal": rows * 2}],
        }

    log = tmp_path / "local-1795643662784"
    lines = [
        json.dumps({"Event": "SparkListenerApplicationStart", "App Name": "x"}),
        json.dumps({"Event": PROGRESS_EVENT, "progress": record(0, 2, 0, "1970-01-01T00:00:00.000Z", 63612)}),
        json.dumps({"Event": PROGRESS_EVENT, "progress": record(1, 4, 3, "2026-11-01T00:29:59.000Z", 5487)}),
        '{"Event": "org.apache.spark.sql.streaming.StreamingQueryListener$QueryProgressEvent", "progress": {"batchI',
    ]
    log.write_text("\n".join(lines) + "\n")
    metrics = summarize(read_progress(tmp_path), 80.0)
    assert (metrics.rows_read, metrics.rows_written, metrics.batches) == (6, 3, 2)
    assert metrics.watermark == "2026-11-01T00:29:59.000Z" and metrics.batch_seconds == 69.099
    assert metrics.queries == ["kappa_playback_sessions_sessions"] and metrics.peak_state_rows == 8
    assert "rows read 6, rows to sink 3, micro-batches 2" in metrics.to_text()


def test_a_run_with_a_data_interval_and_no_start_or_end_backfills_its_interval(job: Path) -> None:
    """A scheduled run (or an Airflow backfill) leaves start and end empty: every step takes the
    run's data interval, and the backfill is the one explicit start and end give (same id)."""
    import pendulum

    explicit = run_op(KappaSnapshotOperator(task_id="snapshot", config_path=str(job)))
    interval = {"data_interval_start": pendulum.instance(at(1)), "data_interval_end": pendulum.instance(at(3))}
    empty = {**PARAMS, "start": None, "end": None}
    scheduled = run_op(KappaSnapshotOperator(task_id="snapshot", config_path=str(job)), empty, **interval)
    assert scheduled == explicit and scheduled["params"]["start"] == PARAMS["start"]
    slices = run_op(KappaPlanOperator(task_id="plan", config_path=str(job), snapshot=scheduled), empty, **interval)
    assert {s["backfill_id"] for s in slices} == {explicit["backfill_id"]}
    # given start and end win over the interval
    other = {"data_interval_start": pendulum.instance(at(0)), "data_interval_end": pendulum.instance(at(4))}
    assert run_op(KappaSnapshotOperator(task_id="snapshot", config_path=str(job)), PARAMS, **other) == explicit


def test_a_manual_run_without_start_end_or_data_interval_fails_saying_what_to_give(job: Path) -> None:
    import pendulum

    empty = {**PARAMS, "start": "", "end": ""}
    point = {"data_interval_start": pendulum.instance(at(1)), "data_interval_end": pendulum.instance(at(1))}
    for context in ({}, point):  # no interval (schedule=None), or an empty one (a trigger timetable)
        with pytest.raises(AirflowFailException, match="start and end are empty and this run has no data interval"):
            run_op(KappaSnapshotOperator(task_id="snapshot", config_path=str(job)), empty, **context)
    assert not (job.parent / "checkpoints").exists()
