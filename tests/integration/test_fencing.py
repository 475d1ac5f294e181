"""Fencing: a superseded run of a slice can neither commit to staging nor keep its checkpoint, and
the Spark processes of a killed launcher end with it.

The old run is kept alive for real: the job is the unchanged example sessionizer, its input passed
through a ``mapInArrow`` that holds the first micro-batch of the first process to claim a ``hold``
file until the test writes ``release`` (:data:`HELD_APP`). So the old run's driver is in the middle
of a micro-batch, its files not yet committed, while the retry runs.

- the retry while the old run (its launcher still alive) is held: the old run's commit is refused
  (the staging table belongs to the retry's epoch), its launcher keeps no checkpoint and records
  nothing done, the staging table holds exactly the retry's rows;
- ``kappa backfill`` SIGKILLed while its slice is held: every process under it ends (checked by
  pid), and its private folder (the 0600 catalogs file) is removed by the next run;
- an Airflow slice task killed (SIGTERM to the task's process during ``dag.test()``, the task
  runner calls ``on_kill``) while its slice is held: its spark-submit and everything under it end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import airflow_env  # noqa: F401  (sets AIRFLOW_HOME before Airflow is imported)
import pytest
from airflow_env import REPO, airflow_db, write_job_config  # noqa: F401  (fixture)
from lake import T0, seed_sessions_incident, sessions_arrow, sorted_rows

from airflow_provider_kappa.backfill import plan as planning
from airflow_provider_kappa.backfill import slices as slice_steps
from airflow_provider_kappa.backfill import snapshot
from airflow_provider_kappa.backfill.backfill import Backfill
from airflow_provider_kappa.exceptions import KappaSupersededError
from airflow_provider_kappa.job.config import load_config

TARGET = "prod.playback_sessions"
#: one slice over the whole read range [00:00, 02:00), two micro-batches (ingestion before and after
#: LATE): its staging table must hold exactly the sessions that start in the window [00:30, 01:30)
#: (all closed by 01:47's watermark)
START, END, LATE = T0 + timedelta(minutes=30), T0 + timedelta(minutes=90), T0 + timedelta(hours=1)
PARAMS = {
    "start": START.isoformat(),
    "end": END.isoformat(),
    "slice": "2h",
    "warmup": "30min",
    "tail": "30min",
    "max_misalignment_threshold": "1h",
}
CLI = [
    "--start",
    PARAMS["start"],
    "--end",
    PARAMS["end"],
    "--slice",
    "2h",
    "--warmup",
    "30min",
    "--tail",
    "30min",
    "--max-misalignment",
    "1h",
]
EXAMPLE_APP = REPO / "airflow_provider_kappa" / "examples" / "playback_sessions" / "playback_sessions.py"
HOLD_ENV = "KAPPA_TEST_HOLD"
HELD_APP = f'''
"""The example sessionizer, unchanged, its input passed through a map that can hold a micro-batch: the
first task to see rows ingested before {LATE.isoformat()} claims $KAPPA_TEST_HOLD/hold-early (if it
exists) and waits for $KAPPA_TEST_HOLD/release-early; rows from then on: hold-late, release-late.
The first micro-batch commit with files: hold-commit, release-commit (in the writer's commit, on the
driver, before anything is committed)."""
import datetime
import os
import runpy
import time

import airflow_provider_kappa.spark as kappa_spark
import airflow_provider_kappa.spark.resolve as resolve
from airflow_provider_kappa.spark.datasource import KappaIcebergDataSource
from airflow_provider_kappa.spark.sink import KappaIcebergStreamWriter

FOLDER = os.environ["{HOLD_ENV}"]
LATE = datetime.datetime.fromisoformat({LATE.isoformat()!r})
read_source = kappa_spark.read_source


def claim(name):
    try:
        os.rename(os.path.join(FOLDER, "hold-" + name), os.path.join(FOLDER, "held-" + name))  # one task wins
    except FileNotFoundError:
        return
    deadline = time.monotonic() + 600
    while not os.path.exists(os.path.join(FOLDER, "release-" + name)) and time.monotonic() < deadline:
        time.sleep(0.1)


def hold(batches):
    for batch in batches:
        if batch.num_rows:
            claim("late" if max(batch.column("ingestion_ts").to_pylist()) >= LATE else "early")
        yield batch


class HeldWriter(KappaIcebergStreamWriter):
    def commit(self, messages, batchId):
        if any(getattr(m, "files", None) for m in messages):
            claim("commit")
        super().commit(messages, batchId)


class HeldSource(KappaIcebergDataSource):
    def streamWriter(self, schema, overwrite):
        return HeldWriter(schema, self.options, overwrite)


def held_read_source(spark, name):
    df = read_source(spark, name)
    return df.mapInArrow(hold, df.schema)


kappa_spark.read_source = held_read_source
resolve.KappaIcebergDataSource = HeldSource
runpy.run_path({str(EXAMPLE_APP)!r}, run_name="__main__")
'''


def expected_window(oracle: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    import pyarrow as pa

    inside = [s for s in oracle if START <= s["session_start"] < END]
    return sorted_rows(pa.Table.from_pylist(inside, schema=sessions_arrow()))


@pytest.fixture()
def held(
    tmp_path: Path, catalog_props: dict[str, str], catalog: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, Any]]:
    """The lake, a job config whose application is :data:`HELD_APP`, and the hold folder (the first
    micro-batch of the first run held: ``hold-early``)."""
    oracle = seed_sessions_incident(catalog, "raw.playbacks", TARGET)
    # engine submit: what is fenced and stopped is a slice's spark-submit (its driver JVM, its process group)
    path = write_job_config(tmp_path, catalog_props, engine="submit")
    app = tmp_path / "held_app.py"
    app.write_text(HELD_APP)
    path.write_text(path.read_text().replace(str(EXAMPLE_APP), str(app)))
    hold = tmp_path / "hold"
    hold.mkdir()
    (hold / "hold-early").touch()
    monkeypatch.setenv(HOLD_ENV, str(hold))
    out = {"config": path, "hold": hold, "oracle": oracle, "catalog": catalog, "folder": tmp_path}
    try:
        yield out
    finally:
        for name in ("early", "late", "commit"):
            (hold / f"release-{name}").touch()  # never leave a held Spark run behind


def wait_for(predicate: Any, what: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


def descendants(pid: int) -> dict[int, float]:
    """pid -> create time of every process under ``pid``."""
    import psutil  # type: ignore[import-untyped]

    return {p.pid: p.create_time() for p in psutil.Process(pid).children(recursive=True)}


def survivors(procs: dict[int, float], timeout: float = 30.0) -> list[str]:
    """Those of ``procs`` (pid -> create time: a reused pid is another process) still running after
    ``timeout`` seconds, described."""
    import psutil

    def running() -> list[Any]:
        out = []
        for pid, created in procs.items():
            try:
                p = psutil.Process(pid)
                if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.NoSuchProcess:
                pass
        return out

    deadline = time.monotonic() + timeout
    while running() and time.monotonic() < deadline:
        time.sleep(0.2)
    described = []
    for p in running():  # never leave them behind, whatever the test concludes
        try:
            described.append(f"{p.pid} {' '.join(p.cmdline())[:300]}")
            p.kill()
        except psutil.Error:
            described.append(f"{p.pid} (gone while being described)")
    return described


def test_a_retry_fences_out_the_old_run_still_running_its_micro_batch(
    held: dict[str, Any], capfd: pytest.CaptureFixture[str]
) -> None:
    """Attempt 1 (its launcher alive, in a thread) is held in the commit of its first micro-batch with
    output (files written, nothing committed); the retry clears the slice and is held in its first
    micro-batch; attempt 1, released, tries to commit into the retry's staging table: refused, and its
    launcher fails without keeping its checkpoint or recording the slice done. The retry, released,
    commits every batch of its own (none taken for already committed) and stages exactly the window."""
    catalog = held["catalog"]
    hold = held["hold"]
    (hold / "hold-early").rename(hold / "hold-commit")  # attempt 1 is held in its first commit
    bf = Backfill.create(load_config(held["config"]), PARAMS)
    (sp,) = planning.plan(bf, snapshot.snapshot(bf)).slices
    store = bf.store()
    staging = bf.staging_table(bf.cfg.sinks["sessions"], sp.slice_id)
    old: dict[str, Any] = {}
    new: dict[str, Any] = {}

    def attempt(out: dict[str, Any]) -> None:
        try:
            out["result"] = slice_steps.run_slice(bf, sp)
        except BaseException as e:  # noqa: BLE001  (asserted below)
            out["error"] = e

    first = threading.Thread(target=attempt, args=(old,), daemon=True)
    first.start()
    wait_for(lambda: (hold / "held-commit").exists() or not first.is_alive(), "attempt 1 to hold its first commit")
    assert first.is_alive(), old
    old_epoch = store.current_epoch(sp.slice_id)

    (hold / "hold-early").touch()  # the retry is held in its first micro-batch
    retry = threading.Thread(target=attempt, args=(new,), daemon=True)
    retry.start()
    wait_for(lambda: (hold / "held-early").exists() or not retry.is_alive(), "the retry to hold its first micro-batch")
    assert retry.is_alive(), new
    epoch = store.current_epoch(sp.slice_id)
    assert epoch != old_epoch

    (hold / "release-commit").touch()  # the old driver goes on committing its micro-batch
    first.join(timeout=300)
    assert not first.is_alive()
    (hold / "release-early").touch()
    retry.join(timeout=300)
    assert not retry.is_alive()
    # the old run fails: its commit was refused (by the sink, inside its Spark driver); its launcher keeps nothing
    assert "result" not in old and isinstance(old.get("error"), KappaSupersededError), old
    assert f"KappaSupersededError: staging table {staging!r} belongs to epoch {epoch!r}" in capfd.readouterr().out
    assert "result" in new, new
    assert store.current_epoch(sp.slice_id) == epoch
    assert store.done(sp.slice_id) == new["result"]
    # staging: exactly the window, every snapshot the retry's, one per micro-batch with output
    table = catalog.load_table(staging)
    assert sorted_rows(table) == expected_window(held["oracle"])
    assert {s.summary.get("kappa.epoch") for s in table.snapshots()} == {epoch}
    # the retry's checkpoint: its own offsets and commits only; the old attempt's folder is gone
    checkpoint = Path(store.attempt(sp.slice_id, epoch or ""))
    offsets = sorted(int(p.name) for p in (checkpoint / "sessions" / "offsets").iterdir() if p.name.isdigit())
    commits = sorted(int(p.name) for p in (checkpoint / "sessions" / "commits").iterdir() if p.name.isdigit())
    assert offsets == commits == list(range(new["result"]["batches"])) and len(offsets) >= 2
    assert not Path(store.attempt(sp.slice_id, old_epoch or "")).exists()


#: after a SIGKILL of ``kappa backfill``, every process it started is gone within this many seconds
GONE_WITHIN = 5.0


@pytest.mark.parametrize("engine", ["submit", "connect"])
def test_kappa_backfill_sigkilled_leaves_no_spark_process_and_no_catalogs_file(
    held: dict[str, Any], engine: str
) -> None:
    """``kappa backfill`` SIGKILLed while its slice's micro-batch runs: every process under it ends by
    itself within :data:`GONE_WITHIN` seconds (parent-death signal), on both engines: spark-submit,
    driver and Python workers; or the local Connect server, its warm daemon and its Python workers,
    and the slice's Connect runner. Its private folder with the catalogs file is removed by the next
    run on the machine."""
    from airflow_provider_kappa.engine.processes import private_folder

    config = held["config"]
    config.write_text(config.read_text().replace("engine: submit", f"engine: {engine}"))
    assert f"engine: {engine}" in config.read_text()
    env = {**os.environ, "TMPDIR": str(held["folder"] / "tmp")}
    (held["folder"] / "tmp").mkdir()
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "kappa"), "backfill", "--config", str(held["config"]), *CLI],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(
            lambda: (held["hold"] / "held-early").exists() or proc.poll() is not None,
            "the slice to hold its first micro-batch",
        )
        assert proc.poll() is None
        tree = descendants(proc.pid)
        assert len(tree) >= 2, tree  # spark-submit (its JVM) or the server and the runner, and Python processes
        if engine == "connect":
            assert any("engine.connect_runner" in " ".join(_cmdline(pid)) for pid in tree), tree
        private = [p for p in (held["folder"] / "tmp").iterdir() if (p / "catalogs.json").exists()]
        assert len(private) == 1, private
        proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        proc.wait(timeout=30)
        left = survivors(tree, timeout=GONE_WITHIN - (time.monotonic() - killed))
        assert left == [], f"still running {GONE_WITHIN:.0f}s after the SIGKILL: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
    assert private[0].exists()  # SIGKILL: nothing of the killed process ran
    with private_folder("next", held["folder"] / "tmp") as mine:
        assert not private[0].exists()
        assert mine.exists()


def test_an_airflow_slice_task_killed_stops_its_spark_submit(held: dict[str, Any], airflow_db: None) -> None:  # noqa: F811
    """SIGTERM to the task's process while its slice's micro-batch runs (what the supervisor sends a
    task marked failed, cleared or timed out): the task runner calls ``on_kill``, which stops the
    slice's spark-submit and every process under it; the task fails."""
    import psutil

    from airflow_provider_kappa.dag import kappa_backfill_dag

    dag = kappa_backfill_dag(str(held["config"]), dag_id="kappa_backfill_playback_sessions", slice_retries=0)
    before = {p.pid for p in psutil.Process().children()}
    spark: dict[int, float] = {}
    commands: list[str] = []
    errors: list[BaseException] = []
    left: list[str] = []

    def kill_when_held() -> None:
        try:
            wait_for(lambda: (held["hold"] / "held-early").exists(), "the slice task to hold its first micro-batch")
            for child in psutil.Process().children():
                if child.pid not in before:  # the slice's spark-submit, and everything under it
                    spark.update({child.pid: child.create_time(), **descendants(child.pid)})
            commands.extend(" ".join(_cmdline(pid)) for pid in spark)
            os.kill(os.getpid(), signal.SIGTERM)  # the task runner's handler calls the operator's on_kill
            # bounded wait: stop_submit gives the JVM 60 s after SIGTERM, then SIGKILLs its group (a loaded
            # machine's JVM can take over 30 s to run its shutdown hooks); whatever still runs is killed and reported
            left.extend(survivors(spark, timeout=75.0))
        except BaseException as e:  # noqa: BLE001  (asserted below)
            errors.append(e)

    previous = signal.getsignal(signal.SIGTERM)
    killer = threading.Thread(target=kill_when_held, daemon=True)
    killer.start()
    try:
        dr = dag.test(run_conf=PARAMS)
    finally:
        signal.signal(signal.SIGTERM, previous)
        killer.join(timeout=120)
    assert errors == []
    assert any("SparkSubmit" in c for c in commands), commands  # the spark-submit's JVM ran when the task was killed
    assert left == []
    states = {(ti.task_id, ti.map_index): ti.state for ti in dr.get_task_instances()}
    assert states[("slice_sequential", 0)] == "failed"


