"""The story's report (stage 5) from its outcomes: the facts (lake, live runs, each job and mode's
backfill, time by stage), a note per differing row saying why it differs, and the report's files
in the workdir (``report.html``, ``report.txt``, ``report.json``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from airflow_provider_kappa.demo.comparison import JobOutcome, explained_by
from airflow_provider_kappa.demo.lakegen import LakeSummary
from airflow_provider_kappa.demo.options import DemoOptions
from airflow_provider_kappa.demo.report import DemoReport


def explain_differences(o: JobOutcome) -> list[str]:
    """One note per differing row: what live and the backfill hold, and why they differ."""
    notes = []
    for side, rows in (("only in live", o.only_live), ("only in the backfill", o.only_backfill)):
        for row in rows:
            shown = {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in row.items() if k != "_count"}
            b = explained_by(row, o.job, o.boundaries)
            why = (
                f"the no-data micro-batch ending sequential slice {b['slice']} moved the watermark {b['from']} -> "
                f"{b['to']}; the next slice dropped as late the events of that span landed after it, which live "
                "(still at the first watermark) counted"
                if b
                else "not explained"
            )
            notes.append(f"{o.job} {o.mode}: {side} (x{row.get('_count', 1)}): {shown}: {why}")
    return notes


def outcome_json(o: JobOutcome) -> dict[str, Any]:
    """``report.json``'s entry for one job and mode."""
    return {
        "job": o.job,
        "mode": o.mode,
        "seconds": round(o.seconds, 1),
        "slices": len(o.slices),
        "rows_read": sum(s.rows_read for s in o.slices),
        "match_rate": o.match_rate,
        "reference_rows": o.reference_rows,
        "published_rows": o.published_rows,
        "only_live": o.only_live,
        "only_backfill": o.only_backfill,
        "nodata_boundaries": o.boundaries,
        "unexplained_rows": o.unexplained,
        "peak_state_rows": o.state_rows,
        "started": o.started,
        "ended": o.ended,
    }


def build_report(
    opts: DemoOptions,
    lake: LakeSummary,
    outcomes: list[JobOutcome],
    live_seconds: dict[str, float],
    start: datetime,
    end: datetime,
    stages: dict[str, float],
    wall: float,
    live_path: str = "iceberg tail",
) -> DemoReport:
    """The demo's report: its facts, its slices, the first outcome's hourly counts, and a note per
    differing row (or one saying every row matched)."""
    facts = [
        ("live path", live_path),
        (
            "lake",
            f"{lake.rows:,} events ({lake.impressions:,} impressions, {lake.playbacks:,} playbacks), "
            f"{lake.snapshots} snapshots, {opts.hours:g} h",
        ),
        ("incident window", f"[{start.isoformat()}, {end.isoformat()})"),
        ("threshold / slice", f"{opts.threshold} / {opts.slice}"),
    ]
    for job, seconds in live_seconds.items():
        facts.append((f"{job} live run", f"{seconds:.0f} s"))
    notes = []
    for o in outcomes:
        rows = sum(s.rows_read for s in o.slices)
        spark = sum(s.seconds for s in o.slices)
        facts.append(
            (
                f"{o.job} {o.mode}",
                f"{len(o.slices)} slices, {rows:,} rows read, {rows / spark if spark else 0:,.0f} rows/s, "
                f"wall {o.seconds:.0f} s, match vs live {o.match_rate:.3f}% "
                f"({o.published_rows:,} published, {o.reference_rows:,} live), peak state rows {o.state_rows:,}",
            )
        )
        if o.only_live or o.only_backfill:
            notes.extend(explain_differences(o))
    own = ", ".join(f"{o.job} {o.mode} {o.ended - o.started:.0f} s" for o in outcomes)
    facts.append(
        (
            "time by stage",
            ", ".join(f"{k} {v:.0f} s" for k, v in stages.items())
            + (f"; each job and mode's own backfill + comparison (jobs overlap): {own}" if own else ""),
        )
    )
    facts.append(("demo wall time", f"{wall:.0f} s"))
    first = outcomes[0] if outcomes else None
    return DemoReport(
        title="Kappa backfill demo",
        facts=facts,
        slices=[s for o in outcomes for s in o.slices],
        hours=first.hours if first else [],
        notes=notes or ["Every published row equals the live reference (multiset of rows, 100% match)."],
    )


def write_report(workdir: Path, report: DemoReport, outcomes: list[JobOutcome], say: Callable[[str], None]) -> None:
    """Write ``report.html``, ``report.txt`` and ``report.json`` into ``workdir`` and say the report."""
    html_path = report.write_html(workdir / "report.html")
    (workdir / "report.txt").write_text(report.to_text() + "\n")
    (workdir / "report.json").write_text(json.dumps([outcome_json(o) for o in outcomes], indent=2, default=str))
    say("[5/5] report")
    say(report.to_text())
    say(f"\nHTML report: {html_path}")
