"""A real Airflow 3 deployment on 127.0.0.1 for tests, and a small client of its REST API v2.

The deployment is the three long-running components a production install has, each a
separate process group: ``airflow api-server`` (REST API, UI and the execution API the
tasks talk to), ``airflow scheduler`` (LocalExecutor) and ``airflow dag-processor``.
AIRFLOW_HOME is a private folder holding the metadata DB (sqlite, unless ``extra_env`` sets
``AIRFLOW__DATABASE__SQL_ALCHEMY_CONN``: tests/deploy/test_airflow.py puts it on PostgreSQL), the
config, the logs and the simple auth manager's password file (one ``admin`` user with a random
password).
The metadata DB is migrated with ``airflow db migrate`` before any component starts.

Typical use::

    with airflow_deployment(tmp / "airflow", dags_folder) as af:
        client = af.client()
        client.unpause("my_dag")
        run = client.trigger("my_dag", conf={"start": "..."})
        client.wait_for_run("my_dag", run["dag_run_id"], timeout=120)
"""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from servers import (
    VENV_BIN,
    DeploymentError,
    DeploymentTimeout,
    ServerProcess,
    free_port,
    venv_env,
    wait_until,
)

ADMIN_USER = "admin"
TERMINAL_RUN_STATES = ("success", "failed")


@dataclass
class AirflowDeployment:
    """api-server + scheduler + dag-processor sharing one AIRFLOW_HOME, on a free loopback port.

    :param home: AIRFLOW_HOME (created if missing).
    :param dags_folder: the DAGs folder the dag-processor parses.
    :param port: API server port (default: a free one).
    :param extra_env: more environment for every component (e.g. ``AIRFLOW_CONN_*``,
        ``AIRFLOW_VAR_*`` or ``AIRFLOW__SECTION__KEY`` overrides).
    """

    home: Path
    dags_folder: Path
    port: int = 0
    extra_env: Mapping[str, str] = field(default_factory=dict)
    password: str = field(default_factory=lambda: secrets.token_urlsafe(12))
    servers: list[ServerProcess] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.home = Path(self.home)
        self.dags_folder = Path(self.dags_folder)
        self.port = self.port or free_port()

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``: the API server (REST API under ``/api/v2``, the UI at ``/``)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_folder(self) -> Path:
        """Where task logs are written (``<home>/logs``)."""
        return self.home / "logs"

    def env(self) -> dict[str, str]:
        """The environment every Airflow component (and task) of this deployment runs with."""
        home = self.home
        settings = {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN_USER}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
            "AIRFLOW__CORE__FERNET_KEY": _fernet_key(home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__BASE_URL": self.base_url,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__SECRET_KEY": _secret(home, "api_secret"),
            "AIRFLOW__API_AUTH__JWT_SECRET": _secret(home, "jwt_secret"),
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.log_folder),
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
            "AIRFLOW__SCHEDULER__STANDALONE_DAG_PROCESSOR": "True",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            # a new file is parsed when the folder's listing finds it (every 5 s); a parsed file again only after
            # 10 min: no test changes a DAG file while its deployment runs, and re-parsing every file every 5 s
            # kept the idle dag-processor at ~46% of a core (41.6 CPU-s in 90 s, against 1.5 s at 300 s)
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",
            "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            "AIRFLOW__CORE__MAX_ACTIVE_RUNS_PER_DAG": "4",
            "NO_COLOR": "1",
        }
        settings.update(self.extra_env)
        return venv_env(settings)

    def start(self, timeout: float = 180.0) -> AirflowDeployment:
        """Migrate the DB, start the three components and wait until all report healthy.

        :param timeout: seconds allowed for the whole start.
        """
        self.home.mkdir(parents=True, exist_ok=True)
        self.dags_folder.mkdir(parents=True, exist_ok=True)
        (self.home / "passwords.json").write_text(json.dumps({ADMIN_USER: self.password}))
        env = self.env()
        t0 = time.monotonic()
        migrate_log = self.home / "db-migrate.log"
        with open(migrate_log, "wb") as log:
            try:
                done = subprocess.run(
                    [str(VENV_BIN / "airflow"), "db", "migrate"],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    timeout=timeout,
                    start_new_session=True,
                    check=False,
                )
            except subprocess.TimeoutExpired as e:
                raise DeploymentTimeout(f"airflow db migrate took over {timeout:.0f}s:\n{_tail(migrate_log)}") from e
        if done.returncode != 0:
            raise DeploymentError(f"airflow db migrate exited {done.returncode}:\n{_tail(migrate_log)}")
        self.timings["db_migrate_s"] = time.monotonic() - t0
        logs = self.home / "component-logs"
        for name, argv in (
            ("api-server", ["api-server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"]),
            ("scheduler", ["scheduler", "--skip-serve-logs"]),  # its log server would bind every interface
            ("dag-processor", ["dag-processor"]),
        ):
            self.servers.append(
                ServerProcess(
                    f"airflow {name}", [str(VENV_BIN / "airflow"), *argv], logs / f"{name}.log", env, cwd=self.home
                )
            )
        remaining = max(10.0, timeout - (time.monotonic() - t0))
        wait_until(
            self._healthy,
            timeout=remaining,
            what=f"Airflow at {self.base_url} to report every component healthy",
            servers=self.servers,
        )
        self.timings["start_total_s"] = time.monotonic() - t0
        return self

    def _healthy(self) -> bool:
        resp = httpx.get(f"{self.base_url}/api/v2/monitor/health", timeout=5)
        if resp.status_code != 200:
            return False
        health = resp.json()
        parts = ("metadatabase", "scheduler", "dag_processor")
        return all((health.get(p) or {}).get("status") == "healthy" for p in parts)

    def stop(self) -> None:
        """Stop every component (SIGTERM to its process group, then SIGKILL); reverse start order."""
        errors: list[str] = []
        for server in reversed(self.servers):
            try:
                server.stop()
            except Exception as e:  # keep stopping the others; reported below
                errors.append(f"{server.name}: {e!r}")
        self.servers.clear()
        if errors:
            raise DeploymentError("could not stop Airflow components: " + "; ".join(errors))

    def describe(self) -> str:
        """Log tails of every component (for assertion messages)."""
        return "\n".join(s.describe() for s in self.servers)

    def client(self) -> AirflowClient:
        """A REST client logged in as the admin user."""
        return AirflowClient(self.base_url, ADMIN_USER, self.password, deployment=self)

    def write_dag(self, filename: str, source: str) -> Path:
        """Write a DAG file into the dags folder (picked up at the next parse).

        :param filename: file name inside the dags folder.
        :param source: Python source of the DAG file.
        """
        path = self.dags_folder / filename
        path.write_text(source)
        return path


