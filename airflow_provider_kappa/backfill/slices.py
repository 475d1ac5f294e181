"""The slice step: one run of the job's unchanged application for one slice, on the job's engine.

:func:`run_slice` clears the slice's staging tables, prepares its checkpoint (sequential: the one
kept at its start; parallel: a fresh one), writes its file lists, runs it once with
``availableNow`` on the engine (:mod:`airflow_provider_kappa.engine`) and keeps its checkpoint for
the next slice. Rerunning a slice, after success or failure, leaves exactly what one clean run
leaves.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from airflow_provider_kappa.backfill.backfill import Backfill
from airflow_provider_kappa.backfill.params import SEQUENTIAL
from airflow_provider_kappa.backfill.plan import SlicePlan, slice_bounds, slice_id, slice_is_empty
from airflow_provider_kappa.engine.base import Engine, SliceRunRequest
from airflow_provider_kappa.engine.engines import engine_for
from airflow_provider_kappa.engine.launch import SliceRun, slice_conf, write_catalogs_file
from airflow_provider_kappa.engine.processes import private_folder
from airflow_provider_kappa.engine.progress import SliceMetrics, summarize
from airflow_provider_kappa.exceptions import KappaSourceError
from airflow_provider_kappa.job.catalogs import job_catalog_properties
from airflow_provider_kappa.job.checkpoints import CheckpointStore
from airflow_provider_kappa.job.config import IcebergSourceConfig
from airflow_provider_kappa.spark.catalog import load_table
from airflow_provider_kappa.spark.source import file_list
from airflow_provider_kappa.spark.staging import clear_slice
from airflow_provider_kappa.timeparse import to_micros

log = logging.getLogger(__name__)


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
    connect_url: str | None = None,
    extra_conf: Mapping[str, str] | None = None,
    engine: Engine | None = None,
) -> dict[str, Any]:
    """Run one slice: clear its staging tables, prepare its checkpoint (sequential: restore the
    checkpoint kept at its start; parallel: a fresh one), run the job's unchanged application
    once with ``availableNow`` on the job's engine (``job.engine``: a Spark Connect session, or a
    spark-submit), then keep the checkpoint for the next slice.

    Rerunning a slice, after success or failure, leaves exactly what one clean run leaves.

    :param bf: the backfill.
    :param sp: the slice (from :func:`~airflow_provider_kappa.backfill.plan.plan`).
    :param spark_conn_id: Airflow Spark connection of the submit engine (default: the job's
        ``master`` in-process).
    :param submit_fn: replaces :func:`airflow_provider_kappa.engine.submit.submit` (tests); given,
        the slice runs on the submit engine whatever ``job.engine`` says.
    :param connect_url: the Spark Connect server of the connect engine (default: ``job.connect``,
        else the kappa-owned server of the backfill's state file (:meth:`Backfill.connect_state_file`),
        restarted if it is gone, else a local server for this slice alone).
    :param extra_conf: more Spark conf of the run, below the slice's own keys (the operator's
        OpenLineage parent job keys, ``spark.openlineage.*``; a Spark Connect session cannot set
        them: the server's own values apply).
    :param engine: the engine to run on (``kappa backfill`` passes the one it started); default
        :func:`slice_engine` of the other arguments.
    :returns: the run's metrics (:class:`~airflow_provider_kappa.engine.progress.SliceMetrics` as a dict)
        with ``slice_id``.
    """
    if sp.backfill_id != bf.id:
        raise KappaSourceError(
            f"slice {sp.slice_id}: planned for backfill {sp.backfill_id!r}, but the parameters give {bf.id!r}; "
            "re-plan after changing parameters"
        )
    engine = engine or slice_engine(bf, spark_conn_id=spark_conn_id, submit_fn=submit_fn, connect_url=connect_url)
    with bf.store().beating():  # running: cleanup keeps it (touched at the start, every 30 s, at the end)
        return _run_slice(bf, sp, engine, extra_conf)


def _run_slice(bf: Backfill, sp: SlicePlan, engine: Engine, extra_conf: Mapping[str, str] | None) -> dict[str, Any]:
    """:func:`run_slice` once its engine is chosen and its heartbeat beats."""
    store = bf.store()
    nxt = next_slice_id(sp)
    engine.before_attempt(sp.slice_id)
    # a new epoch first: from here on an older attempt still running commits nothing and keeps no checkpoint
    epoch = store.new_epoch(sp.slice_id)
    if sp.mode == SEQUENTIAL:
        checkpoint = store.start_sequential(sp.slice_id, sp.index, nxt, epoch)
    else:
        checkpoint = store.start_parallel(sp.slice_id, epoch)
    if slice_is_empty(sp):  # an empty slice stages nothing: it gets no staging table (see plan.staging_tables)
        return _skip_slice(sp, store, nxt, epoch)
    run = _slice_run(bf, sp, checkpoint, epoch)
    catalogs = sorted({s.catalog for s in bf.sources().values()} | {k.catalog for k in bf.cfg.sinks.values()})
    with private_folder(sp.slice_id) as private:
        catalogs_file = write_catalogs_file(bf.cfg, private / "catalogs.json", catalogs)
        request = SliceRunRequest(
            application=bf.cfg.job.application,
            conf={**(extra_conf or {}), **slice_conf(bf.cfg, run, catalogs_file)},
            private=private,
            name=f"kappa-{bf.cfg.job.name}-{bf.id}-{sp.slice_id}",
            slice_id=sp.slice_id,
            epoch=epoch,
        )
        began = time.monotonic()
        try:
            progress = engine.run(request)
        except Exception as e:
            store.check_epoch(sp.slice_id, epoch, cause=e)  # a run that failed because it was superseded says so
            raise
        seconds = time.monotonic() - began
    return _record(sp, store, nxt, epoch, progress, seconds)


def _slice_run(bf: Backfill, sp: SlicePlan, checkpoint: str, epoch: str) -> SliceRun:
    """Clear the slice's staging tables for ``epoch``, write its file lists, and describe its run."""
    staging = {}
    for name, sink in bf.cfg.sinks.items():
        staging[name] = bf.staging_table(sink, sp.slice_id)
        clear_slice(bf.catalog_for(sink.catalog), sink.table, staging[name], epoch)
    log.info(
        "slice %s (%d/%d, %s): reads [%s, %s), owns [%s, %s), checkpoint %s, staging %s",
        sp.slice_id,
        sp.index + 1,
        sp.count,
        sp.mode,
        sp.read_start.isoformat(),
        sp.read_end.isoformat(),
        sp.owns_start.isoformat(),
        sp.owns_end.isoformat(),
        checkpoint,
        sorted(staging.values()),
    )
    return SliceRun(
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
        epoch=epoch,
        ledger=bf.cfg.job.ledger if sp.ledger_batches is not None else None,  # the plan chose (exactness.py)
        file_lists=write_file_lists(bf, sp),
    )


