"""The backfill steps as plain functions: snapshot, plan, slice run, validate, publish.

The Airflow operators and ``kappa backfill`` both call these (one code path). No Airflow
import here; pyiceberg is imported by the helpers it calls, inside functions.

Credentials: catalog properties are read only to open catalogs in this process and to write
the 0600 catalogs file of a slice run (:func:`airflow_provider_kappa.backfill.launch.write_catalogs_file`),
in a private temporary folder removed after the run. Return values (XCom) hold ids, times,
counts and table names only.
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from airflow_provider_kappa.backfill.checkpoints import CheckpointStore, backfill_root
from airflow_provider_kappa.backfill.config import IcebergSinkConfig, IcebergSourceConfig, JobConfig
from airflow_provider_kappa.exceptions import KappaSinkError, KappaSourceError, KappaValidationError
from airflow_provider_kappa.backfill.params import SEQUENTIAL, BackfillParams, backfill_id, parse_params
from airflow_provider_kappa.backfill.plan import BackfillPlan, SlicePlan, plan_backfill, slice_id
from airflow_provider_kappa.timeparse import to_micros

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

    from airflow_provider_kappa.backfill.publish import PublishResult
    from airflow_provider_kappa.backfill.validate import ValidationReport

log = logging.getLogger(__name__)

CatalogFor = Callable[[str], "Catalog"]
#: Retention of the tag pinning a backfill's source snapshots.
DEFAULT_TAG_RETENTION = timedelta(days=7)


def job_catalogs(cfg: JobConfig) -> CatalogFor:
    """A loader of the job's catalogs by name: inline properties, or an Airflow connection
    (``conn_id``) through IcebergHook. Catalogs are cached per process.

    :param cfg: the job config.
    """
    from airflow_provider_kappa.backfill.launch import catalog_properties
    from airflow_provider_kappa.spark.catalog import load_catalog

    def catalog_for(name: str) -> Catalog:
        return load_catalog(name, catalog_properties(cfg, name))

    return catalog_for


@dataclass(frozen=True)
class Backfill:
    """One backfill of a job: its config, validated parameters and id.

    :param cfg: the job config.
    :param params: validated parameters.
    :param id: the deterministic backfill id.
    :param catalog_for: opens a catalog of the job by name.
    """

    cfg: JobConfig
    params: BackfillParams
    id: str
    catalog_for: CatalogFor

    @classmethod
    def create(cls, cfg: JobConfig, raw_params: Mapping[str, Any], catalog_for: CatalogFor | None = None) -> Backfill:
        """Validate ``raw_params`` for ``cfg`` and derive the backfill id.

        :param cfg: the job config.
        :param raw_params: parameters (CLI flags, DAG params).
        :param catalog_for: catalog loader (default :func:`job_catalogs`).
        :raises KappaConfigError: for any bad parameter.
        """
        params = parse_params(cfg, raw_params)
        return cls(cfg, params, backfill_id(cfg, params), catalog_for or job_catalogs(cfg))

    @property
    def tag(self) -> str:
        """Name of the Iceberg tag pinning the source snapshots."""
        return f"kappa-{self.id}"

    def sources(self) -> dict[str, IcebergSourceConfig]:
        """Job source name -> the iceberg candidate the backfill reads."""
        out = {}
        for name in self.params.sources:
            src = self.cfg.resolve(name, backfill=True)
            assert isinstance(src, IcebergSourceConfig)
            out[name] = src
        return out

    def store(self) -> CheckpointStore:
        """The backfill's checkpoint folders."""
        return CheckpointStore(backfill_root(self.cfg.job.checkpoint_root, self.cfg.job.name, self.id))

    def staging_table(self, sink: IcebergSinkConfig, slice_id: str) -> str:
        """Staging table of ``sink`` for one slice."""
        from airflow_provider_kappa.spark.staging import staging_table_name

        return staging_table_name(sink.table, self.id, slice_id, self.cfg.job.staging_namespace)

    def staging_tables(self, sink: IcebergSinkConfig, plan: BackfillPlan) -> list[str]:
        """Staging tables of ``sink`` for every slice of ``plan``, in slice order."""
        return [self.staging_table(sink, s.slice_id) for s in plan.slices]


# --------------------------------------------------------------------------- snapshot


