"""The engine choice (``job.engine``, ``job.connect``), the split of a run's conf between a Spark
Connect session and its server, and the state file of a kappa-owned server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_config import BASE, with_change, write

from airflow_provider_kappa.engine.connect import client_env, write_conf_file
from airflow_provider_kappa.engine.connect_server import (
    TOKEN_ENV,
    LocalConnectServer,
    ServerState,
    configured_url,
    read_state,
    redact_url,
    split_conf,
    stop_owned,
)
from airflow_provider_kappa.engine.processes import start_ticks
from airflow_provider_kappa.engine.shared_server import (
    RECYCLE_ENV,
    RECYCLE_EVERY,
    read_sessions,
    recycle_every,
    shared_session,
)
from airflow_provider_kappa.exceptions import KappaConfigError, KappaEngineError
from airflow_provider_kappa.job.config import ConnectConfig, load_config


def test_engine_defaults_to_connect_with_a_local_server(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, BASE))
    assert cfg.job.engine == "connect" and cfg.job.connect is None
    assert configured_url(cfg) is None


@pytest.mark.parametrize(
    ("engine", "connect", "expected"),
    [
        ("submit", None, None),
        ("connect", {"url": "sc://spark.example:15002"}, ConnectConfig(url="sc://spark.example:15002")),
        ("connect", {"url": "sc://h:1/;token=x"}, ConnectConfig(url="sc://h:1/;token=x")),
        ("connect", {"conn_id": "spark_connect_default"}, ConnectConfig(conn_id="spark_connect_default")),
    ],
)
def test_engine_and_connect_load(tmp_path: Path, engine: str, connect: Any, expected: ConnectConfig | None) -> None:
    data = with_change(["job", "engine"], engine)
    if connect is not None:
        data["job"]["connect"] = connect
    cfg = load_config(write(tmp_path, data))
    assert cfg.job.engine == engine and cfg.job.connect == expected


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("engine", "spark", r"job.engine: 'spark' is not an engine; allowed: \['connect', 'submit'\]"),
        ("engine", True, r"job.engine: True is not an engine"),
        (
            "connect",
            {"url": "http://h:15002"},
            r"job.connect.url: 'http://h:15002' is not a Spark Connect URL; expected 'sc://host:port'",
        ),
        ("connect", {"url": "sc://h:port"}, r"job.connect.url: 'sc://h:port' is not a Spark Connect URL"),
        ("connect", {"host": "h"}, r"job.connect: unknown key\(s\) \['host'\]; allowed: \['conn_id', 'url'\]"),
        (
            "connect",
            {"url": "sc://h:1", "conn_id": "c"},
            r"job.connect: .* must be one of \{conn_id: .*\} or \{url: 'sc://host:port'\}",
        ),
        ("connect", "sc://h:1", r"job.connect: 'sc://h:1' must be one of"),
        ("connect", {"conn_id": ""}, r"job.connect.conn_id: '' must be a non-empty string"),
    ],
)
def test_bad_engine_config(tmp_path: Path, key: str, value: Any, match: str) -> None:
    with pytest.raises(KappaConfigError, match=match):
        load_config(write(tmp_path, with_change(["job", key], value)))


@pytest.mark.airflow
def test_the_url_comes_from_the_config_or_an_airflow_spark_connect_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = with_change(["job", "connect"], {"url": "sc://spark.example:15002"})
    assert configured_url(load_config(write(tmp_path, data))) == "sc://spark.example:15002"
    monkeypatch.setenv(
        "AIRFLOW_CONN_KAPPA_TEST_CONNECT",
        json.dumps({"conn_type": "spark_connect", "host": "spark.example", "port": 15003, "password": "tok"}),
    )
    cfg = load_config(write(tmp_path, with_change(["job", "connect"], {"conn_id": "kappa_test_connect"})))
    url = configured_url(cfg)
    assert url is not None and url.startswith("sc://spark.example:15003/;") and "token=tok" in url
    assert redact_url(url) == "sc://spark.example:15003/"
    cfg = load_config(write(tmp_path, with_change(["job", "connect"], {"conn_id": "kappa_surely_missing"})))
    with pytest.raises(
        KappaConfigError, match=r"job.connect.conn_id: 'kappa_surely_missing' gives no Spark Connect URL"
    ):
        configured_url(cfg)


def test_a_session_gets_kappa_and_runtime_sql_keys_and_the_server_the_rest() -> None:
    conf = {
        "spark.kappa.mode": "backfill",
        "spark.kappa.catalogs.file": "/tmp/x/catalogs.json",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.streaming.noDataMicroBatches.enabled": "false",
        "spark.sql.extensions": "x.Ext",
        "spark.sql.warehouse.dir": "/w",
        "spark.ui.enabled": "false",
        "spark.jars.packages": "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0",
        "spark.executor.memory": "2g",
    }
    session, server = split_conf(conf)
    assert session == {k: conf[k] for k in list(conf)[:4]}
    assert server == {k: conf[k] for k in list(conf)[4:]}


def test_the_session_conf_file_is_private(tmp_path: Path) -> None:
    path = write_conf_file({"spark.kappa.mode": "backfill"}, tmp_path / "conf.json")
    assert (path.stat().st_mode & 0o777) == 0o600
    assert json.loads(path.read_text()) == {"spark.kappa.mode": "backfill"}


def test_sessions_of_kappas_own_server_turn_off_the_per_session_class_loader_and_the_jobs_conf_wins(
    tmp_path: Path,
) -> None:
    """On kappa's own server the sessions turn off the per-session class loader (Spark caches generated
    code per class loader: every slice compiled its classes again); another server's sessions are left as
    its owner set them, and a job's own value of either key wins."""
    from airflow_provider_kappa.engine.connect import OWN_SERVER_SESSION_CONF, _write_session_conf

    job = {"spark.sql.shuffle.partitions": "2"}
    own = json.loads(_write_session_conf(job, tmp_path / "own", "s", owned=True).read_text())
    assert own == {**OWN_SERVER_SESSION_CONF, **job}
    assert own["spark.sql.artifact.isolation.enabled"] == "false"
    other = json.loads(_write_session_conf(job, tmp_path / "other", "s", owned=False).read_text())
    assert other == job
    kept = {**job, "spark.sql.artifact.isolation.enabled": "true"}
    assert (
        json.loads(_write_session_conf(kept, tmp_path / "kept", "s", owned=True).read_text())[
            "spark.sql.artifact.isolation.enabled"
        ]
        == "true"
    )


