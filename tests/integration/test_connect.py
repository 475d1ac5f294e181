"""The Spark Connect engine with real servers: the runner against the tests' shared server, and
``kappa backfill`` with the local server it starts itself, killed mid-slice, rerun exact."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import airflow_env  # noqa: F401  (sets AIRFLOW_HOME before Airflow is imported)
import pytest
from airflow_env import PLANTED_SECRET, write_job_config
from lake import INCIDENT_END, INCIDENT_START, seed_sessions_incident, sorted_rows

from airflow_provider_kappa.cli import main
from airflow_provider_kappa.engine.connect_runner import RUNNER_MODULE

WINDOW = ["--start", INCIDENT_START.isoformat(), "--end", INCIDENT_END.isoformat()]
OPTIONS = ["--slice", "2h", "--warmup", "30min", "--tail", "45min", "--min-match", "50"]

APP = """
from pyspark.sql import SparkSession
from airflow_provider_kappa.spark.resolve import is_connect
spark = SparkSession.builder.getOrCreate()
print("connect", is_connect(spark), spark.conf.get("spark.kappa.job"), spark.conf.get("spark.sql.shuffle.partitions"))
print("catalog", spark.conf.get("spark.sql.catalog.dim.type", None))
"""


def found(folder: Path, pattern: str) -> list[Path]:
    """``folder.rglob(pattern)`` while a backfill runs: it makes the folder (a watcher may look first) and
    removes folders under it mid-walk, so a folder missing is "nothing yet", not a crash of the watcher."""
    try:
        return list(folder.rglob(pattern))
    except FileNotFoundError:
        return []


def run_runner(tmp_path: Path, url: str, conf: dict[str, str]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "app.py").write_text(APP)
    (tmp_path / "conf.json").write_text(json.dumps(conf))
    argv = [
        sys.executable,
        "-m",
        RUNNER_MODULE,
        "--conf-file",
        str(tmp_path / "conf.json"),
        "--progress-file",
        str(tmp_path / "p.jsonl"),
    ]
    env = {**os.environ, "SPARK_REMOTE": url}
    return subprocess.run([*argv, str(tmp_path / "app.py")], env=env, capture_output=True, text=True, timeout=300)


def test_the_runner_gives_the_unchanged_job_its_session_and_refuses_server_keys(
    tmp_path: Path, connect_server: Any
) -> None:
    # a catalog's keys: Spark registers none of them (isModifiable is false), yet a session may set them
    # (Iceberg's SparkCatalog in a job on engine connect; refused before, found on Spark 4.1.3)
    conf = {"spark.kappa.job": "t", "spark.sql.shuffle.partitions": "3", "spark.sql.catalog.dim.type": "jdbc"}
    done = run_runner(tmp_path, connect_server.url, conf)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "connect True t 3" in done.stdout and "catalog jdbc" in done.stdout
    refused = run_runner(tmp_path, connect_server.url, {"spark.kappa.job": "t", "spark.ui.enabled": "true"})
    assert refused.returncode == 1
    assert "conf key(s) ['spark.ui.enabled'] cannot be set in a Spark Connect session" in refused.stderr
    assert connect_server.alive()  # a session's end never stops the server


def test_the_session_conf_goes_in_one_request_and_only_the_keys_that_did_not_take_one_by_one(
    connect_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slice's conf is set in one config request plus one ``getAll``; only a key that did not take (a
    static one here) goes the per-key way, which names it with Spark's reason; the others are set."""
    from pyspark.sql.connect.session import SparkSession

    from airflow_provider_kappa.engine import connect_runner

    one_by_one: list[dict[str, str]] = []
    per_key = connect_runner._set_each

    def spied(spark: Any, conf: dict[str, str]) -> None:
        one_by_one.append(dict(conf))
        per_key(spark, conf)

    monkeypatch.setattr(connect_runner, "_set_each", spied)
    spark = SparkSession.builder.remote(connect_server.url).create()
    try:
        conf = {"spark.kappa.job": "t", "spark.sql.shuffle.partitions": "3", "spark.sql.catalog.dim.type": "jdbc"}
        connect_runner.set_session_conf(spark, conf)
        assert one_by_one == [{}]
        assert {key: spark.conf.get(key) for key in conf} == conf
        with pytest.raises(ValueError, match=r"conf key\(s\) \['spark.ui.enabled'\] cannot be set"):
            connect_runner.set_session_conf(spark, {**conf, "spark.kappa.job": "u", "spark.ui.enabled": "true"})
        assert one_by_one[-1] == {"spark.ui.enabled": "true"}
        assert spark.conf.get("spark.kappa.job") == "u"
    finally:
        spark.stop()


