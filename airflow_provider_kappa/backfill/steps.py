"""A backfill and the steps between its snapshot and its validation: plan, slice runs.

:class:`Backfill` is what every step takes. The other steps have their own modules:
:mod:`~airflow_provider_kappa.backfill.checks` (input checks, before anything is written),
:mod:`~airflow_provider_kappa.backfill.snapshot` (pin and tag the sources' snapshots, lock the
targets' window through :mod:`~airflow_provider_kappa.backfill.lock`),
:mod:`~airflow_provider_kappa.backfill.finish` (validate, gate, publish, summary).
The Airflow operators and ``kappa backfill`` both call them (one code path). No Airflow
import here; pyiceberg is imported by the helpers it calls, inside functions.

Credentials: catalog properties (:mod:`~airflow_provider_kappa.backfill.catalogs`) are read only
to open catalogs in this process and to write the 0600 catalogs file of a slice run
(:func:`airflow_provider_kappa.backfill.launch.write_catalogs_file`), in a private temporary
folder removed after the run. Return values (XCom) hold ids, times, counts and table names only.
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from airflow_provider_kappa.backfill.catalogs import CatalogFor, job_catalogs
from airflow_provider_kappa.backfill.checkpoints import CheckpointStore, backfill_root
from airflow_provider_kappa.backfill.config import SUBMIT, IcebergSinkConfig, IcebergSourceConfig, JobConfig
from airflow_provider_kappa.backfill.processes import private_folder
from airflow_provider_kappa.exceptions import KappaEngineError, KappaSourceError
from airflow_provider_kappa.backfill.params import SEQUENTIAL, BackfillParams, backfill_id, parse_params
from airflow_provider_kappa.backfill.plan import BackfillPlan, SlicePlan, plan_backfill, slice_id
from airflow_provider_kappa.timeparse import to_micros

log = logging.getLogger(__name__)


def tag_name(backfill_id: str) -> str:
    """``kappa-<backfill_id>``: the Iceberg tag pinning a backfill's source snapshots."""
    return f"kappa-{backfill_id}"


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
        :param catalog_for: catalog loader (default
            :func:`~airflow_provider_kappa.backfill.catalogs.job_catalogs`).
        :raises KappaConfigError: for any bad parameter.
        """
        params = parse_params(cfg, raw_params)
        return cls(cfg, params, backfill_id(cfg, params), catalog_for or job_catalogs(cfg))

    @property
    def tag(self) -> str:
        """Name of the Iceberg tag pinning the source snapshots."""
        return tag_name(self.id)

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
        """Staging tables of ``sink`` for every slice of ``plan`` that reads data, in slice order
        (an empty slice creates none: validate and publish count it as zero rows)."""
        return [self.staging_table(sink, s.slice_id) for s in plan.slices if not slice_is_empty(s)]


# --------------------------------------------------------------------------- lock (see lock.py)


def release_command(bf: Backfill) -> str:
    """The ``kappa backfill`` command that releases ``bf``'s lock (shown to backfills it refuses)."""
    import shlex

    from airflow_provider_kappa.backfill.params import to_argv

    argv = ["kappa", "backfill", "--config", str(bf.cfg.path), *to_argv(bf.params, identity_only=True), "--release-lock"]
    return shlex.join(argv)


# --------------------------------------------------------------------------- plan


def spans_loader(bf: Backfill, snapshot_ids: Mapping[str, int]) -> Callable[[str, int | None, int | None], list[Any]]:
    """``spans_of(concrete_source, start_micros, end_micros)`` for the planner, from manifests.

    :param bf: the backfill.
    :param snapshot_ids: concrete source name -> pinned snapshot id.
    """
    from airflow_provider_kappa.spark.catalog import load_table
    from airflow_provider_kappa.spark.source.manifests import file_spans

    concrete = {src.name: src for src in bf.sources().values()}

    def spans_of(name: str, start: int | None, end: int | None) -> list[Any]:
        src = concrete[name]
        table = load_table(bf.catalog_for(src.catalog), src.table)
        return file_spans(table, snapshot_ids.get(name), src.ingestion_column, start, end)

    return spans_of


