"""A real Airflow 3 deployment (api-server + scheduler + dag-processor on 127.0.0.1), driven over REST.

The deployment serves the repo's example DAGs (copied into the test's dags folder, with
``KAPPA_LAKE`` pointing at a tiny lake seeded with an incident), the same example job as a
second DAG whose catalog is an Airflow connection created through REST, and a probe DAG:

- a real backfill of the connection DAG triggered through the public API with a conf succeeds,
  and the published table holds exactly the correct rows;
- a completed slice cleared through the API (with its downstream validate and publish) reruns,
  and the table is still exactly the correct rows; the whole backfill run again with the same
  parameters, through the example DAG ``kappa_backfill_playback_sessions`` (same job, same lake,
  same backfill id), leaves exactly the correct rows too;
- a secret planted in the connection reaches the 0600 catalogs file of every slice run and
  nothing else: not the task logs (files and REST), XCom, the command lines or environments
  of the processes the tasks started (sampled from ``/proc`` while the slices ran), nor
  spark-submit's 0600 properties file;
- confs violating the backfill DAG's Params schema are refused by the API with the reason,
  and create no run; end before start passes the schema but fails the first task, writing nothing;
- the probe DAG proves the harness itself: conf, task logs and XCom through the API, and a
  connection given as ``AIRFLOW_CONN_*`` reaching a task with its password masked in the log.
"""

from __future__ import annotations

import json
import secrets
import shutil
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lake import INCIDENT_END, INCIDENT_START, seed_sessions_incident, sessions_arrow, sorted_rows
from paths import EXAMPLES, REPO
from servers import wait_until
from servers.airflow_server import AirflowClient, AirflowDeployment, airflow_deployment, connection_env
from servers.postgres import PostgresServer, postgres  # noqa: F401  (module-scoped cluster: the metadata DB)
from servers.processes import ProcessWatch, listening_ports

EXAMPLE = EXAMPLES / "playback_sessions"
BACKFILL_DAG = "kappa_backfill_playback_sessions"
TARGET = "prod.playback_sessions"

#: The example job again, its catalog ``lake`` given as an Airflow connection created through REST.
CONN_DAG = "kappa_backfill_playback_sessions_conn"
CONN_ID = "kappa_lake_conn"
#: Planted in the connection's catalog properties: it may reach only the 0600 catalogs file.
PLANTED = f"kappa-planted-{secrets.token_hex(8)}"
SLICE = ("slice_sequential", 0)

# One aligned slice, [00:00, 04:00) = [start - warmup, end + tail), read in at most four
# micro-batches: the least Spark work that still backfills the whole incident. The tail
# closes every session of the window (playbacks go on until 03:50, see lake.py).
CONF = {
    "start": INCIDENT_START.isoformat(),
    "end": INCIDENT_END.isoformat(),
    "slice": "4h",
    "warmup": "1h",
    "tail": "1h",
    "max_misalignment_threshold": "1h",
}

#: Downstream of the backfills' target (dags/playback_sessions_downstream.py, scheduled on its asset).
DOWNSTREAM_DAG = "playback_sessions_downstream"
#: The example job as an hourly scheduled repair, ending with the lake's data (no run after it).
REPAIR_DAG = "kappa_repair_playback_sessions_hourly"
REPAIR_DAG_FILE = textwrap.dedent(
    f"""
    from datetime import datetime, timedelta, timezone
    from airflow_provider_kappa.dag import kappa_backfill_dag

    dag = kappa_backfill_dag(
        {str(EXAMPLE / "kappa.yaml")!r},
        dag_id={REPAIR_DAG!r},
        schedule=timedelta(hours=1),
        start_date=datetime(2026, 11, 1, tzinfo=timezone.utc),
        end_date=datetime(2026, 11, 1, 3, tzinfo=timezone.utc),
        catchup=False,
    )
    """
)

DAG_ID = "kappa_deploy_probe"
SECRET = "s3cr3t-Planted-9f2c"

