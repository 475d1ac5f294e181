"""From kappa.yaml (+ a run's choices) to the ``spark.kappa.*`` conf of one Spark run.

The inverse of :mod:`airflow_provider_kappa.spark.settings`. Catalog properties,
credentials included, go only to a catalogs file readable by its owner alone; the
conf (and so the spark-submit command line) carries its path, never its contents.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from airflow_provider_kappa.engine.iceberg_spark import job_spark_conf
from airflow_provider_kappa.engine.submit_args import CATALOGS_SHIP, SUBMIT_PREFIX
from airflow_provider_kappa.job.catalogs import job_catalog_properties
from airflow_provider_kappa.job.checkpoints import live_checkpoint
from airflow_provider_kappa.job.config import IcebergSourceConfig, JobConfig, KafkaSourceConfig
from airflow_provider_kappa.spark.settings import (
    AVAILABLE_NOW,
    BACKFILL,
    LIVE,
    PREFIX,
    PROCESSING_TIME,
)
from airflow_provider_kappa.spark.source.options import IcebergReadSpec
from airflow_provider_kappa.timeparse import format_duration


def write_catalogs_file(cfg: JobConfig, path: str | Path, names: list[str] | None = None) -> Path:
    """Write the catalogs file (mode 0600) a Spark run reads its catalog properties from.

    :param cfg: the job config.
    :param path: where to write it.
    :param names: catalogs to include (default: all of ``catalogs:``).
    :returns: the file written; ``job.catalogs_file`` instead, when the job names one (then nothing is
        written: the cluster reads that file itself).
    """
    if cfg.job.catalogs_file:
        return Path(cfg.job.catalogs_file)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    data = {n: job_catalog_properties(cfg, n) for n in (names or list(cfg.catalogs))}
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh)
    os.chmod(target, 0o600)
    return target


@dataclass(frozen=True)
class SliceRun:
    """What one backfill slice run reads and owns (all times UTC, aware)."""

    backfill_id: str
    slice_id: str
    read_start: datetime
    read_end: datetime
    owns_start: datetime
    owns_end: datetime
    max_misalignment_threshold: timedelta
    snapshot_ids: Mapping[str, int]  # concrete iceberg source name -> pinned snapshot id
    staging_tables: Mapping[str, str]  # sink name -> staging table identifier
    checkpoint: str
    sources: tuple[str, ...] = field(default_factory=tuple)  # job source names to backfill; empty = all
    continued: bool = False  # sequential: a later slice goes on from this one's checkpoint with data
    file_lists: Mapping[str, str] = field(
        default_factory=dict
    )  # concrete source -> file list (spark/source/file_list.py)
    epoch: str | None = None  # this attempt's epoch (checkpoints.CheckpointStore.new_epoch): fences older attempts
    ledger: str | None = None  # the live ledger (job.ledger) whose micro-batches the sources replay (backfill --ledger)


def common_conf(cfg: JobConfig, mode: str, checkpoint: str, catalogs_file: str | Path) -> dict[str, str]:
    """The conf every run of the job starts from (live, backfill slice, landing): the job's
    ``spark_conf``, the ``spark.kappa.*`` mode, job, checkpoint and catalogs file (``job.catalogs_file``
    when set), and the launch choices of :func:`submit_keys`.

    :param cfg: the job config.
    :param mode: ``live`` or ``backfill``.
    :param checkpoint: the run's checkpoint folder.
    :param catalogs_file: the run's 0600 catalogs file.
    """
    conf = job_spark_conf(cfg)  # with Iceberg's Spark runtime where the job declares an Iceberg catalog
    conf.update(
        {
            PREFIX + "mode": mode,
            PREFIX + "job": cfg.job.name,
            PREFIX + "checkpoint": checkpoint,
            PREFIX + "catalogs.file": cfg.job.catalogs_file or str(catalogs_file),
        }
    )
    conf.update(submit_keys(cfg))
    return conf


def submit_keys(cfg: JobConfig) -> dict[str, str]:
    """The job's launch choices a spark-submit applies (:func:`~airflow_provider_kappa.engine.submit_args.submit_args`
    reads and drops them; they never reach the job): ``spark.kappa.submit.deploy_mode``,
    ``.python_archive``, ``.env.<NAME>``, and ``spark.kappa.catalogs.ship=false`` for a ``job.catalogs_file``.

    :param cfg: the job config.
    """
    out: dict[str, str] = {}
    if cfg.job.deploy_mode:
        out[SUBMIT_PREFIX + "deploy_mode"] = cfg.job.deploy_mode
    if cfg.job.python_archive:
        out[SUBMIT_PREFIX + "python_archive"] = cfg.job.python_archive
    out.update({f"{SUBMIT_PREFIX}env.{k}": v for k, v in cfg.job.env.items()})
    if cfg.job.catalogs_file:
        out[CATALOGS_SHIP] = "false"
    return out


def source_conf(
    name: str,
    src: IcebergSourceConfig | KafkaSourceConfig,
    candidate: str,
    snapshot_id: int | None = None,
    plan_file: str | None = None,
) -> dict[str, str]:
    """The ``spark.kappa.source.<name>.*`` keys of job source ``name`` read through ``src``.

    :param name: the name the job passes to ``read_source``.
    :param src: the concrete source chosen for it.
    :param candidate: that source's name.
    :param snapshot_id: an iceberg source's pinned snapshot (backfill).
    :param plan_file: an iceberg source's file list for the slice (backfill, :mod:`~airflow_provider_kappa.spark.source.file_list`).
    """
    if isinstance(src, IcebergSourceConfig):
        spec = IcebergReadSpec(
            src.catalog, src.table, src.ingestion_column, snapshot_id=snapshot_id, plan_file=plan_file
        )
        return spec.to_conf(name, candidate)
    key = f"{PREFIX}source.{name}."
    out = {
        key + "type": "kafka",
        key + "candidate": candidate,
        key + "topics": src.topics,
        key + "bootstrap_servers": src.bootstrap_servers,
        key + "starting_offsets": src.starting_offsets,
    }
    if src.schema:
        out[key + "schema"] = src.schema
    if src.ingestion_column:
        out[key + "ingestion_column"] = src.ingestion_column
    out.update({key + "option." + k: v for k, v in src.options.items()})
    return out


def _sink_keys(cfg: JobConfig, write_tables: Mapping[str, str] | None = None) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, sink in cfg.sinks.items():
        key = f"{PREFIX}sink.{name}."
        out[key + "catalog"] = sink.catalog
        out[key + "table"] = sink.table
        out[key + "time_column"] = sink.time_column
        out[key + "write_table"] = (write_tables or {}).get(name, sink.table)
    return out


def live_conf(cfg: JobConfig, catalogs_file: str | Path, checkpoint: str | None = None) -> dict[str, str]:
    """The ``spark.kappa.*`` conf of a live run: ``selected`` candidates, processing-time trigger,
    output to the target tables.

    :param cfg: the job config.
    :param catalogs_file: path written by :func:`write_catalogs_file`.
    :param checkpoint: checkpoint folder (default ``<checkpoint_root>/<job>/live``).
    """
    conf = common_conf(cfg, LIVE, checkpoint or live_checkpoint(cfg.job.checkpoint_root, cfg.job.name), catalogs_file)
    conf[PREFIX + "trigger"] = PROCESSING_TIME
    conf[PREFIX + "trigger.interval"] = format_duration(cfg.job.live_trigger)
    conf.setdefault("spark.log.level", "WARN")  # a live run prints its own line per batch; job.spark_conf may say INFO
    for name in cfg.job_sources():
        src = cfg.resolve(name, backfill=False)
        conf.update(source_conf(name, src, src.name))
    conf.update(_sink_keys(cfg))
    return conf


NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"


def slice_conf(cfg: JobConfig, run: SliceRun, catalogs_file: str | Path) -> dict[str, str]:
    """The ``spark.kappa.*`` conf of one backfill slice: iceberg candidates at their pinned
    snapshots, ``availableNow``, the slice's read range, output to staging for the owned window.

    :param cfg: the job config.
    :param run: the slice's bounds, snapshots, staging tables and checkpoint.
    :param catalogs_file: path written by :func:`write_catalogs_file`.
    """
    conf = common_conf(cfg, BACKFILL, run.checkpoint, catalogs_file)
    conf.update(
        {
            PREFIX + "trigger": AVAILABLE_NOW,
            PREFIX + "read.start": run.read_start.isoformat(),
            PREFIX + "read.end": run.read_end.isoformat(),
            PREFIX + "max_misalignment_threshold": format_duration(run.max_misalignment_threshold),
            PREFIX + "backfill.id": run.backfill_id,
        }
    )
    if run.epoch is not None:
        conf[PREFIX + "epoch"] = run.epoch
    if run.ledger is not None:
        conf[PREFIX + "ledger"] = run.ledger
    if run.continued:
        # Live, the micro-batch after this slice's last one holds the next landing and runs
        # with the watermark that last batch advanced. availableNow would instead end on a
        # no-data micro-batch applying that watermark with no data: it closes windows and
        # evicts join state one landing early (rows the next landing would have joined are
        # lost). Without it, the next slice restores the advanced watermark from the commit
        # log (nextBatchWatermarkMs) and runs exactly live's next micro-batch.
        conf[NO_DATA_BATCHES] = "false"
    for name in run.sources or tuple(cfg.job_sources()):
        src = cfg.resolve(name, backfill=True)
        conf.update(source_conf(name, src, src.name, run.snapshot_ids.get(src.name), run.file_lists.get(src.name)))
    conf.update(_sink_keys(cfg, run.staging_tables))
    for name in cfg.sinks:
        key = f"{PREFIX}sink.{name}."
        conf[key + "owns.start"] = run.owns_start.isoformat()
        conf[key + "owns.end"] = run.owns_end.isoformat()
        conf[key + "slice"] = run.slice_id
    return conf