def plan(bf: Backfill, snapshot_ids: Mapping[str, int]) -> BackfillPlan:
    """Cut the backfill into slices and estimate each from manifests (see :mod:`.planner`).

    :param bf: the backfill.
    :param snapshot_ids: from :func:`~airflow_provider_kappa.backfill.snapshot.snapshot`.
    """
    sources = {name: src.name for name, src in bf.sources().items()}
    missing = sorted(set(sources.values()) - set(snapshot_ids))
    if missing:
        raise KappaSourceError(f"plan: no pinned snapshot for source(s) {missing}; got {dict(snapshot_ids)}")
    planned = plan_backfill(bf.params, bf.id, snapshot_ids, sources, spans_loader(bf, snapshot_ids))
    return replace(planned, warnings=planned.warnings + tuple(null_ingestion_warnings(bf, snapshot_ids)))


def null_ingestion_warnings(bf: Backfill, snapshot_ids: Mapping[str, int]) -> list[str]:
    """One warning per source table holding rows with a null ingestion column at its pinned
    snapshot (or without the statistic to tell): no slice reads such rows (docs/source.md).

    :param bf: the backfill.
    :param snapshot_ids: concrete source name -> pinned snapshot id.
    """
    from airflow_provider_kappa.spark.catalog import load_table
    from airflow_provider_kappa.spark.source.manifests import null_ingestion_rows

    out = []
    for src in {s.name: s for s in bf.sources().values()}.values():
        table = load_table(bf.catalog_for(src.catalog), src.table)
        nulls = null_ingestion_rows(table, snapshot_ids.get(src.name), src.ingestion_column)
        if nulls is None:
            out.append(
                f"source {src.name}: some data files of {src.table} have no null count for {src.ingestion_column}; "
                "rows with a null ingestion time, if any, are not read"
            )
        elif nulls:
            out.append(
                f"source {src.name}: {nulls} row(s) of {src.table} have a null {src.ingestion_column}; "
                "no slice reads them (a row without an ingestion time belongs to no slice)"
            )
    return out


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
    connect_url: str | None = None,
    extra_conf: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Run one slice: clear its staging tables, prepare its checkpoint (sequential: restore the
    checkpoint kept at its start; parallel: a fresh one), run the job's unchanged application
    once with ``availableNow`` on the job's engine (``job.engine``: a Spark Connect session, or a
    spark-submit), then keep the checkpoint for the next slice.

    Rerunning a slice, after success or failure, leaves exactly what one clean run leaves.

    :param bf: the backfill.
    :param sp: the slice (from :func:`plan`).
    :param spark_conn_id: Airflow Spark connection of the submit engine (default: the job's
        ``master`` in-process).
    :param submit_fn: replaces :func:`airflow_provider_kappa.backfill.submit.submit` (tests); given,
        the slice runs on the submit engine whatever ``job.engine`` says.
    :param connect_url: the Spark Connect server of the connect engine (default: ``job.connect``,
        else the kappa-owned server of the backfill's state file (:func:`connect_state_file`),
        restarted if it is gone, else a local server for this slice alone).
    :param extra_conf: more Spark conf of the run, below the slice's own keys (the operator's
        OpenLineage parent job keys, ``spark.openlineage.*``; a Spark Connect session cannot set
        them: the server's own values apply).
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
    _stop_previous_session(bf, sp, connect_url)
    # a new epoch first: from here on an older attempt still running commits nothing and keeps no checkpoint
    epoch = store.new_epoch(sp.slice_id)
    if sp.mode == SEQUENTIAL:
        checkpoint = store.start_sequential(sp.slice_id, sp.index, nxt, epoch)
    else:
        checkpoint = store.start_parallel(sp.slice_id, epoch)
    staging = {}
    for name, sink in bf.cfg.sinks.items():
        staging[name] = bf.staging_table(sink, sp.slice_id)
        if not slice_is_empty(sp):  # an empty slice stages nothing: it gets no staging table (see staging_tables)
            clear_slice(bf.catalog_for(sink.catalog), sink.table, staging[name], epoch)
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
        epoch=epoch,
        ledger=bf.cfg.job.ledger if bf.params.ledger else None,
    )
    if slice_is_empty(sp):
        return _skip_slice(bf, sp, store, nxt, epoch)
    run = replace(run, file_lists=write_file_lists(bf, sp))
    catalogs = sorted({s.catalog for s in bf.sources().values()} | {k.catalog for k in bf.cfg.sinks.values()})
    log.info(
        "slice %s (%d/%d, %s): reads [%s, %s), owns [%s, %s), checkpoint %s, staging %s",
        sp.slice_id, sp.index + 1, sp.count, sp.mode, sp.read_start.isoformat(), sp.read_end.isoformat(),
        sp.owns_start.isoformat(), sp.owns_end.isoformat(), checkpoint, sorted(staging.values()),
    )  # fmt: skip
    with private_folder(sp.slice_id) as private:
        catalogs_file = write_catalogs_file(bf.cfg, private / "catalogs.json", catalogs)
        conf = {**(extra_conf or {}), **slice_conf(bf.cfg, run, catalogs_file)}
        name = f"kappa-{bf.cfg.job.name}-{bf.id}-{sp.slice_id}"
        began = time.monotonic()
        try:
            if submit_fn is not None or bf.cfg.job.engine == SUBMIT:
                events = private / "eventlog"
                events.mkdir()
                conf.update(event_log_conf(events))
                (submit_fn or submit)(
                    bf.cfg.job.application,
                    conf,
                    properties_file=private / "spark.properties",
                    name=name,
                    master=bf.cfg.job.master,
                    conn_id=spark_conn_id,
                    class_data_sharing=bf.cfg.job.class_data_sharing,
                )
                progress = read_progress(events)
            else:
                progress = _run_on_connect(bf, conf, private, name, connect_url, (sp.slice_id, epoch))
        except Exception as e:
            store.check_epoch(sp.slice_id, epoch, cause=e)  # a run that failed because it was superseded says so
            raise
        seconds = time.monotonic() - began
    metrics = summarize(progress, seconds)
    store.check_epoch(sp.slice_id, epoch)
    store.record_progress(sp.slice_id, progress)
    result = {"slice_id": sp.slice_id, **metrics.to_dict()}
    if sp.mode == SEQUENTIAL:
        store.finish_sequential(sp.slice_id, nxt, result, epoch)
    else:
        store.finish_parallel(sp.slice_id, result, epoch)
    log.info("slice %s done: %s", sp.slice_id, metrics.to_text())
    return result


