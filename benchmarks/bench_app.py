"""Benchmark (not a test): the backfill and the hand-written batch job as whole applications.

``bench_source.py`` part a times queries inside one Python session. A backfill slice, though,
is a whole ``spark-submit`` of the unchanged streaming job, and the hand-written batch job it
stands against would be one too. Here each is launched with ``spark-submit`` (same Spark conf,
``local[2]``, driver 3 GB), alternately, ``--repeat`` times:

- ``batch``: the aggregation as a plain Spark batch job over the table's Parquet files, read
  natively (the file list given, as a hand-written job would be given it);
- ``kappa``: the unchanged streaming aggregation (watermark 10 min) over ``kappa_iceberg`` at a
  15 min threshold, ``availableNow``, with the file list the launcher writes (``plan_file``).

Wall time and CPU seconds (the spark-submit process tree) per run; every kappa run's output is
compared with the batch job's on the windows the watermark has closed. Data: the one of
``bench_source.py`` (generated there when missing, same parameters).

    .venv/bin/python benchmarks/bench_app.py --workdir /tmp/kappa-bench --repeat 3 --out /tmp/bench-app.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_source as bs  # noqa: E402


def app(mode: str, workdir: Path, hours: float, out: Path) -> None:
    """The application spark-submit runs (``bench_app.py run ...``)."""
    from pyspark.sql import SparkSession

    from airflow_provider_kappa.spark.datasource import KappaIcebergDataSource

    began = time.monotonic()
    spark = (
        SparkSession.builder.appName(f"kappa-bench-{mode}")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    session_s = time.monotonic() - began
    listed = bs.plays_file_list_path(workdir)
    start, end = bs.T0_US, bs.T0_US + int(hours * bs.HOUR) + bs.MIN
    extra: dict[str, Any] = {}
    if mode == "batch":
        paths = [s[0] for s in json.loads(listed.read_text())["spans"]]
        rows = bs.aggregation(spark.read.parquet(*paths), streaming=False).collect()
    else:
        spark.dataSource.register(KappaIcebergDataSource)
        opts = bs.kappa_options(workdir, "raw.plays", start, end, plan_file=str(listed))
        df = spark.readStream.format("kappa_iceberg").options(**opts).load()
        secs, rows, progress = bs.run_stream(bs.aggregation(df, streaming=True), workdir / "ck" / "app-kappa")
        extra = {
            **bs.batch_times(progress),
            **bs.startup(secs, progress),
            "first_batch_ms": progress[0].durationMs if progress else {},
        }
    job_s = time.monotonic() - began - session_s
    spark.stop()
    out.write_text(
        json.dumps(
            {
                "session_s": round(session_s, 2),
                "job_s": round(job_s, 2),
                **extra,
                "rows": [[r.window_start.isoformat(), r.show_id, r["count"]] for r in rows],
            }
        )
    )


def submit(mode: str, workdir: Path, hours: float) -> dict[str, Any]:
    import pyspark

    spark_submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    out = workdir / f"app-{mode}.json"
    env = dict(
        os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1"
    )
    cmd = [
        str(spark_submit),
        "--master",
        "local[2]",
        "--driver-memory",
        "3g",
        "--conf",
        "spark.driver.host=127.0.0.1",
        str(Path(__file__).resolve()),
        "run",
        mode,
        "--workdir",
        str(workdir),
        "--hours",
        str(hours),
        "--out",
        str(out),
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.monotonic()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.monotonic() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    inside = json.loads(out.read_text())
    return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "load": round(os.getloadavg()[0], 1), **inside}


def counts(rows: list[list[Any]], cutoff: str) -> dict[tuple[str, int], int]:
    return {(w, s): c for w, s, c in rows if w < cutoff}


def main(argv: Sequence[str] | None = None) -> None:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "run":
        p = argparse.ArgumentParser()
        p.add_argument("mode", choices=("batch", "kappa"))
        p.add_argument("--workdir", type=Path, required=True)
        p.add_argument("--hours", type=float, required=True)
        p.add_argument("--out", type=Path, required=True)
        a = p.parse_args(argv[1:])
        app(a.mode, a.workdir, a.hours, a.out)
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/kappa-bench"))
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--hours", type=float, default=6)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    bs.prepare(args.workdir, args.rows, args.hours)
    result: dict[str, Any] = {"machine": bs.machine(), "command": " ".join([Path(sys.executable).name, *sys.argv])}
    result["launcher_plan_s"] = bs.write_plays_file_list(
        args.workdir, bs.T0_US, bs.T0_US + int(args.hours * bs.HOUR) + bs.MIN
    )
    cutoff = (bs.T0 + timedelta(hours=args.hours) - timedelta(minutes=30)).replace(tzinfo=None).isoformat()
    runs: dict[str, list[dict[str, Any]]] = {"batch": [], "kappa": []}
    for i in range(args.repeat):
        for mode in ("batch", "kappa"):
            run = submit(mode, args.workdir, args.hours)
            runs[mode].append(run)
            print(mode, i, {k: v for k, v in run.items() if k != "rows"}, flush=True)
    truth = counts(runs["batch"][0]["rows"], cutoff)
    for mode in runs:
        for run in runs[mode]:
            got = counts(run.pop("rows"), cutoff)
            run["windows_wrong"] = sum(truth.get(k) != got.get(k) for k in set(truth) | set(got))
    summary = {}
    for mode, key in ((m, k) for m in runs for k in ("wall_s", "cpu_s", "job_s")):
        summary[f"{mode}_{key}_median"] = statistics.median(r[key] for r in runs[mode])
    summary["wall_ratio"] = round(summary["kappa_wall_s_median"] / summary["batch_wall_s_median"], 2)
    summary["cpu_ratio"] = round(summary["kappa_cpu_s_median"] / summary["batch_cpu_s_median"], 2)
    summary["job_ratio"] = round(summary["kappa_job_s_median"] / summary["batch_job_s_median"], 2)
    summary["windows"] = len(truth)
    result.update(runs=runs, summary=summary)
    text = json.dumps(result, indent=2, default=str)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
