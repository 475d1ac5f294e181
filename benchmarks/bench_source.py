"""Benchmark of the ``kappa_iceberg`` source (not a test). See benchmarks/README.md.

    .venv/bin/python benchmarks/bench_source.py [--rows 3000000] [--hours 6] [--parts a,b,c,d,e]

Parts:
  a  the unchanged streaming aggregation over kappa_iceberg (15 min threshold) vs the same
     aggregation as a plain Spark batch job reading the same Parquet files natively; then, as
     references, Spark's own streaming Parquet file source over the same files with as many
     micro-batches, and the kappa_iceberg query again in the same (now warm) session
  b  vs strict ordering: one data file per micro-batch (ReadMaxFiles(1))
  c  vs unordered reading: files in random order, several per micro-batch (a tiny variant
     source defined here): rows dropped as late / wrong window counts
  d  two sources with 10:1 skew through a stream-stream join (RMI): peak state rows with
     alignment, without alignment (each source paced by its own row budget), and live-paced
  e  planning a table of 100,000 data files (synthetic manifest entries): seconds, memory

Everything runs in one local[2] SparkSession; data lives under --workdir (reused when the
generation parameters are unchanged).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition  # noqa: E402
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow  # noqa: E402
from pyspark.sql.types import StructType  # noqa: E402

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
US = 1_000_000
MIN = 60 * US
HOUR = 60 * MIN
T0_US = int(T0.timestamp()) * US
CHUNK_MIN = 1  # one landed file per minute of ingestion (per hour partition)


# --------------------------------------------------------------------------- data


def catalog_props(workdir: Path) -> dict[str, str]:
    return {"type": "sql", "uri": f"sqlite:///{workdir}/catalog.db", "warehouse": f"file://{workdir}/warehouse"}


def load_catalog(workdir: Path) -> Any:
    from pyiceberg.catalog import load_catalog as _load

    return _load("lake", **catalog_props(workdir))


def land(
    table: Any,
    rows: int,
    hours: float,
    seed: int,
    accounts: int,
    shows: int,
    id_prefix: str,
    gap: tuple[int, int] | None = None,
) -> None:
    """Append ``rows`` landed events over ``hours`` of ingestion time, one append per minute.

    Event time = ingestion - delay: 97% exponential (mean 15 s, capped at 5 min), 3% uniform
    1..9 min (clients that were offline). 1% of each file's rows land up to 4 min late (their
    ingestion time is earlier than the file's window), so neighbouring files overlap.
    ``gap=(from_min, to_min)``: nothing is landed in that stretch of ingestion time (an outage).
    """
    import numpy as np
    import pyarrow as pa

    from airflow_provider_kappa.demo.lake_schema import RAW_EVENTS_ARROW

    rng = np.random.default_rng(seed)
    chunks = int(hours * 60 / CHUNK_MIN)
    per = rows // chunks
    next_id = 0
    for c in range(chunks):
        if gap is not None and gap[0] <= c * CHUNK_MIN < gap[1]:
            continue
        lo = T0_US + c * CHUNK_MIN * MIN
        ingestion = np.sort(rng.integers(lo, lo + CHUNK_MIN * MIN, per))
        late = rng.random(per) < 0.01
        ingestion = np.where(late, np.maximum(ingestion - rng.integers(0, 4 * MIN, per), T0_US), ingestion)
        delay = np.minimum(rng.exponential(15 * US, per), 5 * MIN).astype(np.int64)
        offline = rng.random(per) < 0.03
        delay = np.where(offline, rng.integers(1 * MIN, 9 * MIN, per), delay)
        ids = pa.array([f"{id_prefix}{i}" for i in range(next_id, next_id + per)], pa.string())
        next_id += per
        batch = pa.Table.from_arrays(
            [
                ids,
                pa.array(rng.integers(0, accounts, per), pa.int64()),
                pa.array(rng.integers(0, shows, per), pa.int64()),
                pa.array(ingestion - delay, pa.timestamp("us", tz="UTC")),
                pa.array(ingestion, pa.timestamp("us", tz="UTC")),
            ],
            schema=RAW_EVENTS_ARROW,
        )
        table.append(batch)


def prepare(workdir: Path, rows: int, hours: float) -> None:
    """Create raw.plays (aggregation input) and raw.impressions / raw.clicks (10:1 join pair,
    2 hours, impressions with a one-hour outage from minute 30 to 90)."""
    from airflow_provider_kappa.demo.lake_schema import create_raw_table

    (workdir / "warehouse").mkdir(parents=True, exist_ok=True)
    cat = load_catalog(workdir)
    wanted = {
        "plays": {"rows": rows, "hours": hours, "version": 3},
        "join": {"rows": rows // 5, "version": 4},
    }
    for name, params in wanted.items():
        marker = workdir / f"params-{name}.json"
        if marker.exists() and json.loads(marker.read_text()) == params:
            print(f"reusing {name} data in {workdir}")
            continue
        began = time.monotonic()
        tables = ["raw.plays"] if name == "plays" else ["raw.impressions", "raw.clicks"]
        for t in tables:
            if cat.table_exists(t):
                cat.purge_table(t)
        if name == "plays":
            land(create_raw_table(cat, "raw.plays"), rows, hours, 1, 100_000, 50, "p")
        else:
            # few keys so that clicks match impressions
            land(create_raw_table(cat, "raw.impressions"), rows // 5, 2, 2, 2_000, 20, "i", gap=(30, 90))
            land(create_raw_table(cat, "raw.clicks"), rows // 50, 2, 3, 2_000, 20, "c")
        marker.write_text(json.dumps(params))
        print(f"generated {name} data in {time.monotonic() - began:.0f}s", flush=True)


# --------------------------------------------------------------------------- the variant source


class FileOrderReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The strawmen: whole files, no time grid, no alignment. ``order`` = ``random`` (shuffled)
    or ``lower`` (by lower bound); a batch takes ``files_per_batch`` files or the files holding
    ``rows_per_batch`` rows."""

    def __init__(self, schema: StructType, options: dict[str, str]) -> None:
        self.schema = schema
        self.options = dict(options)
        self._files: tuple[list[Any], Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"schema": self.schema, "options": self.options, "_files": None}

    def files(self) -> tuple[list[Any], Any]:
        if self._files is None:
            from airflow_provider_kappa.spark.catalog import catalog_from_options, load_table
            from airflow_provider_kappa.spark.source.manifests import file_spans
            from airflow_provider_kappa.spark.source.partitions import read_context

            table = load_table(catalog_from_options(self.options), self.options["table"])
            spans = file_spans(table, None, "ingestion_ts", None, None)
            if self.options.get("order") == "random":
                random.Random(int(self.options.get("seed", "7"))).shuffle(spans)
            self._files = (spans, read_context(table, table.schema(), self.schema.fieldNames(), "ingestion_ts"))
        return self._files

    def initialOffset(self) -> dict[str, int]:
        return {"i": 0}

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        spans, _ = self.files()
        i = j = int(start["i"])
        if "files_per_batch" in self.options:
            j = min(len(spans), i + int(self.options["files_per_batch"]))
        else:
            budget, rows = int(self.options["rows_per_batch"]), 0
            while j < len(spans) and (j == i or rows + spans[j].record_count <= budget):
                rows += spans[j].record_count
                j += 1
        return {"i": j} if j > i else start

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        from airflow_provider_kappa.spark.source.partitions import make_partitions

        spans, ctx = self.files()
        return make_partitions(spans[int(start["i"]) : int(end["i"])], None, None, ctx, 2, 64 << 20)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from airflow_provider_kappa.spark.source.read import read_partition

        return read_partition(partition, self.schema)  # type: ignore[arg-type]


class FileOrderSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "bench_file_order"

    def schema(self) -> StructType:
        from airflow_provider_kappa.spark.source.tables import table_spark_schema

        return table_spark_schema(dict(self.options, ingestion_column="ingestion_ts"))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return FileOrderReader(schema, dict(self.options))


# --------------------------------------------------------------------------- jobs


def spark_session() -> Any:
    from pyspark.sql import SparkSession

    from airflow_provider_kappa.spark.datasource import KappaIcebergDataSource

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("kappa-bench")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.memory", "3g")
        .config("spark.sql.streaming.numRecentProgressUpdates", "1000")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.python.authenticate.socketTimeout", "300s")  # busy shared machine
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(KappaIcebergDataSource)
    spark.dataSource.register(FileOrderSource)
    return spark


def plays_file_list_path(workdir: Path) -> Path:
    """Where the file list of raw.plays is kept (option ``plan_file``)."""
    return workdir / "plans" / "raw.plays.json"


def write_plays_file_list(workdir: Path, start: int, end: int) -> float:
    """What the launcher does before a slice's spark-submit: write the source's file list of
    ``[start, end)`` at the current snapshot; returns the seconds it took."""
    from airflow_provider_kappa.spark.source import file_list

    began = time.monotonic()
    table = load_catalog(workdir).load_table("raw.plays")
    files = file_list.build(table, table.current_snapshot().snapshot_id, "ingestion_ts", start, end)
    file_list.write(str(plays_file_list_path(workdir)), files)
    return round(time.monotonic() - began, 2)