def connect_state_file(bf: Backfill) -> Path:
    """The state file of the Spark Connect server kappa owns for ``bf`` (see
    :class:`~airflow_provider_kappa.backfill.connect.LocalConnectServer`): in the backfill's
    checkpoint folder when local, else in a temporary folder of this machine."""
    return connect_state_path(bf.store().root, bf.id)


def connect_state_path(root: str, backfill_id: str) -> Path:
    """:func:`connect_state_file` of the backfill ``backfill_id`` whose checkpoint folder is ``root``."""
    if "://" in root and not root.startswith("file://"):
        return Path(tempfile.gettempdir()) / "kappa-connect" / backfill_id / "server.json"
    return Path(root.removeprefix("file://")) / "connect" / "server.json"


def _run_on_connect(
    bf: Backfill, conf: dict[str, str], private: Path, name: str, url: str | None, attempt: tuple[str, str]
) -> list[dict[str, Any]]:
    """One slice run as a Spark Connect session; see :func:`run_slice` for where the server comes from.
    ``attempt`` is ``(slice_id, epoch)``: the session is recorded with it (:func:`_stop_previous_session`)."""
    import uuid

    from airflow_provider_kappa.backfill import connect

    state_file = connect_state_file(bf)
    url = url or connect.configured_url(bf.cfg)
    if url is None and state_file.is_file():
        url = connect.ensure_server(bf.cfg, state_file).url
    session_id = str(uuid.uuid4())
    if url is None:
        log.warning(
            "slice %s: no Spark Connect server for backfill %s (no job.connect, no server state file %s): starting one "
            "for this slice alone, a Spark start per slice; kappa backfill and the DAG's setup task start one per "
            "backfill (connect.ensure_server(cfg, connect_state_file(bf)))",
            attempt[0], bf.id, state_file,
        )  # fmt: skip
        with connect.LocalConnectServer(bf.cfg, private / "server", die_with_parent=True) as server:
            return connect.run_application(
                bf.cfg.job.application, conf, url=server.url, work=private, name=name, server_alive=server.alive,
                owned=True, session_id=session_id,
            )  # fmt: skip
    bf.store().record_session(*attempt, {"server": connect.redact_url(url), "session_id": session_id})
    state = connect.read_state(state_file)
    owned = state is not None and state.url == url
    progress = connect.run_application(
        bf.cfg.job.application, conf, url=url, work=private, name=name, server_alive=state.alive if owned and state else None,
        owned=owned, session_id=session_id,
    )  # fmt: skip
    bf.store().record_session(*attempt, None)  # released by the runner: nothing for the next attempt to stop
    return progress