def test_a_spare_runner_runs_its_slice_and_a_dead_one_gives_way_to_a_fresh_runner(
    tmp_path: Path, connect_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A spare (``--wait``) gets its run, the server's token included, on stdin and runs the unchanged
    job in its session, the one it opened ahead when given the run's server; one that died before its
    run leaves the slice to a runner of its own."""
    from airflow_provider_kappa.engine.connect import run_application
    from airflow_provider_kappa.engine.spare_runner import SpareRunner

    app = tmp_path / "app.py"
    app.write_text(APP + "print('session', spark.session_id)\n")
    server = connect_server.server  # its plain URL: the token goes on the spare's stdin
    caplog.set_level("INFO", logger="airflow_provider_kappa.engine.connect")

    def run(spare: SpareRunner, url: str = server.url, session_id: str | None = None) -> str:
        """The run in ``spare``; what it logged (the job's lines included)."""
        caplog.clear()
        work = tmp_path / spare.session_id
        conf = {"spark.kappa.job": "t", "spark.sql.shuffle.partitions": "3"}
        run_application(app, conf, url=url, work=work, name="s", token=server.token, spare=spare, session_id=session_id)
        assert "connect True t 3" in caplog.text, caplog.text
        return caplog.text

    spare = SpareRunner()
    assert spare.proc is not None
    assert f"spare runner {spare.proc.pid}" in run(spare)
    # given the server, it opens the run's session ahead; the run is that session
    ahead = SpareRunner(server.url, server.token)
    assert f"session {ahead.session_id}" in run(ahead, session_id=ahead.session_id)
    # one opened ahead on another server (a restarted one) gives way to the run's own session
    elsewhere = SpareRunner(server.url, server.token)
    text = run(elsewhere, url=server.url + "/;user_id=kappa")
    assert "the run is on another server than the session opened ahead" in text
    assert f"session {elsewhere.session_id}" not in text
    # one that could not open its session ahead (here: a wrong token) leaves the run to open its own
    refused = SpareRunner(server.url, "not-the-token")
    assert "connect_runner: session not opened ahead" in run(refused, session_id=refused.session_id)
    dead = SpareRunner()
    assert dead.proc is not None
    dead.proc.kill()
    dead.proc.wait()
    run(dead)
    assert "the spare Spark Connect runner" in caplog.text and "is gone" in caplog.text, caplog.text
    assert "connect True t 3" in caplog.text


def test_a_spare_runner_ends_quietly_without_a_run_and_names_a_bad_one() -> None:
    """End of input before a run: exit 0 (the launcher had no slice left); a line that is not a run:
    exit 1 naming what is wrong."""
    cmd = [sys.executable, "-m", RUNNER_MODULE, "--wait"]
    unused = subprocess.run(cmd, input="", capture_output=True, text=True, timeout=120)
    assert unused.returncode == 0, unused.stderr
    bad = subprocess.run(cmd, input='{"remote": "sc://127.0.0.1:1"}\n', capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1
    assert "connect_runner: the run read from stdin is not valid: KeyError: 'conf_file'" in bad.stderr


def test_embedded_server_killed_mid_slice_fails_the_slice_and_the_rerun_is_exact(
    tmp_path: Path, catalog_props: dict[str, str], catalog: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import pyarrow as pa
    from lake import sessions_arrow

    from airflow_provider_kappa.engine.connect_server import read_state

    expected = seed_sessions_incident(catalog)
    config = write_job_config(
        tmp_path, catalog_props, engine="connect", extra_catalog_props={"s3.secret-access-key": PLANTED_SECRET}
    )
    checkpoints = tmp_path / "checkpoints"
    killed: list[int] = []

    def kill_after_the_first_commit() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            states = found(checkpoints, "connect/server.json")
            if states and found(checkpoints, "commits/0"):
                state = read_state(states[0])
                assert state is not None
                os.killpg(state.pid, signal.SIGKILL)  # the server kappa started for this backfill
                killed.append(state.pid)
                return
            time.sleep(0.1)

    killer = threading.Thread(target=kill_after_the_first_commit, daemon=True)
    killer.start()
    code = main(["backfill", "--config", str(config), *WINDOW, *OPTIONS])
    killer.join(timeout=5)
    out, err = capsys.readouterr()
    assert killed and code == 1, out + err
    assert "engine connect: local Spark Connect server sc://localhost:" in out
    assert "slice s0000 failed: KappaEngineError" in out
    assert not list(checkpoints.rglob("connect/server.json"))  # stopped and forgotten at the end
    # the same command again: a new local server, every slice rerun, exact
    began = time.time()
    code = main(["backfill", "--config", str(config), *WINDOW, *OPTIONS])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    # credentials only ever in the 0600 catalogs file of a run (removed with its private folder)
    kept = [p for p in checkpoints.rglob("*") if p.is_file() and PLANTED_SECRET in p.read_text(errors="replace")]
    assert not kept and PLANTED_SECRET not in out + err
    assert "slices run 2/2" in out and "published snapshot" in out
    # the default warm daemon: Spark's Python processes of the slices were forked from the zygote
    (log,) = [p for p in checkpoints.rglob("connect/server.log") if p.stat().st_mtime >= began]
    forked = log.read_text(errors="replace")
    assert "warm daemon zygote: " in forked and forked.count("warm daemon zygote: forked pyspark.") >= 4, forked[-3000:]
    # the server's lookup of installed Python data sources (the driver's Python) forked warm too
    assert "warm daemon zygote: forked pyspark.daemon pyspark.sql.worker.lookup_data_sources" in forked, forked[-3000:]
    target = catalog.load_table("prod.playback_sessions")
    assert sorted_rows(target) == sorted_rows(pa.Table.from_pylist(expected, schema=sessions_arrow()))
    assert not list(checkpoints.rglob("connect/server.json"))


def test_a_task_finds_the_owned_server_and_restarts_it_when_gone(tmp_path: Path, catalog_props: dict[str, str]) -> None:
    """What an Airflow slice task does with the backfill's state file (``Backfill.connect_state_file``)."""
    from airflow_provider_kappa.engine.connect_server import ServerState, ensure_server, read_state, stop_owned
    from airflow_provider_kappa.job.config import load_config

    cfg = load_config(write_job_config(tmp_path, catalog_props, engine="connect"))
    state_file = tmp_path / "connect" / "server.json"
    ServerState("sc://127.0.0.1:1", 999_999_999, 1, "gone.log").write(state_file)  # a server that died
    try:
        started = ensure_server(cfg, state_file)
        assert started.alive() and read_state(state_file) == started and started.url != "sc://127.0.0.1:1"
        assert ensure_server(cfg, state_file) == started  # alive: reused, not restarted
        assert (
            "spark.ui.enabled false" in (state_file.parent / "server.properties").read_text()
        )  # the job's server keys
    finally:
        stop_owned(state_file)
    assert not state_file.exists() and not started.running()


def test_a_server_whose_port_another_process_took_starts_on_another_port(
    tmp_path: Path, catalog_props: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The port is chosen free, then given to the server's JVM: another process may bind it first (seen
    in CI, with two streams of tests starting servers). That port answers, but not from the server: the
    start must not take it for the server's, and starts the server again on another port."""
    import socket

    from airflow_provider_kappa.engine import connect_server
    from airflow_provider_kappa.engine.processes import holds_listener
    from airflow_provider_kappa.job.config import load_config

    cfg = load_config(write_job_config(tmp_path, catalog_props, engine="connect"))
    thief = socket.socket()
    thief.bind(("127.0.0.1", 0))
    thief.listen(8)
    taken = thief.getsockname()[1]
    ports = iter([taken])
    real_free_port = connect_server.free_port
    monkeypatch.setattr(connect_server, "free_port", lambda: next(ports, None) or real_free_port())
    server = connect_server.LocalConnectServer(cfg, tmp_path / "connect", write_archive=False)
    try:
        server.start()
        port = int(server.url.rsplit(":", 1)[1])
        assert port != taken and server.alive()
        assert holds_listener(server.proc.pid, port) is True  # type: ignore[union-attr]
        assert holds_listener(server.proc.pid, taken) is False  # type: ignore[union-attr]
        assert holds_listener(os.getpid(), taken) is True
    finally:
        server.stop()
        thief.close()
    assert not server.alive()


def test_a_long_backfill_recycles_its_local_server_and_holds_a_bounded_process_count(
    tmp_path: Path,
    catalog_props: dict[str, str],
    catalog: Any,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Spark keeps each session's Python planner daemons for the server's life (about five per slice):
    with ``KAPPA_CONNECT_RECYCLE_EVERY=2``, four slices run on two servers one after the other, the
    daemons under a server stay those of at most two sessions, and the backfill is exact. Every slice
    runs in a spare runner started ahead of it (``--wait``), none is started after the last slice's, none is
    left at the end."""
    import psutil  # type: ignore[import-untyped]
    import pyarrow as pa
    from lake import sessions_arrow

    from airflow_provider_kappa.engine.connect_server import read_state
    from airflow_provider_kappa.engine.shared_server import RECYCLE_ENV

    monkeypatch.setenv(RECYCLE_ENV, "2")
    expected = seed_sessions_incident(catalog)
    config = write_job_config(tmp_path, catalog_props, engine="connect")
    checkpoints = tmp_path / "checkpoints"
    servers: set[int] = set()
    most = [0]
    runners: dict[str, set[int]] = {"--wait": set(), "--conf-file": set()}
    done = threading.Event()

    def sample_runners() -> None:
        """This process's Connect runners: spares (``--wait``) and runners started for a slice alone."""
        for p in psutil.Process().children(recursive=True):
            try:
                cmd = p.cmdline()
            except psutil.Error:
                continue
            if RUNNER_MODULE in cmd:
                runners["--wait" if "--wait" in cmd else "--conf-file"].add(p.pid)

    def sample() -> None:
        """The most ``pyspark.daemon`` processes under one server (Spark starts them as its children)."""
        while not done.is_set():
            sample_runners()
            for state_file in found(checkpoints, "connect/server.json"):
                state = read_state(state_file)
                if state is None:
                    continue
                servers.add(state.pid)
                try:
                    children = psutil.Process(state.pid).children()
                except psutil.Error:
                    continue
                daemons = 0
                for p in children:
                    try:
                        daemons += "pyspark.daemon" in " ".join(p.cmdline())
                    except psutil.Error:
                        pass
                most[0] = max(most[0], daemons)
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        code = main(["backfill", "--config", str(config), *WINDOW, *OPTIONS[:1], "1h", *OPTIONS[2:]])
    finally:
        done.set()
        sampler.join(timeout=5)
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "slices run 4/4" in out, out
    assert len(servers) == 2, servers  # sessions 1-2 and 3-4: recycled after the second one
    # without recycling, ~5 daemons per slice stay (37 by a seventh slice, measured: about 20 by the fourth);
    # with it, one server holds those of two sessions and the executors' shared daemon
    assert 0 < most[0] <= 14, most[0]
    target = catalog.load_table("prod.playback_sessions")
    assert sorted_rows(target) == sorted_rows(pa.Table.from_pylist(expected, schema=sessions_arrow()))
    assert not list(checkpoints.rglob("connect/server.json"))  # the last server stopped at the end
    # every slice ran in a spare started ahead, and one more was opened ahead on the first server, closed when it
    # was recycled; none was started for a slice after the last (engine.last_slice)
    assert runners["--conf-file"] == set() and len(runners["--wait"]) == 5, runners
    runners["--wait"].clear()
    sample_runners()
    assert runners["--wait"] == set(), runners


def test_a_backfill_refused_at_its_table_checks_stops_the_server_starting_beside_them_and_writes_nothing(
    tmp_path: Path,
    catalog_props: dict[str, str],
    catalog: Any,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``kappa backfill`` starts its local server while it checks the tables. A window outside the data
    is refused there (exit 2); here the real check waits until the server's JVM runs, so the refusal
    has a server to stop: it ends with its runner, and the folders its start created are gone."""
    import psutil  # type: ignore[import-untyped]

    import airflow_provider_kappa.cli.backfill as cli_backfill
    from airflow_provider_kappa.engine.connect_server import read_state

    seed_sessions_incident(catalog)
    config = write_job_config(tmp_path, catalog_props, engine="connect")
    checkpoints = tmp_path / "checkpoints"
    seen: list[Any] = []
    real_check = cli_backfill.check_data

    def check_once_the_server_runs(bf: Any) -> None:
        began = time.monotonic()
        while not seen and time.monotonic() - began < 120:
            state = next((read_state(f) for f in found(checkpoints, "connect/server.json")), None)
            if state is not None and state.running():
                seen.append(state)
            time.sleep(0.05)
        real_check(bf)

    monkeypatch.setattr(cli_backfill, "check_data", check_once_the_server_runs)
    code = main(
        ["backfill", "--config", str(config), "--start", "2026-11-02T01:00:00Z", "--end", "2026-11-02T03:00:00Z"]
    )
    out, err = capsys.readouterr()
    assert code == 2 and "is outside the tables' data" in err, out + err
    assert seen, "the local server never ran"
    assert not seen[0].running()  # stopped before kappa returned
    assert not checkpoints.exists()  # its folders, created by its start, removed
    left = []
    for p in psutil.Process().children(recursive=True):
        try:
            if RUNNER_MODULE in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE:
                left.append(p)
        except psutil.Error:  # gone, or a zombie of an earlier test: not running
            continue
    assert left == [], left