@contextmanager
def airflow_deployment(
    home: Path,
    dags_folder: Path,
    *,
    extra_env: Mapping[str, str] | None = None,
    timeout: float = 180.0,
) -> Iterator[AirflowDeployment]:
    """Start an :class:`AirflowDeployment`, yield it, and always stop it.

    :param home: AIRFLOW_HOME (a tmp folder).
    :param dags_folder: the DAGs folder.
    :param extra_env: more environment for every component.
    :param timeout: seconds allowed for the start.
    """
    deployment = AirflowDeployment(home, dags_folder, extra_env=dict(extra_env or {}))
    try:
        deployment.start(timeout=timeout)
        yield deployment
    finally:
        deployment.stop()


class AirflowApiError(DeploymentError):
    """The REST API answered with an unexpected status; carries it and the body."""

    def __init__(self, method: str, url: str, response: httpx.Response) -> None:
        self.status_code = response.status_code
        self.body = response.text
        try:
            self.detail: Any = response.json().get("detail")
        except (ValueError, AttributeError):
            self.detail = None
        super().__init__(f"{method} {url} -> HTTP {response.status_code}: {response.text[:2000]}")


class AirflowClient:
    """A small client of the Airflow 3 public REST API v2 (bearer JWT from ``/auth/token``).

    :param base_url: ``http://host:port`` of the API server.
    :param username: simple auth manager user.
    :param password: its password.
    :param deployment: the deployment (log tails are added to timeout errors).
    """

    def __init__(
        self, base_url: str, username: str, password: str, deployment: AirflowDeployment | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.deployment = deployment
        self.http = httpx.Client(base_url=self.base_url, timeout=30)
        self.token = self.fetch_token(username, password)
        self.http.headers["Authorization"] = f"Bearer {self.token}"

    def fetch_token(self, username: str, password: str) -> str:
        """POST ``/auth/token``: a JWT for ``username``.

        :param username: user name.
        :param password: password.
        """
        resp = self.http.post("/auth/token", json={"username": username, "password": password})
        if resp.status_code not in (200, 201):
            raise AirflowApiError("POST", "/auth/token", resp)
        return str(resp.json()["access_token"])

    def request(self, method: str, path: str, *, expect: tuple[int, ...] = (200,), **kwargs: Any) -> httpx.Response:
        """One API call; raises :class:`AirflowApiError` unless the status is in ``expect``.

        :param method: HTTP method.
        :param path: path under the base URL, e.g. ``/api/v2/dags``.
        :param expect: accepted status codes.
        :param kwargs: passed to :meth:`httpx.Client.request`.
        """
        resp = self.http.request(method, path, **kwargs)
        if resp.status_code not in expect:
            raise AirflowApiError(method, path, resp)
        return resp

    # -- DAGs -----------------------------------------------------------------------------
    def get_dag(self, dag_id: str) -> dict[str, Any]:
        """GET ``/api/v2/dags/{dag_id}``.

        :param dag_id: the DAG.
        """
        return dict(self.request("GET", f"/api/v2/dags/{dag_id}").json())

    def import_errors(self) -> list[dict[str, Any]]:
        """GET ``/api/v2/importErrors``: DAG files that failed to parse."""
        return list(self.request("GET", "/api/v2/importErrors").json()["import_errors"])

    def wait_for_dag(self, dag_id: str, timeout: float = 90.0) -> dict[str, Any]:
        """Wait until the dag-processor has parsed ``dag_id``; fail fast on an import error.

        :param dag_id: the DAG.
        :param timeout: seconds.
        """

        def parsed() -> dict[str, Any] | None:
            errors = self.import_errors()
            if errors:
                text = "\n".join(f"{e.get('filename')}: {e.get('stack_trace')}" for e in errors)
                raise DeploymentError(f"DAG files failed to import while waiting for {dag_id!r}:\n{text}")
            resp = self.http.get(f"/api/v2/dags/{dag_id}")
            return dict(resp.json()) if resp.status_code == 200 else None

        return dict(self._wait(parsed, timeout, f"DAG {dag_id!r} to be parsed", fail_fast=(DeploymentError,)))

    def unpause(self, dag_id: str) -> dict[str, Any]:
        """PATCH ``/api/v2/dags/{dag_id}`` with ``is_paused: false``.

        :param dag_id: the DAG.
        """
        return dict(self.request("PATCH", f"/api/v2/dags/{dag_id}", json={"is_paused": False}).json())

    def dag_params(self, dag_id: str) -> dict[str, Any]:
        """The DAG's Params as the API serves them (``/api/v2/dags/{dag_id}/details``).

        :param dag_id: the DAG.
        """
        return dict(self.request("GET", f"/api/v2/dags/{dag_id}/details").json().get("params") or {})

    # -- runs -----------------------------------------------------------------------------
    def trigger_response(
        self, dag_id: str, conf: Mapping[str, Any] | None = None, run_id: str | None = None
    ) -> httpx.Response:
        """POST ``/api/v2/dags/{dag_id}/dagRuns`` and return the raw response (any status).

        :param dag_id: the DAG.
        :param conf: the run's conf (validated against the DAG's Params by the API).
        :param run_id: optional run id.
        """
        body: dict[str, Any] = {"logical_date": None, "conf": dict(conf or {})}
        if run_id:
            body["dag_run_id"] = run_id
        return self.http.post(f"/api/v2/dags/{dag_id}/dagRuns", json=body)

    def trigger(self, dag_id: str, conf: Mapping[str, Any] | None = None, run_id: str | None = None) -> dict[str, Any]:
        """Trigger a run; raises :class:`AirflowApiError` if the API refuses it.

        :param dag_id: the DAG.
        :param conf: the run's conf.
        :param run_id: optional run id.
        """
        resp = self.trigger_response(dag_id, conf, run_id)
        if resp.status_code != 200:
            raise AirflowApiError("POST", f"/api/v2/dags/{dag_id}/dagRuns", resp)
        return dict(resp.json())

    def get_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        """GET one dag run.

        :param dag_id: the DAG.
        :param run_id: the run.
        """
        return dict(self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}").json())

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float = 180.0, interval: float = 1.0) -> dict[str, Any]:
        """Poll a run until it is ``success`` or ``failed``; return it (whatever the final state).

        :param dag_id: the DAG.
        :param run_id: the run.
        :param timeout: seconds; on timeout the error lists the task states and log tails.
        :param interval: seconds between polls.
        """

        def finished() -> dict[str, Any] | None:
            run = self.get_run(dag_id, run_id)
            return run if run.get("state") in TERMINAL_RUN_STATES else None

        try:
            return dict(self._wait(finished, timeout, f"run {run_id!r} of {dag_id!r} to finish", interval=interval))
        except DeploymentTimeout as e:
            states = [(t["task_id"], t.get("map_index"), t.get("state")) for t in self.task_instances(dag_id, run_id)]
            raise DeploymentTimeout(f"{e}\ntask instances: {states}") from e

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        """GET the task instances of a run (mapped ones included).

        :param dag_id: the DAG.
        :param run_id: the run.
        """
        resp = self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 1000})
        return list(resp.json()["task_instances"])

    def clear_task_instances(
        self,
        dag_id: str,
        run_id: str,
        task_ids: Sequence[str | tuple[str, int]],
        *,
        include_downstream: bool = False,
    ) -> list[dict[str, Any]]:
        """POST ``/api/v2/dags/{dag_id}/clearTaskInstances`` for one run (whatever their state):
        the task instances go back to no state, the run to queued, and the scheduler reruns them.

        :param dag_id: the DAG.
        :param run_id: the run.
        :param task_ids: task ids, or ``(task_id, map_index)`` for one mapped task instance.
        :param include_downstream: clear the tasks downstream of them too.
        :returns: the task instances cleared.
        """
        body = {
            "dry_run": False,
            "dag_run_id": run_id,
            "task_ids": [list(t) if isinstance(t, tuple) else t for t in task_ids],
            "include_downstream": include_downstream,
            "only_failed": False,
            "reset_dag_runs": True,
        }
        resp = self.request("POST", f"/api/v2/dags/{dag_id}/clearTaskInstances", json=body)
        return list(resp.json()["task_instances"])

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1, map_index: int = -1) -> str:
        """The full text of one task try's log.

        :param dag_id: the DAG.
        :param run_id: the run.
        :param task_id: the task.
        :param try_number: the try (1-based).
        :param map_index: the mapped index (-1 if not mapped).
        """
        resp = self.request(
            "GET",
            f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
            params={"full_content": "true", "map_index": map_index},
            headers={"Accept": "application/json"},
        )
        content = resp.json().get("content")
        if isinstance(content, list):
            return "\n".join(_log_line(x) for x in content)
        return str(content)

    def xcom_entries(
        self, dag_id: str, run_id: str, task_id: str, map_index: int | None = None
    ) -> list[dict[str, Any]]:
        """GET the XCom entries of a task instance (keys and values).

        :param dag_id: the DAG.
        :param run_id: the run.
        :param task_id: the task.
        :param map_index: only this mapped index (None: all).
        """
        params: dict[str, Any] = {"limit": 1000}
        if map_index is not None:
            params["map_index"] = map_index
        path = f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries"
        entries = list(self.request("GET", path, params=params).json()["xcom_entries"])
        out = []
        for entry in entries:
            one = self.request(
                "GET",
                f"{path}/{entry['key']}",
                params={"map_index": entry.get("map_index", -1), "deserialize": "true", "stringify": "false"},
            ).json()
            out.append(dict(one))
        return out

    # -- connections -------------------------------------------------------------------------
    def create_connection(self, conn_id: str, conn_type: str, **fields: Any) -> dict[str, Any]:
        """POST ``/api/v2/connections`` (host, login, password, schema, port, extra as JSON text).

        :param conn_id: connection id.
        :param conn_type: connection type, e.g. ``iceberg``.
        :param fields: other connection fields.
        """
        body = {"connection_id": conn_id, "conn_type": conn_type, **fields}
        return dict(self.request("POST", "/api/v2/connections", json=body, expect=(200, 201)).json())

    def _wait(
        self,
        check: Any,
        timeout: float,
        what: str,
        interval: float = 1.0,
        fail_fast: tuple[type[BaseException], ...] = (),
    ) -> Any:
        servers = self.deployment.servers if self.deployment else []
        if not fail_fast:
            return wait_until(check, timeout=timeout, what=what, servers=servers, interval=interval)
        box: list[BaseException] = []

        def guarded() -> Any:
            try:
                return check()
            except fail_fast as e:
                box.append(e)
                return True

        value = wait_until(guarded, timeout=timeout, what=what, servers=servers, interval=interval)
        if box:
            raise box[0]
        return value


def connection_env(conn_id: str, uri_or_json: str) -> dict[str, str]:
    """``AIRFLOW_CONN_<ID>`` for ``extra_env``: a connection every component sees, never in the DB.

    :param conn_id: connection id.
    :param uri_or_json: a connection URI or its JSON form.
    """
    return {f"AIRFLOW_CONN_{conn_id.upper()}": uri_or_json}


def _log_line(item: Any) -> str:
    if isinstance(item, dict):
        return str(item.get("event", "")) + "".join(
            f" {k}={v}" for k, v in item.items() if k not in ("event", "timestamp", "level")
        )
    return str(item)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def _secret(home: Path, name: str) -> str:
    path = home / f".{name}"
    if not path.exists():
        home.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(32))
    return path.read_text()


def _fernet_key(home: Path) -> str:
    import base64

    path = home / ".fernet_key"
    if not path.exists():
        home.mkdir(parents=True, exist_ok=True)
        path.write_text(base64.urlsafe_b64encode(secrets.token_bytes(32)).decode())
    return path.read_text()