PROBE_DAG = textwrap.dedent(
    f"""
    import pendulum
    from airflow.sdk import DAG, Param, task

    with DAG(
        {DAG_ID!r},
        schedule=None,
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        catchup=False,
        params={{
            "start": Param("2026-11-01T00:00:00+00:00", type="string", format="date-time"),
            "slices": Param(2, type="integer", minimum=1, maximum=24),
            "mode": Param("sequential", type="string", enum=["sequential", "parallel"]),
        }},
    ) as dag:

        @task
        def echo(params=None):
            print("probe params:", dict(params))
            return {{"mode": params["mode"], "slices": params["slices"] * 10}}

        @task
        def read_connection():
            from airflow.sdk import BaseHook

            conn = BaseHook.get_connection("kappa_probe_conn")
            print("connection password:", conn.password)
            return conn.host

        echo() >> read_connection()
    """
)


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``KAPPA_LAKE`` of the example jobs: a sqlite catalog named ``lake`` with the sessions incident."""
    from pyiceberg.catalog import load_catalog

    folder = tmp_path_factory.mktemp("lake")
    (folder / "warehouse").mkdir()
    catalog = load_catalog(
        "lake", type="sql", uri=f"sqlite:///{folder}/catalog.db", warehouse=f"file://{folder}/warehouse"
    )
    expected = seed_sessions_incident(catalog, "raw.playbacks", TARGET)
    return {"dir": folder, "catalog": catalog, "expected": expected}


@pytest.fixture(scope="module")
def airflow(
    tmp_path_factory: pytest.TempPathFactory,
    lake: dict[str, Any],
    postgres: PostgresServer,  # noqa: F811
) -> Iterator[AirflowDeployment]:
    """One Airflow deployment for the module: the example DAGs, the probe DAG, one env connection;
    its metadata DB on PostgreSQL, as a production deployment's (on sqlite, the scheduler and the
    API server writing at once failed CI twice: a 503 "database is locked" on a backfill POST, and
    the scheduler's loop ending on a StaleDataError of a dag_run update)."""
    root = tmp_path_factory.mktemp("airflow")
    dags = root / "dags"
    dags.mkdir()
    for example in sorted((REPO / "dags").glob("*.py")):
        shutil.copy(example, dags / example.name)
    (dags / "kappa_deploy_probe.py").write_text(PROBE_DAG)
    (dags / "kappa_repair_hourly.py").write_text(REPAIR_DAG_FILE)
    conn_config = conn_job_config(root / "conn-job")
    (dags / "playback_sessions_conn_backfill.py").write_text(
        "from airflow_provider_kappa.dag import kappa_backfill_dag\n"
        f"dag = kappa_backfill_dag({str(conn_config)!r}, dag_id={CONN_DAG!r})\n"
    )
    env = {
        **connection_env("kappa_probe_conn", f"iceberg://probe-user:{SECRET}@catalog.internal:8181/"),
        "KAPPA_LAKE": str(lake["dir"]),
        "PYTHONDONTWRITEBYTECODE": "1",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": postgres.create_database("airflow"),
    }
    t0 = time.monotonic()
    with airflow_deployment(root / "home", dags, extra_env=env) as deployment:
        print(f"airflow started in {time.monotonic() - t0:.1f}s {deployment.timings}")
        yield deployment


def conn_job_config(folder: Path) -> Path:
    """The example job's kappa.yaml with catalog ``lake`` as ``{conn_id: kappa_lake_conn}``; the rest
    (job name, checkpoint root under ``KAPPA_LAKE``, tables) as in the example: the same backfill."""
    raw = yaml.safe_load((EXAMPLE / "kappa.yaml").read_text())
    raw["job"]["application"] = str(EXAMPLE / "playback_sessions.py")
    raw["catalogs"] = {"lake": {"conn_id": CONN_ID}}
    # this DAG runs its slices with spark-submit (the secret test reads spark-submit's properties
    # file and command lines); the example DAG (engine connect, the default) runs the same backfill
    raw["job"]["engine"] = "submit"
    folder.mkdir(parents=True)
    path = folder / "kappa.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def client(airflow: AirflowDeployment, lake: dict[str, Any]) -> AirflowClient:
    """A logged-in REST client; the Iceberg connection created; the DAGs parsed and unpaused."""
    c = airflow.client()
    folder = lake["dir"]
    # The sqlite SqlCatalog ignores the extra property; the IcebergHook passes it on like any other.
    extra = {
        "type": "sql",
        "uri": f"sqlite:///{folder}/catalog.db",
        "warehouse": f"file://{folder}/warehouse",
        "credential": PLANTED,
    }
    c.create_connection(CONN_ID, "iceberg", extra=json.dumps(extra))
    for dag_id in (DAG_ID, BACKFILL_DAG, CONN_DAG, DOWNSTREAM_DAG):
        c.wait_for_dag(dag_id, timeout=120)
        c.unpause(dag_id)
    return c


