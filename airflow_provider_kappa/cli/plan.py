"""``kappa plan --config kappa.yaml --start T --end T [backfill options]``: the slices a backfill
would run, with per-slice files, rows and bytes from manifests only. Writes nothing (no tag).

The backfill options are shared with ``kappa backfill`` (:func:`add_backfill_arguments`).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from airflow_provider_kappa.backfill.backfill import Backfill
from airflow_provider_kappa.backfill.checks import check_inputs, check_setup, closed_by, falls_short, landed_end
from airflow_provider_kappa.backfill.exactness import THRESHOLD_UNUSED, job_ledger
from airflow_provider_kappa.backfill.params import CLI_PARAMS
from airflow_provider_kappa.backfill.plan import plan as plan_slices
from airflow_provider_kappa.backfill.snapshot import snapshot
from airflow_provider_kappa.cli.output import new_console, print_table, say
from airflow_provider_kappa.exceptions import KappaSourceError
from airflow_provider_kappa.job.config import load_config
from airflow_provider_kappa.spark.ledger import Ledger
from airflow_provider_kappa.timeparse import to_micros

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from airflow_provider_kappa.backfill.backfill import Backfill
    from airflow_provider_kappa.backfill.plan import BackfillPlan


def add_backfill_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``kappa plan`` and ``kappa backfill`` (DESIGN.md "Command line"): ``--config``
    and one flag per row of :data:`airflow_provider_kappa.backfill.params.PARAMS`, in CLI order.

    Unset options take the job's ``backfill:`` defaults (see :func:`airflow_provider_kappa.backfill.params.parse_params`).
    """
    parser.add_argument("--config", required=True, help="path to the job's kappa.yaml")
    for p in CLI_PARAMS:
        if p.kind == "bool":
            action = "store_false" if p.flag.startswith("--no-") else "store_true"
            parser.add_argument(p.flag, dest=p.name, action=action, help=p.cli_help())
        elif p.kind == "enum":
            bare = {"nargs": "?", "const": "true"} if "true" in p.choices else {}  # `--ledger` alone: true
            parser.add_argument(p.flag, dest=p.name, choices=list(p.choices), help=p.cli_help(), **bare)
        else:
            parser.add_argument(p.flag, dest=p.name, required=p.required, help=p.cli_help())


def params_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The raw backfill parameters given on the command line (unset ones left out)."""
    return {p.name: getattr(args, p.name) for p in CLI_PARAMS if getattr(args, p.name, None) is not None}


def load_backfill(args: argparse.Namespace, *, tables: bool = True) -> Backfill:
    """Load the config, validate the flags, and check (reading only) the tables, so bad input is
    refused before anything is written (:func:`airflow_provider_kappa.backfill.checks.check_inputs`):
    ``kappa plan`` checks the source tables it reads; ``kappa backfill`` also the sinks' target
    tables and the job's application. ``kappa backfill --release-lock`` runs nothing: it is checked
    like ``kappa plan`` (an abandoned lock must be releasable whatever the data has become since).

    :param tables: also check the tables (:func:`~airflow_provider_kappa.backfill.checks.check_data`);
        ``kappa backfill`` checks them itself, while its engine starts.
    """

    bf = Backfill.create(load_config(args.config), params_from_args(args))
    runs = getattr(args, "verb", "backfill") != "plan" and not getattr(args, "release_lock", False)
    if tables:
        check_inputs(bf, runs=runs, spark_conn_id=getattr(args, "spark_conn_id", None))
    else:
        check_setup(bf, runs=runs, spark_conn_id=getattr(args, "spark_conn_id", None))
    return bf


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def plan_table(plan: BackfillPlan) -> Table:
    """The slice table: read range, owned range, per source files / ~rows / ~bytes, warnings."""

    sources = [s.source for s in plan.slices[0].stats] if plan.slices else []
    table = Table(title=Text(f"backfill {plan.backfill_id}: {len(plan.slices)} {plan.mode} slice(s)"), show_lines=False)
    table.add_column("slice")
    table.add_column("reads (ingestion, UTC)")
    table.add_column("owns (output, UTC)")
    for name in sources:
        table.add_column(f"{name}\nfiles / ~rows / ~bytes", justify="right")
    if plan.replays_ledger:
        table.add_column("live batches\nreplayed", justify="right")
    table.add_column("warnings", style="yellow")
    for s in plan.slices:
        cells = [f"{x.files} / {x.rows} / {_size(x.bytes)}" for x in s.stats]
        cells += [str(s.ledger_batches or 0)] if plan.replays_ledger else []
        table.add_row(
            Text(s.slice_id),
            f"{s.read_start:%m-%d %H:%M}→{s.read_end:%m-%d %H:%M}",
            f"{s.owns_start:%m-%d %H:%M}→{s.owns_end:%m-%d %H:%M}",
            *cells,
            Text("; ".join(s.warnings)),
        )
    return table


def print_header(console: Console, bf: Backfill) -> None:
    """The backfill's identity and parameters."""
    p = bf.params.to_dict()
    threshold = p["max_misalignment_threshold"]
    if p["ledger"] == "true":  # a replay cuts its micro-batches where live did; with auto the plan says which
        threshold += f" ({THRESHOLD_UNUSED}: ledger true)"
    say(console, (f"backfill {bf.id}", "bold"), " of job ", (bf.cfg.job.name, "bold"), f" ({bf.cfg.path})")
    say(
        console,
        f"  window [{p['start']}, {p['end']}), reads [{bf.params.read_start.isoformat()}, {bf.params.read_end.isoformat()}), "
        f"mode {p['mode']}, slice {p['slice']}, threshold {threshold}, warmup {p['warmup']}, "
        f"tail {p['tail']}, ledger {p['ledger']}, sources {','.join(p['sources'])}",
    )


