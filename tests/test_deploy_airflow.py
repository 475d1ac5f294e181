"""A real Airflow 3 deployment (api-server + scheduler + dag-processor on 127.0.0.1), driven over REST.

The deployment serves the repo's example DAGs (copied into the test's dags folder, with
``KAPPA_LAKE`` pointing at a tiny lake seeded with an incident) and a small probe DAG:

- a real backfill of ``kappa_backfill_playback_sessions`` triggered through the public API with
  a conf succeeds, and the published table holds exactly the correct rows;
- confs violating the backfill DAG's Params schema are refused by the API with the reason,
  and create no run; end before start passes the schema but fails the first task, writing nothing;
- the probe DAG proves the harness itself: conf, task logs and XCom through the API, and a
  connection given as ``AIRFLOW_CONN_*`` reaching a task with its password masked in the log.
"""

from __future__ import annotations

import shutil
import textwrap
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from lake import INCIDENT_END, INCIDENT_START, seed_sessions_incident, sessions_arrow, sorted_rows

from deploy.airflow_server import AirflowClient, AirflowDeployment, airflow_deployment, connection_env

REPO = Path(__file__).resolve().parent.parent
BACKFILL_DAG = "kappa_backfill_playback_sessions"
TARGET = "prod.playback_sessions"

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
    catalog = load_catalog("lake", type="sql", uri=f"sqlite:///{folder}/catalog.db", warehouse=f"file://{folder}/warehouse")
    expected = seed_sessions_incident(catalog, "raw.playbacks", TARGET)
    return {"dir": folder, "catalog": catalog, "expected": expected}


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory, lake: dict[str, Any]) -> Iterator[AirflowDeployment]:
    """One Airflow deployment for the module: the example DAGs, the probe DAG, one env connection."""
    root = tmp_path_factory.mktemp("airflow")
    dags = root / "dags"
    dags.mkdir()
    for example in sorted((REPO / "dags").glob("*.py")):
        shutil.copy(example, dags / example.name)
    (dags / "kappa_deploy_probe.py").write_text(PROBE_DAG)
    env = {
        **connection_env("kappa_probe_conn", f"iceberg://probe-user:{SECRET}@catalog.internal:8181/"),
        "KAPPA_LAKE": str(lake["dir"]),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    t0 = time.monotonic()
    with airflow_deployment(root / "home", dags, extra_env=env) as deployment:
        print(f"airflow started in {time.monotonic() - t0:.1f}s {deployment.timings}")
        yield deployment


@pytest.fixture(scope="module")
def client(airflow: AirflowDeployment) -> AirflowClient:
    """A logged-in REST client; the probe and backfill DAGs parsed and unpaused."""
    c = airflow.client()
    for dag_id in (DAG_ID, BACKFILL_DAG):
        c.wait_for_dag(dag_id, timeout=120)
        c.unpause(dag_id)
    return c


def target_rows(lake: dict[str, Any]) -> list[tuple[Any, ...]]:
    return sorted_rows(lake["catalog"].load_table(TARGET))


def test_backfill_triggered_through_rest_publishes_exactly_the_correct_window(
    client: AirflowClient, airflow: AirflowDeployment, lake: dict[str, Any]
) -> None:
    import pyarrow as pa

    before = target_rows(lake)
    expected = sorted_rows(pa.Table.from_pylist(lake["expected"], schema=sessions_arrow()))
    assert before != expected, "the seeded incident must differ from the correct rows"
    # One aligned slice, [00:00, 04:00) = [start - warmup, end + tail), read in at most four
    # micro-batches: the least Spark work that still backfills the whole incident. The tail
    # closes every session of the window (playbacks go on until 03:50, see lake.py).
    conf = {
        "start": INCIDENT_START.isoformat(),
        "end": INCIDENT_END.isoformat(),
        "slice": "4h",
        "warmup": "1h",
        "tail": "1h",
        "max_misalignment_threshold": "1h",
    }
    t0 = time.monotonic()
    run = client.trigger(BACKFILL_DAG, conf=conf)
    done = client.wait_for_run(BACKFILL_DAG, run["dag_run_id"], timeout=600, interval=2)
    elapsed = time.monotonic() - t0
    tis = client.task_instances(BACKFILL_DAG, run["dag_run_id"])
    states = sorted((t["task_id"], t["map_index"], t["state"]) for t in tis)
    if done["state"] != "success":
        failed = [t for t in tis if t["state"] == "failed"]
        logs = "\n".join(client.task_log(BACKFILL_DAG, run["dag_run_id"], t["task_id"], t["try_number"], t["map_index"])[-4000:] for t in failed)
        pytest.fail(f"backfill run {done['state']}: {states}\n{logs}")
    print(f"backfill run succeeded in {elapsed:.1f}s: {states}")
    assert [s for s in states if s[0] == "slice_sequential"] == [("slice_sequential", 0, "success")], states
    assert ("slice_parallel", -1, "skipped") in states or all(s[2] == "skipped" for s in states if s[0] == "slice_parallel"), states
    assert ("publish", -1, "success") in states, states
    assert target_rows(lake) == expected


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
        ({"start": "2026-11-01T01:00:00"}, "Invalid input for param start: '2026-11-01T01:00:00' does not match"),
        ({"mode": "banana"}, "Invalid input for param mode: 'banana' is not one of ['sequential', 'parallel']"),
        ({"max_misalignment_threshold": "0s"}, "Invalid input for param max_misalignment_threshold: '0s' does not match"),
        ({"sources": ["nope"]}, "Invalid input for param sources: 'nope' is not one of ['playbacks']"),
        ({"min_match": 101}, "Invalid input for param min_match: 101 is greater than the maximum of 100"),
    ],
    ids=["naive-start", "unknown-mode", "zero-threshold", "unknown-source", "min-match-over-100"],
)
def test_bad_backfill_params_refused_by_the_api(client: AirflowClient, lake: dict[str, Any], change: dict[str, Any], reason: str) -> None:
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
    states = {(t["task_id"], t["map_index"]): t["state"] for t in client.task_instances(BACKFILL_DAG, run["dag_run_id"])}
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
    listening = _listening_ports(airflow)
    assert airflow.port in listening, listening
    assert all(addr.startswith("127.") or addr.startswith("::ffff:127.") for addr in listening.values()), listening


def _listening_ports(airflow: AirflowDeployment) -> dict[int, str]:
    """TCP ports our Airflow processes listen on -> bound address (from /proc/net/tcp*)."""
    import socket

    inodes: set[str] = set()
    for server in airflow.servers:
        for pid in _group_pids(server.pid):
            fd_dir = Path(f"/proc/{pid}/fd")
            try:
                for fd in fd_dir.iterdir():
                    target = str(fd.readlink()) if fd.is_symlink() else ""
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
            except (FileNotFoundError, PermissionError):
                continue
    out: dict[int, str] = {}
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            parts = line.split()
            local, state, inode = parts[1], parts[3], parts[9]
            if state != "0A" or inode not in inodes:  # 0A = LISTEN
                continue
            hex_addr, hex_port = local.split(":")
            raw = bytes.fromhex(hex_addr)
            if family == socket.AF_INET:
                addr = socket.inet_ntop(family, raw[::-1])
            else:
                addr = socket.inet_ntop(family, b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))
            out[int(hex_port, 16)] = addr
    return out


def _group_pids(pgid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(fields[2]) == pgid:
                pids.append(int(entry.name))
    return pids