def target_rows(lake: dict[str, Any]) -> list[tuple[Any, ...]]:
    return sorted_rows(lake["catalog"].load_table(TARGET))


def expected_rows(lake: dict[str, Any]) -> list[tuple[Any, ...]]:
    import pyarrow as pa

    return sorted_rows(pa.Table.from_pylist(lake["expected"], schema=sessions_arrow()))


def states_of(client: AirflowClient, dag_id: str, run_id: str) -> dict[tuple[str, int], dict[str, Any]]:
    return {(t["task_id"], t["map_index"]): t for t in client.task_instances(dag_id, run_id)}


def require_success(client: AirflowClient, dag_id: str, run_id: str, done: dict[str, Any]) -> None:
    """Fail with the failed tasks' log tails unless the run succeeded."""
    if done["state"] == "success":
        return
    tis = client.task_instances(dag_id, run_id)
    failed = [t for t in tis if t["state"] == "failed"]
    logs = "\n".join(
        client.task_log(dag_id, run_id, t["task_id"], t["try_number"], t["map_index"])[-4000:] for t in failed
    )
    pytest.fail(
        f"run {run_id} of {dag_id} {done['state']}: {sorted((t['task_id'], t['map_index'], t['state']) for t in tis)}\n{logs}"
    )


@pytest.fixture(scope="module")
def conn_run(client: AirflowClient, airflow: AirflowDeployment, lake: dict[str, Any]) -> dict[str, Any]:
    """The backfill of the connection DAG, triggered through REST, its processes watched from /proc."""
    before = target_rows(lake)
    t0 = time.monotonic()
    with ProcessWatch([s.pid for s in airflow.servers]) as watch:
        run = client.trigger(CONN_DAG, conf=CONF)
        done = client.wait_for_run(CONN_DAG, run["dag_run_id"], timeout=600, interval=2)
    elapsed = time.monotonic() - t0
    print(f"connection-catalog backfill run {done['state']} in {elapsed:.1f}s ({watch.samples} process samples)")
    return {"run_id": run["dag_run_id"], "done": done, "before": before, "watch": watch}


def test_backfill_with_the_catalog_from_a_connection_publishes_exactly_the_correct_window(
    client: AirflowClient, lake: dict[str, Any], conn_run: dict[str, Any]
) -> None:
    assert conn_run["before"] != expected_rows(lake), "the seeded incident must differ from the correct rows"
    require_success(client, CONN_DAG, conn_run["run_id"], conn_run["done"])
    states = sorted((k[0], k[1], t["state"]) for k, t in states_of(client, CONN_DAG, conn_run["run_id"]).items())
    assert [s for s in states if s[0] == "slice_sequential"] == [("slice_sequential", 0, "success")], states
    assert all(s[2] == "skipped" for s in states if s[0] == "slice_parallel"), states
    assert ("publish", -1, "success") in states, states
    assert target_rows(lake) == expected_rows(lake)