def check_inputs(bf: Backfill, *, runs: bool = True) -> None:
    """Refuse bad input before anything is written (no lock, no tag, no checkpoint): the source
    tables read must exist with a timestamp ingestion column (opening them proves the catalogs
    can be reached); a backfill that runs (``runs``) also needs the job's application file and
    every sink's target table with a time ``time_column``. ``kappa plan`` checks only sources.

    :param bf: the backfill.
    :param runs: the backfill will run the job (``kappa backfill``, the DAG's snapshot task).
    :raises KappaConfigError: a missing application, an unreachable catalog.
    :raises KappaSourceError: a missing source table or ingestion column.
    :raises KappaSinkError: a missing target table or ``time_column``.
    """
    from airflow_provider_kappa.backfill.config import check_application
    from airflow_provider_kappa.backfill.plan import check_tables

    if runs:
        check_application(bf.cfg)
    check_tables(bf.cfg, bf.params.sources, bf.catalog_for, sinks=runs)


def snapshot(bf: Backfill, *, tag: bool = True, retention: timedelta = DEFAULT_TAG_RETENTION) -> dict[str, int]:
    """Lock the window of every sink's target (a backfill that publishes; see :func:`lock`), then
    pin the current snapshot of every source table read, and tag it so that snapshot expiry
    cannot remove it during the backfill. A rerun with the same parameters finds its lock and
    its tag, and reuses the snapshot it pins (its input does not change).

    :param bf: the backfill.
    :param tag: lock and create/reuse the tag (``kappa plan`` passes ``False``: it writes nothing).
    :param retention: ``max-ref-age`` of a new tag, and how long the lock stays live.
    :returns: concrete source name -> snapshot id.
    :raises KappaConcurrencyError: another backfill holds an overlapping window of a target;
        nothing was written.
    :raises KappaSourceError: a missing table, or a table without any snapshot (no data).
    """
    if not (tag and bf.params.publishes):
        return _pin(bf, tag=tag, retention=retention)
    _pin(bf, tag=False, retention=retention)  # read only: refuse missing or empty sources before locking
    taken = lock(bf, retention=retention)
    try:
        return _pin(bf, tag=tag, retention=retention)
    except BaseException:
        for catalog, table in taken:  # a lock this call took for nothing is given back
            _release(bf, catalog, table)
        raise


def _pin(bf: Backfill, *, tag: bool, retention: timedelta) -> dict[str, int]:
    from airflow_provider_kappa.spark.catalog import load_table

    pinned: dict[str, int] = {}
    by_table: dict[tuple[str, str], int] = {}
    for src in bf.sources().values():
        key = (src.catalog, src.table)
        if key in by_table:
            pinned[src.name] = by_table[key]
            continue
        table = load_table(bf.catalog_for(src.catalog), src.table)
        ref = table.metadata.refs.get(bf.tag)
        if tag and ref is not None:
            snap_id = ref.snapshot_id
            log.info("source %s: reusing snapshot %s pinned by tag %s of %s", src.name, snap_id, bf.tag, src.table)
        else:
            current = table.current_snapshot()
            if current is None:
                raise KappaSourceError(
                    f"source {src.name}: table {src.table!r} has no snapshot (it holds no data); nothing to backfill"
                )
            snap_id = current.snapshot_id
            if tag:
                _create_tag(table, snap_id, bf.tag, retention)
                log.info("source %s: pinned snapshot %s of %s with tag %s", src.name, snap_id, src.table, bf.tag)
        by_table[key] = pinned[src.name] = int(snap_id)
    return pinned


def _create_tag(table: Any, snapshot_id: int, name: str, retention: timedelta) -> None:
    from pyiceberg.exceptions import CommitFailedException

    try:
        table.manage_snapshots().create_tag(
            snapshot_id, name, max_ref_age_ms=int(retention.total_seconds() * 1000)
        ).commit()
    except CommitFailedException as e:  # another task created it first: reuse only if identical
        table.refresh()
        ref = table.metadata.refs.get(name)
        if ref is None or ref.snapshot_id != snapshot_id:
            raise KappaSourceError(f"tag {name!r} of {'.'.join(table.name())!r} could not be created: {e}") from e


# --------------------------------------------------------------------------- lock


def release_command(bf: Backfill) -> str:
    """The ``kappa backfill`` command that releases ``bf``'s lock (shown to backfills it refuses)."""
    import shlex

    p = bf.params.to_dict()
    argv = [
        "kappa", "backfill", "--config", str(bf.cfg.path), "--start", p["start"], "--end", p["end"],
        "--mode", p["mode"], "--slice", p["slice"], "--warmup", p["warmup"], "--tail", p["tail"],
        "--max-misalignment", p["max_misalignment_threshold"], "--sources", ",".join(p["sources"]), "--release-lock",
    ]  # fmt: skip
    return shlex.join(argv)