def kappa_options(workdir: Path, table: str, start: int, end: int, **extra: Any) -> dict[str, str]:
    opts = {
        "catalog": "lake",
        "catalog_properties": json.dumps(catalog_props(workdir)),
        "table": table,
        "ingestion_column": "ingestion_ts",
        "mode": "bounded",
        "read_start_micros": str(start),
        "read_end_micros": str(end),
        "max_misalignment_threshold": "15min",
    }
    opts.update({k: str(v) for k, v in extra.items()})
    return opts


def aggregation(df: Any, streaming: bool) -> Any:
    """The job's logic: plays per 5-minute event-time window and show."""
    from pyspark.sql import functions as F

    if streaming:
        df = df.withWatermark("event_ts", "10 minutes")
    return (
        df.groupBy(F.window("event_ts", "5 minutes"), "show_id")
        .count()
        .select(F.col("window.start").alias("window_start"), "show_id", "count")
    )


def run_stream(df: Any, checkpoint: Path, collect: bool = True) -> tuple[float, list[Any], list[Any]]:
    """Run to the end with availableNow; (seconds, output rows, progress)."""
    shutil.rmtree(checkpoint, ignore_errors=True)
    out: list[Any] = []

    def sink(batch: Any, _batch_id: int) -> None:
        if collect:
            out.extend(batch.collect())

    began = time.monotonic()
    query = (
        df.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    seconds = time.monotonic() - began
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    return seconds, out, list(query.recentProgress)


def batch_times(progress: list[Any]) -> dict[str, float]:
    """Seconds of the first micro-batch and the median of the others."""
    import statistics

    times = [p.durationMs.get("triggerExecution", 0) / 1000 for p in progress if p.numInputRows]
    if not times:
        return {}
    rest = times[1:] or times
    return {"first_batch_s": round(times[0], 1), "median_batch_s": round(statistics.median(rest), 2)}


def spark_cpu_seconds(spark: Any) -> float:
    """CPU seconds used so far by the Spark JVM and its descendants (Python workers, runners;
    exited children count once reaped): a measure of work that, unlike wall time, another
    user's load on the machine inflates little."""
    root = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the process ended meanwhile
        pid = int(stat.parent.name)
        parents[pid] = int(fields[1])
        ticks[pid] = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    tree, frontier = {root}, [root]
    while frontier:
        children = [p for p, pp in parents.items() if pp in frontier and p not in tree]
        tree.update(children)
        frontier = children
    return sum(ticks.get(p, 0) for p in tree) / os.sysconf("SC_CLK_TCK")


def startup(seconds: float, progress: list[Any]) -> dict[str, float]:
    """Seconds of the run spent outside micro-batches (query start, source planning, stop)."""
    inside = sum(p.durationMs.get("triggerExecution", 0) for p in progress) / 1000
    return {"outside_batches_s": round(seconds - inside, 1)}


def as_counts(rows: list[Any], before: datetime) -> dict[tuple[datetime, int], int]:
    return {(r.window_start, r.show_id): r["count"] for r in rows if r.window_start < before.replace(tzinfo=None)}


def compare(truth: dict[Any, int], got: dict[Any, int]) -> dict[str, int]:
    keys = set(truth) | set(got)
    return {
        "windows": len(truth),
        "rows_expected": sum(truth.values()),
        "rows_counted": sum(got.get(k, 0) for k in truth),
        "rows_missing": sum(max(truth[k] - got.get(k, 0), 0) for k in truth),
        "windows_wrong": sum(truth.get(k) != got.get(k) for k in keys),
    }


# --------------------------------------------------------------------------- parts


def part_a_b_c(spark: Any, workdir: Path, hours: float, parts: set[str], native_first: bool = False) -> dict[str, Any]:
    from airflow_provider_kappa.spark.source.manifests import file_spans

    results: dict[str, Any] = {}
    table = load_catalog(workdir).load_table("raw.plays")
    spans = file_spans(table, None, "ingestion_ts", None, None)
    paths = [s.path for s in spans]
    rows = sum(s.record_count for s in spans)
    size = sum(s.file_size_in_bytes for s in spans)
    results["data"] = {"files": len(paths), "rows": rows, "mb": round(size / 2**20, 1), "hours": hours}
    start, end = T0_US, T0_US + int(hours * HOUR) + MIN
    # compare windows that the watermark has closed in every run (the read range's "tail")
    cutoff = T0 + timedelta(hours=hours) - timedelta(minutes=30)

    spark.read.parquet(paths[0]).count()  # warm the JVM and the parquet reader
    cpu = spark_cpu_seconds(spark)
    began = time.monotonic()
    truth_rows = aggregation(spark.read.parquet(*paths), streaming=False).collect()
    batch_s = time.monotonic() - began
    batch_cpu = spark_cpu_seconds(spark) - cpu
    truth = as_counts(truth_rows, cutoff)
    results["batch"] = {"seconds": round(batch_s, 1), "cpu_s": round(batch_cpu, 1), "load": _load()}

    plan_path = plays_file_list_path(workdir)

    def kappa_run(name: str, planned: bool = True) -> None:
        # timed from .load() (the data source's schema() runs there), as the batch job is timed
        # from spark.read.parquet (file listing and footers)
        plan_s = write_plays_file_list(workdir, start, end) if planned else None
        extra = {"plan_file": str(plan_path)} if planned else {}
        cpu = spark_cpu_seconds(spark)
        began = time.monotonic()
        df = (
            spark.readStream.format("kappa_iceberg")
            .options(**kappa_options(workdir, "raw.plays", start, end, **extra))
            .load()
        )
        load_s = time.monotonic() - began
        secs, out, progress = run_stream(aggregation(df, streaming=True), workdir / "ck" / name)
        secs += load_s
        used = spark_cpu_seconds(spark) - cpu
        results[name] = {
            "seconds": round(secs, 1),
            "plan_file": planned,
            "launcher_plan_s": plan_s,
            "load_s": round(load_s, 2),
            "batches": len(progress),
            **batch_times(progress),
            **startup(secs, progress),
            **compare(truth, as_counts(out, cutoff)),
        }
        results[name].update(
            ratio_vs_batch=round(secs / batch_s, 2),
            cpu_s=round(used, 1),
            cpu_ratio_vs_batch=round(used / batch_cpu, 2),
            load=_load(),
        )

    def native_run() -> None:
        # Spark's own streaming Parquet file source over the same files, as many files per
        # micro-batch as give kappa's number of batches (24 data batches): the per-batch cost of
        # Structured Streaming itself; it reads files in modification order, not by ingestion time
        links = workdir / "native-links"
        shutil.rmtree(links, ignore_errors=True)
        links.mkdir()
        for i, path in enumerate(paths):
            os.symlink(path.removeprefix("file://"), links / f"f{i:05d}.parquet")
        per_trigger = -(-len(paths) // 24)
        cpu = spark_cpu_seconds(spark)
        df = (
            spark.readStream.schema(spark.read.parquet(paths[0]).schema)
            .option("maxFilesPerTrigger", per_trigger)
            .parquet(str(links))
        )
        secs, out, progress = run_stream(aggregation(df, streaming=True), workdir / "ck" / "native")
        used = spark_cpu_seconds(spark) - cpu
        results["native_stream"] = {
            "seconds": round(secs, 1),
            "batches": len(progress),
            "files_per_batch": per_trigger,
            "first_streaming_query": native_first,
            **batch_times(progress),
            **startup(secs, progress),
            **compare(truth, as_counts(out, cutoff)),
        }
        results["native_stream"].update(
            ratio_vs_batch=round(secs / batch_s, 2),
            cpu_s=round(used, 1),
            cpu_ratio_vs_batch=round(used / batch_cpu, 2),
            load=_load(),
        )

    if native_first and "a" in parts:
        native_run()  # the first streaming query of the session pays the JVM's one-time costs
    kappa_run("kappa")  # the first kappa query of the session: pays the one-time costs
    print("a", results, flush=True)
    if "a" in parts:
        if not native_first:
            native_run()
        kappa_run("kappa_warm")  # the same query again in the same session (Python workers, JVM warm)
        kappa_run("kappa_warm_self_planned", planned=False)  # warm, the reader planning from the catalog
        print("a", {k: results[k] for k in ("native_stream", "kappa_warm", "kappa_warm_self_planned")}, flush=True)

    if "b" in parts:
        write_plays_file_list(workdir, start, end)
        strict = kappa_options(workdir, "raw.plays", start, end, max_files_per_batch=1, plan_file=str(plan_path))
        cpu = spark_cpu_seconds(spark)
        began = time.monotonic()
        df = spark.readStream.format("kappa_iceberg").options(**strict).load()
        load_s = time.monotonic() - began
        secs, out, progress = run_stream(aggregation(df, streaming=True), workdir / "ck" / "strict")
        secs += load_s
        used = spark_cpu_seconds(spark) - cpu
        results["strict"] = {
            "seconds": round(secs, 1),
            "batches": len(progress),
            **batch_times(progress),
            **compare(truth, as_counts(out, cutoff)),
            "cpu_s": round(used, 1),
            "load": _load(),
        }
        results["strict"]["slowdown_vs_kappa"] = round(secs / results["kappa"]["seconds"], 1)
        results["strict"]["cpu_slowdown_vs_kappa"] = round(used / results["kappa"]["cpu_s"], 1)
        if "kappa_warm" in results:  # both queries in a warm session: the like-for-like ratio
            results["strict"]["slowdown_vs_kappa_warm"] = round(secs / results["kappa_warm"]["seconds"], 1)
            results["strict"]["cpu_slowdown_vs_kappa_warm"] = round(used / results["kappa_warm"]["cpu_s"], 1)
        print("b", results["strict"], flush=True)

    if "c" in parts:
        per_batch = max(2, round(len(paths) / (hours * 4)))  # as many files per batch as kappa reads per 15 min
        opts = {
            "catalog": "lake",
            "catalog_properties": json.dumps(catalog_props(workdir)),
            "table": "raw.plays",
            "order": "random",
            "seed": "7",
            "files_per_batch": str(per_batch),
        }
        df = spark.readStream.format("bench_file_order").options(**opts).load()
        secs, out, progress = run_stream(aggregation(df, streaming=True), workdir / "ck" / "unordered")
        results["unordered"] = {
            "seconds": round(secs, 1),
            "batches": len(progress),
            "files_per_batch": per_batch,
            **compare(truth, as_counts(out, cutoff)),
        }
        print("c", results["unordered"], flush=True)
    return results


def rmi_join(impressions: Any, clicks: Any) -> Any:
    """RMI: clicks attributed to the impression that preceded them, per 5-minute window."""
    from pyspark.sql import functions as F

    i = impressions.select(
        F.col("account_id").alias("i_account"),
        F.col("show_id").alias("i_show"),
        F.col("event_ts").alias("impression_ts"),
    ).withWatermark("impression_ts", "10 minutes")
    c = clicks.select(
        F.col("account_id").alias("c_account"), F.col("show_id").alias("c_show"), F.col("event_ts").alias("click_ts")
    ).withWatermark("click_ts", "10 minutes")
    joined = i.join(
        c,
        F.expr(
            "c_account = i_account AND c_show = i_show "
            "AND click_ts >= impression_ts AND click_ts <= impression_ts + INTERVAL 30 MINUTES"
        ),
    )
    return (
        joined.groupBy(F.window("impression_ts", "5 minutes"), F.col("i_show").alias("show_id"))
        .count()
        .select(F.col("window.start").alias("window_start"), "show_id", "count")
    )


def peak_state(progress: list[Any]) -> int:
    return max((sum(op.numRowsTotal for op in p.stateOperators) for p in progress), default=0)


def part_d(spark: Any, workdir: Path) -> dict[str, Any]:
    start, end = T0_US, T0_US + 2 * HOUR + MIN
    align = json.dumps(
        [
            {"catalog": "lake", "table": t, "ingestion_column": "ingestion_ts", "snapshot_id": None}
            for t in ("raw.impressions", "raw.clicks")
        ]
    )
    results: dict[str, Any] = {}

    def kappa(threshold: str, aligned: bool = True) -> tuple[Any, Any]:
        extra: dict[str, str] = {"max_misalignment_threshold": threshold} | ({"align_with": align} if aligned else {})
        imp = (
            spark.readStream.format("kappa_iceberg")
            .options(**kappa_options(workdir, "raw.impressions", start, end, **extra))
            .load()
        )
        clk = (
            spark.readStream.format("kappa_iceberg")
            .options(**kappa_options(workdir, "raw.clicks", start, end, **extra))
            .load()
        )
        return imp, clk

    cat = load_catalog(workdir)
    imp_rows = sum(s.record_count for s in _spans(cat, "raw.impressions"))
    budget = imp_rows // 4  # each source admits this many rows per batch: 15 min of impressions
    base = {
        "catalog": "lake",
        "catalog_properties": json.dumps(catalog_props(workdir)),
        "order": "lower",
        "rows_per_batch": str(budget),
    }
    variants = {
        "aligned_15min": lambda: kappa("15min"),
        "no_align_with_15min": lambda: kappa("15min", aligned=False),
        "live_paced_2min": lambda: kappa("2min"),
        "unaligned_row_budget": lambda: (
            spark.readStream.format("bench_file_order").options(**base, table="raw.impressions").load(),
            spark.readStream.format("bench_file_order").options(**base, table="raw.clicks").load(),
        ),
    }
    outputs = {}
    for name, make in variants.items():
        imp, clk = make()
        secs, out, progress = run_stream(rmi_join(imp, clk), workdir / "ck" / f"rmi_{name}")
        outputs[name] = as_counts(out, T0 + timedelta(hours=2) - timedelta(minutes=45))
        results[name] = {
            "seconds": round(secs, 1),
            "batches": len(progress),
            "peak_state_rows": peak_state(progress),
            "output_rows": len(out),
        }
        print("d", name, results[name], flush=True)
    for name, counts in outputs.items():
        diff = compare(outputs["live_paced_2min"], counts)
        results[name]["windows_differing_from_live"] = diff["windows_wrong"]
    live = results["live_paced_2min"]["peak_state_rows"] or 1
    for r in results.values():
        r["peak_vs_live"] = round(r["peak_state_rows"] / live, 2)
    results["rows"] = {"impressions": imp_rows, "clicks": sum(s.record_count for s in _spans(cat, "raw.clicks"))}
    return results


def _spans(cat: Any, table: str) -> list[Any]:
    from airflow_provider_kappa.spark.source.manifests import file_spans

    return file_spans(cat.load_table(table), None, "ingestion_ts", None, None)


def make_many_files(workdir: Path, files: int, per_commit: int) -> float:
    """A table whose snapshot lists ``files`` data files, made by fast-appending synthetic
    DataFile entries (with ingestion bounds) through pyiceberg: manifests only, no Parquet."""
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    from airflow_provider_kappa.demo.lake_schema import create_raw_table

    cat = load_catalog(workdir)
    if cat.table_exists("raw.many"):
        cat.drop_table("raw.many")
    table = create_raw_table(cat, "raw.many")
    pack = struct.Struct("<q").pack
    began = time.monotonic()
    for c in range(0, files, per_commit):
        with table.transaction() as tx, tx.update_snapshot().fast_append() as fa:
            for i in range(c, min(files, c + per_commit)):
                lo = T0_US + i * 10 * US
                df = DataFile.from_args(
                    content=DataFileContent.DATA,
                    file_path=f"file:///synthetic/f{i}.parquet",
                    file_format=FileFormat.PARQUET,
                    partition=Record(lo // HOUR),
                    record_count=1000,
                    file_size_in_bytes=50_000,
                    column_sizes={5: 8000},
                    value_counts={5: 1000},
                    null_value_counts={5: 0},
                    nan_value_counts={},
                    lower_bounds={4: pack(lo - MIN), 5: pack(lo)},
                    upper_bounds={4: pack(lo + 9 * US), 5: pack(lo + 9 * US)},
                    split_offsets=[4],
                )
                df.spec_id = 0
                fa.append_data_file(df)
    return time.monotonic() - began


PLAN_CHILD = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
from pyiceberg.catalog import load_catalog
from airflow_provider_kappa.spark.source.file_index import SpanIndex
from airflow_provider_kappa.spark.source.grid import Presence, grid_batch_end
from airflow_provider_kappa.spark.source.manifests import file_spans
table = load_catalog("lake", **json.loads({props!r})).load_table("raw.many")
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
began = time.monotonic()
spans = file_spans(table, None, "ingestion_ts", None, None)
full = time.monotonic() - began
began = time.monotonic()
part = file_spans(table, None, "ingestion_ts", {lo}, {hi})
ranged = time.monotonic() - began
began = time.monotonic()
index = SpanIndex(spans)
presence = Presence(spans, spans[0].lower_micros, spans[-1].upper_micros + 1)
pos, batches = spans[0].lower_micros, 0
while (end := grid_batch_end(pos, presence, 900_000_000, spans[-1].upper_micros + 1)) is not None:
    index.between(pos, end); pos = end; batches += 1
grid = time.monotonic() - began
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"files": len(spans), "plan_seconds": round(full, 2), "ranged_files": len(part),
                  "ranged_plan_seconds": round(ranged, 2), "grid_batches": batches, "grid_seconds": round(grid, 3),
                  "rss_before_mb": round(before / 1024), "rss_peak_mb": round(peak / 1024)}}))