@pytest.fixture(scope="module")
def cleared(
    client: AirflowClient, airflow: AirflowDeployment, lake: dict[str, Any], conn_run: dict[str, Any]
) -> dict[str, Any]:
    """The completed slice of :func:`conn_run` cleared through REST with its downstream tasks, rerun by the scheduler."""
    require_success(client, CONN_DAG, conn_run["run_id"], conn_run["done"])
    run_id = conn_run["run_id"]
    tries = {k: t["try_number"] for k, t in states_of(client, CONN_DAG, run_id).items()}
    snapshot = lake["catalog"].load_table(TARGET).current_snapshot().snapshot_id
    t0 = time.monotonic()
    with ProcessWatch([s.pid for s in airflow.servers]) as watch:
        cleared = client.clear_task_instances(CONN_DAG, run_id, [SLICE], include_downstream=True)

        def rerun_done() -> dict[str, Any] | None:
            run = client.get_run(CONN_DAG, run_id)
            ti = states_of(client, CONN_DAG, run_id)[SLICE]
            rerun = ti["try_number"] > tries[SLICE]
            return run if rerun and run["state"] in ("success", "failed") else None

        done = wait_until(
            rerun_done, timeout=600, what=f"cleared slice of {run_id} to rerun", servers=airflow.servers, interval=2
        )
    print(f"cleared slice and downstream rerun {done['state']} in {time.monotonic() - t0:.1f}s")
    return {"cleared": cleared, "tries": tries, "snapshot": snapshot, "done": done, "watch": watch}


def test_a_cleared_slice_reruns_and_the_table_stays_exactly_correct(
    client: AirflowClient, lake: dict[str, Any], conn_run: dict[str, Any], cleared: dict[str, Any]
) -> None:
    run_id = conn_run["run_id"]
    assert sorted((t["task_id"], t["map_index"]) for t in cleared["cleared"]) == [
        ("cleanup", -1),
        ("publish", -1),
        ("slice_sequential", 0),
        ("validate", -1),
    ], cleared["cleared"]
    require_success(client, CONN_DAG, run_id, cleared["done"])
    after = states_of(client, CONN_DAG, run_id)
    for key in (SLICE, ("validate", -1), ("publish", -1)):
        assert (after[key]["state"], after[key]["try_number"]) == ("success", cleared["tries"][key] + 1), after[key]
    assert after[("snapshot", -1)]["try_number"] == cleared["tries"][("snapshot", -1)], "upstream tasks must not rerun"
    table = lake["catalog"].load_table(TARGET)
    assert table.current_snapshot().snapshot_id != cleared["snapshot"], "the rerun publish must commit again"
    assert sorted_rows(table) == expected_rows(lake)


def test_the_whole_backfill_rerun_with_the_same_params_through_the_example_dag_stays_exactly_correct(
    client: AirflowClient, lake: dict[str, Any], cleared: dict[str, Any]
) -> None:
    snapshot = lake["catalog"].load_table(TARGET).current_snapshot().snapshot_id
    t0 = time.monotonic()
    run = client.trigger(BACKFILL_DAG, conf=CONF)
    done = client.wait_for_run(BACKFILL_DAG, run["dag_run_id"], timeout=600, interval=2)
    print(f"example DAG rerun of the same backfill {done['state']} in {time.monotonic() - t0:.1f}s")
    require_success(client, BACKFILL_DAG, run["dag_run_id"], done)
    xcom = client.xcom_entries(BACKFILL_DAG, run["dag_run_id"], "snapshot")[0]["value"]
    first = client.xcom_entries(CONN_DAG, cleared["done"]["dag_run_id"], "snapshot")[0]["value"]
    assert xcom["backfill_id"] == first["backfill_id"] and xcom["snapshot_ids"] == first["snapshot_ids"], (xcom, first)
    table = lake["catalog"].load_table(TARGET)
    assert table.current_snapshot().snapshot_id != snapshot, "the rerun must publish again"
    assert sorted_rows(table) == expected_rows(lake)


