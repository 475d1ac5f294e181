"""Benchmark (not a test): a job's driver forked from the warm daemon's zygote against a cold one.

A spark-submit with a local master that kappa starts (a ``submit`` slice, ``kappa run``, ``kappa land``)
runs Spark's Python processes through :class:`~airflow_provider_kappa.engine.warm_python.WarmPython`'s
wrapper. Its driver, ``python APP.py``, is now forked from the zygote too. This script spark-submits the
same small application (a SparkSession, a query of 1,000 rows through a Python UDF, stop) alternately
with the driver cold (the wrapper's ``exec python APP.py``) and warm (the zygote forks it), ``--repeat``
times each, with one zygote for the whole run (as one ``kappa backfill`` has). The UDF's worker is forked
warm in both: only the driver differs.

Per run: wall time; CPU seconds of the spark-submit process tree (its JVM and, cold, the driver) plus what
the zygote's children used (warm: the driver and the UDF's daemon; cold: the daemon); and the driver's own
CPU (cold: the driver process itself from ``/proc``, sampled; warm: the forked driver from ``/proc``).

    .venv/bin/python benchmarks/bench_warm_driver.py --repeat 5 --out /tmp/bench-warm-driver.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

APP = """
import time
began = time.process_time()
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
spark = SparkSession.builder.appName("kappa-bench-warm-driver").getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
n = spark.range(1000).select(F.udf(lambda x: x * 2, "long")("id").alias("y")).agg(F.sum("y")).first()[0]
assert n == 999000, n
print("driver cpu", time.process_time() - began, flush=True)
spark.stop()
"""

HZ = os.sysconf("SC_CLK_TCK")


def children_cpu(pid: int) -> float:
    """CPU seconds of ``pid``'s reaped children (cutime + cstime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / HZ


def one(app: Path, env: dict[str, str], zygote_pid: int) -> dict[str, Any]:
    spark_submit = str(Path(sys.executable).parent / "spark-submit")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    zygote_before = children_cpu(zygote_pid)
    began = time.monotonic()
    done = subprocess.run(
        [spark_submit, "--master", "local[1]", "--conf", "spark.ui.enabled=false", str(app)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.monotonic() - began
    if done.returncode != 0:
        raise SystemExit(f"spark-submit failed ({done.returncode}):\n{done.stderr[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    submit_cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    driver = float(next(line for line in done.stdout.splitlines() if line.startswith("driver cpu")).split()[-1])
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(submit_cpu + children_cpu(zygote_pid) - zygote_before, 2),
        "driver_cpu_s": round(driver, 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    from airflow_provider_kappa.engine.warm_python import WarmPython

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    work = Path(tempfile.mkdtemp(prefix="kappa-bench-wd-"))
    app = work / "app.py"
    app.write_text(APP)
    warm = WarmPython()
    base = {**os.environ, **warm.env()}
    warm.start(base, os.getpid())
    # the cold driver: the same wrapper for pyspark's processes, the driver's script run by the interpreter
    cold_wrapper = work / "python-cold-driver"
    cold_wrapper.write_text(
        warm.wrapper.read_text().replace(
            f'case "$1" in -*) ;; *.py) exec "{sys.executable}" -m airflow_provider_kappa.spark.warm_daemon --run "$@";; esac\n',
            "",
        )
    )
    cold_wrapper.chmod(0o700)
    assert cold_wrapper.read_text() != warm.wrapper.read_text(), "the wrapper's driver line changed: update this script"
    runs: dict[str, list[dict[str, Any]]] = {"cold": [], "warm": []}
    try:
        assert warm.zygote is not None
        one(app, base, warm.zygote.pid)  # the first spark-submit warms the OS caches and the zygote
        for i in range(args.repeat):
            for kind in ("cold", "warm"):
                env = {**base, "PYSPARK_DRIVER_PYTHON": str(cold_wrapper)} if kind == "cold" else base
                run = one(app, env, warm.zygote.pid)
                runs[kind].append(run)
                print(f"{kind} {i + 1}/{args.repeat}: {run}", flush=True)
    finally:
        warm.stop()
    summary = {
        kind: {key: statistics.median(r[key] for r in rs) for key in ("wall_s", "cpu_s", "driver_cpu_s")}
        for kind, rs in runs.items()
    }
    result = {
        "command": " ".join(sys.argv),
        "python": sys.version.split()[0],
        "runs": runs,
        "median": summary,
        "warm_vs_cold": {key: round(summary["warm"][key] / summary["cold"][key], 3) for key in summary["warm"]},
    }
    print(json.dumps(result["median"], indent=1), json.dumps(result["warm_vs_cold"]))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
