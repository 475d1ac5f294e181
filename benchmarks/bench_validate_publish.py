"""Peak memory and wall time of the Airflow-side validate and publish steps on a big window.

Not a test: a script to run by hand (results in benchmarks/README.md). For every size it
generates, once, a file sqlite SqlCatalog in ``--workdir/n<size>/``:

- ``prod.summary`` (an RMI-like sink: window_start, window_end timestamptz, show_id,
  attributed_plays; partitioned by hour(window_start)) holding ``size`` rows in the 24-hour
  window and ``size / 24`` rows in each of the hours just before and after it;
- 24 staging tables (one per 1-hour slice, created by ``ensure_staging_table``) holding the
  backfill's rows for the window: the same rows, one in a thousand with another
  ``attributed_plays``.

Then, each in a fresh child process (its ``VmHWM`` is the step's own peak RSS), it runs
``validate_window`` and ``publish_window`` of today's code and of a baseline commit
(``--baseline-ref``, extracted with ``git archive`` into ``--workdir/baseline-<ref>/`` and put
first on the child's ``sys.path``). Before each publish the catalog database is restored to its
state after generation, so every publish replaces the same window of the same table.

    .venv/bin/python benchmarks/bench_validate_publish.py --workdir /tmp/kappa-bench-vp --sizes 5000000,20000000
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
HOURS = 24
TARGET = "prod.summary"
BACKFILL = "bench"


def _catalog(lake: Path) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog("lake", uri=f"sqlite:///{lake}/catalog.db", warehouse=f"file://{lake}/warehouse")


def _hour_rows(hour: int, n: int, differ_every: int = 0) -> Any:
    """``n`` rows whose window_start falls in hour ``hour`` after T0 (negative: before)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    i = pa.array(range(n), pa.int64())
    base = int((T0 + timedelta(hours=hour)).timestamp() * 1_000_000)
    micros = pc.add(pc.multiply(pc.divide(pc.multiply(i, 3_600), n), 1_000_000), base)  # spread over the hour
    start = micros.cast(pa.timestamp("us", tz="UTC"))
    end = pc.add(micros, 300_000_000).cast(pa.timestamp("us", tz="UTC"))
    plays = pc.add(pc.bit_wise_and(pc.multiply(i, 2_654_435_761), 0xFFFF), hour)
    if differ_every:
        every = pc.equal(pc.subtract(i, pc.multiply(pc.divide(i, differ_every), differ_every)), 0)
        plays = pc.if_else(every, pc.negate(plays), plays)
    return pa.table(
        {"window_start": start, "window_end": end, "show_id": pc.bit_wise_and(i, 1023), "attributed_plays": plays}
    )


def generate(lake: Path, size: int) -> dict[str, Any]:
    """The lake of one size (kept and reused while ``done.json`` is there)."""
    done = lake / "done.json"
    if done.exists():
        return dict(json.loads(done.read_text()))
    shutil.rmtree(lake, ignore_errors=True)
    (lake / "warehouse").mkdir(parents=True)
    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(ROOT))
    from lake import create_summary_table

    from airflow_provider_kappa.spark.staging import ensure_staging_table, staging_table_name

    began = time.monotonic()
    catalog = _catalog(lake)
    target = create_summary_table(catalog, TARGET)
    per_hour = size // HOURS
    target.append(_hour_rows(-1, per_hour))
    target.append(_hour_rows(HOURS, per_hour))
    staging = []
    for h in range(HOURS):
        target.append(_hour_rows(h, per_hour))
        name = staging_table_name(TARGET, BACKFILL, f"s{h:04d}")
        ensure_staging_table(catalog, TARGET, name).append(_hour_rows(h, per_hour, differ_every=1000))
        staging.append(name)
    shutil.copyfile(lake / "catalog.db", lake / "catalog.db.generated")
    info = {
        "size": per_hour * HOURS,
        "staging": staging,
        "generate_s": round(time.monotonic() - began, 1),
        "parquet_mb": round(sum(p.stat().st_size for p in (lake / "warehouse").rglob("*.parquet")) / 2**20, 1),
    }
    done.write_text(json.dumps(info))
    return info


def baseline_root(workdir: Path, ref: str) -> Path:
    """The package of commit ``ref``, extracted once."""
    root = workdir / f"baseline-{ref}"
    if not (root / "airflow_provider_kappa").exists():
        root.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "archive", ref, "airflow_provider_kappa"], cwd=ROOT, capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True)
    return root