def test_the_planted_secret_reaches_only_the_catalogs_file(
    client: AirflowClient, airflow: AirflowDeployment, conn_run: dict[str, Any], cleared: dict[str, Any]
) -> None:
    secret = PLANTED.encode()
    watches: list[ProcessWatch] = [conn_run["watch"], cleared["watch"]]
    # It was used: each slice run (the first and the cleared rerun) wrote it to its own catalogs file, 0600.
    seen = [f for w in watches for f in w.files.values()]
    catalogs = [f for f in seen if f.path.endswith("/catalogs.json")]
    properties = [f for f in seen if f.path.endswith("/spark.properties")]
    assert len(catalogs) == 2 and len(properties) == 2, [f.path for f in seen]
    assert all(f.mode == 0o600 and secret in f.content for f in catalogs), [(f.path, oct(f.mode)) for f in catalogs]
    # ... and nowhere else: spark-submit's properties file (0600) names the catalogs file only.
    for f in properties:
        assert f.mode == 0o600, (f.path, oct(f.mode))
        assert secret not in f.content and b"spark.kappa.catalogs.file" in f.content, f.content.decode()
    assert not [f.path for f in seen if Path(f.path).exists()], "the private folder must be removed after the slice"
    # Command lines and environments of every process the deployment started while the slices ran.
    commands = [c for w in watches for c in w.command_lines()]
    assert any("org.apache.spark.deploy.SparkSubmit" in c and "playback_sessions.py" in c for c in commands), commands
    assert any(c.endswith("playback_sessions.py") and "python" in c for c in commands), (
        "the job's Python driver was not seen"
    )
    assert [c for c in commands if PLANTED in c] == []
    assert [pid for w in watches for pid, env in w.environs if secret in env] == []
    # Task logs: every file under the log folder, and the component logs.
    files = [p for p in [*airflow.log_folder.rglob("*"), *(airflow.home / "component-logs").rglob("*")] if p.is_file()]
    assert len(files) > 10, files
    assert [str(p) for p in files if secret in p.read_bytes()] == []
    # Logs and XCom served by the REST API, every try of every task of the run.
    run_id = conn_run["run_id"]
    texts, xcoms = [], []
    for (task_id, map_index), ti in states_of(client, CONN_DAG, run_id).items():
        if ti["state"] == "skipped":  # the branch not taken never ran: no log, no XCom
            continue
        for try_number in range(1, ti["try_number"] + 1):
            texts.append(client.task_log(CONN_DAG, run_id, task_id, try_number, map_index))
        xcoms.extend(client.xcom_entries(CONN_DAG, run_id, task_id, map_index))
    slice_log = "\n".join(texts)
    assert "Spark-Submit cmd:" in slice_log and "--properties-file" in slice_log, "the slice log must show the command"
    assert PLANTED not in slice_log
    assert {x["task_id"] for x in xcoms} >= {"snapshot", "plan", "slice_sequential", "validate", "publish"}, xcoms
    assert PLANTED not in json.dumps(xcoms, default=str)


def test_trigger_with_conf_runs_to_success(client: AirflowClient, airflow: AirflowDeployment) -> None:
    t0 = time.monotonic()
    run = client.trigger(DAG_ID, conf={"slices": 3, "mode": "parallel"})
    assert run["conf"] == {"slices": 3, "mode": "parallel"}
    done = client.wait_for_run(DAG_ID, run["dag_run_id"], timeout=150)
    print(f"run finished in {time.monotonic() - t0:.1f}s")
    assert done["state"] == "success", airflow.describe()
    states = {t["task_id"]: t["state"] for t in client.task_instances(DAG_ID, run["dag_run_id"])}
    assert states == {"echo": "success", "read_connection": "success"}
    log = client.task_log(DAG_ID, run["dag_run_id"], "echo")
    assert "probe params: {'start': '2026-11-01T00:00:00+00:00', 'slices': 3, 'mode': 'parallel'}" in log, log[-3000:]
    [xcom] = client.xcom_entries(DAG_ID, run["dag_run_id"], "echo")
    assert (xcom["key"], xcom["value"]) == ("return_value", {"mode": "parallel", "slices": 30})
    # The connection given as AIRFLOW_CONN_* reached the task; its password is masked in the log.
    [host] = client.xcom_entries(DAG_ID, run["dag_run_id"], "read_connection")
    assert host["value"] == "catalog.internal"
    conn_log = client.task_log(DAG_ID, run["dag_run_id"], "read_connection")
    assert "connection password: ***" in conn_log, conn_log[-3000:]
    assert SECRET not in conn_log


