"""Benchmark (not a test): a ``kappa backfill`` replaying a synthetic live ledger over a landed day,
against the Structured Streaming floor with the same micro-batches.

    .venv/bin/python benchmarks/bench_ledger.py --out /tmp/bench-ledger.json       # a day at 10 s: 8,640 batches
    .venv/bin/python benchmarks/bench_ledger.py --hours 1 --out /tmp/bench-ledger-1h.json
    .venv/bin/python benchmarks/bench_ledger.py --quick                            # 6 min of live: 36 batches

The lake (file-backed sqlite ``SqlCatalog``, reused while the parameters are unchanged): ``--hours``
of synthetic Kafka records of topic ``plays`` (``--partitions`` partitions, about ``--rate``
records per ``--trigger`` batch, Poisson), landed as ``kappa land`` lands them: the event columns
the job reads, the ingestion column (the record's Kafka timestamp, whole milliseconds) and
``kafka_topic`` / ``kafka_partition`` / ``kafka_offset``, one Iceberg append per ``--landing``
interval. Event time = ingestion - delay (97% exponential, mean 15 s, capped at 5 min; 3% 1..9 min:
offline clients), so some events are late for the watermark and live drops them. Beside it, the
live ledger a ``kappa run`` at that trigger would have recorded, in the job's ledger folder
(``job/checkpoints.ledger_folder`` of the lake's checkpoint root, ``spark/ledger.sink_ledger``):
one version-2 ``LedgerEntry`` per batch (offset ranges per partition, first / last record ms,
counts, the watermark Spark would have run the batch with). The data and the ledger run a few
landing intervals past ``--hours``, so the window's end is landed and covered.

Runs, each timed (wall, CPU of its process tree: ``RUSAGE_CHILDREN``):

- ``floor``: plain Structured Streaming, one ``spark-submit --master local[2]``: the job's query
  (watermark, windows, append) over Spark's Parquet file source, one Parquet file per live batch of
  the range read (``maxFilesPerTrigger=1``, ``availableNow``): the same micro-batches, no Iceberg, no
  slices, no kappa.
- ``kappa sequential``: the real ``kappa backfill`` (the ``kappa`` console script: snapshot,
  pre-flight, plan, every slice, validate, publish) of the unchanged streaming job, engine
  ``connect``, ``ledger`` left at its default (``auto``: it must say ``exact: the live ledger
  covers``, else the benchmark stops), ``--slice`` = hours / 12 (2 h for a day), ``--tail`` =
  watermark + window (at least 1 min; the window's end is the data's end minus the tail).
- ``kappa parallel``: the same with ``--mode parallel`` and ``--warmup`` = window + watermark.
  ``kappa backfill`` runs parallel slices one after the other; the Airflow DAG runs them at once.
  ``parallel N at once`` is computed, not measured: the fixed cost outside slices plus the
  makespan of the measured slice times over ``--at-once`` workers (on a machine with the cores).

Every run's output windows of ``[start, end)`` are compared with the floor's as a multiset
(``exact``); the per-batch cost is wall / micro-batches.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import bench_backfill as bb  # noqa: E402  (timing, slice breakdown, row comparison)

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
T0_MS = int(T0.timestamp() * 1000)
SOURCE, TARGET, TOPIC, JOB_NAME, SINK = "raw.plays", "prod.plays_summary", "plays", "bench_ledger", "summary"
MARGIN_INTERVALS = 3  # landed (and recorded) past --hours: the window's end + tail is landed


class Day:
    """The benchmark's parameters: the live run that is replayed and the backfill of it."""

    def __init__(self, a: argparse.Namespace) -> None:
        from airflow_provider_kappa.timeparse import parse_duration

        self.hours, self.rate, self.partitions, self.seed = a.hours, a.rate, a.partitions, a.seed
        self.trigger = parse_duration(a.trigger, "--trigger")
        self.landing = parse_duration(a.landing, "--landing")
        self.window_d, self.watermark_d = (
            parse_duration(a.window, "--window"),
            parse_duration(a.watermark, "--watermark"),
        )
        # Spark's interval form, for the job and the floor
        self.window, self.watermark = (f"{int(d.total_seconds())} seconds" for d in (self.window_d, self.watermark_d))
        # the window's last windows close once an event a watermark past its end is read, and a batch after it
        self.tail = self.watermark_d + max(self.window_d, timedelta(minutes=1))
        self.warmup = self.window_d + self.watermark_d
        self.slice = a.slice or _duration_text(timedelta(hours=self.hours) / 12)
        if self.trigger.total_seconds() <= 0 or self.landing < self.trigger:
            raise SystemExit(f"--trigger {a.trigger!r} must be positive and --landing {a.landing!r} at least it")
        if timedelta(hours=self.hours) <= self.tail:
            raise SystemExit(f"--hours {self.hours} must be longer than the tail {_duration_text(self.tail)}")

    @property
    def batches(self) -> int:
        """Live batches of the range read (the day): 3600 * hours / trigger seconds."""
        return int(timedelta(hours=self.hours) / self.trigger)

    @property
    def recorded(self) -> int:
        """Live batches landed and recorded: the day plus the margin."""
        return int((timedelta(hours=self.hours) + MARGIN_INTERVALS * self.landing) / self.trigger)

    @property
    def end(self) -> datetime:
        return T0 + timedelta(hours=self.hours) - self.tail

    def params(self) -> dict[str, Any]:
        keys = ("hours", "rate", "partitions", "seed", "trigger", "landing", "watermark")
        return {k: str(getattr(self, k)) for k in keys} | {"version": 1}