def _peak_rss() -> int:
    """This process's peak RSS in bytes: ``VmHWM`` (per address space, so it starts afresh at
    exec; ``ru_maxrss`` would include the benchmark parent's RSS at fork time), else ru_maxrss."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def child(impl_root: str, step: str, lake: str) -> None:
    """One step in this (fresh) process; prints a JSON line."""
    sys.path.insert(0, impl_root)
    import psutil

    import airflow_provider_kappa

    assert Path(airflow_provider_kappa.__file__).resolve().is_relative_to(Path(impl_root).resolve()), (
        airflow_provider_kappa.__file__
    )
    from airflow_provider_kappa.backfill.publish import publish_window
    from airflow_provider_kappa.backfill.validate import validate_window

    info = json.loads((Path(lake) / "done.json").read_text())
    catalog = _catalog(Path(lake))
    catalog.load_table(TARGET)
    rss_before = psutil.Process().memory_info().rss
    began = time.monotonic()
    if step == "validate":
        report = validate_window(catalog, TARGET, info["staging"], "window_start", T0, T0 + timedelta(hours=HOURS))
        result: dict[str, Any] = {
            "staged": report.staged_rows,
            "target": report.target_rows,
            "matched": report.matched_rows,
        }
    else:
        published = publish_window(catalog, TARGET, info["staging"], "window_start", T0, T0 + timedelta(hours=HOURS))
        result = {"rows_deleted": published.rows_deleted, "rows_added": published.rows_added}
    seconds = time.monotonic() - began
    peak = _peak_rss()
    print(
        json.dumps(
            {
                "seconds": round(seconds, 2),
                "peak_rss_mb": round(peak / 2**20),
                "rss_before_mb": round(rss_before / 2**20),
                **result,
            }
        )
    )


def run(impl: str, root: Path, step: str, lake: Path) -> dict[str, Any]:
    if step == "publish":
        shutil.copyfile(lake / "catalog.db.generated", lake / "catalog.db")
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(root), step, str(lake)], capture_output=True, text=True, cwd=ROOT
    )
    if out.returncode:
        raise RuntimeError(f"{impl} {step} failed:\n{out.stderr[-3000:]}")
    data = json.loads(out.stdout.strip().splitlines()[-1])
    if step == "publish":
        shutil.copyfile(lake / "catalog.db.generated", lake / "catalog.db")
    return {"impl": impl, "step": step, **data}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", default="/tmp/kappa-bench-vp")
    parser.add_argument("--sizes", default="5000000,20000000", help="rows in the window, comma-separated")
    parser.add_argument("--baseline-ref", default="a8cdae8", help="commit of the code to compare with")
    parser.add_argument("--impls", default="new,baseline")
    parser.add_argument("--steps", default="validate,publish")
    parser.add_argument("--out", default=None, help="JSON file for the results")
    parser.add_argument("--child", nargs=3, metavar=("ROOT", "STEP", "LAKE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    workdir = Path(args.workdir)
    roots = {"new": ROOT, "baseline": baseline_root(workdir, args.baseline_ref)}
    results: dict[str, Any] = {
        "machine": {
            "nproc": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "loadavg_at_start": os.getloadavg(),
        },
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "baseline_ref": args.baseline_ref,
        "runs": [],
    }
    for size in (int(s) for s in args.sizes.split(",")):
        lake = workdir / f"n{size}"
        info = generate(lake, size)
        print(f"size {info['size']}: lake {lake} ({info['parquet_mb']} MB of Parquet)", flush=True)
        for step in args.steps.split(","):
            for impl in args.impls.split(","):
                row = {"size": info["size"], "load": os.getloadavg()[0], **run(impl, roots[impl], step, lake)}
                results["runs"].append(row)
                print(json.dumps(row), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    print("\n| rows in window | step | code | wall s | peak RSS MB | RSS before step MB |")
    print("|---:|---|---|---:|---:|---:|")
    for r in results["runs"]:
        print(
            f"| {r['size']:,} | {r['step']} | {r['impl']} | {r['seconds']} | {r['peak_rss_mb']} | {r['rss_before_mb']} |"
        )


if __name__ == "__main__":
    main()