def _targets(bf: Backfill) -> list[tuple[str, str]]:
    """``(catalog, table)`` of every sink target, each once, in a fixed order (no lock-order deadlock)."""
    return sorted({(sink.catalog, sink.table) for sink in bf.cfg.sinks.values()})


def _load_target(bf: Backfill, catalog: str, table: str) -> Any:
    from pyiceberg.exceptions import NoSuchTableError

    try:
        return bf.catalog_for(catalog).load_table(table)
    except NoSuchTableError as e:
        raise KappaSinkError(
            f"backfill {bf.id}: target table {table!r} does not exist in catalog {catalog!r}; "
            "a backfill replaces a window of an existing table"
        ) from e


def lock(bf: Backfill, *, retention: timedelta = DEFAULT_TAG_RETENTION) -> list[tuple[str, str]]:
    """Lock the window ``[start, end)`` of every sink's target table for ``bf`` (see
    :mod:`airflow_provider_kappa.backfill.lock`): refused when another backfill holds an overlapping
    window of one of them; re-taking its own lock (rerun, resume, retry) is allowed.

    :param bf: the backfill.
    :param retention: how long the lock stays live without being released (then it is stale
        and may be taken over).
    :returns: ``(catalog, table)`` of the locks this call newly took.
    :raises KappaConcurrencyError: naming the holder and its window; locks this call took are
        given back, so a refused backfill leaves nothing behind.
    """
    from airflow_provider_kappa.backfill.lock import take_lock

    taken: list[tuple[str, str]] = []
    try:
        for catalog, table in _targets(bf):
            _, held = take_lock(
                _load_target(bf, catalog, table), bf.id, bf.cfg.job.name, bf.params.start, bf.params.end,
                retention=retention, release=release_command(bf),
            )  # fmt: skip
            if not held:
                taken.append((catalog, table))
    except BaseException:
        for catalog, table in taken:
            _release(bf, catalog, table)
        raise
    return taken


def _release(bf: Backfill, catalog: str, table: str) -> bool:
    from airflow_provider_kappa.backfill.lock import release_lock

    return release_lock(_load_target(bf, catalog, table), bf.id)


def release(bf: Backfill) -> list[str]:
    """Release ``bf``'s lock on every sink target (publish does it; ``kappa backfill --release-lock``
    does it for an abandoned backfill). Idempotent.

    :param bf: the backfill.
    :returns: the tables whose lock was removed.
    """
    return [table for catalog, table in _targets(bf) if _release(bf, catalog, table)]


# --------------------------------------------------------------------------- plan


def spans_loader(bf: Backfill, snapshot_ids: Mapping[str, int]) -> Callable[[str, int | None, int | None], list[Any]]:
    """``spans_of(concrete_source, start_micros, end_micros)`` for the planner, from manifests.

    :param bf: the backfill.
    :param snapshot_ids: concrete source name -> pinned snapshot id.
    """
    from airflow_provider_kappa.spark.catalog import load_table
    from airflow_provider_kappa.spark.scan_plan import plan_files

    concrete = {src.name: src for src in bf.sources().values()}

    def spans_of(name: str, start: int | None, end: int | None) -> list[Any]:
        src = concrete[name]
        table = load_table(bf.catalog_for(src.catalog), src.table)
        return plan_files(table, snapshot_ids.get(name), src.ingestion_column, start, end)

    return spans_of


def plan(bf: Backfill, snapshot_ids: Mapping[str, int]) -> BackfillPlan:
    """Cut the backfill into slices and estimate each from manifests (see :mod:`.planner`).

    :param bf: the backfill.
    :param snapshot_ids: from :func:`snapshot`.
    """
    sources = {name: src.name for name, src in bf.sources().items()}
    missing = sorted(set(sources.values()) - set(snapshot_ids))
    if missing:
        raise KappaSourceError(f"plan: no pinned snapshot for source(s) {missing}; got {dict(snapshot_ids)}")
    return plan_backfill(bf.params, bf.id, snapshot_ids, sources, spans_loader(bf, snapshot_ids))


# --------------------------------------------------------------------------- slice


def next_slice_id(sp: SlicePlan) -> str | None:
    """The id of the slice after ``sp``, ``None`` for the last one."""
    return slice_id(sp.index + 1, sp.count) if sp.index + 1 < sp.count else None


