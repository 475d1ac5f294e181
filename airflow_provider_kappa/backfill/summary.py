"""The few lines that sum up a backfill: slices, rows, throughput, match rate, publish."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow_provider_kappa.backfill.backfill import Backfill
from airflow_provider_kappa.backfill.checks import closed_end
from airflow_provider_kappa.backfill.plan import BackfillPlan
from airflow_provider_kappa.backfill.validate import clipped_note, pinned


def summary(
    bf: Backfill,
    plan: BackfillPlan,
    slice_results: Sequence[Mapping[str, Any]],
    reports: Mapping[str, Mapping[str, Any]] | None = None,
    published: Mapping[str, Mapping[str, Any]] | None = None,
) -> str:
    """A few lines summing up a backfill: slices, rows, throughput, match rate, publish.

    :param bf: the backfill.
    :param plan: its plan.
    :param slice_results: metrics of every slice run (:func:`~airflow_provider_kappa.backfill.slices.run_slice` results).
    :param reports: sink -> validation report as a dict (``ValidationReport.to_dict``).
    :param published: sink -> publish result as a dict.
    """
    rows = sum(int(r.get("rows_read", 0)) for r in slice_results)
    batches = sum(int(r.get("batches", 0)) for r in slice_results)
    seconds = sum(float(r.get("seconds", 0.0)) for r in slice_results)
    p = bf.params
    lines = [
        f"backfill {bf.id} of job {bf.cfg.job.name}: window [{p.start.isoformat()}, {p.end.isoformat()}), "
        f"mode {p.mode}, slice {p.to_dict()['slice']}",
        f"  slices run {len(slice_results)}/{len(plan.slices)}, rows read {rows}, micro-batches {batches}, "
        f"spark time {seconds:.1f}s, throughput {rows / seconds if seconds else 0.0:.0f} rows/s",
    ]
    if p.allow_open_end and plan.slices:
        end = closed_end(bf, pinned(plan))
        if end < p.end:
            lines.append(f"  {clipped_note(bf, end)}")
    for name, rep in (reports or {}).items():
        lines.append(
            f"  sink {name}: match rate {float(rep['match_rate']):.3f}% (staged {rep['staged_rows']}, "
            f"target {rep['target_rows']}, matched {rep['matched_rows']})"
        )
    if published:
        for name, res in published.items():
            lines.append(
                f"  sink {name}: published snapshot {res.get('snapshot_id')}: {res.get('rows_deleted')} rows replaced "
                f"by {res.get('rows_added')} ({res.get('attempts')} commit attempt(s))"
            )
    elif p.dry_run:
        lines.append("  dry run: nothing published; staged rows kept for inspection")
    elif not p.publish:
        lines.append("  publish off: nothing published; staged rows kept")
    return "\n".join(lines)
