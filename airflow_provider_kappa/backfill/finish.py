"""The last steps of a backfill: validate the staged rows against the target, gate on
``min_match``, publish (one atomic Iceberg commit per sink, then release the lock), and the
summary of the whole run.

No Airflow import here; pyiceberg is imported by the helpers it calls, inside functions.
Return values (XCom) hold ids, times, counts and table names only.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from airflow_provider_kappa.backfill.lock import load_target, release, targets
from airflow_provider_kappa.exceptions import KappaCatalogUnavailableError, KappaValidationError

if TYPE_CHECKING:
    from airflow_provider_kappa.backfill.plan import BackfillPlan
    from airflow_provider_kappa.backfill.publish import PublishResult
    from airflow_provider_kappa.backfill.steps import Backfill
    from airflow_provider_kappa.backfill.validate import ValidationReport

log = logging.getLogger(__name__)


def validate(bf: Backfill, plan: BackfillPlan) -> dict[str, ValidationReport]:
    """Compare every sink's staged rows with its target's current rows over the window, and
    write the backfill's HTML report beside its checkpoints
    (:func:`~airflow_provider_kappa.backfill.report.report_file`).

    :param bf: the backfill.
    :param plan: the plan whose slices staged the rows.
    :returns: sink name -> report.
    """
    from airflow_provider_kappa.backfill.checks import closed_end
    from airflow_provider_kappa.backfill.report import write_report
    from airflow_provider_kappa.backfill.steps import null_ingestion_warnings
    from airflow_provider_kappa.backfill.validate import validate_window

    end = closed_end(bf, pinned(plan))  # the part of the window published (see publish)
    reports = {
        name: validate_window(
            bf.catalog_for(sink.catalog),
            sink.table,
            bf.staging_tables(sink, plan),
            sink.time_column,
            bf.params.start,
            end,
        )
        for name, sink in bf.cfg.sinks.items()
    }
    notes = null_ingestion_warnings(bf, pinned(plan))  # rows no slice read (docs/source.md)
    if end < bf.params.end:
        notes.append(_clipped(bf, end))
    for report in reports.values():
        report.warnings = [*report.warnings, *notes]
    write_report(bf, plan, reports)  # before the gate: a refused backfill has its report too
    return reports


def pinned(plan: BackfillPlan) -> dict[str, int]:
    """Concrete source name -> the snapshot id the plan's slices read."""
    return dict(plan.slices[0].snapshot_ids) if plan.slices else {}


def _clipped(bf: Backfill, end: datetime) -> str:
    return (
        f"allow_open_end: end + tail lies past the landed data, which closes the window only up to "
        f"{end.isoformat()}: validated and published [{bf.params.start.isoformat()}, {end.isoformat()}); "
        f"staged rows from {end.isoformat()} on are not published, the target's rows in "
        f"[{end.isoformat()}, {bf.params.end.isoformat()}) are kept as they are"
    )


def check_gate(bf: Backfill, reports: Mapping[str, ValidationReport]) -> None:
    """Refuse to go on when a sink's match rate is below ``min_match``, or when a publish would
    replace a non-empty window of the target with nothing (say so rather than silently empty it).

    :param bf: the backfill.
    :param reports: from :func:`validate`.
    :raises KappaValidationError: naming the sink and the numbers.
    """
    from airflow_provider_kappa.backfill.validate import check_min_match

    for name, report in reports.items():
        if bf.params.min_match > 0:
            check_min_match(report, bf.params.min_match)
        if report.staged_rows == 0 and report.target_rows > 0:
            raise KappaValidationError(
                f"sink {name}: the backfill staged no rows for [{report.window_start}, {report.window_end}) but "
                f"{report.target_table} holds {report.target_rows} there; refusing to replace the window with nothing "
                "(check the window and the source data)"
            )


def publish(bf: Backfill, plan: BackfillPlan) -> dict[str, PublishResult]:
    """Replace every sink's window with its staged rows, one atomic Iceberg commit per sink, then
    release the backfill's lock on the targets.

    Before its commit, each target is checked to hold no other backfill's live lock over an
    overlapping window: two backfills never interleave their publishes.

    :param bf: the backfill.
    :param plan: the plan whose slices staged the rows.
    :returns: sink name -> result.
    :raises KappaConcurrencyError: another backfill holds an overlapping window of a target.
    """
    from airflow_provider_kappa.backfill.checks import closed_end
    from airflow_provider_kappa.backfill.lock import check_lock
    from airflow_provider_kappa.backfill.publish import publish_window
    from airflow_provider_kappa.faults import retry_transient, transient_cause

    p = bf.params
    end = closed_end(bf, pinned(plan))  # allow_open_end: only what the landed data closes
    results: dict[str, PublishResult] = {}

    def checked() -> None:
        for catalog, table in targets(bf):
            check_lock(load_target(bf, catalog, table), bf.id, p.start, p.end)

    def one(name: str) -> PublishResult:
        sink = bf.cfg.sinks[name]
        return publish_window(
            bf.catalog_for(sink.catalog),
            sink.table,
            bf.staging_tables(sink, plan),
            sink.time_column,
            p.start,
            end,
            snapshot_properties={"kappa.backfill-id": bf.id},
            drop_until=p.end if end < p.end else None,
        )

    try:
        retry_transient(checked, f"backfill {bf.id}: lock check before publish")
        for name in bf.cfg.sinks:  # a repeated publish of a sink commits the same window again
            log.info("sink %s: publishing [%s, %s)", name, p.start.isoformat(), end.isoformat())
            results[name] = retry_transient(lambda name=name: one(name), f"publish of sink {name}")  # type: ignore[misc]
            log.info("sink %s: published %s", name, results[name])
        released = retry_transient(lambda: release(bf), f"backfill {bf.id}: release of its lock")
    except Exception as e:
        cause = transient_cause(e)
        if cause is None:
            raise
        raise KappaCatalogUnavailableError(_publish_failure(bf, results, cause)) from e
    if released:
        log.info("backfill %s: released its lock on %s", bf.id, released)
    return results


def _publish_failure(bf: Backfill, results: Mapping[str, Any], cause: BaseException) -> str:
    """The one-line message of a publish stopped by a transient catalog or storage fault."""
    from airflow_provider_kappa.backfill.steps import release_command
    from airflow_provider_kappa.faults import RETRY_ATTEMPTS, one_line, root_transient_cause

    cause = root_transient_cause(cause) or cause
    left = [name for name in bf.cfg.sinks if name not in results]
    fault = f"backfill {bf.id}: publish stopped by a catalog fault that outlasted {RETRY_ATTEMPTS} attempts ({one_line(cause)})"
    if not left:
        return (
            f"{fault}: every sink was published, but its lock on the targets could not be released; "
            f"release it: {release_command(bf)}"
        )
    done = f"sink(s) {sorted(results)} published, " if results else ""
    return (
        f"{fault}; {done}sink(s) {left} not changed. The backfill keeps its lock on the targets for a rerun: run the "
        "same kappa backfill command again with --resume (or clear the publish task in Airflow) once the catalog is "
        f"free; to abandon the backfill instead, release the lock: {release_command(bf)}"
    )


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
    :param slice_results: metrics of every slice run (:func:`~airflow_provider_kappa.backfill.steps.run_slice` results).
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
        from airflow_provider_kappa.backfill.checks import closed_end

        end = closed_end(bf, pinned(plan))
        if end < p.end:
            lines.append(f"  {_clipped(bf, end)}")
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