def slice_ready(bf: Backfill, sp: SlicePlan) -> bool:
    """Whether ``sp`` may start: always in parallel mode; in sequential mode once the slice
    before it has succeeded (the checkpoint at its start is kept)."""
    return sp.mode != SEQUENTIAL or sp.index == 0 or bf.store().boundary_ready(sp.slice_id)


def run_slice(
    bf: Backfill,
    sp: SlicePlan,
    *,
    spark_conn_id: str | None = None,
    submit_fn: Callable[..., None] | None = None,
) -> dict[str, Any]:
    """Run one slice: clear its staging tables, prepare its checkpoint (sequential: restore the
    checkpoint kept at its start; parallel: a fresh one), spark-submit the job's unchanged
    application once with ``availableNow``, then keep the checkpoint for the next slice.

    Rerunning a slice, after success or failure, leaves exactly what one clean run leaves.

    :param bf: the backfill.
    :param sp: the slice (from :func:`plan`).
    :param spark_conn_id: Airflow Spark connection (default: the job's ``master`` in-process).
    :param submit_fn: replaces :func:`airflow_provider_kappa.backfill.submit.submit` (tests).
    :returns: the run's metrics (:class:`~airflow_provider_kappa.backfill.progress.SliceMetrics` as a dict)
        with ``slice_id``.
    """
    from airflow_provider_kappa.backfill.launch import SliceRun, slice_conf, write_catalogs_file
    from airflow_provider_kappa.backfill.progress import event_log_conf, read_progress, summarize
    from airflow_provider_kappa.spark.staging import clear_slice
    from airflow_provider_kappa.backfill.submit import submit

    if sp.backfill_id != bf.id:
        raise KappaSourceError(
            f"slice {sp.slice_id}: planned for backfill {sp.backfill_id!r}, but the parameters give {bf.id!r}; "
            "re-plan after changing parameters"
        )
    store = bf.store()
    nxt = next_slice_id(sp)
    checkpoint = store.start_sequential(sp.slice_id, sp.index, nxt) if sp.mode == SEQUENTIAL else store.start_parallel(sp.slice_id)
    staging = {}
    for name, sink in bf.cfg.sinks.items():
        staging[name] = bf.staging_table(sink, sp.slice_id)
        clear_slice(bf.catalog_for(sink.catalog), sink.table, staging[name])
    run = SliceRun(
        backfill_id=bf.id,
        slice_id=sp.slice_id,
        read_start=sp.read_start,
        read_end=sp.read_end,
        owns_start=sp.owns_start,
        owns_end=sp.owns_end,
        max_misalignment_threshold=bf.params.max_misalignment_threshold,
        snapshot_ids=dict(sp.snapshot_ids),
        staging_tables=staging,
        checkpoint=checkpoint,
        sources=bf.params.sources,
        continued=sp.continued,
    )
    if slice_is_empty(sp):
        return _skip_slice(bf, sp, store, nxt)
    run = replace(run, plan_files=write_source_plans(bf, sp))
    catalogs = sorted({s.catalog for s in bf.sources().values()} | {k.catalog for k in bf.cfg.sinks.values()})
    log.info(
        "slice %s (%d/%d, %s): reads [%s, %s), owns [%s, %s), checkpoint %s, staging %s",
        sp.slice_id, sp.index + 1, sp.count, sp.mode, sp.read_start.isoformat(), sp.read_end.isoformat(),
        sp.owns_start.isoformat(), sp.owns_end.isoformat(), checkpoint, sorted(staging.values()),
    )  # fmt: skip
    with tempfile.TemporaryDirectory(prefix=f"kappa-{sp.slice_id}-") as work:
        private = Path(work)
        catalogs_file = write_catalogs_file(bf.cfg, private / "catalogs.json", catalogs)
        conf = slice_conf(bf.cfg, run, catalogs_file)
        events = private / "eventlog"
        events.mkdir()
        conf.update(event_log_conf(events))
        began = time.monotonic()
        (submit_fn or submit)(
            bf.cfg.job.application,
            conf,
            properties_file=private / "spark.properties",
            name=f"kappa-{bf.cfg.job.name}-{bf.id}-{sp.slice_id}",
            master=bf.cfg.job.master,
            conn_id=spark_conn_id,
            class_data_sharing=bf.cfg.job.class_data_sharing,
        )
        seconds = time.monotonic() - began
        progress = read_progress(events)
    metrics = summarize(progress, seconds)
    store.record_progress(sp.slice_id, progress)
    result = {"slice_id": sp.slice_id, **metrics.to_dict()}
    if sp.mode == SEQUENTIAL:
        store.finish_sequential(sp.slice_id, nxt, result)
    else:
        store.finish_parallel(sp.slice_id, result)
    log.info("slice %s done: %s", sp.slice_id, metrics.to_text())
    return result


