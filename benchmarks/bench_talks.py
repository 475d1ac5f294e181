"""The talks' comparison on one dataset, one run, one machine (not a test). See benchmarks/comparison.md.

    .venv/bin/python benchmarks/bench_talks.py --workdir /tmp/kappa-talks --hours 3 --rate 100 \\
        --md benchmarks/comparison.md

One lake from :mod:`airflow_provider_kappa.demo.lakegen` (impressions and playbacks, 10:1, landed
every ``--landing``), the unchanged ``rmi`` example job (a stream-stream join then a windowed
count), and six ways to compute its output:

- ``live``: the live reference (:mod:`airflow_provider_kappa.demo.live_reference`): the job LIVE over
  the lake in ingestion order, one landing per micro-batch. The truth.
- ``strawman 1 (unordered)``: the job reading whole files in random order, several per
  micro-batch (``bench_file_order`` of bench_source.py), no alignment.
- ``strawman 2 (strict order)``: the job reading one file per source per micro-batch
  (``kappa_iceberg`` with ``max_files_per_batch=1``).
- ``Kappa sequential`` / ``Kappa parallel``: the real backfill path
  (:mod:`airflow_provider_kappa.backfill.slices` and its siblings: snapshot, plan, one Spark
  Connect session per slice on a local server started for the backfill (engine ``connect``, the
  default), validate), the code the DAG's tasks run. Parallel slices run ``--parallelism`` at once.
  Both at ``--threshold``; ``Kappa sequential, threshold = landing interval`` is sequential at
  ``--landing``: one landing per micro-batch, as live reads them.
- ``batch job``: the hand-written plain Spark batch job over the same Parquet files (the speed limit).

Every variant runs in its own process with its own JVM (``local[2]``); its wall time includes
start-up. Outputs are compared with the live output over the compared window
``[lake start + 30 min, lake end - 1 h)`` (a warmup of data before it; after it, enough for
live to have closed every window in it) as multisets of rows.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# Spark's Python workers unpickle bench_source's reader (strawman 1): they need this folder too
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT / "benchmarks"), str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
)

JOB = "rmi"
CONFIG = ROOT / "airflow_provider_kappa" / "examples" / JOB / "kappa.yaml"
WARMUP = timedelta(minutes=30)
#: The compared window ends this long before the lake: live (which stops at the lake's end)
#: has closed every rmi window before it (10-minute watermark + 30-minute join bound + 5-minute window).
TAIL = timedelta(hours=1)
VARIANTS = ("live", "strawman1", "strawman2", "sequential", "parallel", "sequential_landing", "batch")
LABELS = {
    "live": "live reference (the truth)",
    "strawman1": "strawman 1: unordered (random files, {files} per batch)",
    "strawman2": "strawman 2: strict order (1 file per batch)",
    "sequential": "Kappa sequential",
    "parallel": "Kappa parallel",
    "sequential_landing": "Kappa sequential, threshold = landing interval",
    "batch": "hand-written batch job (speed limit)",
}


# --------------------------------------------------------------------------- set-up


def lake_spec(args: argparse.Namespace) -> Any:
    from airflow_provider_kappa.demo.lakegen import LakeSpec
    from airflow_provider_kappa.timeparse import parse_duration

    return LakeSpec(
        hours=args.hours, rate=args.rate, seed=args.seed, landing_interval=parse_duration(args.landing, "--landing")
    )


def prepare_lake(args: argparse.Namespace) -> dict[str, Any]:
    """Generate the lake in ``<workdir>/lake`` (reused while its parameters are unchanged)."""
    from airflow_provider_kappa.demo.lakegen import generate_lake, local_catalog

    lake = Path(args.workdir) / "lake"
    params = {"hours": args.hours, "rate": args.rate, "seed": args.seed, "landing": args.landing, "version": 1}
    marker = lake / "params.json"
    if marker.exists() and json.loads(marker.read_text()).get("params") == params:
        print(f"reusing the lake in {lake}", flush=True)
        return dict(json.loads(marker.read_text())["summary"])
    shutil.rmtree(lake, ignore_errors=True)
    lake.mkdir(parents=True)
    s = generate_lake(local_catalog(lake), lake_spec(args))
    summary = {
        "impressions": s.impressions,
        "playbacks": s.playbacks,
        "rows": s.rows,
        "snapshots": s.snapshots,
        "start": s.start.isoformat(),
        "end": s.end.isoformat(),
        "seconds": round(s.seconds, 1),
        "files": _file_count(lake),
    }
    marker.write_text(json.dumps({"params": params, "summary": summary}))
    print(f"lake: {summary}", flush=True)
    return summary


def _file_count(lake: Path) -> int:
    return sum(1 for p in (lake / "warehouse").rglob("*.parquet") if "/data/" in str(p))


def window(args: argparse.Namespace) -> tuple[datetime, datetime]:
    spec = lake_spec(args)
    return spec.start + WARMUP, spec.end - TAIL


def job_config(lake: Path) -> Any:
    from airflow_provider_kappa.demo.live_reference import lake_env
    from airflow_provider_kappa.job.config import load_config

    with lake_env(lake):
        return load_config(CONFIG)


def catalog(lake: Path) -> Any:
    from airflow_provider_kappa.demo.lakegen import local_catalog

    return local_catalog(lake)


# --------------------------------------------------------------------------- variants run by the parent


def run_live(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    from airflow_provider_kappa.demo.live_reference import run_live_reference
    from airflow_provider_kappa.engine.progress import event_log_conf, read_progress

    lake = Path(args.workdir) / "lake"
    events = _fresh(out / "eventlog")
    began = time.monotonic()
    run_live_reference(CONFIG, lake_dir=lake, fresh=True, extra_conf=event_log_conf(events))
    wall = time.monotonic() - began
    return {"wall": wall, **_progress_facts(read_progress(events)), "planning": _offset_seconds(read_progress(events))}


def run_kappa(args: argparse.Namespace, mode: str, threshold: str) -> dict[str, Any]:
    """The real backfill path, as the DAG's tasks call it: snapshot, plan, slices, validate.
    Nothing is published: the live output stays the reference."""
    from airflow_provider_kappa.backfill import backfill as backfills
    from airflow_provider_kappa.backfill import plan as planning
    from airflow_provider_kappa.backfill import slices as slice_steps
    from airflow_provider_kappa.backfill import snapshot
    from airflow_provider_kappa.backfill import validate as validation
    from airflow_provider_kappa.demo.options import PARALLEL_TAIL
    from airflow_provider_kappa.engine import connect_server
    from airflow_provider_kappa.timeparse import format_duration

    lake = Path(args.workdir) / "lake"
    start, end = window(args)
    cfg = job_config(lake)
    raw = {
        "start": start.isoformat(),
        "end": end.isoformat(),
        "mode": mode,
        "slice": args.slice,
        "max_misalignment_threshold": threshold,
        "warmup": "30min",
        "publish": False,
        "tail": format_duration(PARALLEL_TAIL),
    }
    began = time.monotonic()
    bf = backfills.Backfill.create(cfg, raw)
    shutil.rmtree(bf.store().root.removeprefix("file://"), ignore_errors=True)
    pinned = snapshot.snapshot(bf)
    plan = planning.plan(bf, pinned)
    planned = time.monotonic() - began
    state_file = bf.connect_state_file()
    if cfg.job.engine == "connect" and cfg.job.connect is None:
        connect_server.ensure_server(cfg, state_file)  # the backfill's local server, as the DAG's setup task starts it
    try:
        if mode == "parallel":
            with ThreadPoolExecutor(max_workers=args.parallelism) as pool:
                results = list(pool.map(lambda sp: slice_steps.run_slice(bf, sp), plan.slices))
        else:
            results = [slice_steps.run_slice(bf, sp) for sp in plan.slices]
    finally:
        connect_server.stop_owned(state_file)
    reports = validation.validate(bf, plan)
    wall = time.monotonic() - began
    progress = _stored_progress(bf.store())
    [report] = reports.values()
    return {
        "wall": wall,
        "slices": len(plan.slices),
        "batches": sum(int(r["batches"]) for r in results),
        "rows_read": sum(int(r["rows_read"]) for r in results),
        "peak_state_rows": max((int(r.get("peak_state_rows", 0)) for r in results), default=0),
        "planning": planned + _offset_seconds(progress),
        "plan_step": planned,
        "startup": sum(float(r["seconds"]) - float(r["batch_seconds"]) for r in results),
        "match": {
            "matched": report.matched_rows,
            "live": report.target_rows,
            "variant": report.staged_rows,
            "only_live": report.only_target_sample,
            "only_variant": report.only_staged_sample,
            "only_live_rows": report.only_target_rows,
            "only_variant_rows": report.only_staged_rows,
        },
    }


def _stored_progress(store: Any) -> list[dict[str, Any]]:
    return [record for records in store.progress().values() for record in records]


def run_child(args: argparse.Namespace, variant: str, out: Path) -> dict[str, Any]:
    """Run ``variant`` in a fresh process (its own JVM), timed from the parent."""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--workdir",
        str(args.workdir),
        "--hours",
        str(args.hours),
        "--rate",
        str(args.rate),
        "--seed",
        str(args.seed),
        "--landing",
        args.landing,
        "--threshold",
        args.threshold,
        "--unordered-files",
        str(args.unordered_files),
        "--child",
        variant,
    ]
    began = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - began
    (out / f"{variant}.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"variant {variant} failed (exit {done.returncode}): {done.stderr[-3000:]}")
    result = json.loads((out / f"{variant}.json").read_text())
    return {"wall": wall, **result}


# --------------------------------------------------------------------------- variants run in a child process


def child(args: argparse.Namespace, variant: str) -> None:
    """One variant in this process: strawman 1, strawman 2 (the unchanged job through the
    kappa_iceberg writer into a staging table) or the batch job (rows written as Parquet)."""
    from airflow_provider_kappa.engine.progress import event_log_conf, read_progress

    out = Path(args.workdir) / "runs"
    lake = Path(args.workdir) / "lake"
    events = _fresh(out / variant / "eventlog")
    cfg = job_config(lake)
    spark = _session(cfg, event_log_conf(events))
    began = time.monotonic()
    if variant == "batch":
        result = _batch_job(spark, args, lake, out / variant / "rows.parquet")
    else:
        result = _streaming_job(spark, args, cfg, variant)
    result["in_process"] = time.monotonic() - began
    spark.stop()
    progress = read_progress(events)
    if variant != "batch":
        result.update(_progress_facts(progress))
        result["planning"] = _offset_seconds(progress)
    (out / f"{variant}.json").write_text(json.dumps(result))


def _session(cfg: Any, extra: dict[str, str]) -> Any:
    from pyspark.sql import SparkSession

    from airflow_provider_kappa.engine.progress import PROGRESS_DIR
    from airflow_provider_kappa.engine.submit_args import private_event_log

    if PROGRESS_DIR in extra:  # what the launcher makes of kappa's progress folder: a plain, one-file event log
        extra = {**extra, **private_event_log(extra[PROGRESS_DIR])}
    builder = SparkSession.builder.master(cfg.job.master or "local[2]").appName("kappa-bench-talks")
    conf = {
        **cfg.job.spark_conf,
        "spark.ui.enabled": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.host": "127.0.0.1",
        "spark.ui.showConsoleProgress": "false",
        "spark.python.authenticate.socketTimeout": "300s",
        **extra,
    }
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def _streaming_job(spark: Any, args: argparse.Namespace, cfg: Any, variant: str) -> dict[str, Any]:
    """The unchanged rmi.py in this process, configured as one slice over the whole lake
    that owns the compared window; strawman 1 swaps the reader."""
    from airflow_provider_kappa.engine.launch import SliceRun, slice_conf, write_catalogs_file
    from airflow_provider_kappa.spark import resolve
    from airflow_provider_kappa.spark.settings import IcebergSourceSettings
    from airflow_provider_kappa.spark.staging import clear_slice, staging_table_name
    from airflow_provider_kappa.timeparse import parse_duration

    lake = Path(args.workdir) / "lake"
    spec = lake_spec(args)
    start, end = window(args)
    cat = catalog(lake)
    sink_name, sink = next(iter(cfg.sinks.items()))
    staging = staging_table_name(sink.table, f"bench-{variant}", "s0000", cfg.job.staging_namespace)
    clear_slice(cat, sink.table, staging)
    snaps = {}
    for name in cfg.job_sources():
        src = cfg.resolve(name, backfill=True)
        snaps[src.name] = int(cat.load_table(src.table).current_snapshot().snapshot_id)
    ckpt = _fresh(Path(args.workdir) / "runs" / variant / "checkpoint")
    run = SliceRun(
        backfill_id=f"bench-{variant}",
        slice_id="s0000",
        read_start=spec.start,
        read_end=spec.end,
        owns_start=start,
        owns_end=end,
        max_misalignment_threshold=parse_duration(args.threshold, "--threshold"),
        snapshot_ids=snaps,
        staging_tables={sink_name: staging},
        checkpoint=str(ckpt),
    )
    conf = slice_conf(cfg, run, write_catalogs_file(cfg, ckpt.parent / "catalogs.json"))
    if variant == "strawman2":
        for name in cfg.job_sources():
            conf[f"spark.kappa.source.{name}.option.max_files_per_batch"] = "1"
    for k, v in conf.items():
        if k.startswith("spark.kappa."):
            spark.conf.set(k, v)
    if variant == "strawman1":
        from bench_source import FileOrderSource

        spark.dataSource.register(FileOrderSource)
        settings = resolve.settings_of(spark)

        def unordered(session: Any, name: str) -> Any:
            src = settings.source(name)
            assert isinstance(src, IcebergSourceSettings)  # backfill mode: the iceberg candidates
            return (
                session.readStream.format("bench_file_order")
                .options(**resolve.catalog_options(settings, src.catalog))
                .option("catalog", src.catalog)
                .option("table", src.table)
                .option("order", "random")
                .option("seed", str(args.seed))
                .option("files_per_batch", str(args.unordered_files))
                .load()
            )

        resolve.read_source = unordered  # type: ignore[assignment]  # the job's read_source resolves through this module
    runpy.run_path(str(cfg.job.application), run_name="__main__")
    return {"staging": staging}


def _batch_job(spark: Any, args: argparse.Namespace, lake: Path, rows_path: Path) -> dict[str, Any]:
    """rmi as a plain Spark batch job over the same Parquet files: the same join condition
    and 5-minute windows, no watermark (it sees every event, late ones included)."""
    from pyspark.sql import functions as F

    from airflow_provider_kappa.spark.source.manifests import file_spans

    cat = catalog(lake)
    t = time.monotonic()
    paths = {
        name: [f.path for f in file_spans(cat.load_table(name), None, "ingestion_ts", None, None)]
        for name in ("raw.impressions", "raw.playbacks")
    }
    listing = time.monotonic() - t
    impressions = spark.read.parquet(*paths["raw.impressions"]).select(
        F.col("account_id").alias("i_account"),
        F.col("show_id").alias("i_show"),
        F.col("event_ts").alias("impression_ts"),
    )
    plays = spark.read.parquet(*paths["raw.playbacks"]).select(
        F.col("account_id").alias("p_account"), F.col("show_id").alias("p_show"), F.col("event_ts").alias("play_ts")
    )
    joined = impressions.join(
        plays,
        F.expr(
            "p_account = i_account AND p_show = i_show "
            "AND play_ts >= impression_ts AND play_ts <= impression_ts + INTERVAL 30 MINUTES"
        ),
    )
    summary = joined.groupBy(F.window("impression_ts", "5 minutes"), F.col("i_show").alias("show_id")).agg(
        F.count(F.lit(1)).alias("attributed_plays")
    )
    result = summary.select(
        F.col("window.start").alias("window_start"),
        F.col("window.end").alias("window_end"),
        "show_id",
        "attributed_plays",
    ).toArrow()
    import pyarrow.parquet as pq

    rows_path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(result, rows_path)
    return {
        "rows_file": str(rows_path),
        "planning": listing,
        "batches": 1,
        "peak_state_rows": 0,
        "rows_read": 0,
        "files": sum(len(v) for v in paths.values()),
    }


# --------------------------------------------------------------------------- measures


def _fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def _progress_facts(progress: list[dict[str, Any]]) -> dict[str, Any]:
    from airflow_provider_kappa.engine.progress import summarize

    m = summarize(progress, 0.0)
    return {"batches": m.batches, "rows_read": m.rows_read, "peak_state_rows": m.peak_state_rows}


def _offset_seconds(progress: list[dict[str, Any]]) -> float:
    """Seconds the micro-batches spent deciding what to read (``latestOffset``) and planning
    the query (``queryPlanning``), from Spark's progress records."""
    total = 0
    for p in progress:
        d = p.get("durationMs") or {}
        total += int(d.get("latestOffset") or 0) + int(d.get("queryPlanning") or 0)
    return total / 1000.0


