"""OpenLineage of a backfill, through the OpenLineage provider's real listener and file transport.

A child process runs ``dag.test()`` of a backfill DAG built by ``kappa_backfill_dag`` with
OpenLineage configured only by its environment (a file transport): the provider's plugin
registers its listener, which asks each operator for its lineage when the task completes and
writes the events to a file. Only the spark-submit process is replaced, by the stand-in of
tests/integration/test_operators.py (it plays the job's part from the properties file a real
Spark run receives, so the test sees the Spark conf each slice got).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import airflow_env  # noqa: F401  (sets AIRFLOW_HOME before Airflow is imported)
import pyarrow as pa
from airflow_env import PLANTED_SECRET, REPO, airflow_db, write_job_config  # noqa: F401  (fixture)
from lake import T0, append_events, create_events_table, create_sessions_table, event, sessions_arrow

SOURCE, TARGET = "raw.playbacks", "prod.playback_sessions"
DAG_ID = "kappa_lineage_playback_sessions"
NAMESPACE = "kappa-lineage-test"
PARAMS = {
    "start": (T0 + timedelta(hours=1)).isoformat(),
    "end": (T0 + timedelta(hours=3)).isoformat(),
    "slice": "1h",
    "warmup": "0s",
    "tail": "0s",
    "mode": "parallel",  # slices at once: a sequential slice waits for the one before by rescheduling
}

#: The child: the stand-in replaces the spark-submit process, then the DAG runs under dag.test().
RUN_DAG = """
import json, sys
from pathlib import Path
import airflow  # first: the environment given by the test is the Airflow it uses
sys.path[:0] = [{tests!r}, {integration!r}]
from test_operators import FakeSparkSubmit
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
import runpy

fake = FakeSparkSubmit()
SparkSubmitHook.submit = lambda hook, application="", **kw: fake(hook, application, **kw)
dag = runpy.run_path({dag_file!r})["dag"]
run = dag.test(run_conf={params!r})
states = {{ti.task_id + ("" if ti.map_index < 0 else f"[{{ti.map_index}}]"): ti.state for ti in run.get_task_instances()}}
Path({out!r}).write_text(json.dumps({{"state": run.state, "tasks": states, "confs": [c["conf"] for c in fake.calls]}}))
"""

#: The DAG file (dag.test() finds the DAG in the DAGs folder it is given).
DAG_FILE = """
from airflow_provider_kappa.dag import kappa_backfill_dag

