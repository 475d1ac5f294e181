"""Soak: backfills in a row under seeded random faults, each compared row for row with a clean run
(issue 18). Not part of the test suite: it runs ``kappa backfill`` for real many times, on engine
``submit`` (one spark-submit per slice) or, with ``--engine connect``, on kappa's local Spark Connect server.

Every run starts from a fresh tiny lake (tests/lake.py ``seed_sessions_incident``: playbacks
00:00-03:50, the sessions of [01:00, 03:00) damaged in prod.playback_sessions) and backfills that
window through the real CLI, in its own process group. Faults, one per run in turn and a second
one drawn at random half of the time (``--seed``):

- ``parent_killed``: the ``kappa backfill`` process is SIGKILLed while its slice runs (its
  children are left as they are), and the same command is rerun at once with ``--resume``;
- ``driver_killed``: the slice's Spark driver (the spark-submit JVM; on engine ``connect``, the local server's JVM) is
  SIGKILLed; rerun with ``--resume``;
- ``catalog_locked``: another connection holds the sqlite catalog's exclusive lock (``BEGIN
  EXCLUSIVE``) for a few seconds at a random moment; a failed run is rerun with ``--resume``;
- ``ingestion``: rows are appended to the source table during the run (in the window and after
  it): the backfill reads the snapshot it pins, so rows landed before the pin are its input (the
  expectation is then the sessionizer's oracle of the pinned snapshot's events inside the window)
  and rows landed after it are not seen;
- ``other_backfill``: a backfill of another job and target (prod.playback_sessions_b, the same
  source table, so both tag it) runs at the same time; it is compared with the oracle too;
- ``live_writer``: the live job appends rows to the target outside the window during the run:
  they are all kept, once each;
- ``cleanup_running``: ``kappa cleanup --older-than 0s`` runs while the slice's driver runs (issue 25's
  red-team finding: it removed a running backfill); the backfill must go on and finish exact;
- ``publish_killed``: the ``kappa backfill`` process is SIGKILLed the moment its output shows
  validate's match rate, i.e. between validate and publish (or, on a slower disk, inside publish);
  rerun with ``--resume``.

A failed command is rerun with ``--resume`` (at most ``--reruns`` times). Then the target is
compared with the expectation: the clean run's rows (a fault-free backfill of the same lake,
run first; it equals an independent oracle of the sessionizer), plus the live writer's rows.
Reported: faults injected by kind, runs exact, rows lost (expected rows missing), rows extra.

    .venv/bin/python benchmarks/bench_soak.py --runs 20 --seed 18 --out /tmp/kappa-soak

Results are printed and appended, one JSON line per run, to ``<out>/soak.jsonl`` as they come.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from airflow_env import write_job_config  # noqa: E402
from lake import (  # noqa: E402
    INCIDENT_END,
    INCIDENT_START,
    T0,
    append_events,
    create_sessions_table,
    event,
    seed_sessions_incident,
    sessions_arrow,
    sorted_rows,
)

from airflow_provider_kappa.engine.connect_runner import RUNNER_MODULE  # noqa: E402
from airflow_provider_kappa.engine.connect_server import SERVER_CLASS  # noqa: E402

SOURCE = "raw.playbacks"
TARGET = "prod.playback_sessions"
OTHER = "prod.playback_sessions_b"
FAULTS = (
    "parent_killed",
    "driver_killed",
    "catalog_locked",
    "ingestion",
    "other_backfill",
    "live_writer",
    "cleanup_running",
    "publish_killed",
)
#: faults that kill ``kappa backfill`` or its driver: at most one of them a run
KILLS = ("parent_killed", "driver_killed", "publish_killed")
#: the JVM spark-submit runs first to build the command line of the one it runs (wait_for_driver)
LAUNCHER = "org.apache.spark.launcher.Main"
#: what validate's summary prints before publish starts (kill_at_publish)
MATCH_RATE = b"match rate"
WINDOW = ["--start", INCIDENT_START.isoformat(), "--end", INCIDENT_END.isoformat()]
#: parallel: one slice (the 3h grid cell holding the window); sequential: two slices
PARAMS = {
    mode: {
        "start": INCIDENT_START.isoformat(),
        "end": INCIDENT_END.isoformat(),
        "mode": mode,
        "slice": slice_,
        "warmup": "30min",
        "tail": "45min",
        "max_misalignment_threshold": "1h",
    }
    for mode, slice_ in (("parallel", "3h"), ("sequential", "2h"))
}
OPTIONS = {
    mode: [
        "--mode",
        mode,
        "--slice",
        p["slice"],
        "--warmup",
        p["warmup"],
        "--tail",
        p["tail"],
        "--max-misalignment",
        p["max_misalignment_threshold"],
    ]
    for mode, p in PARAMS.items()
}


@dataclass
class Run:
    """One soak run and its outcome."""

    index: int
    mode: str
    faults: list[str]
    commands: int = 0
    exit_codes: list[int] = field(default_factory=list)
    other_exit_codes: list[int] = field(default_factory=list)
    exact: bool = False
    rows_expected: int = 0
    rows_lost: int = 0
    rows_extra: int = 0
    other_exact: bool | None = None
    other_rows_lost: int = 0
    live_rows: int = 0
    ingested_rows: int = 0
    lock_held_seconds: float = 0.0
    killed: list[str] = field(default_factory=list)
    #: exit codes of ``kappa cleanup --older-than 0s`` run while the backfill ran (``cleanup_running``)
    cleanup_codes: list[int] = field(default_factory=list)
    seconds: float = 0.0
    note: str = ""


def catalog_props(lake: Path) -> dict[str, str]:
    # the catalog waits 2 s for a lock another connection holds, then says "database is locked"
    return {"type": "sql", "uri": f"sqlite:///{lake}/catalog.db?timeout=2", "warehouse": f"file://{lake}/warehouse"}


def load(props: dict[str, str]) -> Any:
    from pyiceberg.catalog import load_catalog

    return load_catalog("lake", **props)


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    out.update(PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1", AIRFLOW__CORE__LOAD_EXAMPLES="False")
    return out


def prepare(folder: Path, engine: str) -> dict[str, Any]:
    """A fresh lake, the target's damaged window, a second target, both jobs' configs."""
    import pyarrow as pa
    import yaml

    lake = folder / "lake"
    lake.mkdir(parents=True)
    props = catalog_props(lake)
    catalog = load(props)
    oracle = seed_sessions_incident(catalog, SOURCE, TARGET)
    create_sessions_table(catalog, OTHER).append(catalog.load_table(TARGET).scan().to_arrow())
    (folder / "a").mkdir()
    (folder / "b").mkdir()
    config_a = write_job_config(folder / "a", props, engine=engine)
    config_b = write_job_config(folder / "b", props, engine=engine)
    raw = yaml.safe_load(config_b.read_text())
    raw["job"]["name"] = "playback_sessions_b"  # another job: its own backfill id, lock and source tag
    raw["sinks"]["sessions"]["table"] = OTHER
    config_b.write_text(yaml.safe_dump(raw, sort_keys=False))
    expected = sorted_rows(pa.Table.from_pylist(oracle, schema=sessions_arrow()))
    return {
        "props": props,
        "catalog": catalog,
        "a": config_a,
        "b": config_b,
        "oracle": expected,
        "home": folder / "airflow",
    }


def start(config: Path, mode: str, log: Path, home: Path, resume: bool = False) -> subprocess.Popen[bytes]:
    """``kappa backfill`` in its own process group (so that everything it starts can be found and stopped)."""
    argv = [str(Path(sys.executable).parent / "kappa"), "backfill", "--config", str(config), *WINDOW, *OPTIONS[mode]]
    e = env()
    home.mkdir(exist_ok=True)
    e["AIRFLOW_HOME"] = str(home)
    with log.open("a") as fh:
        fh.write(f"\n$ {' '.join(argv + (['--resume'] if resume else []))}\n")
        fh.flush()
        return subprocess.Popen(
            argv + (["--resume"] if resume else []), stdout=fh, stderr=subprocess.STDOUT, env=e, start_new_session=True
        )


def descendants(pid: int) -> list[Any]:
    import psutil

    try:
        return list(psutil.Process(pid).children(recursive=True))
    except psutil.NoSuchProcess:
        return []


def wait_for_driver(proc: subprocess.Popen[bytes], application: str, timeout: float = 300) -> Any | None:
    """The slice's driver, once the job runs in it (``None`` when the command ended first): engine
    ``submit``, the spark-submit JVM whose child Python runs the job's ``application`` (other JVMs it
    may start first, a class-data-sharing archive dump, are not it); engine ``connect``, the local Spark
    Connect server's JVM once a slice runner (``engine.connect_runner``, started ahead of its slice) runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        found = descendants(proc.pid)
        server, runner = None, False
        for p in found:
            try:
                name, argv = p.name(), p.cmdline()
                if name.startswith("python") and any(a.endswith(application) for a in argv):
                    parent = p.parent()
                    if parent is not None and parent.name() == "java":
                        return parent
                runner = runner or (name.startswith("python") and RUNNER_MODULE in argv)
                # the server's JVM, not the launcher JVM spark-submit runs first to build its command line
                # (its argv names the server's class too, and it ends within a second)
                if name == "java" and SERVER_CLASS in argv and LAUNCHER not in argv:
                    server = p
            except Exception:  # noqa: BLE001 (a process that ended meanwhile)
                continue
        if server is not None and runner:
            return server
        time.sleep(0.2)
    return None