def _duration_text(d: timedelta) -> str:
    s = int(d.total_seconds())
    return f"{s // 3600}h" if s % 3600 == 0 else f"{s // 60}min" if s % 60 == 0 else f"{s}s"


def catalog(lake: Path) -> Any:
    return bb.catalog(lake)


def ledger_path(lake: Path) -> Path:
    """The job's live ledger for its one sink, where ``kappa run`` records it: the product's paths."""
    from airflow_provider_kappa.job.checkpoints import ledger_folder
    from airflow_provider_kappa.spark.ledger import sink_ledger

    return Path(sink_ledger(ledger_folder(str(lake / "checkpoints"), JOB_NAME), SINK))


# --------------------------------------------------------------------------- the landed day and its ledger


def live_batch(rng: Any, day: Day, k: int, offsets: list[int]) -> Any:
    """Live batch k's records (an Arrow table in landed columns, ingestion order per partition);
    advances ``offsets`` (the next offset per partition)."""
    import numpy as np
    import pyarrow as pa

    lo = T0_MS + int(k * day.trigger.total_seconds() * 1000)
    step = int(day.trigger.total_seconds() * 1000)
    cols: dict[str, list[Any]] = {c: [] for c in ("ing", "part", "off")}
    for p in range(day.partitions):
        n = int(rng.poisson(day.rate / day.partitions))
        cols["ing"].append(np.sort(rng.integers(lo, lo + step, n)))
        cols["part"].append(np.full(n, p, np.int32))
        cols["off"].append(np.arange(offsets[p], offsets[p] + n, dtype=np.int64))
        offsets[p] += n
    ing, part, off = (np.concatenate(cols[c]) for c in ("ing", "part", "off"))
    n = len(ing)
    delay = np.minimum(rng.exponential(15_000, n), 300_000).astype(np.int64)
    delay = np.where(rng.random(n) < 0.03, rng.integers(60_000, 540_000, n), delay)
    ts = pa.timestamp("ms", tz="UTC")
    return pa.table(
        {
            "event_id": pa.array([f"{TOPIC}-{p}-{o}" for p, o in zip(part.tolist(), off.tolist())], pa.string()),
            "account_id": pa.array(rng.integers(0, 100_000, n), pa.int64()),
            "show_id": pa.array(rng.integers(0, 50, n), pa.int64()),
            "event_ts": pa.array(ing - delay, ts).cast(pa.timestamp("us", tz="UTC")),
            "ingestion_ts": pa.array(ing, ts).cast(pa.timestamp("us", tz="UTC")),
            "kafka_topic": pa.array([TOPIC] * n, pa.string()),
            "kafka_partition": pa.array(part, pa.int32()),
            "kafka_offset": pa.array(off, pa.int64()),
        }
    )


