"""A real Airflow 3 deployment (api-server + scheduler + dag-processor on 127.0.0.1), driven over REST.

Proves the harness of :mod:`deploy.airflow_server` with a small DAG written into the test's own
dags folder: a run triggered through the public API with a conf succeeds (task log and XCom
read back through the API); a conf violating the DAG's Params schema is refused by the API
with the reason; a connection given as ``AIRFLOW_CONN_*`` reaches the task and its password
is masked in the task log.
"""

from __future__ import annotations

import textwrap
import time
from pathlib import Path
from typing import Iterator

import pytest

from deploy.airflow_server import AirflowClient, AirflowDeployment, airflow_deployment, connection_env

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
def airflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowDeployment]:
    """One Airflow deployment for the module, with the probe DAG and one env connection."""
    root = tmp_path_factory.mktemp("airflow")
    dags = root / "dags"
    dags.mkdir()
    (dags / "kappa_deploy_probe.py").write_text(PROBE_DAG)
    env = connection_env("kappa_probe_conn", f"iceberg://probe-user:{SECRET}@catalog.internal:8181/")
    t0 = time.monotonic()
    with airflow_deployment(root / "home", dags, extra_env=env) as deployment:
        print(f"airflow started in {time.monotonic() - t0:.1f}s {deployment.timings}")
        yield deployment


@pytest.fixture(scope="module")
def client(airflow: AirflowDeployment) -> AirflowClient:
    """A logged-in REST client; the probe DAG parsed and unpaused."""
    c = airflow.client()
    c.wait_for_dag(DAG_ID, timeout=120)
    c.unpause(DAG_ID)
    return c


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


@pytest.mark.parametrize(
    ("conf", "reason"),
    [
        ({"mode": "banana"}, "Invalid input for param mode: 'banana' is not one of ['sequential', 'parallel']"),
        ({"slices": 0}, "Invalid input for param slices: 0 is less than the minimum of 1"),
        ({"slices": "two"}, "Invalid input for param slices: 'two' is not of type 'integer'"),
    ],
)
def test_bad_params_refused_by_the_api(client: AirflowClient, conf: dict[str, object], reason: str) -> None:
    before = client.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns").json()["total_entries"]
    resp = client.trigger_response(DAG_ID, conf=conf)
    assert resp.status_code == 400, resp.text
    assert reason in resp.json()["detail"], resp.text
    after = client.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns").json()["total_entries"]
    assert after == before, "a refused trigger must not create a dag run"


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