def compare_with_live(args: argparse.Namespace, variant: str, result: dict[str, Any]) -> dict[str, Any]:
    """Multiset comparison of the variant's rows in the compared window with the live output."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_provider_kappa.backfill.compare import compare_rows
    from airflow_provider_kappa.backfill.validate import in_window_mask, read_window

    cat = catalog(Path(args.workdir) / "lake")
    cfg = job_config(Path(args.workdir) / "lake")
    sink = next(iter(cfg.sinks.values()))
    start, end = window(args)
    live = read_window(cat.load_table(sink.table), sink.time_column, start, end)
    if "staging" in result:
        got = cat.load_table(result["staging"]).scan().to_arrow()
    else:
        got = pq.read_table(result["rows_file"])
    got = got.filter(in_window_mask(got, sink.time_column, start, end))
    got = pa.table({c: got[c].cast(live.schema.field(c).type) for c in live.column_names})
    matched, only_v, only_l, n_v, n_l = compare_rows(got, live, 10)
    return {
        "matched": matched,
        "live": live.num_rows,
        "variant": got.num_rows,
        "only_live": only_l,
        "only_variant": only_v,
        "only_live_rows": n_l,
        "only_variant_rows": n_v,
    }


def match_rate(m: dict[str, Any]) -> float:
    denominator = max(int(m["live"]), int(m["variant"]))
    return 100.0 * int(m["matched"]) / denominator if denominator else 100.0


# --------------------------------------------------------------------------- table


def machine() -> str:
    import platform

    import pyspark

    cpu = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return (
        f"{os.cpu_count()} vCPU {cpu}, Linux {platform.release()}, Python {platform.python_version()}, "
        f"PySpark {pyspark.__version__} local[2]"
    )


def table(args: argparse.Namespace, lake: dict[str, Any], results: dict[str, dict[str, Any]]) -> str:
    rows = int(lake["rows"])
    base = results.get("batch", {}).get("wall")
    lines = [
        "| variant | wall s | vs batch job | rows/s | micro-batches | match vs live | peak state rows | planning s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for v in VARIANTS:
        r = results.get(v)
        if r is None:
            continue
        label = LABELS[v].format(files=args.unordered_files)
        if v in ("sequential", "parallel", "sequential_landing"):
            label += f" ({r['slices']} slices of {args.slice}" + (
                f", {args.parallelism} at once)" if v == "parallel" else ")"
            )
        ratio = f"{r['wall'] / base:.1f}x" if base else "-"
        match = "(truth)" if v == "live" else f"{match_rate(r['match']):.2f}%"
        lines.append(
            f"| {label} | {r['wall']:.0f} | {ratio} | {rows / r['wall']:,.0f} | {r.get('batches', '-')} | {match} | "
            f"{int(r.get('peak_state_rows', 0)):,} | {float(r.get('planning', 0)):.1f} |"
        )
    return "\n".join(lines)


def markdown(args: argparse.Namespace, doc: dict[str, Any]) -> str:
    """The results as a markdown section: command, machine, load, data, the table, mismatches."""
    lake = doc["lake"]
    lines = [
        "## Results",
        "",
        f"Command: `{doc['command']}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, total {doc['wall']:.0f} s)",
        "",
        f"Machine: {doc['machine']}. Load average (1, 5, 15 min) before: "
        f"{', '.join(f'{x:.1f}' for x in doc['load_before'])}; after: {', '.join(f'{x:.1f}' for x in doc['load_after'])}.",
        "",
        f"Data: {lake['rows']:,} landed events ({lake['impressions']:,} impressions, {lake['playbacks']:,} playbacks), "
        f"{args.hours:g} h of ingestion time landed every {args.landing} ({lake['files']} Parquet files, "
        f"{lake['snapshots']} snapshots). Compared window: [{doc['window'][0]}, {doc['window'][1]}).",
        "",
        doc["table"],
        "",
    ]
    for v, r in doc["results"].items():
        m = r.get("match")
        if not m or (not m["only_live_rows"] and not m["only_variant_rows"]):
            continue
        lines.append(
            f"- {v}: {m['only_live_rows']:,} live rows missing or different, {m['only_variant_rows']:,} rows not in live. "
            f"Sample only in live: `{json.dumps(m['only_live'][:3], default=str)}`; "
            f"only in {v}: `{json.dumps(m['only_variant'][:3], default=str)}`"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/kappa-talks"))
    p.add_argument("--hours", type=float, default=3.0, help="hours of landed events (default 3)")
    p.add_argument("--rate", type=float, default=100.0, help="impressions per second (default 100; playbacks 1/10)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--landing", default="5min", help="landing interval (default 5min)")
    p.add_argument("--threshold", default="15min", help="Kappa max_misalignment_threshold (default 15min)")
    p.add_argument("--slice", default="1h", help="Kappa slice length (default 1h)")
    p.add_argument("--parallelism", type=int, default=2, help="Kappa parallel: slices at once (default 2)")
    p.add_argument("--unordered-files", type=int, default=6, help="strawman 1: files per micro-batch (default 6)")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out", type=Path, default=None, help="results JSON (default <workdir>/results.json)")
    p.add_argument("--md", type=Path, default=None, help="write the results table (markdown) here")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.workdir = args.workdir.resolve()
    if args.child:
        child(args, args.child)
        return
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        p.error(f"--variants: unknown {unknown}; allowed {list(VARIANTS)}")
    load_before = os.getloadavg()
    began = time.monotonic()
    lake = prepare_lake(args)
    out = _fresh(args.workdir / "runs")
    results: dict[str, dict[str, Any]] = {}
    if "live" in variants or not _has_live(args):
        results["live"] = run_live(args, out / "live")
        print(f"live: {results['live']['wall']:.0f}s", flush=True)
    for v in variants:
        if v == "live":
            continue
        loads = os.getloadavg()
        if v in ("sequential", "parallel"):
            r = run_kappa(args, v, args.threshold)
        elif v == "sequential_landing":  # one landing per micro-batch, as live reads them
            r = run_kappa(args, "sequential", args.landing)
        else:
            r = run_child(args, v, out)
            r["match"] = compare_with_live(args, v, r)
        r["load"] = loads
        results[v] = r
        print(f"{v}: {r['wall']:.0f}s, match {match_rate(r['match']):.2f}%", flush=True)
    text = table(args, lake, results)
    start, end = window(args)
    command = "python benchmarks/bench_talks.py " + " ".join(argv if argv is not None else sys.argv[1:])
    doc = {
        "command": command,
        "machine": machine(),
        "lake": lake,
        "window": [start.isoformat(), end.isoformat()],
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "wall": time.monotonic() - began,
        "results": results,
        "table": text,
    }
    (args.out or args.workdir / "results.json").write_text(json.dumps(doc, indent=2, default=str))
    print(text)
    print(f"load average before {load_before}, after {os.getloadavg()}; total {doc['wall']:.0f}s")
    if args.md:
        head = args.md.read_text() if args.md.exists() else "# The talks' comparison (`bench_talks.py`)\n\n"
        head = head.split("## Results")[0]  # the explanations above the results stay
        args.md.write_text(head + markdown(args, doc))


def _has_live(args: argparse.Namespace) -> bool:
    from pyiceberg.exceptions import NoSuchTableError

    cfg = job_config(Path(args.workdir) / "lake")
    sink = next(iter(cfg.sinks.values()))
    try:
        return catalog(Path(args.workdir) / "lake").load_table(sink.table).current_snapshot() is not None
    except NoSuchTableError:
        return False


if __name__ == "__main__":
    main()