def print_plan(console: Console, plan: BackfillPlan) -> None:
    """The slice table, the plan's warnings and how exact to expect the backfill."""
    print_table(console, plan_table(plan))
    for w in plan.warnings:
        say(console, ("warning:", "yellow"), f" {w}")
    if plan.exactness is not None:
        say(console, ("exactness:", "bold"), f" {plan.exactness.statement}")


def totals_line(bf: Backfill, plan: BackfillPlan) -> str:
    """``~rows rows in N file(s) to read in M slice(s) (...); K live ledger entries replayed (R Kafka
    records by their recorded counts)``: the files and the ledger entries the backfill reads."""
    files = sum(s.files for s in plan.slices)
    line = f"~{plan.rows} rows in {files} file(s) to read in {len(plan.slices)} slice(s) (estimates from manifest statistics)"
    uri = plan.exactness.ledger if plan.exactness is not None else None
    uri = uri or job_ledger(bf)[0]
    book = Ledger.find(uri) if uri is not None else None
    if book is None:
        return line
    lo, hi = to_micros(bf.params.read_start) // 1000, to_micros(bf.params.read_end) // 1000
    try:
        records, count = book.records(lo, hi), book.count(lo, hi)
    except KappaSourceError:  # an unreadable ledger: the exactness line says so
        return line
    held = "" if records is None else f", holding {records} Kafka record(s) (their recorded counts)"
    replayed = "replayed" if plan.replays_ledger else "in the range read, not replayed"
    return f"{line}; {count} live ledger entr(ies) {replayed}{held}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``kappa plan``."""
    add_backfill_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Print the slice table of a backfill at the sources' current snapshots."""

    console = new_console()
    bf = load_backfill(args)
    print_header(console, bf)
    snapshot_ids = snapshot(bf, tag=False)
    say(console, "  snapshots " + ", ".join(f"{k}={v}" for k, v in snapshot_ids.items()))
    plan = plan_slices(bf, snapshot_ids)
    print_plan(console, plan)
    say(console, totals_line(bf, plan))
    open_end = open_end_notice(bf, snapshot_ids)
    if open_end:
        say(console, ("warning:", "yellow"), f" {open_end}")
    return 0


def open_end_notice(bf: Backfill, snapshot_ids: dict[str, int]) -> str | None:
    """What ``kappa backfill`` would say of a window whose ``end + tail`` lies past the landed data
    at these snapshots (it refuses it, or with ``allow_open_end`` publishes only the part the landed
    data closes); ``None`` when the landed data closes the whole window."""

    p = bf.params
    landed = falls_short(bf, landed_end(bf, snapshot_ids))
    if landed is None:
        return None
    closes = closed_by(bf, landed)
    past = (
        f"end + tail = {p.read_end.isoformat()} lies past the landed data (source {landed.source} landed through "
        f"{landed.end.isoformat()}), which closes the window only up to {closes.isoformat()}"
    )
    if closes <= p.start:
        return f"{past}: kappa backfill refuses this window, even with --allow-open-end (the landed data closes no part of it)"
    if not p.allow_open_end:
        return f"{past}: kappa backfill refuses this window (pass --allow-open-end to publish only that part)"
    return f"{past}: with --allow-open-end, kappa backfill validates and publishes [{p.start.isoformat()}, {closes.isoformat()})"