def test_a_state_file_tells_a_live_server_from_a_gone_one_and_stops_it_by_pid(tmp_path: Path) -> None:
    from airflow_provider_kappa.engine.processes import start_ticks as _start_ticks

    assert read_state(tmp_path / "none.json") is None
    (tmp_path / "bad.json").write_text("{")
    assert read_state(tmp_path / "bad.json") is None
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        state = ServerState("sc://127.0.0.1:1", proc.pid, _start_ticks(proc.pid), "log")
        path = state.write(tmp_path / "server.json")
        again = read_state(path)
        assert again == state and again.running() and not again.alive()  # nothing listens on port 1
        assert ServerState(state.url, proc.pid, (state.start_ticks or 0) + 1, "log").running() is False  # a reused pid
        stop_owned(path)
        assert proc.wait(timeout=30) != 0 and not path.exists()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)


def test_the_owned_server_token_is_kept_in_a_0600_state_file_and_given_by_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The token of a kappa-owned server: in its state file (0600, even over a left-over file),
    never in ``repr``; a runner child gets it by environment, a given server's client does not."""
    path = tmp_path / "server.json"
    path.with_suffix(".tmp").write_text("left over")
    path.with_suffix(".tmp").chmod(0o644)
    state = ServerState("sc://localhost:1", 1, None, "log", "s3cr3t-t0ken")
    state.write(path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert read_state(path) == state and read_state(path).token == "s3cr3t-t0ken"  # type: ignore[union-attr]
    assert "s3cr3t-t0ken" not in repr(state)
    monkeypatch.setenv(TOKEN_ENV, "the-users-own")
    assert client_env("sc://localhost:1", "s3cr3t-t0ken")[TOKEN_ENV] == "s3cr3t-t0ken"
    assert client_env("sc://spark.example:15002", None)[TOKEN_ENV] == "the-users-own"  # a given server: untouched
    server = LocalConnectServer(None, tmp_path)
    with pytest.raises(KappaEngineError, match="not started"):
        _ = server.token


def test_the_default_engine_is_connect_where_it_works_out_of_the_box(tmp_path: Path) -> None:
    """Unset ``job.engine``: connect for a local master or a given server, submit for a cluster master."""

    def engine_of(job: dict[str, object]) -> str:
        data = with_change(["job"], {**BASE["job"], **job})
        return load_config(write(tmp_path, data)).job.engine

    assert engine_of({}) == "connect"
    assert engine_of({"master": "local[2]"}) == "connect"
    assert engine_of({"master": "spark://h:7077"}) == "submit"
    assert engine_of({"master": "yarn", "connect": {"url": "sc://h:15002"}}) == "connect"
    assert engine_of({"master": "yarn", "engine": "connect"}) == "connect"


def test_the_connect_server_recycling_period_comes_from_the_environment_and_bad_values_are_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(RECYCLE_ENV, raising=False)
    assert recycle_every() == RECYCLE_EVERY == 50
    monkeypatch.setenv(RECYCLE_ENV, "0")
    assert recycle_every() == 0  # never
    monkeypatch.setenv(RECYCLE_ENV, "-3")
    with pytest.raises(KappaConfigError, match=r"KAPPA_CONNECT_RECYCLE_EVERY: '-3' is not a whole number"):
        recycle_every()


def test_a_shared_server_is_not_recycled_while_another_task_runs_a_session_on_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The slice tasks of a DAG share the setup task's server through its sessions book: a task that
    finds the count reached but another task's session running keeps the server and counts its own.
    The server is a plain TCP listener standing in for Spark Connect (a process boundary)."""
    listener = subprocess.Popen(
        [sys.executable, "-c", LISTENER], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert listener.stdout is not None
        port = int(listener.stdout.readline())
        state_file = tmp_path / "connect" / "server.json"
        ServerState(f"sc://127.0.0.1:{port}", listener.pid, start_ticks(listener.pid), "log").write(state_file)
        book = {"pid": listener.pid, "sessions": 7, "recycled": 0, "active": {"other": os.getpid()}}
        (tmp_path / "connect" / "sessions.json").write_text(json.dumps(book))
        monkeypatch.setenv(RECYCLE_ENV, "2")
        cfg = load_config(write(tmp_path, BASE))
        with shared_session(cfg, state_file, "mine") as state:
            assert state.pid == listener.pid  # not recycled: "other" runs on it
            assert read_sessions(state_file)["active"] == {"other": os.getpid(), "mine": os.getpid()}
        after = read_sessions(state_file)
        assert after["sessions"] == 8 and after["recycled"] == 0 and after["active"] == {"other": os.getpid()}
        assert listener.poll() is None
    finally:
        listener.kill()
        listener.wait()


LISTENER = """
import socket, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(8)
print(s.getsockname()[1], flush=True)
while True:
    s.accept()[0].close()
"""


#: A runner's end as ``python -m ...connect_runner`` has it: main() returned ``3`` after an exit hook was
#: registered during the run (as a live run's ledger flush is) and output was left in stdout's buffer.
_RUNNER_END = """
import atexit, sys
from airflow_provider_kappa.engine import connect_runner
atexit.register(lambda: open(sys.argv[1], "w").write("hook ran"))
sys.stdout.write("unflushed output")
connect_runner.UNFINALIZED_EXIT.code = 3
sys.exit(3)
"""


#: The ``kappa`` console script's end: a verb that returns 2 (a config that does not exist), an exit hook
#: registered during the run, output left in stdout's buffer, and an object whose finalizer would say
#: that the interpreter was finalized.
_CONSOLE_END = """
import atexit, sys
from airflow_provider_kappa import cli
hook = sys.argv[1]
class Finalized:
    def __del__(self, open=open, path=hook + ".finalized"):  # builtins are gone by then: bound here
        open(path, "w").write("finalized")
kept = Finalized()
verbs = cli.main
def main():  # the verb registers an exit hook as it runs (as a module it imports may)
    atexit.register(lambda: open(hook, "w").write("hook ran"))
    sys.stdout.write("unflushed output")
    return verbs()
cli.main = main
sys.argv = ["kappa", "plan", "--config", hook + ".missing.yaml", "--start", "2026-11-01T00:00:00Z",
            "--end", "2026-11-01T01:00:00Z"]
cli.console()
"""


def test_the_kappa_command_ends_with_its_verbs_code_after_every_exit_hook_without_finalizing(tmp_path: Path) -> None:
    """``kappa`` (the console script) skips the interpreter's finalization (0.9 s at the end of a backfill)
    but not the exit hooks, its buffered output or its verb's exit code."""
    hook = tmp_path / "hook"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout block-buffered, as a pipe has it
    ran = subprocess.run(
        [sys.executable, "-c", _CONSOLE_END, str(hook)], capture_output=True, text=True, timeout=60, env=env
    )
    assert (ran.returncode, ran.stdout, hook.read_text()) == (2, "unflushed output", "hook ran"), ran.stderr
    assert "kappa plan: error:" in ran.stderr and ".missing.yaml" in ran.stderr
    assert not (tmp_path / "hook.finalized").exists()  # no finalization: the object's finalizer never ran
    # the check can fail: the same script ended by Python (sys.exit, not console()) finalizes the object
    plain = _CONSOLE_END.replace("cli.console()", "sys.exit(main())")
    ran = subprocess.run([sys.executable, "-c", plain, str(hook)], capture_output=True, text=True, timeout=60, env=env)
    assert ran.returncode == 2 and (tmp_path / "hook.finalized").read_text() == "finalized", ran.stderr


def test_a_runner_ends_with_mains_code_after_every_exit_hook_and_its_output_flushed(tmp_path: Path) -> None:
    """The runner skips the interpreter's finalization (0.3-0.6 s a slice) but not the exit hooks registered
    during the run, nor its buffered output; a runner whose main did not return exits as Python does."""
    hook = tmp_path / "hook"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout block-buffered, as a pipe has it
    ran = subprocess.run(
        [sys.executable, "-c", _RUNNER_END, str(hook)], capture_output=True, text=True, timeout=60, env=env
    )
    assert (ran.returncode, ran.stdout, hook.read_text()) == (3, "unflushed output", "hook ran"), ran.stderr
    escaped = _RUNNER_END.replace("connect_runner.UNFINALIZED_EXIT.code = 3\nsys.exit(3)", "raise SystemExit(2)")
    ran = subprocess.run(
        [sys.executable, "-c", escaped, str(hook)], capture_output=True, text=True, timeout=60, env=env
    )
    assert ran.returncode == 2, ran.stderr
