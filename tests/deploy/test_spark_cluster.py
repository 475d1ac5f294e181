"""A real Spark standalone cluster (master + two workers on 127.0.0.1) runs PySpark jobs and a backfill.

- The harness (:mod:`deploy.spark_cluster`): executors run the venv's Python and import
  ``airflow_provider_kappa``; a worker SIGKILLed mid-job (with its executor) loses nothing:
  Spark reruns its tasks on the other worker and the result is exact.
- A real ``kappa backfill --mode parallel`` of the example playback-sessions job submits its
  slices to the cluster; a worker is SIGKILLed while a micro-batch of a slice runs, and the
  published table is exactly the correct rows.
- kappa's launcher (``backfill.submit``) on the cluster: executors run a packed virtualenv shipped
  through ``spark.archives`` (``job.python_archive``), not the driver machine's venv; the platform's
  spark-defaults are kept; ``job.env`` reaches the driver and executors; the catalogs file is shipped
  with the application and read through SparkFiles; the event log goes to the user's folder.
"""

from __future__ import annotations

import json
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lake import INCIDENT_END, INCIDENT_START, seed_sessions_incident, sessions_arrow, sorted_rows
from servers import ServerProcess, wait_until
from servers.spark_cluster import SparkCluster, client_conf, packed_venv, spark_cluster

import airflow_provider_kappa

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
            lambda: (
                {str(victim), str(cluster.worker_dir(1))} <= {str(Path(m["cwd"]).parents[1]) for m in _markers(markers)}
            ),
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
    raw["catalogs"] = {
        "lake": {"type": "sql", "uri": f"sqlite:///{lake}/catalog.db", "warehouse": f"file://{lake}/warehouse"}
    }
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
    catalog: Any = load_catalog(
        "lake", type="sql", uri=f"sqlite:///{lake}/catalog.db", warehouse=f"file://{lake}/warehouse"
    )
    expected = sorted_rows(pa.Table.from_pylist(seed_sessions_incident(catalog), schema=sessions_arrow()))
    assert sorted_rows(catalog.load_table("prod.playback_sessions")) != expected, "the seeded incident must differ"
    config = cluster_job_config(tmp_path, cluster, lake)
    argv = [
        str(Path(sys.executable).parent / "kappa"),
        "backfill",
        "--config",
        str(config),
        "--start",
        INCIDENT_START.isoformat(),
        "--end",
        INCIDENT_END.isoformat(),
        "--mode",
        "parallel",
        "--slice",
        "2h",
        "--warmup",
        "30min",
        "--tail",
        "45min",
    ]
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


# Reports, from every executor and from the driver, which Python runs and what it sees.
PROBE = textwrap.dedent(
    """
    import json, os, sys
    from pyspark.sql import SparkSession

    out = sys.argv[1]
    spark = SparkSession.builder.getOrCreate()

    def seen():
        import airflow_provider_kappa
        from airflow_provider_kappa.spark.settings import read_catalogs_file

        return {
            "python": sys.executable, "prefix": sys.prefix, "package": airflow_provider_kappa.__file__,
            "cwd": os.getcwd(), "from_defaults": os.environ.get("KAPPA_FROM_DEFAULTS"),
            "job_env": os.environ.get("KAPPA_JOB_ENV"),
            # a path no process here has: only the copy shipped with the application can answer
            "catalogs": read_catalogs_file("/not-on-this-machine/catalogs.json"),
        }

    executors = spark.sparkContext.parallelize(range(4), 4).mapPartitions(lambda rows: [seen()]).collect()

    # A Python data source, as kappa_iceberg, is planned in a Python worker of the driver: the same
    # spark.pyspark.python as executors. Its schema names the planner's environment. (Reading it on
    # executors would need pyarrow in the archive: a real job's archive holds it, this small one not.)
    from pyspark.sql.datasource import DataSource

    class Probe(DataSource):
        @classmethod
        def name(cls):
            return "kappa_probe"

        def schema(self):
            return f"`{sys.prefix}` string"

    spark.dataSource.register(Probe)
    source = {"planner": spark.read.format("kappa_probe").load().columns[0]}
    with open(out, "w") as fh:
        json.dump({"executors": executors, "driver": seen(), "source": source}, fh)
    spark.stop()
    """
)


