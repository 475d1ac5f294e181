"""``kappa cleanup --config kappa.yaml [--older-than DUR] [--ledger-older-than DUR] [--dry-run]``:
remove the staging tables, checkpoints, plan files and tags of the job's backfills last active longer
ago than the retention (``job.retention``, 7 days by default; ``--older-than`` overrides it), keeping
every backfill that holds a lock (see :mod:`airflow_provider_kappa.backfill.cleanup`); then compact
the live ledger and, with ``--ledger-older-than``, drop its entries older than that which no kept
backfill may replay (:mod:`airflow_provider_kappa.backfill.ledger_upkeep`).

Prints one row per backfill found: what it left and whether it was removed (``--dry-run``:
would be) or kept, and why; then one line per live ledger. Exits 0 when done (also when nothing was due), 2 on bad input
(a bad config or ``--older-than``), 1 when the catalog kept refusing a commit or could not be
reached (``kappa`` prints the error; run it again).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from airflow_provider_kappa.backfill.cleanup import age_text, cleanup
from airflow_provider_kappa.backfill.ledger_upkeep import LedgerUpkeep, ledger_upkeep
from airflow_provider_kappa.cli.output import new_console, print_table, say
from airflow_provider_kappa.job.config import load_config
from airflow_provider_kappa.timeparse import human_duration, parse_duration

if TYPE_CHECKING:
    from rich.table import Table

    from airflow_provider_kappa.backfill.cleanup import CleanupDecision


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``kappa cleanup``."""
    parser.add_argument("--config", required=True, help="path to the job's kappa.yaml")
    parser.add_argument(
        "--older-than",
        help="remove backfills last active at least this long ago, e.g. 7d, 12h, 0s (default: job.retention, 7d)",
    )
    parser.add_argument(
        "--ledger-older-than",
        help="also drop live ledger entries older than this (e.g. 30d) that no kept backfill may replay "
        "(default: keep them all; the ledger is compacted either way)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print what would be removed; remove nothing")


def cleanup_table(decisions: list[CleanupDecision], *, dry_run: bool) -> Table:
    """One row per backfill: last activity, age, publish, what it left, and the action taken."""

    removed = sum(d.remove for d in decisions)
    verb = "would remove" if dry_run else "removed"
    table = Table(title=Text(f"{len(decisions)} backfill(s) found, {removed} {verb}"))
    for column in ("backfill", "last active (UTC)", "age", "published", "staging tables", "tags", "checkpoint folder"):
        table.add_column(column, justify="right" if column in ("age", "staging tables", "tags") else "left")
    table.add_column("action")
    for d in decisions:
        lo = d.leftovers
        action = (
            Text.assemble((verb, "green"), f" ({d.reason})")
            if d.remove
            else Text.assemble(("kept", "yellow"), f": {d.reason}")
        )
        table.add_row(
            Text(lo.backfill_id),
            "-" if lo.last_activity is None else f"{lo.last_activity:%Y-%m-%d %H:%M}",
            age_text(d.age),
            "-" if lo.published_at is None else f"{lo.published_at:%Y-%m-%d %H:%M}",
            str(len(lo.staging)),
            Text(", ".join(source for _, source in lo.tags) or "-"),
            "yes" if lo.checkpoint else "-",
            action,
        )
    return table


def run(args: argparse.Namespace) -> int:
    """Apply the retention to the job's backfills; see the module docstring for exit codes."""

    cfg = load_config(args.config)
    older_than = None if args.older_than is None else parse_duration(args.older_than, "--older-than", allow_zero=True)
    retention = cfg.job.retention if older_than is None else older_than
    console = new_console()
    say(
        console,
        ("cleanup", "bold"),
        " of job ",
        (cfg.job.name, "bold"),
        f" ({cfg.path}): backfills last active at least "
        f"{human_duration(retention)} ago{' (dry run: nothing is removed)' if args.dry_run else ''}",
    )
    ledger_retention = (
        None
        if args.ledger_older_than is None
        else parse_duration(args.ledger_older_than, "--ledger-older-than", allow_zero=True)
    )
    decisions = cleanup(cfg, older_than=retention, dry_run=args.dry_run)
    if decisions:
        print_table(console, cleanup_table(decisions, dry_run=args.dry_run))
    else:
        say(console, f"  nothing to clean: no backfill of {cfg.job.name} left anything behind")
    for upkeep in ledger_upkeep(cfg, decisions, older_than=ledger_retention, dry_run=args.dry_run):
        say(console, ledger_line(upkeep, dry_run=args.dry_run))
    return 0


def ledger_line(upkeep: LedgerUpkeep, *, dry_run: bool) -> str:
    """``live ledger <uri>: 8640 entries; 8000 compacted; 100 older than <iso> dropped (why)``."""
    verb = "would be " if dry_run else ""
    parts = [f"  live ledger {upkeep.uri}: {upkeep.entries} entries"]
    if not dry_run:
        parts.append(f"{upkeep.compacted} compacted")
    if upkeep.kept_from is not None:
        parts.append(f"{upkeep.trimmed} older than {upkeep.kept_from.isoformat()} {verb}dropped")
    if upkeep.note:
        parts.append(f"kept more: {upkeep.note}" if upkeep.kept_from is not None else f"none dropped: {upkeep.note}")
    return "; ".join(parts)
