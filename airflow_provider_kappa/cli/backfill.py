"""``kappa backfill --config kappa.yaml --start T --end T [backfill options]``: snapshot, plan,
run every slice, validate and publish, without an Airflow deployment.

The same functions as the Airflow operators (:mod:`airflow_provider_kappa.backfill.steps` and its
siblings snapshot, lock, finish). Slices
run one after the other (``parallel`` slices are independent, so any order gives the same
result); each slice's Spark output goes to a log file, not the terminal. Engine ``connect``
(``job.engine``): slices are sessions of one Spark Connect server, ``job.connect``'s, or a local
one started for this backfill (only if a slice runs) and stopped at its end, also on failure,
Ctrl-C or SIGTERM. Engine ``submit``: one spark-submit per slice. Killed, even by SIGKILL, it
leaves no Spark process running (parent-death signal, ``engine/processes.py``), and a retry
fences out anything it left (docs/sink.md, Fencing). Exits 0 on
success (published, or validated for ``--dry-run`` / ``--no-publish``, or ``--release-lock``
done), 1 when a slice fails or validation refuses the publish, 2 on bad input or when another
backfill holds an overlapping window of a target (``kappa`` prints the error).
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from airflow_provider_kappa.backfill.backfill import Backfill
from airflow_provider_kappa.backfill.checks import check_data
from airflow_provider_kappa.backfill.lock import release
from airflow_provider_kappa.backfill.plan import BackfillPlan
from airflow_provider_kappa.backfill.plan import plan as plan_slices
from airflow_provider_kappa.backfill.publish import publish
from airflow_provider_kappa.backfill.slices import run_slice, slice_engine
from airflow_provider_kappa.backfill.snapshot import snapshot
from airflow_provider_kappa.backfill.summary import summary
from airflow_provider_kappa.backfill.validate import check_gate, validate
from airflow_provider_kappa.cli.output import new_console, say
from airflow_provider_kappa.cli.plan import add_backfill_arguments, load_backfill, print_header, print_plan
from airflow_provider_kappa.engine.base import Engine
from airflow_provider_kappa.engine.connect import ConnectEngine
from airflow_provider_kappa.engine.connect_server import redact_url
from airflow_provider_kappa.engine.processes import sigterm_raises
from airflow_provider_kappa.exceptions import KappaEngineError, KappaValidationError
from airflow_provider_kappa.report.report import write_report

#: The stdlib logger of the backfill steps (details go to the slice log, not the terminal).
_STEPS_LOGGER = "airflow_provider_kappa"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``kappa backfill``."""
    add_backfill_arguments(parser)
    parser.add_argument(
        "--resume",
        action="store_true",
        help="skip slices that completed in an earlier run with the same parameters (default: rerun all)",
    )
    parser.add_argument(
        "--spark-conn-id", help="engine submit: an Airflow Spark connection to submit through (default: job.master)"
    )
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="print how long each step took (the engine's start runs beside the snapshot and the plan)",
    )
    parser.add_argument(
        "--release-lock",
        action="store_true",
        help="release the lock this backfill (these parameters) holds on its target tables, then exit; "
        "for a backfill abandoned before it published",
    )


@contextmanager
def slice_log(path: Path) -> Iterator[None]:
    """Send spark-submit's output (SparkSubmitHook logs it through Airflow's structlog) and the
    step details (stdlib logging) to ``path`` while a slice runs."""
    # Importing Airflow configures its logging (structlog included) once per process; done inside
    # the block, it would replace the configuration below and send the first slice's output to
    # the terminal. Import it first.
    import airflow.providers.apache.spark.hooks.spark_submit  # noqa: F401
    import structlog

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        handler = logging.StreamHandler(fh)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        steps = logging.getLogger(_STEPS_LOGGER)
        saved = (steps.level, steps.propagate)
        steps.addHandler(handler)
        steps.setLevel(logging.INFO)
        steps.propagate = False
        structlog_config = structlog.get_config()
        structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=fh))
        try:
            yield
        finally:
            structlog.configure(**structlog_config)
            steps.removeHandler(handler)
            steps.setLevel(saved[0])
            steps.propagate = saved[1]