def stop_group(pgid: int) -> None:
    """Stop what is left of a process group this script started (orphans of a killed parent)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def hold_catalog_lock(db: Path, after: float, hold: float, run: Run) -> None:
    time.sleep(after)
    conn = sqlite3.connect(db, isolation_level=None, timeout=30)
    try:
        conn.execute("BEGIN EXCLUSIVE")
        began = time.monotonic()
        time.sleep(hold)
        conn.execute("ROLLBACK")
        run.lock_held_seconds += time.monotonic() - began
    finally:
        conn.close()


def ingest(props: dict[str, str], stop: threading.Event, run: Run, rng: random.Random) -> None:
    catalog = load(props)
    n = 0
    while not stop.wait(rng.uniform(1.0, 4.0)):
        at = T0 + timedelta(hours=rng.choice([1, 2, 4]), minutes=rng.randrange(60))  # in the window and after
        try:
            append_events(
                catalog.load_table(SOURCE), [event(5_000_000 + 1000 * run.index + n, at, account=40 + n % 5, show=9)]
            )
            n += 1
        except Exception as e:  # noqa: BLE001 (a lost race with the backfill's tag commit: the live router retries)
            run.note += f" ingestion append retried ({type(e).__name__});"
    run.ingested_rows = n


def live_writer(props: dict[str, str], stop: threading.Event, rows: list[dict[str, Any]], rng: random.Random) -> None:
    import pyarrow as pa

    catalog = load(props)
    n = 0
    while not stop.wait(rng.uniform(0.5, 2.0)):
        begin = T0 + timedelta(hours=5, minutes=n)  # the present: after the window
        row = {
            "account_id": 900 + n,
            "session_start": begin,
            "session_end": begin + timedelta(minutes=5),
            "plays": 1,
            "last_play_ts": begin,
        }
        for _ in range(10):
            try:
                catalog.load_table(TARGET).append(pa.Table.from_pylist([row], schema=sessions_arrow()))
                rows.append(row)
                break
            except Exception:  # noqa: BLE001 (a commit conflict with publish or a locked catalog: the live sink retries)
                time.sleep(0.2)
        n += 1


def run_to_completion(
    config: Path,
    mode: str,
    log: Path,
    home: Path,
    codes: list[int],
    reruns: int,
    first: subprocess.Popen[bytes] | None = None,
    during: Callable[[subprocess.Popen[bytes]], None] | None = None,
) -> int:
    """Run (or finish) one backfill command, rerunning it with ``--resume`` after a failure."""
    proc = first or start(config, mode, log, home)
    groups = [proc.pid]
    if during is not None:
        during(proc)
    code = proc.wait(timeout=900)
    codes.append(code)
    while code != 0 and len(codes) <= reruns:
        proc = start(config, mode, log, home, resume=True)
        groups.append(proc.pid)
        code = proc.wait(timeout=900)
        codes.append(code)
    for pgid in groups:
        stop_group(pgid)
    return code


def pinned_oracle(catalog: Any, clean: list[tuple[Any, ...]], config: Path, mode: str) -> list[tuple[Any, ...]]:
    """The clean result of the input the backfill pinned: the clean run's rows outside the window,
    and the sessionizer's oracle (tests/lake.py ``expected_sessions``) of the pinned snapshot's
    events inside it."""
    import pyarrow as pa
    from lake import expected_sessions

    from airflow_provider_kappa.backfill.backfill import Backfill
    from airflow_provider_kappa.job.config import load_config

    bf = Backfill.create(load_config(config), PARAMS[mode])
    source = catalog.load_table(SOURCE)
    events = source.scan(snapshot_id=source.metadata.refs[bf.tag].snapshot_id).to_arrow().to_pylist()
    inside = [s for s in expected_sessions(events) if INCIDENT_START <= s["session_start"] < INCIDENT_END]
    keep = [r for r in clean if not INCIDENT_START <= r[1] < INCIDENT_END]
    return sorted(keep + sorted_rows(pa.Table.from_pylist(inside, schema=sessions_arrow())), key=repr)


def compare(expected: list[tuple[Any, ...]], actual: list[tuple[Any, ...]]) -> tuple[int, int]:
    want, got = Counter(expected), Counter(actual)
    return sum((want - got).values()), sum((got - want).values())


def soak_run(
    index: int,
    mode: str,
    faults: list[str],
    folder: Path,
    clean: list[tuple[Any, ...]],
    rng: random.Random,
    reruns: int,
    engine: str,
) -> Run:
    run = Run(index, mode, faults)
    began = time.monotonic()
    lake = prepare(folder, engine)
    log = folder / "backfill.log"
    props = lake["props"]
    stop = threading.Event()
    threads: list[threading.Thread] = []
    live: list[dict[str, Any]] = []
    if "ingestion" in faults:
        threads.append(
            threading.Thread(target=ingest, args=(props, stop, run, random.Random(rng.random())), daemon=True)
        )
    if "live_writer" in faults:
        threads.append(
            threading.Thread(target=live_writer, args=(props, stop, live, random.Random(rng.random())), daemon=True)
        )
    if "catalog_locked" in faults:
        db = Path(props["uri"].removeprefix("sqlite:///").split("?")[0])
        threads.append(
            threading.Thread(
                target=hold_catalog_lock, args=(db, rng.uniform(2, 25), rng.uniform(3, 12), run), daemon=True
            )
        )
    other: subprocess.Popen[bytes] | None = None
    if "other_backfill" in faults:
        other = start(lake["b"], mode, folder / "other.log", lake["home"])
    for t in threads:
        t.start()

    log_start = log.stat().st_size if log.exists() else 0

    def inject(proc: subprocess.Popen[bytes]) -> None:
        if "cleanup_running" in faults:
            cleanup_while_running(proc, lake["a"], lake["home"], folder / "cleanup.log", run)
        if "publish_killed" in faults:
            kill_at_publish(proc, log, log_start, run)
        if "parent_killed" not in faults and "driver_killed" not in faults:
            return
        driver = wait_for_driver(proc, "playback_sessions.py")
        if driver is None:
            run.note += " the command ended before its driver could be killed;"
            return
        time.sleep(rng.uniform(0.5, 5))
        if "driver_killed" in faults:
            try:
                driver.kill()
                run.killed.append(f"driver {driver.pid}")
            except Exception as e:  # noqa: BLE001
                run.note += f" driver gone before the kill ({type(e).__name__});"
        if "parent_killed" in faults and proc.poll() is None:
            proc.kill()  # the parent only: its children (spark-submit, driver) are left running
            run.killed.append(f"kappa {proc.pid}")

    code = run_to_completion(lake["a"], mode, log, lake["home"], run.exit_codes, reruns, during=inject)
    if other is not None:
        run_to_completion(
            lake["b"], mode, folder / "other.log", lake["home"], run.other_exit_codes, reruns, first=other
        )
    stop.set()
    for t in threads:
        t.join(60)
    catalog = load(props)
    actual = sorted_rows(catalog.load_table(TARGET))
    live_rows = sorted_rows(__import__("pyarrow").Table.from_pylist(live, schema=sessions_arrow())) if live else []
    if run.ingested_rows:
        # rows landed before the backfill pinned its snapshot are its input: the clean run of that
        # input is the independent oracle (equal to the clean run on the unchanged lake) over it
        clean = pinned_oracle(catalog, clean, lake["a"], mode)
    expected = sorted(clean + live_rows, key=repr)
    run.live_rows = len(live_rows)
    run.rows_expected = len(expected)
    run.rows_lost, run.rows_extra = compare(expected, actual)
    run.exact = code == 0 and actual == expected
    if other is not None:
        lost, extra = compare(lake["oracle"], sorted_rows(catalog.load_table(OTHER)))
        run.other_rows_lost = lost
        run.other_exact = run.other_exit_codes[-1] == 0 and lost == 0 and extra == 0
    run.commands = len(run.exit_codes) + len(run.other_exit_codes)
    run.seconds = time.monotonic() - began
    return run


def cleanup_while_running(proc: subprocess.Popen[bytes], config: Path, home: Path, out: Path, run: Run) -> None:
    """``kappa cleanup --older-than 0s`` on the backfill's job while its slice's driver runs."""
    if wait_for_driver(proc, "playback_sessions.py") is None:
        run.note += " the command ended before cleanup could run beside it;"
        return
    e = dict(env(), AIRFLOW_HOME=str(home))
    argv = [str(Path(sys.executable).parent / "kappa"), "cleanup", "--config", str(config), "--older-than", "0s"]
    with out.open("a") as fh:
        code = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, env=e, timeout=300).returncode
    if proc.poll() is None:
        run.cleanup_codes.append(code)
    else:
        run.note += " the backfill ended while cleanup ran;"


def kill_at_publish(proc: subprocess.Popen[bytes], log: Path, start: int, run: Run) -> None:
    """SIGKILL ``kappa backfill`` as soon as its output (after ``start``) shows validate's match rate: the
    log is read on from where the last look ended (the phrase may straddle two reads)."""
    seen, position = b"", start
    while proc.poll() is None:
        with log.open("rb") as fh:
            fh.seek(position)
            new = fh.read()
        position += len(new)
        if MATCH_RATE in seen + new:
            proc.kill()
            run.killed.append(f"kappa-publish {proc.pid}")
            return
        seen = (seen + new)[-len(MATCH_RATE) :]
        time.sleep(0.02)
    run.note += " the command ended before it published;"


def landed(run: Run, fault: str) -> bool:
    """Whether a drawn fault really hit the run (a kill needs a live process to kill, ...)."""
    if fault == "parent_killed":
        return any(k.startswith("kappa ") for k in run.killed)
    if fault == "driver_killed":
        return any(k.startswith("driver ") for k in run.killed)
    if fault == "catalog_locked":
        return run.lock_held_seconds > 0
    if fault == "ingestion":
        return run.ingested_rows > 0
    if fault == "live_writer":
        return run.live_rows > 0
    if fault == "cleanup_running":
        return bool(run.cleanup_codes)
    if fault == "publish_killed":
        return any(k.startswith("kappa-publish ") for k in run.killed)
    return bool(run.other_exit_codes)


def machine() -> str:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "?",
    )
    return f"{platform.node()}: {os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, load average at start {os.getloadavg()[0]:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=18)
    parser.add_argument("--reruns", type=int, default=3, help="reruns with --resume after a failed command (default 3)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/kappa-soak"))
    parser.add_argument(
        "--engine",
        choices=("submit", "connect"),
        default="submit",
        help="job.engine: submit (a spark-submit per slice, its driver killed by driver_killed; default) or "
        "connect (kappa's local Spark Connect server's JVM is driver_killed's target: a 2-run smoke on 2026-11-29 "
        "landed it; the summary counts only faults that landed)",
    )
    args = parser.parse_args()
    if args.out.exists():
        shutil.rmtree(args.out)
    args.out.mkdir(parents=True)
    results = args.out / "soak.jsonl"
    print(f"soak: {args.runs} runs, seed {args.seed}, engine {args.engine}; {machine()}", flush=True)
    began = time.monotonic()
    # the clean run: a fault-free backfill of the same lake (it must equal the independent oracle)
    folder = args.out / "clean"
    lake = prepare(folder, args.engine)
    codes: list[int] = []
    t = time.monotonic()
    code = run_to_completion(lake["a"], "parallel", folder / "backfill.log", lake["home"], codes, 0)
    clean = sorted_rows(load(lake["props"]).load_table(TARGET))
    print(
        f"clean run: exit {code}, {len(clean)} rows, equal to the oracle: {clean == lake['oracle']}, {time.monotonic() - t:.0f} s",
        flush=True,
    )
    if code != 0 or clean != lake["oracle"]:
        print(f"the clean run failed; see {folder / 'backfill.log'}", flush=True)
        return 1
    rng = random.Random(args.seed)
    runs = []
    for i in range(args.runs):
        faults = [FAULTS[i % len(FAULTS)]]
        if rng.random() < 0.5:
            faults.append(
                rng.choice([f for f in FAULTS if f not in faults and not (f in KILLS and faults[0] in KILLS)])
            )
        mode = "sequential" if i % 4 == 3 else "parallel"
        run = soak_run(
            i, mode, faults, args.out / f"run{i:02d}", clean, random.Random(rng.random()), args.reruns, args.engine
        )
        runs.append(run)
        with results.open("a") as fh:
            fh.write(json.dumps(asdict(run)) + "\n")
        print(
            f"run {i:2d} {mode:10s} {'+'.join(faults):30s} exits {run.exit_codes}{' other ' + str(run.other_exit_codes) if run.other_exit_codes else ''} "
            f"exact {run.exact} lost {run.rows_lost} extra {run.rows_extra} live {run.live_rows} ingested {run.ingested_rows} "
            f"lock {run.lock_held_seconds:.0f}s {run.seconds:.0f}s{(' |' + run.note) if run.note else ''}",
            flush=True,
        )
    drawn = Counter(f for r in runs for f in r.faults)
    injected = Counter(f for r in runs for f in r.faults if landed(r, f))
    print(f"\nfaults drawn: {sum(drawn.values())} ({', '.join(f'{k} {v}' for k, v in sorted(drawn.items()))})")
    print(
        f"faults injected (the kill hit a live process, the lock was held, rows were appended during the run): "
        f"{sum(injected.values())} ({', '.join(f'{k} {v}' for k, v in sorted(injected.items()))})"
    )
    print(
        f"runs exact: {sum(r.exact for r in runs)}/{len(runs)}; other target exact: "
        f"{sum(bool(r.other_exact) for r in runs if r.other_exact is not None)}/{sum(r.other_exact is not None for r in runs)}"
    )
    print(
        f"rows lost: {sum(r.rows_lost + r.other_rows_lost for r in runs)}; rows extra: {sum(r.rows_extra for r in runs)}"
    )
    print(
        f"commands run: {sum(r.commands for r in runs)} (failed and rerun with --resume: {sum(c != 0 for r in runs for c in r.exit_codes + r.other_exit_codes)})"
    )
    print(f"wall time: {time.monotonic() - began:.0f} s")
    return 0 if all(r.exact for r in runs) and all(r.other_exact is not False for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