GOOD = {"start": INCIDENT_START.isoformat(), "end": INCIDENT_END.isoformat()}


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        # refused by its date-time format or by its pattern, whichever is checked first (the pattern's message
        # came first with a sqlite metadata DB, the format's with PostgreSQL): either way the key and the value
        ({"start": "2026-11-01T01:00:00"}, "Invalid input for param start: '2026-11-01T01:00:00' "),
        ({"mode": "banana"}, "Invalid input for param mode: 'banana' is not one of ['sequential', 'parallel']"),
        (
            {"max_misalignment_threshold": "0s"},
            "Invalid input for param max_misalignment_threshold: '0s' does not match",
        ),
        ({"sources": ["nope"]}, "Invalid input for param sources: 'nope' is not one of ['playbacks']"),
        ({"min_match": 101}, "Invalid input for param min_match: 101 is greater than the maximum of 100"),
    ],
    ids=["naive-start", "unknown-mode", "zero-threshold", "unknown-source", "min-match-over-100"],
)
def test_bad_backfill_params_refused_by_the_api(
    client: AirflowClient, lake: dict[str, Any], change: dict[str, Any], reason: str
) -> None:
    before = client.request("GET", f"/api/v2/dags/{BACKFILL_DAG}/dagRuns").json()["total_entries"]
    rows = target_rows(lake)
    resp = client.trigger_response(BACKFILL_DAG, conf={**GOOD, **change})
    assert resp.status_code == 400, resp.text
    assert reason in resp.json()["detail"], resp.text
    after = client.request("GET", f"/api/v2/dags/{BACKFILL_DAG}/dagRuns").json()["total_entries"]
    assert after == before, "a refused trigger must not create a dag run"
    assert target_rows(lake) == rows


def test_end_before_start_fails_the_first_task_and_writes_nothing(client: AirflowClient, lake: dict[str, Any]) -> None:
    rows = target_rows(lake)
    conf = {"start": INCIDENT_END.isoformat(), "end": INCIDENT_START.isoformat()}
    run = client.trigger(BACKFILL_DAG, conf=conf)  # each value is valid alone: the schema accepts it
    done = client.wait_for_run(BACKFILL_DAG, run["dag_run_id"], timeout=180, interval=2)
    assert done["state"] == "failed"
    states = {
        (t["task_id"], t["map_index"]): t["state"] for t in client.task_instances(BACKFILL_DAG, run["dag_run_id"])
    }
    assert states[("snapshot", -1)] == "failed", states
    assert not [k for k, v in states.items() if v == "success"], states
    log = client.task_log(BACKFILL_DAG, run["dag_run_id"], "snapshot")
    assert f"backfill parameter end: '{INCIDENT_START.isoformat()}' is not after start" in log, log[-3000:]
    assert target_rows(lake) == rows


def test_connection_created_through_rest_is_stored_without_exposing_password(client: AirflowClient) -> None:
    client.create_connection("kappa_rest_conn", "iceberg", host="rest.internal", login="u", password=SECRET)
    got = client.request("GET", "/api/v2/connections/kappa_rest_conn").json()
    assert (got["connection_id"], got["conn_type"], got["host"]) == ("kappa_rest_conn", "iceberg", "rest.internal")
    assert SECRET not in str(got)


def test_deployment_listens_on_loopback_only(airflow: AirflowDeployment) -> None:
    listening = listening_ports(server.pid for server in airflow.servers)
    assert airflow.port in listening, listening
    assert all(addr.startswith("127.") or addr.startswith("::ffff:127.") for addr in listening.values()), listening


def runs_of(client: AirflowClient, dag_id: str) -> list[dict[str, Any]]:
    return list(client.request("GET", f"/api/v2/dags/{dag_id}/dagRuns", params={"limit": 100}).json()["dag_runs"])


