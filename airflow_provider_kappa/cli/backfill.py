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
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_provider_kappa.cli.plan import add_backfill_arguments, load_backfill, plan_table, print_header
from airflow_provider_kappa.engine.processes import sigterm_raises

if TYPE_CHECKING:
    from rich.console import Console

    from airflow_provider_kappa.backfill.backfill import Backfill
    from airflow_provider_kappa.backfill.plan import BackfillPlan

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


def connect_server(bf: Backfill, plan: BackfillPlan, resume: bool, stack: ExitStack, console: Console) -> str | None:
    """The Spark Connect URL the slices run on (engine ``connect``): ``job.connect``'s, else a local
    server started now and stopped when ``stack`` closes (also on failure or Ctrl-C), only if
    some slice will run (not empty, not done with ``--resume``). ``None`` for engine ``submit``."""
    from airflow_provider_kappa.backfill.backfill import connect_state_file
    from airflow_provider_kappa.backfill.plan import slice_is_empty
    from airflow_provider_kappa.engine.connect_server import LocalConnectServer, configured_url, redact_url
    from airflow_provider_kappa.job.config import CONNECT

    if bf.cfg.job.engine != CONNECT:
        return None
    url = configured_url(bf.cfg)
    if url is not None:
        console.print(f"  engine connect: Spark Connect server {redact_url(url)}")
        return url
    store = bf.store()
    if all(slice_is_empty(sp) or (resume and store.done(sp.slice_id) is not None) for sp in plan.slices):
        return None
    server = stack.enter_context(LocalConnectServer(bf.cfg, connect_state_file(bf).parent, die_with_parent=True))
    console.print(
        f"  engine connect: local Spark Connect server {server.url} (pid {server.state.pid if server.state else '?'}) "
        f"started in {server.seconds:.1f}s, log {server.log_file}"
    )
    return server.url


def run(args: argparse.Namespace) -> int:
    """Run a whole backfill; see the module docstring for exit codes."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from airflow_provider_kappa.backfill.lock import release
    from airflow_provider_kappa.backfill.plan import plan as plan_slices
    from airflow_provider_kappa.backfill.publish import publish
    from airflow_provider_kappa.backfill.slices import run_slice
    from airflow_provider_kappa.backfill.snapshot import snapshot
    from airflow_provider_kappa.backfill.summary import summary
    from airflow_provider_kappa.backfill.validate import check_gate, validate
    from airflow_provider_kappa.exceptions import KappaEngineError, KappaValidationError
    from airflow_provider_kappa.report.report import write_report

    console = Console()
    logging.getLogger(_STEPS_LOGGER).setLevel(logging.WARNING)  # the terminal gets this command's own output
    bf = load_backfill(args)
    if args.release_lock:
        released = release(bf)
        console.print(
            f"backfill {bf.id}: lock released on {released}" if released else f"backfill {bf.id}: held no lock"
        )
        return 0
    print_header(console, bf)
    snapshot_ids = snapshot(bf)
    console.print(f"  pinned snapshots {snapshot_ids} (tag {bf.tag})")
    plan = plan_slices(bf, snapshot_ids)
    console.print(plan_table(plan))
    for w in plan.warnings:
        console.print(f"[yellow]warning:[/] {w}")
    store = bf.store()
    logs = store.log_folder(bf.id)
    results: list[dict[str, Any]] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with ExitStack() as stack, Progress(*columns, console=console) as progress:
        stack.enter_context(sigterm_raises(lambda signum: SystemExit(128 + signum)))  # stopped: fails, cleaned up
        try:
            connect_url = connect_server(bf, plan, args.resume, stack, console)
        except KappaEngineError as e:
            console.print(f"[red]Spark Connect server not started:[/] {e}")
            return 1
        task = progress.add_task("slices", total=len(plan.slices))
        for sp in plan.slices:
            done = store.done(sp.slice_id) if args.resume else None
            if done is not None:
                results.append(done)
                progress.console.print(f"  {sp.slice_id} already done (--resume): rows read {done.get('rows_read')}")
                progress.advance(task)
                continue
            progress.update(task, description=f"slice {sp.slice_id} {sp.read_start:%H:%M}→{sp.read_end:%H:%M}")
            log_path = logs / f"{sp.slice_id}.log"
            try:
                with slice_log(log_path):
                    result = run_slice(bf, sp, spark_conn_id=args.spark_conn_id, connect_url=connect_url)
            except Exception as e:  # a failed spark-submit (AirflowException), session (KappaEngineError) or I/O
                progress.console.print(f"[red]slice {sp.slice_id} failed:[/] {type(e).__name__}: {e}")
                progress.console.print(f"  Spark output: {log_path}")
                progress.console.print("  rerun the same command (add --resume to skip completed slices)")
                return 1
            results.append(result)
            if result.get("skipped"):
                progress.console.print(f"  {sp.slice_id} skipped: no source data in its read range  (log {log_path})")
                progress.advance(task)
                continue
            progress.console.print(
                f"  {sp.slice_id} rows read {result['rows_read']}, micro-batches {result['batches']}, "
                f"watermark {result['watermark'] or '-'}, {result['seconds']:.1f}s  (log {log_path})"
            )
            progress.advance(task)
    reports = validate(bf, plan)
    write_report(bf, plan, reports)  # before the gate: a refused backfill has its report too
    for report in reports.values():
        console.print(report.to_text())
    console.print(f"  report: {store.report_file()}")
    report_dicts = {name: r.to_dict() for name, r in reports.items()}
    try:
        check_gate(bf, reports)
    except KappaValidationError as e:
        console.print(f"[red]not published:[/] {e}")
        console.print(summary(bf, plan, results, report_dicts))
        return 1
    published = None
    if bf.params.publishes:
        published = {name: asdict(r) for name, r in publish(bf, plan).items()}
    console.print(summary(bf, plan, results, report_dicts, published))
    return 0
