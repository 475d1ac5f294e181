"""Benchmark (not a test): an end-to-end ``kappa backfill`` against a hand-written Spark batch job.

    .venv/bin/python benchmarks/bench_backfill.py --workdir /tmp/kappa-bf --out /tmp/bench-backfill.json
    .venv/bin/python benchmarks/bench_backfill.py --quick          # tiny sizes, a smoke run

For each size (``--sizes``, default 2M and 8M landed rows over the same 8.5 hours of ingestion
time, one pyiceberg append per minute, so 4x the rows per file at 8M) in a file-backed sqlite
``SqlCatalog``:

- ``batch``: a hand-written Spark batch job, one ``spark-submit --master local[2]``: it lists the
  table's data files overlapping the read range with pyiceberg, reads them with
  ``spark.read.parquet``, keeps the rows of the read range, counts per 5-minute event-time window
  and show, keeps the windows of ``[start, end)`` and writes them as Parquet.
- ``stream floor`` (unless ``--no-floor``): plain Structured Streaming, one ``spark-submit``: the
  same query (watermark, windows, append) over Spark's own streaming Parquet source (copies of the
  read range's data files in ingestion order, as many files per micro-batch as give kappa's number
  of data micro-batches) into Spark's Parquet file sink, ``availableNow``. No Iceberg, no slices,
  no kappa: what any Structured Streaming backfill of this query at this micro-batch size costs.
- ``kappa <engine>`` (``--engines``, default ``connect,submit``): the real ``kappa backfill``
  command (the ``kappa`` console script: snapshot, plan, every slice, validate, publish) of the
  unchanged streaming job (the same count with a 10-minute watermark, through ``read_source`` /
  ``write_sink``) over the same table: 8 h window, 2 h slices, 15 min threshold, sequential, no
  warmup, tail = the threshold (so 5 slices, the last one 15 min), ``job.master: local[2]``.
  Engine ``connect`` starts its local Spark Connect server inside the command (counted).

Wall time and CPU seconds (``RUSAGE_CHILDREN`` of the command's process tree) of every run, the
ratio kappa / batch; per slice, from the slice's log and its ``StreamingQueryProgress`` records:
``start`` (the slice's launch to its first micro-batch), the first micro-batch, the median of the
later ones, ``end`` (the last micro-batch's end to the slice's end: session or application stop);
every run's published window (and the floor's output) compared, as a multiset of rows, with the
batch job's output.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))
# as on a user's machine, every process may write bytecode caches (a shell that forbids it makes each of the
# runs' many interpreters compile what it imports from source: in an end's venv installed --no-compile, 1.5-4
# CPU-s more per interpreter; benchmarks/README.md, 2026-11-29)
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
TARGET = "prod.plays_summary"
SOURCE = "raw.plays"

JOB_TEMPLATE = '''"""The unchanged streaming job of the benchmarks: plays per event-time window and show."""
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from airflow_provider_kappa.spark import read_source, write_sink

spark = SparkSession.builder.getOrCreate()
plays = read_source(spark, "plays")
counts = (
    plays.withWatermark("event_ts", "{watermark}")
    .groupBy(F.window("event_ts", "{window}"), "show_id")
    .count()
    .select(F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"), "show_id", "count")
)
write_sink(counts, "summary").awaitTermination()
'''


def job_source(window: str = "5 minutes", watermark: str = "10 minutes") -> str:
    """The job's file: :data:`JOB_TEMPLATE` with its window and watermark (this script's: 5 and 10 minutes)."""
    return JOB_TEMPLATE.replace("{window}", window).replace("{watermark}", watermark)


# --------------------------------------------------------------------------- set-up


class Size:
    """One lake: ``rows`` landed over ``hours``; the backfill's window and slicing."""

    def __init__(self, rows: int, hours: float, window_h: float, slice_: str, threshold: str) -> None:
        self.rows, self.hours, self.window_h, self.slice, self.threshold = rows, hours, window_h, slice_, threshold

    @property
    def start(self) -> datetime:
        return T0

    @property
    def end(self) -> datetime:
        return T0 + timedelta(hours=self.window_h)

    @property
    def tail(self) -> timedelta:
        from airflow_provider_kappa.timeparse import parse_duration

        return parse_duration(self.threshold, "threshold")

    def label(self) -> str:
        return f"{self.rows / 1e6:g}M" if self.rows >= 1_000_000 else f"{self.rows / 1e3:g}k"

    def params(self) -> dict[str, Any]:
        return {"rows": self.rows, "hours": self.hours, "version": 1}