def _record(
    sp: SlicePlan, store: CheckpointStore, nxt: str | None, epoch: str, progress: list[dict[str, Any]], seconds: float
) -> dict[str, Any]:
    """Record a slice run that ended well (its epoch still current) and keep its checkpoint."""
    metrics = summarize(progress, seconds)
    store.check_epoch(sp.slice_id, epoch)
    store.record_progress(sp.slice_id, progress)
    result = {"slice_id": sp.slice_id, **metrics.to_dict()}
    _keep(sp, store, nxt, result, epoch)
    log.info("slice %s done: %s", sp.slice_id, metrics.to_text())
    return result


def _keep(sp: SlicePlan, store: CheckpointStore, nxt: str | None, result: dict[str, Any], epoch: str) -> None:
    """Record ``sp`` done with ``result``; sequential: keep its checkpoint as the next slice's start."""
    if sp.mode == SEQUENTIAL:
        store.finish_sequential(sp.slice_id, nxt, result, epoch)
    else:
        store.finish_parallel(sp.slice_id, result, epoch)


def slice_engine(
    bf: Backfill,
    *,
    spark_conn_id: str | None = None,
    submit_fn: Callable[..., None] | None = None,
    connect_url: str | None = None,
) -> Engine:
    """The engine ``bf``'s slices run on (``job.engine``); see :func:`run_slice` for the arguments."""
    return engine_for(
        bf.cfg,
        state_file=bf.connect_state_file(),
        store=bf.store(),
        spark_conn_id=spark_conn_id,
        submit_fn=submit_fn,
        connect_url=connect_url,
    )