#: A Connect runner (its module imported, its stop watch running, no signal handler: nothing is sent)
#: under a launcher that exits (``orphan``) or lives on, once the runner has read its launcher's pid.
_RUNNER_UNDER_A_LAUNCHER = """
import os, sys, threading, time
r, w = os.pipe()
if os.fork():
    os.read(r, 1)
    if sys.argv[1] == "orphan":
        os._exit(0)
    time.sleep(60)
    os._exit(0)
from airflow_provider_kappa.engine import connect_runner
threading.Thread(target=connect_runner.watch_stop, daemon=True).start()
print(os.getpid(), flush=True)
os.write(w, b"x")
time.sleep(60)
"""


def test_a_connect_runner_whose_launcher_is_gone_ends_within_its_orphan_budget_with_no_signal() -> None:
    """The runner's stop watch ends it :data:`ORPHAN_STOP_SECONDS` after its launcher is gone, with no
    signal at all (the parent-death signal's handler may never run on a stuck main thread: a CI run
    once saw a runner outlive its SIGKILLed ``kappa backfill`` by 5 s); a runner whose launcher lives
    keeps running."""
    import psutil

    from airflow_provider_kappa.engine.connect_runner import ORPHAN_STOP_SECONDS

    launchers = {
        how: subprocess.Popen([sys.executable, "-c", _RUNNER_UNDER_A_LAUNCHER, how], stdout=subprocess.PIPE, text=True)
        for how in ("orphan", "lives")
    }
    runners = {how: psutil.Process(int(p.stdout.readline())) for how, p in launchers.items() if p.stdout}
    try:
        orphan = runners["orphan"]
        assert survivors({orphan.pid: orphan.create_time()}, timeout=ORPHAN_STOP_SECONDS + 1.5) == []
        assert runners["lives"].status() != psutil.STATUS_ZOMBIE
    finally:
        for p in launchers.values():
            p.kill()
            p.wait()
        for runner in runners.values():
            if runner.is_running():
                runner.kill()