"""


def part_e(workdir: Path, files: int) -> dict[str, Any]:
    made = make_many_files(workdir, files, 10_000)
    lo, hi = T0_US + 2 * HOUR, T0_US + 3 * HOUR
    code = PLAN_CHILD.format(root=str(ROOT), props=json.dumps(catalog_props(workdir)), lo=lo, hi=hi)
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    result["generate_seconds"] = round(made, 1)
    print("e", result, flush=True)
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default="/tmp/kappa-bench")
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--hours", type=float, default=6)
    parser.add_argument("--files-e", type=int, default=100_000)
    parser.add_argument("--parts", default="a,b,c,d,e")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument(
        "--native-first",
        action="store_true",
        help="part a: run Spark's native streaming file source before kappa_iceberg (as the session's first streaming query)",
    )
    args = parser.parse_args(argv)
    parts = set(args.parts.split(","))
    workdir = Path(args.workdir)
    results: dict[str, Any] = {"machine": machine(), "command": " ".join([Path(sys.executable).name, *sys.argv])}
    if parts & {"a", "b", "c", "d"}:
        prepare(workdir, args.rows, args.hours)
        spark = spark_session()
        if parts & {"a", "b", "c"}:
            results["abc"] = part_a_b_c(spark, workdir, args.hours, parts, args.native_first)
        if "d" in parts:
            results["d"] = part_d(spark, workdir)
        spark.stop()
    if "e" in parts:
        (workdir / "warehouse").mkdir(parents=True, exist_ok=True)
        results["e"] = part_e(workdir, args.files_e)
    text = json.dumps(results, indent=2, default=str)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


def _load() -> float:
    """The 1-minute load average now."""
    return round(os.getloadavg()[0], 1)


def machine() -> dict[str, Any]:
    import platform

    load = os.getloadavg()
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_at_start": [round(x, 1) for x in load],
        "max_rss_limit": resource.getrlimit(resource.RLIMIT_AS)[0],
    }


if __name__ == "__main__":
    main()