def write_file_lists(bf: Backfill, sp: SlicePlan) -> dict[str, str]:
    """Write the file list of each source for ``sp``'s read range next to the backfill's
    checkpoints, so the slice's readers need no catalog, manifest or pyiceberg import on the
    driver (see :mod:`airflow_provider_kappa.spark.source.file_list`).

    :returns: concrete source name -> file list path; a source whose table's FileIO has properties
        the catalog does not give (vended credentials) is left out and planned by its reader.
    """
    store = bf.store()
    start, end = to_micros(sp.read_start), to_micros(sp.read_end)
    out = {}
    for src in bf.sources().values():
        snapshot_id = sp.snapshot_ids.get(src.name)
        if snapshot_id is None:
            continue
        table = load_table(bf.catalog_for(src.catalog), src.table)
        if not file_list.listable(table, job_catalog_properties(bf.cfg, src.catalog)):
            log.info("source %s: its table's FileIO has properties of its own; the reader plans it", src.name)
            continue
        files = _backfill_file_list(bf, src, table, snapshot_id)
        files = replace(
            files, start_micros=start, end_micros=end, spans=tuple(f for f in files.spans if f.intersects(start, end))
        )
        out[src.name] = file_list.write(store.plan_file(sp.slice_id, src.name), files)
    return out


#: The folder of ``plans/`` holding each source's file list for the whole backfill.
WHOLE_BACKFILL = "backfill"


def _backfill_file_list(bf: Backfill, src: IcebergSourceConfig, table: Any, snapshot_id: int) -> Any:
    """The file list of ``src`` at ``snapshot_id`` for the read range of every slice of ``bf``,
    built from manifests by the backfill's first slice run and kept under ``plans/`` (a slice's
    list is this one's files that intersect its range: each slice does not read manifests again).
    A missing, unreadable or stale copy (another snapshot, a narrower range) is rebuilt."""

    bounds = slice_bounds(bf.params)
    lo, hi = to_micros(min(b[0] for b in bounds)), to_micros(max(b[1] for b in bounds))
    uri = bf.store().plan_file(WHOLE_BACKFILL, f"{src.name}-{snapshot_id}")
    try:
        cached = file_list.read(uri)
        cached.check(".".join(table.name()), snapshot_id, src.ingestion_column, lo, hi)
        return cached
    except KappaSourceError:
        files = file_list.build(table, snapshot_id, src.ingestion_column, lo, hi)
        file_list.write(uri, files)
        return files


def _skip_slice(sp: SlicePlan, store: CheckpointStore, nxt: str | None, epoch: str) -> dict[str, Any]:
    """Record an empty slice done without a spark-submit.

    A run over no input commits no micro-batch: the checkpoint and the staged output would be
    left as they are. So, sequential: the checkpoint restored at the slice's start is kept as
    the next slice's start; parallel: nothing. It has no staging table (:func:`~airflow_provider_kappa.backfill.plan.staging_tables`).
    """
    store.record_progress(sp.slice_id, [])
    result = {"slice_id": sp.slice_id, **SliceMetrics().to_dict(), "skipped": True}
    _keep(sp, store, nxt, result, epoch)
    log.info(
        "slice %s (%d/%d, %s): skipped, no source has data in its read range [%s, %s); recorded done with 0 rows",
        sp.slice_id,
        sp.index + 1,
        sp.count,
        sp.mode,
        sp.read_start.isoformat(),
        sp.read_end.isoformat(),
    )
    return result