def test_a_published_backfill_triggers_the_dag_scheduled_on_its_target(
    client: AirflowClient, lake: dict[str, Any], conn_run: dict[str, Any]
) -> None:
    """The scheduler runs the downstream DAG on the publish task's asset event; the event's extra
    (read by the downstream task from ``triggering_asset_events``) names the window, the
    published snapshot and the backfill."""
    require_success(client, CONN_DAG, conn_run["run_id"], conn_run["done"])
    [snapshot] = client.xcom_entries(CONN_DAG, conn_run["run_id"], "snapshot")
    backfill_id = snapshot["value"]["backfill_id"]

    def downstream_run() -> dict[str, Any] | None:
        for run in runs_of(client, DOWNSTREAM_DAG):
            if run["run_type"] == "asset_triggered" and run["state"] in ("success", "failed"):
                [xcom] = client.xcom_entries(DOWNSTREAM_DAG, run["dag_run_id"], "windows_replaced")
                if any(w.get("backfill_id") == backfill_id for w in xcom["value"]):
                    return {**run, "windows": xcom["value"]}
        return None

    run = wait_until(downstream_run, timeout=180, interval=2, what=f"a run of {DOWNSTREAM_DAG} after {backfill_id}")
    assert run["state"] == "success"
    [window] = [w for w in run["windows"] if w["backfill_id"] == backfill_id]
    assert window == {
        "backfill_id": backfill_id,
        "job": "playback_sessions",
        "sink": "sessions",
        "table": TARGET,
        "start": CONF["start"],
        "end": CONF["end"],
        "snapshot_id": window["snapshot_id"],
    }
    assert isinstance(window["snapshot_id"], int)


def test_an_airflow_backfill_over_two_intervals_runs_two_kappa_backfills_in_turn(
    client: AirflowClient, lake: dict[str, Any]
) -> None:
    """``POST /api/v2/backfills`` (what ``airflow backfill create`` and the Backfill dialog do) over
    two hourly intervals of the scheduled repair DAG, the incident's [01:00, 03:00): two runs, one
    after the other, each a Kappa backfill of its data interval; the table ends exactly correct.
    (Last in this module: it rewrites the incident's window of the shared lake.)"""
    client.wait_for_dag(REPAIR_DAG, timeout=120)
    client.unpause(REPAIR_DAG)
    body = {
        "dag_id": REPAIR_DAG,
        # logical dates 01:00, 02:00 (both ends included): the intervals [01:00, 03:00)
        "from_date": "2026-11-01T01:00:00+00:00",
        "to_date": "2026-11-01T02:00:00+00:00",
        "max_active_runs": 1,
        # one slice a run: what is tested is the runs, one after the other, each a backfill of its own interval;
        # slicing has its own tests. Parallel mode cuts [start, end) (an hour, on the hourly grid) into one slice
        # reading [start - 30min, end + 45min), as test_dag's [parallel] slices do on the same lake (exact); in
        # sequential mode the grid (multiples of `slice` from the Unix epoch) cuts the range read, which starts
        # 30 min before the hour, in two whatever the slice
        "dag_run_conf": {"mode": "parallel", "slice": "1h", "warmup": "30min", "tail": "45min"},
    }
    backfill = client.request("POST", "/api/v2/backfills", json=body).json()
    runs: list[dict[str, Any]] = []

    def all_done() -> list[dict[str, Any]] | None:
        found = [r for r in runs_of(client, REPAIR_DAG) if r.get("run_type") == "backfill"]
        return found if len(found) == 2 and all(r["state"] in ("success", "failed") for r in found) else None

    runs = wait_until(all_done, timeout=900, interval=3, what=f"the 2 runs of backfill {backfill['id']}")
    for run in runs:
        require_success(client, REPAIR_DAG, run["dag_run_id"], run)
    intervals = sorted((r["data_interval_start"], r["data_interval_end"]) for r in runs)
    assert [(a[11:16], b[11:16]) for a, b in intervals] == [("01:00", "02:00"), ("02:00", "03:00")]
    ordered = sorted(runs, key=lambda r: r["start_date"])
    assert all(a["end_date"] <= b["start_date"] for a, b in zip(ordered, ordered[1:])), "runs overlapped"
    windows = []
    for run in runs:
        [snap] = client.xcom_entries(REPAIR_DAG, run["dag_run_id"], "snapshot")
        windows.append((snap["value"]["params"]["start"], snap["value"]["params"]["end"]))
    assert sorted(windows) == [
        ("2026-11-01T01:00:00+00:00", "2026-11-01T02:00:00+00:00"),
        ("2026-11-01T02:00:00+00:00", "2026-11-01T03:00:00+00:00"),
    ]
    assert target_rows(lake) == expected_rows(lake)