class Timeline:
    """How long each step of the backfill took, printed at its end (``--timeline``, and in the
    benchmark's output): the steps that overlap say so."""

    def __init__(self) -> None:
        self.began = time.monotonic()
        self.steps: list[tuple[str, float, float]] = []

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Time the block as step ``name``."""
        began = time.monotonic()
        try:
            yield
        finally:
            self.add(name, began)

    def add(self, name: str, began: float, ended: float | None = None) -> None:
        """Record step ``name`` from ``began`` to ``ended`` (default now), monotonic seconds."""
        self.steps.append((name, began - self.began, (ended or time.monotonic()) - self.began))

    def to_text(self) -> str:
        """One line per step: its start and end from the command's start, and its length."""
        lines = ["  timeline (seconds from the start of the command):"]
        for name, start, end in self.steps:
            lines.append(f"    {start:7.1f} → {end:7.1f}  {end - start:6.1f}s  {name}")
        return "\n".join(lines)


def start_engine(engine: Engine, stack: ExitStack, timeline: Timeline) -> Future[None]:
    """Start ``engine`` in a background thread (a local Spark Connect server starts while the tables
    are checked and the snapshot and the plan run); it is stopped when ``stack`` closes, also on failure, Ctrl-C or
    SIGTERM."""
    pool = stack.enter_context(ThreadPoolExecutor(max_workers=1, thread_name_prefix="kappa-engine"))
    began = time.monotonic()

    def start() -> None:
        try:
            engine.start()
        finally:
            timeline.add(f"engine {engine.name}: start (beside the table checks, snapshot and plan)", began)

    stack.callback(engine.stop)
    return pool.submit(start)


@contextmanager
def discarded_if_refused(engine: Engine, started: Future[None]) -> Iterator[None]:
    """Checks run while ``engine`` starts: when they refuse, the engine is stopped and what its start
    wrote removed (:meth:`Engine.discard`), so bad input still leaves nothing behind."""
    try:
        yield
    except BaseException:
        engine.stop()  # a local server still starting ends now, not after its start
        ended = started.exception()  # waits for the start; its error (this stop) is not the one to report
        if ended is not None:
            logging.getLogger(_STEPS_LOGGER).info("engine start ended by the refusal: %s", ended)
        engine.discard()
        raise


def describe_engine(engine: Engine, console: Console) -> None:
    """Say where the slices run."""
    if not isinstance(engine, ConnectEngine):
        say(console, f"  engine {engine.name}: one spark-submit per slice")
        return
    server = engine.owned_server
    if server is not None:
        pid = server.state.pid if server.state else "?"
        say(
            console,
            f"  engine connect: local Spark Connect server {server.url} (pid {pid}) started in "
            f"{server.seconds:.1f}s, log {server.log_file}",
        )
    elif (url := engine.server_url()) is not None:
        say(console, f"  engine connect: Spark Connect server {redact_url(url)}")