def _stop_previous_session(bf: Backfill, sp: SlicePlan, url: str | None) -> None:
    """Before a new attempt of ``sp`` on the connect engine: release the Spark Connect session of the
    slice's previous attempt if it ran on the same server (its runner may have been killed, leaving
    its query running inside the server). The epoch fence refuses that query's commits anyway; this
    stops it from spending the server's cores."""
    if bf.cfg.job.engine == SUBMIT:
        return
    from airflow_provider_kappa.backfill import connect

    previous = bf.store().session(sp.slice_id)
    if not previous:
        return
    url = url or connect.configured_url(bf.cfg)
    if url is None:
        state = connect.read_state(connect_state_file(bf))
        url = state.url if state is not None and state.alive() else None
    if url is None or connect.redact_url(url) != previous.get("server"):
        return
    try:
        connect.stop_session(url, str(previous["session_id"]))
    except KappaEngineError as e:
        # Not fatal on purpose: the epoch taken next fences that session's query out whatever it
        # does; the retry must not fail because an old session could not be reached.
        log.warning("slice %s: the previous attempt's Spark Connect session was not stopped: %s", sp.slice_id, e)


def write_file_lists(bf: Backfill, sp: SlicePlan) -> dict[str, str]:
    """Write the file list of each source for ``sp``'s read range next to the backfill's
    checkpoints, so the slice's readers need no catalog, manifest or pyiceberg import on the
    driver (see :mod:`airflow_provider_kappa.spark.source.file_list`).

    :returns: concrete source name -> file list path; a source whose table's FileIO has properties
        the catalog does not give (vended credentials) is left out and planned by its reader.
    """
    from airflow_provider_kappa.backfill.catalogs import catalog_properties
    from airflow_provider_kappa.spark.source import file_list
    from airflow_provider_kappa.spark.catalog import load_table

    store = bf.store()
    start, end = to_micros(sp.read_start), to_micros(sp.read_end)
    out = {}
    for src in bf.sources().values():
        snapshot_id = sp.snapshot_ids.get(src.name)
        if snapshot_id is None:
            continue
        table = load_table(bf.catalog_for(src.catalog), src.table)
        if not file_list.listable(table, catalog_properties(bf.cfg, src.catalog)):
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
    from airflow_provider_kappa.backfill.plan import slice_bounds
    from airflow_provider_kappa.exceptions import KappaSourceError
    from airflow_provider_kappa.spark.source import file_list

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


def slice_is_empty(sp: SlicePlan) -> bool:
    """Whether no source has a data file that may hold rows in ``sp``'s read range (from the
    plan's manifest statistics; a file without ingestion bounds counts as possibly holding rows)."""
    return bool(sp.stats) and all(s.files == 0 for s in sp.stats)


def _skip_slice(bf: Backfill, sp: SlicePlan, store: CheckpointStore, nxt: str | None, epoch: str) -> dict[str, Any]:
    """Record an empty slice done without a spark-submit.

    A run over no input commits no micro-batch: the checkpoint and the staged output would be
    left as they are. So, sequential: the checkpoint restored at the slice's start is kept as
    the next slice's start; parallel: nothing. It has no staging table (:meth:`Backfill.staging_tables`).
    """
    from airflow_provider_kappa.backfill.progress import SliceMetrics

    store.record_progress(sp.slice_id, [])
    result = {"slice_id": sp.slice_id, **SliceMetrics().to_dict(), "skipped": True}
    if sp.mode == SEQUENTIAL:
        store.finish_sequential(sp.slice_id, nxt, result, epoch)
    else:
        store.finish_parallel(sp.slice_id, result, epoch)
    log.info(
        "slice %s (%d/%d, %s): skipped, no source has data in its read range [%s, %s); recorded done with 0 rows",
        sp.slice_id, sp.index + 1, sp.count, sp.mode, sp.read_start.isoformat(), sp.read_end.isoformat(),
    )  # fmt: skip
    return result