dag = kappa_backfill_dag({config!r}, dag_id={dag_id!r})
"""


def run_backfill_dag(tmp_path: Path, config: Path) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    """Run the DAG in a child with OpenLineage's file transport; the run's summary, the events and
    the child's output."""
    events, out, script = tmp_path / "openlineage.jsonl", tmp_path / "run.json", tmp_path / "run_dag.py"
    tests, dags = REPO / "tests", tmp_path / "dags"
    dags.mkdir()
    dag_file = dags / "kappa_lineage_dag.py"
    dag_file.write_text(DAG_FILE.format(config=str(config), dag_id=DAG_ID))
    script.write_text(
        RUN_DAG.format(
            tests=str(tests),
            integration=str(tests / "integration"),
            dag_file=str(dag_file),
            params=PARAMS,
            out=str(out),
        )
    )
    env = {
        **os.environ,
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": str(events), "append": True}),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": NAMESPACE,
    }
    proc = subprocess.run(
        [sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 and out.exists(), output[-5000:]
    lines = events.read_text().splitlines() if events.exists() else []
    return json.loads(out.read_text()), [json.loads(line) for line in lines], output


def completed(events: list[dict[str, Any]], task: str) -> list[dict[str, Any]]:
    """The COMPLETE events of one task's job (``<dag_id>.<task_id>``)."""
    return [e for e in events if e["eventType"] == "COMPLETE" and e["job"]["name"] == f"{DAG_ID}.{task}"]


def table_of(dataset: dict[str, Any]) -> str:
    """The catalog's name of the table of a dataset (its ``symlinks`` facet)."""
    (identifier,) = dataset["facets"]["symlinks"]["identifiers"]
    assert identifier["type"] == "TABLE"
    return str(identifier["name"])


def test_a_backfill_reports_its_tables_at_their_snapshots_and_parents_its_spark_runs(
    tmp_path: Path,
    catalog: Any,
    catalog_props: dict[str, str],
    lake_dir: Path,
    airflow_db: None,  # noqa: F811
) -> None:
    raw = create_events_table(catalog, SOURCE)
    append_events(raw, [event(i, T0 + timedelta(minutes=10 * i), account=1 + i % 2) for i in range(24)])
    wrong = {"account_id": 9, "session_start": T0 + timedelta(hours=1, minutes=5), "plays": 7}
    create_sessions_table(catalog, TARGET).append(
        pa.Table.from_pylist(
            [{**wrong, "session_end": wrong["session_start"], "last_play_ts": wrong["session_start"]}],
            schema=sessions_arrow(),
        )
    )  # a wrong row in the window: publish replaces it (a commit on the target)
    # engine submit: the stand-in of test_operators replaces the spark-submit process
    config = write_job_config(
        tmp_path, catalog_props, engine="submit", extra_catalog_props={"s3.secret-access-key": PLANTED_SECRET}
    )

    run, events, output = run_backfill_dag(tmp_path, config)
    assert run["state"] == "success", (run, output[-5000:])
    assert events, f"no OpenLineage event was written\n{output[-5000:]}"
    assert PLANTED_SECRET not in json.dumps(events)

    source = catalog.load_table(SOURCE)
    (tag,) = [name for name in source.refs() if name.startswith("kappa-")]  # the tag pinning its snapshot
    pinned = source.refs()[tag].snapshot_id
    expected_input = {
        "namespace": "file",
        "name": source.location().removeprefix("file://"),
        "table": SOURCE,
        "version": str(pinned),
    }

    def summary(dataset: dict[str, Any]) -> dict[str, Any]:
        version = dataset["facets"].get("version", {}).get("datasetVersion")
        return {
            "namespace": dataset["namespace"],
            "name": dataset["name"],
            "table": table_of(dataset),
            "version": version,
        }

    # snapshot: the source at the snapshot it pinned (and tagged)
    (snap,) = completed(events, "snapshot")
    assert [summary(d) for d in snap["inputs"]] == [expected_input] and snap["outputs"] == []
    facets = snap["inputs"][0]["facets"]
    assert facets["catalog"]["framework"] == "iceberg" and facets["catalog"]["name"] == "lake"
    assert facets["catalog"]["type"] == "sql" and facets["storage"]["storageLayer"] == "iceberg"
    assert facets["symlinks"]["identifiers"][0]["namespace"] == catalog_props["uri"]
    assert "ingestion_ts" in [f["name"] for f in facets["schema"]["fields"]]

    # slices: the source at the pinned snapshot in, the slice's staging table out; the Spark
    # conf of each slice names that slice task's run as its parent job
    slices = completed(events, "slice_parallel")
    slice_tasks = [t for t, state in run["tasks"].items() if t.startswith("slice_parallel[") and state == "success"]
    assert len(slices) == len(run["confs"]) == len(slice_tasks) >= 2, (run["tasks"], [e["job"]["name"] for e in events])
    parent_runs = {c["spark.openlineage.parentRunId"]: c for c in run["confs"]}
    for ev in slices:
        assert [summary(d) for d in ev["inputs"]] == [expected_input]
        (staged,) = ev["outputs"]
        assert table_of(staged).startswith("kappa_staging.") and staged["namespace"] == "file"
        conf = parent_runs[ev["run"]["runId"]]  # this slice task's run is its Spark run's parent
        assert conf["spark.openlineage.parentJobName"] == f"{DAG_ID}.slice_parallel"
        assert conf["spark.openlineage.parentJobNamespace"] == NAMESPACE
        assert conf["spark.openlineage.rootParentJobName"] == DAG_ID
        assert table_of(staged).endswith(conf["spark.kappa.sink.sessions.slice"])

    # publish: the source at the pinned snapshot in, the target at the snapshot it committed out
    (pub,) = completed(events, "publish")
    target = catalog.load_table(TARGET)
    assert [summary(d) for d in pub["inputs"]] == [expected_input]
    assert [summary(d) for d in pub["outputs"]] == [
        {
            "namespace": "file",
            "name": target.location().removeprefix("file://"),
            "table": TARGET,
            "version": str(target.current_snapshot().snapshot_id),
        },
    ]