@pytest.fixture(scope="session")
def python_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small packed virtualenv executors run (built once per session)."""
    t0 = time.monotonic()
    archive = packed_venv(tmp_path_factory.mktemp("packed-venv"))
    print(f"packed venv built in {time.monotonic() - t0:.2f}s: {archive.stat().st_size} bytes")
    return archive


def test_launcher_ships_a_packed_venv_the_catalogs_and_keeps_defaults_env_and_event_log(
    cluster: SparkCluster, python_archive: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_provider_kappa.engine.progress import event_log_conf
    from airflow_provider_kappa.engine.submit import submit

    secret = f"kappa-planted-{time.time_ns()}"
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    catalogs = private / "catalogs.json"
    catalogs.write_text(json.dumps({"lake": {"type": "sql", "credential": secret}}))
    catalogs.chmod(0o600)
    conf_dir = tmp_path / "spark-conf"  # the platform's spark-defaults.conf
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text("spark.executorEnv.KAPPA_FROM_DEFAULTS  defaults-kept\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf_dir))
    history = tmp_path / "history"  # the user's spark.eventLog.dir
    history.mkdir()
    conf = {k: v for k, v in client_conf().items() if "python" not in k.lower()}  # Python: from the archive
    conf.update(
        {
            "spark.kappa.catalogs.file": str(catalogs),
            "spark.kappa.submit.python_archive": str(python_archive),
            "spark.kappa.submit.env.KAPPA_JOB_ENV": "from-job-env",
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": history.as_uri(),
            **event_log_conf(private / "events"),
        }
    )
    app = tmp_path / "probe.py"
    app.write_text(PROBE)
    out = tmp_path / "seen.json"
    props = private / "spark.properties"
    t0 = time.monotonic()
    submit(
        app,
        conf,
        properties_file=props,
        name="kappa-packed-venv",
        master=cluster.master_url,
        class_data_sharing=False,
        application_args=[str(out)],
    )
    print(f"packed-venv probe on the cluster took {time.monotonic() - t0:.1f}s")
    seen = json.loads(out.read_text())
    workers = {str(cluster.worker_dir(i)) for i in range(cluster.workers)}
    for ex in seen["executors"]:
        # the unpacked archive in the executor's work dir, not the driver machine's venv
        assert ex["prefix"].endswith("/kappa_env") and ex["prefix"].startswith(ex["cwd"]), ex
        assert str(Path(ex["cwd"]).parents[1]) in workers, ex
        assert ex["python"] != sys.executable and ex["package"].startswith(ex["prefix"] + "/lib/"), ex
        assert (ex["from_defaults"], ex["job_env"]) == ("defaults-kept", "from-job-env"), ex
        assert ex["catalogs"] == {"lake": {"type": "sql", "credential": secret}}, ex
    # the driver's Python workers run ./kappa_env/bin/python too: there, the link to this machine's venv
    assert Path(seen["source"]["planner"]).resolve() == Path(sys.prefix).resolve(), seen["source"]
    driver = seen["driver"]
    assert driver["python"] == sys.executable and driver["job_env"] == "from-job-env", driver  # client mode: here
    assert driver["catalogs"]["lake"]["credential"] == secret
    # the credential is in the shipped catalogs file only, not in the properties file (0600), which holds
    # the whole conf (spark-submit's command line holds only paths: test_airflow.py samples /proc for it)
    assert secret not in props.read_text() and props.stat().st_mode & 0o077 == 0
    # the event log went to the user's folder (Spark 4 writes a rolling log: a folder per application)
    ours = [p for p in history.rglob("events_*") if '"spark.kappa.run.id"' in p.read_text(errors="replace")]
    assert len(ours) == 1, sorted(history.rglob("*"))
    # and the launcher found this run's log there by its run id (an RDD job: no streaming progress in it)
    assert [p.name for p in (private / "events").iterdir()] == [ours[0].parent.name]
