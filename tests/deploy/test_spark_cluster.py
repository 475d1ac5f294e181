"""A real Spark standalone cluster (master + two workers on 127.0.0.1) runs PySpark jobs and a backfill.

- The harness (:mod:`deploy.spark_cluster`): executors run the venv's Python and import
  ``airflow_provider_kappa``; a worker SIGKILLed mid-job (with its executor) loses nothing:
  Spark reruns its tasks on the other worker and the result is exact.
- A real ``kappa backfill --mode parallel`` of the example playback-sessions job submits its
  slices to the cluster; a worker is SIGKILLed while a micro-batch of a slice runs, and the
  published table is exactly the correct rows.
"""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from lake import INCIDENT_END, INCIDENT_START, seed_sessions_incident, sessions_arrow, sorted_rows

import airflow_provider_kappa

from servers import ServerProcess, wait_until
from servers.spark_cluster import SparkCluster, client_conf, spark_cluster

# One task per partition; each task sleeps so that a worker can be killed while tasks run.
JOB = textwrap.dedent(
    """
    import json, os, sys, time
    from pyspark.sql import SparkSession

    markers, partitions, sleep_s, out = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    spark = SparkSession.builder.appName("kappa-cluster-test").getOrCreate()
    sc = spark.sparkContext

    def work(index, rows):
        import airflow_provider_kappa  # the package must be importable on every executor
        from pyspark import TaskContext

        ctx = TaskContext.get()
        marker = os.path.join(markers, f"p{index}-t{ctx.taskAttemptId()}")
        with open(marker, "w") as fh:
            json.dump({"cwd": os.getcwd(), "package": airflow_provider_kappa.__file__, "python": sys.executable}, fh)
        time.sleep(sleep_s)
        for n in rows:
            yield (n % 7, n)

    pairs = sc.parallelize(range(1, 1001), partitions).mapPartitionsWithIndex(work)
    # A shuffle after the killed stage: lost map outputs must be recomputed too.
    sums = dict(pairs.reduceByKey(lambda a, b: a + b).collect())
    with open(out, "w") as fh:
        json.dump({str(k): v for k, v in sums.items()}, fh)
    spark.stop()
    """
)

EXPECTED = {str(k): sum(n for n in range(1, 1001) if n % 7 == k) for k in range(7)}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """One standalone master and two 1-core workers for this module."""
    t0 = time.monotonic()
    with spark_cluster(tmp_path_factory.mktemp("spark-cluster"), workers=2) as c:
        print(f"spark cluster started in {time.monotonic() - t0:.1f}s {c.timings}")
        yield c


@pytest.fixture(autouse=True)
def all_workers_alive(cluster: SparkCluster) -> Iterator[None]:
    """Every test starts with both workers ALIVE; a worker a test killed is started again after it."""
    yield
    for i, worker in enumerate(cluster.worker_procs):
        if not worker.alive():
            cluster.restart_worker(i)


def _markers(folder: Path) -> list[dict[str, str]]:
    out = []
    for path in folder.iterdir():
        try:
            out.append({"name": path.name, **json.loads(path.read_text())})
        except ValueError:
            continue  # written but not yet flushed: read at the next poll
    return out


def test_cluster_registers_two_workers_on_loopback(cluster: SparkCluster) -> None:
    state = cluster.state() or {}
    alive = [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]
    assert len(alive) == 2, cluster.describe()
    assert all(w["host"] == "127.0.0.1" for w in alive), alive
    assert cluster.master_url == state["url"], state


def test_worker_killed_mid_job_result_still_exact(cluster: SparkCluster, tmp_path: Path) -> None:
    app = tmp_path / "job.py"
    app.write_text(JOB)
    markers = tmp_path / "markers"
    markers.mkdir()
    out = tmp_path / "result.json"
    driver = cluster.submit(app, args=[str(markers), "8", "3", str(out)], log_path=tmp_path / "driver.log")
    try:
        victim = cluster.worker_dir(0)
        # Mid-job: both workers' executors are running tasks of the first stage.
        wait_until(
            lambda: {str(victim), str(cluster.worker_dir(1))} <= {str(Path(m["cwd"]).parents[1]) for m in _markers(markers)},
            timeout=120,
            what="tasks running on both workers",
            servers=[driver, *cluster.worker_procs],
        )
        assert not out.exists(), "the job finished before the worker could be killed"
        cluster.kill_worker(0)
        killed_at = time.monotonic()
        rc = driver.popen.wait(timeout=150)
    finally:
        if driver.alive():
            driver.stop()
    driver_log = (tmp_path / "driver.log").read_text(errors="replace")
    assert rc == 0, f"driver exited {rc}:\n{driver.log_tail(60)}\n{cluster.describe()}"
    assert json.loads(out.read_text()) == EXPECTED
    # The kill really hit running work: the driver lost an executor and reran tasks elsewhere.
    assert "Lost executor" in driver_log or "ExecutorLostFailure" in driver_log, driver.log_tail(80)
    seen = _markers(markers)
    assert {m["package"] for m in seen} == {airflow_provider_kappa.__file__}, seen
    assert {m["python"] for m in seen} == {str(Path(cluster.env()["PYSPARK_PYTHON"]))}, seen
    # Some partition started on the killed worker ran again on the surviving one.
    def partitions_on(worker: int) -> set[str]:
        return {m["name"].split("-")[0] for m in seen if Path(m["cwd"]).parents[1] == cluster.worker_dir(worker)}

    assert partitions_on(0) & partitions_on(1), sorted((m["name"], m["cwd"]) for m in seen)
    assert cluster.alive_workers() == 1
    print(f"job finished {time.monotonic() - killed_at:.1f}s after the kill")