def write_source_plans(bf: Backfill, sp: SlicePlan) -> dict[str, str]:
    """Write the scan plan of each source for ``sp``'s read range next to the backfill's
    checkpoints, so the slice's readers need no catalog, manifest or pyiceberg import on the
    driver (see :mod:`airflow_provider_kappa.spark.source_plan`).

    :returns: concrete source name -> plan file; a source whose table's FileIO has properties
        the catalog does not give (vended credentials) is left out and planned by its reader.
    """
    from airflow_provider_kappa.backfill.launch import catalog_properties
    from airflow_provider_kappa.spark import source_plan
    from airflow_provider_kappa.spark.catalog import load_table

    store = bf.store()
    start, end = to_micros(sp.read_start), to_micros(sp.read_end)
    out = {}
    for src in bf.sources().values():
        snapshot_id = sp.snapshot_ids.get(src.name)
        if snapshot_id is None:
            continue
        table = load_table(bf.catalog_for(src.catalog), src.table)
        if not source_plan.plannable(table, catalog_properties(bf.cfg, src.catalog)):
            log.info("source %s: its table's FileIO has properties of its own; the reader plans it", src.name)
            continue
        plan = source_plan.build(table, snapshot_id, src.ingestion_column, start, end)
        out[src.name] = source_plan.write(store.plan_file(sp.slice_id, src.name), plan)
    return out


def slice_is_empty(sp: SlicePlan) -> bool:
    """Whether no source has a data file that may hold rows in ``sp``'s read range (from the
    plan's manifest statistics; a file without ingestion bounds counts as possibly holding rows)."""
    return bool(sp.stats) and all(s.files == 0 for s in sp.stats)


def _skip_slice(bf: Backfill, sp: SlicePlan, store: CheckpointStore, nxt: str | None) -> dict[str, Any]:
    """Record an empty slice done without a spark-submit.

    A run over no input commits no micro-batch: the checkpoint and the staged output would be
    left as they are. So, sequential: the checkpoint restored at the slice's start is kept as
    the next slice's start; parallel: nothing. Its (cleared) staging tables stay empty.
    """
    from airflow_provider_kappa.backfill.progress import SliceMetrics

    store.record_progress(sp.slice_id, [])
    result = {"slice_id": sp.slice_id, **SliceMetrics().to_dict(), "skipped": True}
    if sp.mode == SEQUENTIAL:
        store.finish_sequential(sp.slice_id, nxt, result)
    else:
        store.finish_parallel(sp.slice_id, result)
    log.info(
        "slice %s (%d/%d, %s): skipped, no source has data in its read range [%s, %s); recorded done with 0 rows",
        sp.slice_id, sp.index + 1, sp.count, sp.mode, sp.read_start.isoformat(), sp.read_end.isoformat(),
    )  # fmt: skip
    return result


# --------------------------------------------------------------------------- validate / publish


def validate(bf: Backfill, plan: BackfillPlan) -> dict[str, ValidationReport]:
    """Compare every sink's staged rows with its target's current rows over the window.

    :param bf: the backfill.
    :param plan: the plan whose slices staged the rows.
    :returns: sink name -> report.
    """
    from airflow_provider_kappa.backfill.validate import validate_window

    return {
        name: validate_window(
            bf.catalog_for(sink.catalog),
            sink.table,
            bf.staging_tables(sink, plan),
            sink.time_column,
            bf.params.start,
            bf.params.end,
        )
        for name, sink in bf.cfg.sinks.items()
    }


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
    from airflow_provider_kappa.backfill.lock import check_lock
    from airflow_provider_kappa.backfill.publish import publish_window

    for catalog, table in _targets(bf):
        check_lock(_load_target(bf, catalog, table), bf.id, bf.params.start, bf.params.end)
    results = {}
    for name, sink in bf.cfg.sinks.items():
        results[name] = publish_window(
            bf.catalog_for(sink.catalog),
            sink.table,
            bf.staging_tables(sink, plan),
            sink.time_column,
            bf.params.start,
            bf.params.end,
            snapshot_properties={"kappa.backfill-id": bf.id},
        )
        log.info("sink %s: published %s", name, results[name])
    released = release(bf)
    if released:
        log.info("backfill %s: released its lock on %s", bf.id, released)
    return results


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
    :param slice_results: metrics of every slice run (:func:`run_slice` results).
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