def catalog_props(lake: Path) -> dict[str, str]:
    return {"type": "sql", "uri": f"sqlite:///{lake}/catalog.db", "warehouse": f"file://{lake}/warehouse"}


def catalog(lake: Path) -> Any:
    from pyiceberg.catalog import load_catalog

    return load_catalog("lake", **catalog_props(lake))


def prepare(lake: Path, size: Size) -> None:
    """The landed table (``bench_source.land``: one append per minute, late and offline events)
    and the empty target table; reused while the parameters are unchanged (so a lake made on one
    pyspark release serves another: bench_source imports the newest's streaming API)."""
    marker = lake / "params.json"
    if marker.exists() and json.loads(marker.read_text()) == size.params():
        print(f"reusing the lake in {lake}", flush=True)
        return
    import bench_source as bs

    from airflow_provider_kappa.demo.lake_schema import create_raw_table

    shutil.rmtree(lake, ignore_errors=True)
    (lake / "warehouse").mkdir(parents=True)
    began = time.monotonic()
    cat = catalog(lake)
    bs.land(create_raw_table(cat, SOURCE), size.rows, size.hours, 1, 100_000, 50, "p")
    create_summary_target(cat)
    marker.write_text(json.dumps(size.params()))
    print(f"generated {size.rows} rows in {lake} in {time.monotonic() - began:.0f}s", flush=True)


def create_summary_target(cat: Any) -> None:
    """The job's sink target :data:`TARGET` (window start and end, show, count), partitioned by ``window_start``."""
    from pyspark.sql.types import LongType, StructField, StructType, TimestampType

    from airflow_provider_kappa.spark.sink import create_target_table

    schema = StructType(
        [
            StructField("window_start", TimestampType()),
            StructField("window_end", TimestampType()),
            StructField("show_id", LongType()),
            StructField("count", LongType()),
        ]
    )
    create_target_table(cat, TARGET, schema, "window_start")


def plays_sources(backfill_keys: dict[str, str] | None = None) -> dict[str, Any]:
    """kappa.yaml ``sources`` of the job: ``plays``, live from Kafka topic ``plays``, backfilled from :data:`SOURCE`
    (with ``backfill_keys`` more keys of the iceberg candidate)."""
    return {
        "plays": {"type": "dynamic", "selected": "live-plays", "candidates": ["live-plays", "backfill-plays"]},
        "live-plays": {
            "type": "kafka",
            "topics": "plays",
            "bootstrap_servers": "127.0.0.1:9092",
            "schema": "event_id STRING, account_id BIGINT, show_id BIGINT, event_ts TIMESTAMP",
            "ingestion_column": "ingestion_ts",
        },
        "backfill-plays": {
            "type": "iceberg",
            "catalog": "lake",
            "table": SOURCE,
            "ingestion_column": "ingestion_ts",
            **(backfill_keys or {}),
        },
    }