EXAMPLES = Path(airflow_provider_kappa.__file__).parent / "examples"


def cluster_job_config(folder: Path, cluster: SparkCluster, lake: Path) -> Path:
    """The example playback_sessions kappa.yaml, on ``lake``, submitting to ``cluster``."""
    raw = yaml.safe_load((EXAMPLES / "playback_sessions" / "kappa.yaml").read_text())
    raw["job"]["application"] = str(EXAMPLES / "playback_sessions" / "playback_sessions.py")
    raw["job"]["checkpoint_root"] = str(folder / "checkpoints")
    raw["job"]["master"] = cluster.master_url
    raw["job"]["engine"] = "submit"  # batch clusters run a spark-submit per slice (engine connect: tests/integration)
    raw["job"]["spark_conf"] = client_conf()
    raw["catalogs"] = {"lake": {"type": "sql", "uri": f"sqlite:///{lake}/catalog.db", "warehouse": f"file://{lake}/warehouse"}}
    path = folder / "kappa.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def running_batch(checkpoints: Path) -> str | None:
    """A micro-batch in flight after at least one completed: ``<query dir>#<batch>``, else None."""
    for offsets in checkpoints.glob("**/offsets"):
        commits = offsets.parent / "commits"
        started = {p.name for p in offsets.iterdir() if p.name.isdigit()}
        done = {p.name for p in commits.iterdir() if p.name.isdigit()} if commits.is_dir() else set()
        if done and started - done:
            return f"{offsets.parent}#{max(started - done, key=int)}"
    return None


def test_parallel_backfill_on_the_cluster_survives_a_killed_worker(cluster: SparkCluster, tmp_path: Path) -> None:
    import pyarrow as pa
    from pyiceberg.catalog import load_catalog

    lake = tmp_path / "lake"
    (lake / "warehouse").mkdir(parents=True)
    catalog: Any = load_catalog("lake", type="sql", uri=f"sqlite:///{lake}/catalog.db", warehouse=f"file://{lake}/warehouse")
    expected = sorted_rows(pa.Table.from_pylist(seed_sessions_incident(catalog), schema=sessions_arrow()))
    assert sorted_rows(catalog.load_table("prod.playback_sessions")) != expected, "the seeded incident must differ"
    config = cluster_job_config(tmp_path, cluster, lake)
    argv = [
        str(Path(sys.executable).parent / "kappa"), "backfill", "--config", str(config),
        "--start", INCIDENT_START.isoformat(), "--end", INCIDENT_END.isoformat(),
        "--mode", "parallel", "--slice", "2h", "--warmup", "30min", "--tail", "45min",
    ]  # fmt: skip
    t0 = time.monotonic()
    cli = ServerProcess("kappa backfill", argv, tmp_path / "kappa-backfill.log", cluster.env(), cwd=tmp_path)
    try:
        batch = wait_until(
            lambda: running_batch(tmp_path / "checkpoints"),
            timeout=400,
            what="a micro-batch of a slice running on the cluster",
            servers=[cli, *cluster.worker_procs],
            interval=0.2,
        )
        cluster.kill_worker(0)
        print(f"killed worker 0 during {batch} at {time.monotonic() - t0:.1f}s")
        rc = cli.popen.wait(timeout=600)
    finally:
        if cli.alive():
            cli.stop()
    elapsed = time.monotonic() - t0
    # Spark's output: the CLI's own log (it may carry a slice's spark-submit output) and the slice logs.
    logs = [tmp_path / "kappa-backfill.log", *sorted((tmp_path / "checkpoints").glob("**/logs/*"))]
    tails = "\n".join(f"--- {p}\n" + p.read_text(errors="replace")[-3000:] for p in logs)
    assert rc == 0, f"kappa backfill exited {rc}:\n{tails}\n{cluster.describe()}"
    # The kill hit the running backfill: the driver lost the worker's executor.
    assert "Lost executor" in "".join(p.read_text(errors="replace") for p in logs), tails
    got = sorted_rows(catalog.load_table("prod.playback_sessions"))
    diff = sorted(set(got) ^ set(expected), key=repr)
    assert got == expected, [("published only" if r in got else "expected only", r) for r in diff]
    print(f"parallel backfill on the cluster finished in {elapsed:.1f}s")