def ledger_entry(day: Day, k: int, rows: Any, starts: list[int], watermark_ms: int) -> Any:
    """Live batch k's version-2 ledger entry, as ``kappa run``'s sink and listener record it."""
    import pyarrow.compute as pc

    from airflow_provider_kappa.spark.ledger import LedgerEntry

    step = int(day.trigger.total_seconds() * 1000)
    parts = rows.column("kafka_partition").to_pylist()
    counts = {p: parts.count(p) for p in range(day.partitions)}
    ing = rows.column("ingestion_ts").cast("int64")
    return LedgerEntry(
        query_id="bench-ledger-live",
        batch_id=k,
        end_ms=T0_MS + (k + 1) * step,
        start_ms=None if k == 0 else T0_MS + k * step,
        watermark_ms=watermark_ms,
        ranges={TOPIC: {p: (starts[p], starts[p] + counts[p]) for p in range(day.partitions)}},
        first_record_ms=pc.min(ing).as_py() // 1000 if len(rows) else None,
        last_record_ms=pc.max(ing).as_py() // 1000 if len(rows) else None,
        counts={TOPIC: counts},
        source_rows={f"KafkaV2[Subscribe[{TOPIC}]]": len(rows)},
    )


def prepare(lake: Path, day: Day) -> None:
    """The landed table, the empty target, the live ledger and the floor's files (one per batch)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    marker = lake / "params.json"
    if marker.exists() and json.loads(marker.read_text()) == day.params():
        print(f"reusing the lake in {lake}", flush=True)
        return
    shutil.rmtree(lake, ignore_errors=True)
    (lake / "warehouse").mkdir(parents=True)
    (lake / "floor-files").mkdir()
    folder = ledger_path(lake)
    folder.mkdir(parents=True)
    began = time.monotonic()
    table = create_tables(lake)
    rng = np.random.default_rng(day.seed)
    offsets, pending, watermark, max_event = [0] * day.partitions, [], 0, 0
    per_landing = int(day.landing / day.trigger)
    base = time.time() - day.recorded
    for k in range(day.recorded):
        starts = list(offsets)
        rows = live_batch(rng, day, k, offsets)
        entry = ledger_entry(day, k, rows, starts, watermark)
        (folder / entry.name).write_text(entry.to_json())
        if len(rows):  # Spark's watermark for the next batch: the largest event time so far minus the delay
            max_event = max(max_event, pc.max(rows.column("event_ts").cast("int64")).as_py() // 1000)
            watermark = max(watermark, max_event - int(day.watermark_d.total_seconds() * 1000))
        if k < day.batches:  # the floor reads the batches of the range read, one file each, in order
            path = lake / "floor-files" / f"{k:06d}.parquet"
            pq.write_table(rows, path)
            os.utime(path, (base + k, base + k))  # Spark's file source takes files oldest first
        pending.append(rows)
        if len(pending) == per_landing or k == day.recorded - 1:
            table.append(pa.concat_tables(pending))
            pending = []
    marker.write_text(json.dumps(day.params()))
    print(f"landed {day.recorded} live batches and their ledger in {lake} in {time.monotonic() - began:.0f}s")


def create_tables(lake: Path) -> Any:
    """The landed table (``kappa land``'s columns, partitioned by hour of ingestion) and the target."""
    from pyiceberg.types import IntegerType, LongType, StringType

    from airflow_provider_kappa.demo.lake_schema import create_raw_table

    cat = catalog(lake)
    table = create_raw_table(cat, SOURCE)
    with table.update_schema() as update:
        update.add_column("kafka_topic", StringType())
        update.add_column("kafka_partition", IntegerType())
        update.add_column("kafka_offset", LongType())
    bb.create_summary_target(cat)
    return cat.load_table(SOURCE)


# --------------------------------------------------------------------------- runs


def write_config(run: Path, lake: Path, day: Day) -> Path:
    import yaml

    run.mkdir(parents=True, exist_ok=True)
    (run / "job.py").write_text(bb.job_source(day.window, day.watermark))
    raw = {
        "job": {
            "name": JOB_NAME,
            "application": "job.py",
            "checkpoint_root": str(run / "checkpoints"),
            "ledger": str(ledger_path(lake).parent),  # the live run's (its checkpoint root is the lake's)
            "master": "local[2]",
            "engine": "connect",
            "spark_conf": {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"},
        },
        "catalogs": {"lake": bb.catalog_props(lake)},
        "sources": bb.plays_sources(),
        "sinks": {SINK: {"type": "iceberg", "catalog": "lake", "table": TARGET, "time_column": "window_start"}},
    }
    path = run / "kappa.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def run_kappa(work: Path, lake: Path, day: Day, mode: str) -> dict[str, Any]:
    """One ``kappa backfill`` (the console script) with the ledger at its default; figures and slices."""
    run = work / f"kappa-{mode}"
    shutil.rmtree(run, ignore_errors=True)
    config = write_config(run, lake, day)
    cmd = [
        str(Path(sys.executable).parent / "kappa"),
        "backfill",
        "--config",
        str(config),
        "--start",
        T0.isoformat(),
        "--end",
        day.end.isoformat(),
        "--slice",
        day.slice,
        "--warmup",
        _duration_text(day.warmup) if mode == "parallel" else "0s",
        "--tail",
        _duration_text(day.tail),
        "--max-misalignment",  # not used by a ledger replay; at most the slice
        day.slice,
        "--mode",
        mode,
        "--min-match",
        "0",
        "--timeline",
    ]
    result = bb.timed(cmd, run / "kappa.log", dict(os.environ, COLUMNS="200"))
    text = (run / "kappa.log").read_text()
    exactness = re.search(r"exactness: ([^\n]+)", text)
    result["exactness"] = exactness.group(1).strip() if exactness else None
    if not result["exactness"] or "the live ledger covers" not in result["exactness"]:
        raise RuntimeError(f"kappa backfill did not replay the ledger ({result['exactness']}); see {run / 'kappa.log'}")
    result["slices"] = bb.slice_breakdown(run / "checkpoints")
    result["batches"] = sum(s["batches"] for s in result["slices"])
    result["timeline"] = bb.timeline(text)
    result["command"] = " ".join(cmd)
    return result


def at_once(kappa: dict[str, Any], workers: int) -> dict[str, Any]:
    """Computed (not measured): the wall time with ``workers`` slices at once: the run's time outside
    its slices plus the makespan of its measured slice times over ``workers`` (longest first)."""
    times = sorted((s["slice_s"] for s in kappa["slices"] if "slice_s" in s), reverse=True)
    loads = [0.0] * workers
    for t in times:
        heapq.heapreplace(loads, loads[0] + t)
    outside = kappa["wall_s"] - sum(times)
    return {"workers": workers, "wall_s": round(outside + max(loads), 1), "outside_slices_s": round(outside, 1)}


def run_floor(work: Path, lake: Path, day: Day) -> dict[str, Any]:
    """The Structured Streaming floor: one spark-submit of :func:`floor_app`."""
    import pyspark

    run = work / "floor"
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    cmd = [
        str(Path(pyspark.__file__).parent / "bin" / "spark-submit"),
        "--master",
        "local[2]",
        *("--conf", "spark.sql.shuffle.partitions=2", "--conf", "spark.ui.enabled=false"),
        *("--conf", "spark.sql.session.timeZone=UTC", "--conf", "spark.sql.streaming.numRecentProgressUpdates=1000000"),
        str(Path(__file__).resolve()),
        "floor-app",
        *("--files", str(lake / "floor-files"), "--out", str(run)),
        *("--window", day.window, "--watermark", day.watermark),
    ]
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    result = bb.timed(cmd, run / "floor.log", env)
    records = json.loads((run / "progress.json").read_text())
    result.update(
        batches=len(records),
        data_batches=sum(1 for r in records if bb._input_rows(r) > 0),
        batches_s=round(sum(r["durationMs"].get("triggerExecution", 0) for r in records) / 1000, 1),
        command=" ".join(cmd),
    )
    return result


def floor_app(files: Path, out: Path, window: str, watermark: str) -> None:
    """The floor (runs inside spark-submit): the job's query over Spark's file source and sink."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = SparkSession.builder.appName("bench-ledger-floor").getOrCreate()
    schema = spark.read.parquet(str(next(files.iterdir()))).schema
    rows = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(files))
    counts = (
        rows.withWatermark("event_ts", watermark)
        .groupBy(F.window("event_ts", window), "show_id")
        .count()
        .select(
            F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"), "show_id", "count"
        )
    )
    query = (
        counts.writeStream.format("parquet")
        .outputMode("append")
        .option("path", str(out / "rows"))
        .option("checkpointLocation", str(out / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()  # every batch's progress: numRecentProgressUpdates is raised on the command line
    records = [json.loads(p.json) for p in query.recentProgress]
    (out / "progress.json").write_text(json.dumps(records))
    spark.stop()


# --------------------------------------------------------------------------- results


def window_filter(day: Day) -> Any:
    from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan

    return And(GreaterThanOrEqual("window_start", T0.isoformat()), LessThan("window_start", day.end.isoformat()))


def floor_rows(work: Path, day: Day) -> list[tuple[Any, ...]]:
    """The floor's output windows of ``[start, end)`` (its file sink's folder)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    t = pq.read_table(work / "floor" / "rows", columns=["window_start", "show_id", "count"])
    typ = t.schema.field("window_start").type
    start, end = pc.cast(T0, typ), pc.cast(day.end, typ)
    return bb._rows(t.filter(pc.and_(pc.greater_equal(t["window_start"], start), pc.less(t["window_start"], end))))


def published_rows(lake: Path, day: Day) -> list[tuple[Any, ...]]:
    """The target's rows of ``[start, end)`` after a publish."""
    table = catalog(lake).load_table(TARGET)
    scan = table.scan(row_filter=window_filter(day), selected_fields=("window_start", "show_id", "count"))
    return bb._rows(scan.to_arrow())


def summarize(run: dict[str, Any], floor: dict[str, Any]) -> dict[str, Any]:
    """Per-batch cost and the ratios to the floor."""
    batches = run.get("batches") or 0
    return {
        "per_batch_s": round(run["wall_s"] / batches, 3) if batches else None,
        "wall_vs_floor": round(run["wall_s"] / floor["wall_s"], 2),
        "cpu_vs_floor": round(run["cpu_s"] / floor["cpu_s"], 2) if floor["cpu_s"] else None,
    }


def table(doc: dict[str, Any]) -> str:
    """The results as a markdown table."""
    d = doc["day"]
    out = [
        f"live: {d['hours']} h at a {d['trigger']} trigger = {d['batches']} batches in the range read, "
        f"~{d['rate']} records a batch, {d['partitions']} partitions; window [{d['start']}, {d['end']}), "
        f"tail {d['tail']}, slices {d['slice']}",
        "| run | micro-batches | wall s | CPU s | per batch s | wall vs floor | CPU vs floor | slices | exact |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, r in doc["runs"].items():
        s = r.get("summary", {})
        slices = len(r["slices"]) if "slices" in r else ""
        exact = r["match"]["exact"] if "match" in r else "(reference)"
        out.append(
            f"| {name} | {r.get('batches', '')} | {r['wall_s']} | {r.get('cpu_s', '')} | {s.get('per_batch_s', '')} "
            f"| {s.get('wall_vs_floor', '')} | {s.get('cpu_vs_floor', '')} | {slices} | {exact} |"
        )
    for name, c in doc.get("computed", {}).items():
        out.append(
            f"| {name} (computed from the measured slices, not run) | | {c['wall_s']} | | | "
            f"{round(c['wall_s'] / doc['runs']['floor']['wall_s'], 2)} | | | |"
        )
    return "\n".join(out)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hours", type=float, default=24.0, help="hours of live replayed (default 24)")
    p.add_argument("--trigger", default="10s", help="live's trigger interval (default 10s)")
    p.add_argument("--rate", type=int, default=300, help="records per live batch, all partitions (default 300)")
    p.add_argument("--partitions", type=int, default=2, help="Kafka partitions of the topic (default 2)")
    p.add_argument("--landing", default="5min", help="one Iceberg append per this much live (default 5min)")
    p.add_argument("--window", default="5min", help="the job's event-time window (default 5min)")
    p.add_argument("--watermark", default="10min", help="the job's watermark delay (default 10min)")
    p.add_argument("--slice", default=None, help="slice length (default hours / 12: 2h for a day)")
    p.add_argument("--at-once", type=int, default=4, help="parallel slices at once, computed (default 4)")
    p.add_argument("--modes", default="sequential,parallel", help="kappa backfill modes to run")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--reuse-floor", action="store_true", help="reuse the floor's run of the same workdir (marked)")
    p.add_argument("--quick", action="store_true", help="a smoke run: 6 min of live (36 batches), 1-min windows")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/kappa-bench-ledger"))
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    a = p.parse_args(argv)
    if a.quick:
        a.hours, a.window, a.watermark, a.landing, a.slice = 0.1, "1min", "1min", "1min", a.slice or "1min"
    return a


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "floor-app":
        p = argparse.ArgumentParser()
        for flag in ("--files", "--out", "--window", "--watermark"):
            p.add_argument(flag, required=True)
        a = p.parse_args(argv[1:])
        floor_app(Path(a.files), Path(a.out), a.window, a.watermark)
        return
    a = parse(argv)
    day = Day(a)
    label = f"{a.hours:g}h-{a.trigger}"
    lake, work = a.workdir / f"lake-{label}", a.workdir / f"runs-{label}"
    prepare(lake, day)
    doc: dict[str, Any] = {
        "machine": bb.machine(),
        "command": " ".join([sys.executable, *sys.argv]),
        "day": {
            "hours": a.hours,
            "trigger": a.trigger,
            "batches": day.batches,
            "rate": a.rate,
            "partitions": a.partitions,
            "start": T0.isoformat(),
            "end": day.end.isoformat(),
            "tail": _duration_text(day.tail),
            "slice": day.slice,
        },
        "runs": {},
        "computed": {},
    }
    saved = work / "floor" / "result.json"
    if a.reuse_floor and saved.exists():
        floor = json.loads(saved.read_text()) | {"reused": True}
    else:
        floor = run_floor(work, lake, day)
        saved.write_text(json.dumps(floor))
    doc["runs"]["floor"] = floor
    print("floor", {k: v for k, v in floor.items() if k != "command"}, flush=True)
    truth = floor_rows(work, day)
    for mode in [m for m in a.modes.split(",") if m]:
        kappa = run_kappa(work, lake, day, mode)
        kappa["match"] = bb.compare(truth, published_rows(lake, day))
        kappa["summary"] = summarize(kappa, floor)
        doc["runs"][f"kappa {mode}"] = kappa
        print(f"kappa {mode}", {k: kappa[k] for k in ("wall_s", "cpu_s", "batches", "match", "summary")}, flush=True)
        for step in kappa["timeline"]:
            print(f"    {step['start_s']:7.1f} → {step['end_s']:7.1f}  {step['step']}", flush=True)
        if mode == "parallel":
            doc["computed"][f"kappa parallel, {a.at_once} at once"] = at_once(kappa, a.at_once)
    floor["summary"] = summarize(floor, floor)
    doc["machine"]["uptime_after"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(doc, indent=2, default=str))
    print(table(doc))


if __name__ == "__main__":
    main()