def write_config(
    run: Path, lake: Path, size: Size, engine: str, extra_conf: dict[str, str], class_data_sharing: bool = True
) -> Path:
    import yaml

    run.mkdir(parents=True, exist_ok=True)
    (run / "job.py").write_text(job_source())
    raw = {
        "job": {
            "name": "bench_counts",
            "application": "job.py",
            "checkpoint_root": str(run / "checkpoints"),
            "master": "local[2]",
            "engine": engine,
            "class_data_sharing": class_data_sharing,
            "spark_conf": {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false", **extra_conf},
        },
        "catalogs": {"lake": catalog_props(lake)},
        "sources": plays_sources({"max_misalignment_threshold": size.threshold}),
        "sinks": {"summary": {"type": "iceberg", "catalog": "lake", "table": TARGET, "time_column": "window_start"}},
    }
    path = run / "kappa.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


# --------------------------------------------------------------------------- runs


def timed(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``cmd`` (output to ``log``); wall seconds, CPU seconds of its process tree, load averages."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load_before = os.getloadavg()
    began = time.monotonic()
    with log.open("w") as out:
        code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    wall = time.monotonic() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if code != 0:
        raise RuntimeError(f"{cmd[:3]} failed with exit code {code}; see {log}:\n{log.read_text()[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "load_before": [round(x, 1) for x in load_before],
        "load_after": [round(x, 1) for x in os.getloadavg()],
    }


def run_kappa(work: Path, lake: Path, size: Size, variant: str, extra_conf: dict[str, str]) -> dict[str, Any]:
    """One ``kappa backfill`` through the console script; its figures and per-slice breakdown.
    ``variant``: ``connect``, ``submit``, ``connect-cold`` (engine connect, its local server
    started without the warm daemon: ``KAPPA_WARM_DAEMON=0``) or ``<engine>-nocds`` (``job.class_data_sharing:
    false``: no class archive for the drivers or the local server)."""
    run = work / f"kappa-{variant}"
    shutil.rmtree(run, ignore_errors=True)
    engine = variant.removesuffix("-cold").removesuffix("-nocds")
    config = write_config(run, lake, size, engine, extra_conf, class_data_sharing=not variant.endswith("-nocds"))
    kappa = str(Path(sys.executable).parent / "kappa")
    cmd = [
        kappa,
        "backfill",
        "--config",
        str(config),
        "--start",
        size.start.isoformat(),
        "--end",
        size.end.isoformat(),
        "--slice",
        size.slice,
        "--max-misalignment",
        size.threshold,
        "--warmup",
        "0s",
        "--tail",
        size.threshold,
        "--mode",
        "sequential",
        "--min-match",
        "0",
        "--timeline",
    ]
    env = dict(os.environ, COLUMNS="200", KAPPA_WARM_DAEMON="0" if variant.endswith("-cold") else "1")
    result = timed(cmd, run / "kappa.log", env)
    text = (run / "kappa.log").read_text()
    server = re.search(r"started in ([0-9.]+)s", text)
    result["server_start_s"] = float(server.group(1)) if server else None
    result["slices"] = slice_breakdown(run / "checkpoints")
    result["timeline"] = timeline(text)
    result["command"] = " ".join(cmd)
    return result


def timeline(text: str) -> list[dict[str, Any]]:
    """The per-step timeline ``kappa backfill --timeline`` printed: step, start, end (seconds from
    the command's start)."""
    steps = []
    for m in re.finditer(r"^\s+([0-9.]+) → +([0-9.]+) +[0-9.]+s  (.+)$", text, re.M):
        steps.append({"step": m.group(3).strip(), "start_s": float(m.group(1)), "end_s": float(m.group(2))})
    return steps


def _log_time(line: str) -> float:
    """Epoch seconds of a slice log line (``%(asctime)s``: local time, milliseconds)."""
    stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    return stamp.astimezone().timestamp()


def _progress_time(record: dict[str, Any]) -> float:
    return datetime.strptime(record["timestamp"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()


def _input_rows(record: dict[str, Any]) -> int:
    return sum(int(s.get("numInputRows", 0)) for s in record.get("sources", []))


def slice_breakdown(checkpoints: Path) -> list[dict[str, Any]]:
    """Per slice: launch -> first micro-batch, first micro-batch (and its addBatch), median of the
    later ones, last micro-batch's end -> the slice's end, from the slice log and progress records."""
    slices = []
    for log in sorted(checkpoints.rglob("logs/*.log")):
        lines = log.read_text(errors="replace").splitlines()
        launch = next((_log_time(x) for x in lines if re.search(r" slice \S+ \(\d+/\d+, ", x)), None)
        done = next((_log_time(x) for x in lines if re.search(r" slice \S+ done: ", x)), None)
        progress_file = next(checkpoints.rglob(f"progress/{log.stem}.jsonl"), None)
        records = [json.loads(x) for x in progress_file.read_text().splitlines() if x.strip()] if progress_file else []
        entry: dict[str, Any] = {
            "slice": log.stem,
            "batches": len(records),
            "rows": sum(_input_rows(r) for r in records),
        }
        if records and launch is not None and done is not None:
            first, rest = records[0], records[1:]
            dur = [r["durationMs"].get("triggerExecution", 0) / 1000 for r in records]
            last_end = _progress_time(records[-1]) + dur[-1]
            entry.update(
                start_s=round(_progress_time(first) - launch, 2),
                first_batch_s=round(dur[0], 2),
                first_add_batch_s=round(first["durationMs"].get("addBatch", 0) / 1000, 2),
                first_query_planning_s=round(first["durationMs"].get("queryPlanning", 0) / 1000, 2),
                steady_median_s=round(statistics.median(dur[1:]), 2) if rest else None,
                end_s=round(done - last_end, 2),
                slice_s=round(done - launch, 2),
            )
            steady = entry["steady_median_s"] or 0.0
            entry["fixed_s"] = round(entry["start_s"] + entry["first_batch_s"] - steady + entry["end_s"], 2)
        slices.append(entry)
    return slices


def run_batch(work: Path, lake: Path, size: Size) -> dict[str, Any]:
    """The hand-written batch job as one spark-submit (the same local[2] and Spark conf)."""
    run = work / "batch"
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    return submit_app(
        [
            "batch-app",
            "--lake",
            str(lake),
            "--start",
            size.start.isoformat(),
            "--end",
            size.end.isoformat(),
            "--tail",
            size.threshold,
            "--out",
            str(run / "rows"),
        ],
        run / "batch.log",
    )


def submit_app(app_args: list[str], log: Path) -> dict[str, Any]:
    """This script's ``app_args`` app (``batch-app``, ``stream-app``) as one ``spark-submit
    --master local[2]`` with the benchmark's Spark conf, timed (:func:`timed`)."""
    import pyspark

    spark_submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    cmd = [
        str(spark_submit),
        "--master",
        "local[2]",
        "--conf",
        "spark.sql.shuffle.partitions=2",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.sql.session.timeZone=UTC",
        str(Path(__file__).resolve()),
        *app_args,
    ]
    env = dict(
        os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1"
    )
    result = timed(cmd, log, env)
    result["command"] = " ".join(cmd)
    return result


def ingestion_filter(start: datetime, read_end: datetime) -> Any:
    """The pyiceberg row filter of the read range ``[start, read_end)`` of ingestion time."""
    from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan

    return And(GreaterThanOrEqual("ingestion_ts", start.isoformat()), LessThan("ingestion_ts", read_end.isoformat()))


def counts_per_window(rows: Any) -> Any:
    """The job's aggregation: rows per 5-minute event-time window and show, as its output columns."""
    from pyspark.sql import functions as F

    return (
        rows.groupBy(F.window("event_ts", "5 minutes"), "show_id")
        .count()
        .select(
            F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"), "show_id", "count"
        )
    )


def batch_app(lake: Path, start: datetime, end: datetime, tail: str, out: Path) -> None:
    """The batch job (runs inside spark-submit)."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from airflow_provider_kappa.timeparse import parse_duration

    read_end = end + parse_duration(tail, "tail")
    spark = SparkSession.builder.appName("bench-batch").getOrCreate()
    table = catalog(lake).load_table(SOURCE)
    paths = [task.file.file_path for task in table.scan(row_filter=ingestion_filter(start, read_end)).plan_files()]
    rows = spark.read.parquet(*paths).where(
        (F.col("ingestion_ts") >= F.lit(start)) & (F.col("ingestion_ts") < F.lit(read_end))
    )
    counts = counts_per_window(rows).where(
        (F.col("window_start") >= F.lit(start)) & (F.col("window_start") < F.lit(end))
    )
    counts.write.mode("overwrite").parquet(str(out))
    spark.stop()


def run_stream(work: Path, lake: Path, size: Size) -> dict[str, Any]:
    """The Structured Streaming floor, one ``spark-submit`` (the batch job's conf): Spark's own
    streaming Parquet source over copies of the same files, in ingestion order, as many files per
    micro-batch as give kappa's number of data micro-batches, the streaming job's aggregation and
    watermark, Spark's Parquet file sink, ``availableNow``. No Iceberg, no slices, no kappa: what any Structured
    Streaming backfill of this job at this micro-batch size costs here."""
    from pyiceberg.conversions import from_bytes

    run = work / "stream"
    shutil.rmtree(run, ignore_errors=True)
    (run / "files").mkdir(parents=True)
    table = catalog(lake).load_table(SOURCE)
    read_end = size.end + size.tail
    field = table.schema().find_field("ingestion_ts")
    upper = lambda task: from_bytes(field.field_type, task.file.upper_bounds[field.field_id])  # noqa: E731
    tasks = sorted(
        table.scan(row_filter=ingestion_filter(size.start, read_end)).plan_files(),
        key=lambda t: (upper(t), t.file.file_path),
    )
    base = time.time() - 10 * len(tasks)
    for i, task in enumerate(tasks):  # Spark's file source takes files oldest first: mtime = ingestion order
        copy = run / "files" / f"{i:05d}.parquet"
        shutil.copyfile(task.file.file_path.removeprefix("file://"), copy)
        os.utime(copy, (base + i, base + i))
    # as many data micro-batches as kappa's (one per threshold of the read range): the files are
    # one landing a minute, but late rows make more files overlap the range than it has minutes
    cells = -(-int((read_end - size.start).total_seconds()) // int(size.tail.total_seconds()))
    files_per_batch = -(-len(tasks) // cells)
    result = submit_app(
        [
            "stream-app",
            "--files",
            str(run / "files"),
            "--per-batch",
            str(files_per_batch),
            "--start",
            size.start.isoformat(),
            "--end",
            size.end.isoformat(),
            "--tail",
            size.threshold,
            "--out",
            str(run),
        ],
        run / "stream.log",
    )
    result["files"] = len(tasks)
    result["files_per_batch"] = files_per_batch
    records = json.loads((run / "progress.json").read_text())
    dur = [r["durationMs"].get("triggerExecution", 0) / 1000 for r in records]
    result.update(
        batches=len(records),
        first_batch_s=round(dur[0], 2) if dur else None,
        steady_median_s=round(statistics.median(dur[1:]), 2) if len(dur) > 1 else None,
        batches_s=round(sum(dur), 2),
    )
    return result


def stream_app(files: Path, per_batch: int, start: datetime, end: datetime, tail: str, out: Path) -> None:
    """The Structured Streaming floor (runs inside spark-submit): the streaming job's query over
    Spark's own file source and sink."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from airflow_provider_kappa.timeparse import parse_duration

    read_end = end + parse_duration(tail, "tail")
    spark = SparkSession.builder.appName("bench-stream").getOrCreate()
    schema = spark.read.parquet(str(next(files.iterdir()))).schema
    rows = (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", per_batch)
        .parquet(str(files))
        .where((F.col("ingestion_ts") >= F.lit(start)) & (F.col("ingestion_ts") < F.lit(read_end)))
    )
    query = (
        counts_per_window(rows.withWatermark("event_ts", "10 minutes"))
        .writeStream.format("parquet")
        .outputMode("append")
        .option("path", str(out / "rows"))
        .option("checkpointLocation", str(out / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    (out / "progress.json").write_text(json.dumps([json.loads(p.json) for p in query.recentProgress]))
    spark.stop()


# --------------------------------------------------------------------------- results


def published_rows(lake: Path, size: Size) -> list[tuple[Any, ...]]:
    from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan

    table = catalog(lake).load_table(TARGET)
    flt = And(
        GreaterThanOrEqual("window_start", size.start.isoformat()), LessThan("window_start", size.end.isoformat())
    )
    return _rows(table.scan(row_filter=flt, selected_fields=("window_start", "show_id", "count")).to_arrow())


def batch_rows(work: Path) -> list[tuple[Any, ...]]:
    import pyarrow.parquet as pq

    return _rows(pq.read_table(work / "batch" / "rows", columns=["window_start", "show_id", "count"]))


def stream_rows(work: Path, size: Size) -> list[tuple[Any, ...]]:
    """The floor's output windows of ``[start, end)`` (its file sink's folder; ``_spark_metadata`` is skipped)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    t = pq.read_table(work / "stream" / "rows", columns=["window_start", "show_id", "count"])
    start = pc.greater_equal(t["window_start"], pc.cast(size.start, t.schema.field("window_start").type))
    end = pc.less(t["window_start"], pc.cast(size.end, t.schema.field("window_start").type))
    return _rows(t.filter(pc.and_(start, end)))


def _rows(t: Any) -> list[tuple[Any, ...]]:
    import pyarrow as pa

    t = t.cast(
        pa.schema([("window_start", pa.timestamp("us", tz="UTC")), ("show_id", pa.int64()), ("count", pa.int64())])
    )
    return sorted(zip(*(t.column(i).to_pylist() for i in range(3))))


def compare(truth: list[tuple[Any, ...]], got: list[tuple[Any, ...]]) -> dict[str, Any]:
    from collections import Counter

    a, b = Counter(truth), Counter(got)
    return {
        "rows_batch": len(truth),
        "rows_kappa": len(got),
        "only_batch": sum((a - b).values()),
        "only_kappa": sum((b - a).values()),
        "exact": a == b,
        "counted": sum(c for *_, c in truth),
    }


def machine() -> dict[str, Any]:
    import platform

    free = subprocess.run(["free", "-g"], capture_output=True, text=True).stdout
    return {
        "nproc": os.cpu_count(),
        "free_g": free.strip(),
        "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def summarize(kappa: dict[str, Any], batch: dict[str, Any]) -> dict[str, Any]:
    slices = [s for s in kappa["slices"] if "start_s" in s]
    med = lambda key: round(statistics.median(s[key] for s in slices), 2) if slices else None  # noqa: E731
    steady = [s["steady_median_s"] for s in slices if s.get("steady_median_s") is not None]
    return {
        "wall_ratio": round(kappa["wall_s"] / batch["wall_s"], 2),
        "cpu_ratio": round(kappa["cpu_s"] / batch["cpu_s"], 2),
        "slices": len(kappa["slices"]),
        "start_s_median": med("start_s"),
        "first_batch_s_median": med("first_batch_s"),
        "steady_batch_s_median": round(statistics.median(steady), 2) if steady else None,
        "end_s_median": med("end_s"),
        "fixed_s_median": med("fixed_s"),
    }


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "batch-app":
        p = argparse.ArgumentParser()
        for flag in ("--lake", "--start", "--end", "--tail", "--out"):
            p.add_argument(flag, required=True)
        a = p.parse_args(argv[1:])
        batch_app(Path(a.lake), datetime.fromisoformat(a.start), datetime.fromisoformat(a.end), a.tail, Path(a.out))
        return
    if argv and argv[0] == "stream-app":
        p = argparse.ArgumentParser()
        for flag in ("--files", "--per-batch", "--start", "--end", "--tail", "--out"):
            p.add_argument(flag, required=True)
        a = p.parse_args(argv[1:])
        stream_app(
            Path(a.files),
            int(a.per_batch),
            datetime.fromisoformat(a.start),
            datetime.fromisoformat(a.end),
            a.tail,
            Path(a.out),
        )
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/kappa-bench-backfill"))
    parser.add_argument("--sizes", default="2000000,8000000", help="landed rows, comma-separated")
    parser.add_argument(
        "--engines",
        default=None,
        help="comma-separated: connect, connect-cold (local server without the warm daemon), connect-nocds "
        "(job.class_data_sharing: false), submit "
        "(default connect,submit; connect with --quick; '' for none: the batch job and the floor)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 20k rows over 1.5 h, 1 h window, 1 h slices")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="more job.spark_conf")
    parser.add_argument(
        "--no-floor",
        action="store_true",
        help="skip the Structured Streaming floor (Spark's own file source and sink, one spark-submit)",
    )
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    if args.quick:
        sizes = [Size(20_000, 1.5, 1, "1h", "15min")]
    else:
        sizes = [Size(int(n), 8.5, 8, "2h", "15min") for n in args.sizes.split(",")]
    extra_conf = dict(kv.split("=", 1) for kv in args.conf)
    default_engines = "connect" if args.quick else "connect,submit"
    engines = [e for e in (default_engines if args.engines is None else args.engines).split(",") if e]
    doc: dict[str, Any] = {"machine": machine(), "command": " ".join([sys.executable, *sys.argv]), "sizes": {}}
    for size in sizes:
        lake = args.workdir / f"lake-{size.label()}"
        work = args.workdir / f"runs-{size.label()}"
        prepare(lake, size)
        runs: dict[str, Any] = {"batch": run_batch(work, lake, size)}
        print(size.label(), "batch", {k: v for k, v in runs["batch"].items() if k != "command"}, flush=True)
        truth = batch_rows(work)
        if not args.no_floor:
            floor = run_stream(work, lake, size)
            floor["match"] = compare(truth, stream_rows(work, size))
            floor["ratio"] = {
                "wall": round(floor["wall_s"] / runs["batch"]["wall_s"], 2),
                "cpu": round(floor["cpu_s"] / runs["batch"]["cpu_s"], 2),
            }
            runs["stream_floor"] = floor
            print(size.label(), "stream floor", {k: v for k, v in floor.items() if k != "command"}, flush=True)
        for engine in engines:
            kappa = run_kappa(work, lake, size, engine, extra_conf)
            kappa["match"] = compare(truth, published_rows(lake, size))
            kappa["summary"] = summarize(kappa, runs["batch"])
            runs[engine] = kappa
            print(size.label(), engine, {k: kappa[k] for k in ("wall_s", "cpu_s", "match", "summary")}, flush=True)
            for s in kappa["slices"]:
                print("   ", s, flush=True)
            for step in kappa["timeline"]:
                print(f"    {step['start_s']:7.1f} → {step['end_s']:7.1f}  {step['step']}", flush=True)
        doc["sizes"][size.label()] = runs
    doc["machine"]["uptime_after"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    text = json.dumps(doc, indent=2, default=str)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(table(doc))


def table(doc: dict[str, Any]) -> str:
    """The results as a markdown table."""
    head = (
        "| size | run | wall s | CPU s | vs batch (wall / CPU) | slices | start | first batch | steady batch "
        "| end | fixed per slice | exact |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    )
    out = [head]
    for label, runs in doc["sizes"].items():
        b = runs["batch"]
        out.append(f"| {label} | batch job | {b['wall_s']} | {b['cpu_s']} | 1 | | | | | | | |")
        if "stream_floor" in runs:
            f = runs["stream_floor"]
            out.append(
                f"| {label} | Structured Streaming floor | {f['wall_s']} | {f['cpu_s']} | {f['ratio']['wall']}x / "
                f"{f['ratio']['cpu']}x | 1 (one JVM) | | {f['first_batch_s']} | {f['steady_median_s']} | | "
                f"| {f['match']['exact']} |"
            )
        for engine, k in runs.items():
            if engine in ("batch", "stream_floor"):
                continue
            s = k["summary"]
            out.append(
                f"| {label} | kappa {engine} | {k['wall_s']} | {k['cpu_s']} | {s['wall_ratio']}x / {s['cpu_ratio']}x "
                f"| {s['slices']} | {s['start_s_median']} | {s['first_batch_s_median']} | {s['steady_batch_s_median']} "
                f"| {s['end_s_median']} | {s['fixed_s_median']} | {k['match']['exact']} |"
            )
    return "\n".join(out)


if __name__ == "__main__":
    main()
