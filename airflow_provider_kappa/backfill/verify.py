"""Continuous verification: a replay that does not publish, read as a check of live output.

A verification is a backfill with ``publish: false`` (the DAG of
:func:`airflow_provider_kappa.dag.kappa_verify_dag`, scheduled: each run replays its data interval,
yesterday). Its validation compares the replayed rows with what live wrote to the targets; a
sink whose match rate is below the verification's ``min_match`` **drifts**. Unset, ``min_match``
is 100 in a verification, whether or not the ledger is replayed (:meth:`~airflow_provider_kappa.backfill.params.BackfillParams.min_match_for`): with
the ledger the replay is exact, so any difference is drift; without it, a job whose output depends
on live's micro-batch cuts (late-event drops, joins) may differ near window ends, and its
verification sets ``min_match`` (or ``backfill.min_match``) to the match ``kappa plan`` says to
expect.

:func:`verification` turns the validation reports into the small JSON summary a verification
returns and puts on its asset event: per sink, the match rate, the rows on both sides and the
drifting output windows (start, end, live rows, replayed rows, rows on one side only), at most
:data:`MAX_DRIFT_WINDOWS` of them per sink (their total is kept). No Airflow, no Spark.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow_provider_kappa.timeparse import parse_timestamp

if TYPE_CHECKING:
    from airflow_provider_kappa.backfill.backfill import Backfill
    from airflow_provider_kappa.backfill.validate import ValidationReport

#: Most drifting windows a verification lists per sink (the first ones in time; the count says how many in all).
MAX_DRIFT_WINDOWS = 20


def drifting_windows(report: ValidationReport, limit: int = MAX_DRIFT_WINDOWS) -> tuple[list[dict[str, Any]], int]:
    """The output windows of ``report`` whose rows differ (the first ``limit``), and how many differ in all.

    Each window: ``start``, ``end`` (ISO-8601, the end clipped to the validated window),
    ``live_rows`` (the target's rows), ``replayed_rows`` (the replay's), ``only_live`` and
    ``only_replayed`` (rows on that side only: a window can differ with equal counts).

    :param report: a sink's validation report.
    :param limit: the most windows listed.
    """
    counts = report.windows
    if counts is None:
        return [], 0
    differing = counts.differing()
    first = parse_timestamp(counts.first, "first output window")
    step = timedelta(seconds=counts.step_seconds)
    window_end = parse_timestamp(report.window_end, "window end")
    out = []
    for i in differing[:limit]:
        start = first + i * step
        out.append(
            {
                "start": start.isoformat(),
                "end": min(start + step, window_end).isoformat(),
                "live_rows": counts.target[i],
                "replayed_rows": counts.staged[i],
                "only_live": counts.only_target[i],
                "only_replayed": counts.only_staged[i],
            }
        )
    return out, len(differing)


def verification(
    bf: Backfill, reports: Mapping[str, ValidationReport], *, report_url: str = "", limit: int = MAX_DRIFT_WINDOWS
) -> dict[str, Any]:
    """The summary of a verification (JSON-safe, small: at most ``limit`` windows per sink).

    ``drift`` is True when a sink's match rate is below ``min_match_for(verification=True)``; ``sinks`` holds,
    per sink: ``table``, ``match_rate``, ``drift``, ``live_rows``, ``replayed_rows``,
    ``drifting_windows`` (how many output windows differ), ``windows`` (the first ``limit`` of
    them, :func:`drifting_windows`) and ``window_seconds`` / ``grid`` (the windows' length; ``grid``
    False when the values lie on no grid and round buckets were counted instead).

    :param bf: the verification (a backfill that does not publish).
    :param reports: sink name -> its validation report.
    :param report_url: where the HTML report opens ('' when no browser can open it).
    :param limit: the most windows listed per sink.
    """
    min_match = bf.params.min_match_for(verification=True)
    sinks: dict[str, Any] = {}
    for name, report in reports.items():
        windows, differing = drifting_windows(report, limit)
        sinks[name] = {
            "table": report.target_table,
            "match_rate": report.match_rate,
            "drift": report.match_rate < min_match,
            "live_rows": report.target_rows,
            "replayed_rows": report.staged_rows,
            "drifting_windows": differing,
            "windows": windows,
            "window_seconds": report.windows.step_seconds if report.windows else None,
            "grid": bool(report.windows and report.windows.grid),
        }
    first = next(iter(reports.values()), None)
    return {
        "backfill_id": bf.id,
        "job": bf.cfg.job.name,
        "start": first.window_start if first else bf.params.start.isoformat(),
        "end": first.window_end if first else bf.params.end.isoformat(),
        "min_match": min_match,
        "drift": any(s["drift"] for s in sinks.values()),
        "report": report_url,
        "sinks": sinks,
    }


def drift_text(summary: Mapping[str, Any]) -> str:
    """One line per drifting sink and window of a :func:`verification` summary.

    :param summary: the verification's summary.
    """
    lines = [
        f"verification {summary.get('backfill_id')} of job {summary.get('job')} over "
        f"[{summary.get('start')}, {summary.get('end')}): "
        + ("live output drifts from the replay" if summary.get("drift") else "no drift")
    ]
    for name, sink in dict(summary.get("sinks") or {}).items():
        verdict = "DRIFT" if sink.get("drift") else "ok"
        lines.append(
            f"  sink {name} ({sink.get('table')}): {verdict}, match rate {float(sink.get('match_rate', 0)):.3f}% "
            f"(min_match {summary.get('min_match')}%), live rows {sink.get('live_rows')}, "
            f"replayed rows {sink.get('replayed_rows')}, {sink.get('drifting_windows')} window(s) differ"
        )
        for w in sink.get("windows") or []:
            lines.append(
                f"    [{w['start']}, {w['end']})  live {w['live_rows']}  replayed {w['replayed_rows']}  "
                f"only live {w['only_live']}  only replayed {w['only_replayed']}"
            )
        if len(sink.get("windows") or []) < int(sink.get("drifting_windows") or 0):
            lines.append(f"    … the first {len(sink['windows'])} listed; the report shows them all")
    if summary.get("report"):
        lines.append(f"  report: {summary['report']}")
    return "\n".join(lines)