def _cmdline(pid: int) -> list[str]:
    import psutil

    try:
        return list(psutil.Process(pid).cmdline())
    except psutil.NoSuchProcess:
        return []


def test_on_kill_of_a_connect_slice_stops_its_query_inside_the_server(
    held: dict[str, Any], catalog_props: dict[str, str], connect_server: Any
) -> None:
    """Engine connect: the query runs inside a shared Spark Connect server, where a killed client
    would leave it running. The slice operator's ``on_kill`` (called while the run is live, as the
    task runner calls it) ends the runner and its session: the session is closed on the server (its
    queries stopped), the held micro-batch never commits, and the launcher fails."""
    from airflow_provider_kappa.engine.connect_server import with_session_id
    from airflow_provider_kappa.operators.slice_run import KappaSliceRunOperator

    (held["folder"] / "connect").mkdir()
    path = write_job_config(held["folder"] / "connect", catalog_props, engine="connect", connect_url=connect_server.url)
    path.write_text(path.read_text().replace(str(EXAMPLE_APP), str(held["folder"] / "held_app.py")))
    bf = Backfill.create(load_config(path), PARAMS)
    (sp,) = planning.plan(bf, snapshot.snapshot(bf)).slices
    store = bf.store()
    run: dict[str, Any] = {}

    def attempt() -> None:
        try:
            run["result"] = slice_steps.run_slice(bf, sp, connect_url=connect_server.url)
        except BaseException as e:  # noqa: BLE001  (asserted below)
            run["error"] = e

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    wait_for(
        lambda: (held["hold"] / "held-early").exists() or not thread.is_alive(),
        "the session's query to hold its micro-batch",
    )
    assert thread.is_alive(), run
    session = store.session(sp.slice_id)
    assert session is not None
    KappaSliceRunOperator(task_id="slice", config_path=str(path), slice_plan=sp.to_dict()).on_kill()
    thread.join(timeout=120)
    assert not thread.is_alive() and "error" in run, run
    (held["hold"] / "release-early").touch()  # were the query still running, it would now commit
    from pyspark.sql import SparkSession

    # a Connect session in this process puts pyspark in Connect mode through the environment
    # (SPARK_CONNECT_MODE_ENABLED, SPARK_REMOTE), which later tests' classic session and spark-submit
    # children would inherit: restore it after the check
    saved = {k: os.environ.get(k) for k in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")}
    spark = SparkSession.builder.remote(with_session_id(connect_server.url, session["session_id"])).create()
    try:
        with pytest.raises(Exception, match="SESSION_CLOSED"):
            _ = spark.streams.active
    finally:
        spark.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    time.sleep(3)
    assert (
        catalog_props
        and held["catalog"].load_table(bf.staging_table(bf.cfg.sinks["sessions"], sp.slice_id)).current_snapshot()
        is None
    )
    assert connect_server.alive()  # a session's end never stops the server