def run_slices(
    bf: Backfill, plan: BackfillPlan, engine: Engine, args: argparse.Namespace, console: Console
) -> list[dict[str, Any]] | None:
    """Run every slice of ``plan`` in turn with a progress bar; their results, ``None`` when one failed."""
    store = bf.store()
    logs = store.log_folder(bf.id)
    results: list[dict[str, Any]] = []
    columns = (TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("slices", total=len(plan.slices))
        for sp in plan.slices:
            done = store.done(sp.slice_id) if args.resume else None
            if done is not None:
                results.append(done)
                say(progress.console, f"  {sp.slice_id} already done (--resume): rows read {done.get('rows_read')}")
                progress.advance(task)
                continue
            progress.update(task, description=f"slice {sp.slice_id} {sp.read_start:%H:%M}→{sp.read_end:%H:%M}")
            log_path = logs / f"{sp.slice_id}.log"
            if sp is plan.slices[-1]:
                engine.last_slice()  # e.g. no spare Spark Connect runner for a slice after it
            try:
                with slice_log(log_path):
                    result = run_slice(bf, sp, engine=engine)
            except Exception as e:  # a failed spark-submit (AirflowException), session (KappaEngineError) or I/O
                say(progress.console, (f"slice {sp.slice_id} failed:", "red"), f" {type(e).__name__}: {e}")
                say(progress.console, f"  Spark output: {log_path}")
                say(progress.console, "  rerun the same command (add --resume to skip completed slices)")
                return None
            results.append(result)
            say(progress.console, slice_line(sp.slice_id, result, log_path))
            progress.advance(task)
    return results


def slice_line(slice_id: str, result: dict[str, Any], log_path: Path) -> str:
    """The line printed when a slice is done."""
    if result.get("skipped"):
        return f"  {slice_id} skipped: no source data in its read range  (log {log_path})"
    return (
        f"  {slice_id} rows read {result['rows_read']}, micro-batches {result['batches']}, "
        f"watermark {result['watermark'] or '-'}, {result['seconds']:.1f}s  (log {log_path})"
    )


def run(args: argparse.Namespace) -> int:
    """Run a whole backfill; see the module docstring for exit codes."""
    console = new_console()
    logging.getLogger(_STEPS_LOGGER).setLevel(logging.WARNING)  # the terminal gets this command's own output
    timeline = Timeline()
    if args.release_lock:
        bf = load_backfill(args)
        released = release(bf)
        say(
            console, f"backfill {bf.id}: lock released on {released}" if released else f"backfill {bf.id}: held no lock"
        )
        return 0
    with timeline.step("load and check the config and the flags"):
        bf = load_backfill(args, tables=False)  # the tables are checked while the engine starts
    try:
        return run_steps(bf, args, console, timeline)
    finally:
        bf.store().end_heartbeat()  # done, failed or stopped: not running any more (kappa cleanup may take it)


def run_steps(bf: Backfill, args: argparse.Namespace, console: Console, timeline: Timeline) -> int:
    """Table checks, snapshot, plan, slices (the engine started beside the first three), then :func:`finish`."""
    engine = slice_engine(bf, spark_conn_id=args.spark_conn_id)
    with ExitStack() as stack:
        stack.enter_context(sigterm_raises(lambda signum: SystemExit(128 + signum)))  # stopped: fails, cleaned up
        engine_stack = stack.enter_context(ExitStack())  # closed beside validate, below
        started = start_engine(engine, engine_stack, timeline)
        with timeline.step("check the tables"), discarded_if_refused(engine, started):
            check_data(bf)
        print_header(console, bf)
        with timeline.step("snapshot"):
            snapshot_ids = snapshot(bf)
        say(console, f"  pinned snapshots {snapshot_ids} (tag {bf.tag})")
        with timeline.step("plan"):
            plan = plan_slices(bf, snapshot_ids, pin=True)
        print_plan(console, plan)
        try:
            started.result()
        except KappaEngineError as e:
            say(console, ("Spark Connect server not started:", "red"), f" {e}")
            return 1
        describe_engine(engine, console)
        with timeline.step("slices"):
            results = run_slices(bf, plan, engine, args, console)
        if results is None:
            return 1
        stopping = engine_stack.pop_all()  # the engine stops while validate runs
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="kappa-engine-stop") as pool:
        stopped = pool.submit(stopping.close)
        code = finish(bf, plan, results, console, timeline)
        stopped.result()
    if args.timeline:
        say(console, timeline.to_text())
    return code


def finish(
    bf: Backfill, plan: BackfillPlan, results: list[dict[str, Any]], console: Console, timeline: Timeline
) -> int:
    """Validate, write the report, gate and publish; print the summary. The exit code."""
    with timeline.step("validate"):
        reports = validate(bf, plan)
        write_report(bf, plan, reports)  # before the gate: a refused backfill has its report too
    for report in reports.values():
        say(console, report.to_text())
    say(console, f"  report: {bf.store().report_file()}")
    report_dicts = {name: r.to_dict() for name, r in reports.items()}
    try:
        check_gate(bf, plan, reports)
    except KappaValidationError as e:
        say(console, ("not published:", "red"), f" {e}")
        say(console, summary(bf, plan, results, report_dicts))
        return 1
    published = None
    if bf.params.publishes:
        with timeline.step("publish"):
            published = {name: asdict(r) for name, r in publish(bf, plan).items()}
    say(console, summary(bf, plan, results, report_dicts, published))
    return 0
