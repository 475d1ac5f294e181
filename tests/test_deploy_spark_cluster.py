"""A real Spark standalone cluster (master + two workers on 127.0.0.1) runs PySpark jobs.

Proves the harness of :mod:`deploy.spark_cluster`: executors run the venv's Python and import
``airflow_provider_kappa``; a worker SIGKILLed mid-job (with its executor) loses nothing:
Spark reruns its tasks on the other worker and the result is exact.
"""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path
from typing import Iterator

import pytest

import airflow_provider_kappa

from deploy import wait_until
from deploy.spark_cluster import SparkCluster, spark_cluster

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
