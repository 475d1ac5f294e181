"""The live reference: the unchanged job run LIVE over the landed lake, in ingestion order.

A backfill is judged against production output. Without Kafka, the closest thing to the
live stream is the lake itself replayed the way it was landed: every source is read by the
``kappa_iceberg`` reader in tail mode (following the table's snapshots in commit order), a
few snapshots per micro-batch (one by default, i.e. one landing interval), with the
``availableNow`` trigger so the run ends once it has caught up with the tables. The job
writes its live sink tables, exactly as ``kappa run`` would.

With a broker (``kappa demo``'s Kafka story, :mod:`~airflow_provider_kappa.demo.kafka_lake`), the
reference is the job run live FROM KAFKA instead (:func:`kafka_reference_conf`): every source on its
``kafka`` candidate from the earliest offset, ``availableNow``, ``maxOffsetsPerTrigger`` per topic, the
sink recording the live ledger (``job.ledger``) as ``kappa run`` does.

The run is one spark-submit of the job's own application (:func:`~airflow_provider_kappa.engine.submit.submit`).
Nothing here imports pyspark; pyiceberg is imported inside functions.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_provider_kappa.engine.jvm import kafka_connector_conf
from airflow_provider_kappa.engine.launch import live_conf, source_conf, write_catalogs_file
from airflow_provider_kappa.engine.submit import submit
from airflow_provider_kappa.exceptions import KappaConfigError
from airflow_provider_kappa.job.catalogs import job_catalogs
from airflow_provider_kappa.job.checkpoints import live_checkpoint
from airflow_provider_kappa.job.config import IcebergSourceConfig, JobConfig, KafkaSourceConfig, load_config
from airflow_provider_kappa.spark.settings import AVAILABLE_NOW, PREFIX

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

LAKE_ENV = "KAPPA_LAKE"
"""Environment variable the example kappa.yaml files use for the lake folder."""


@dataclass(frozen=True)
class LiveReference:
    """What one live reference run did.

    :param job: the job name.
    :param checkpoint: the run's checkpoint folder (one sub-folder per sink).
    :param tables: sink name -> target table the run wrote.
    :param rows: sink name -> rows in that table after the run.
    :param batches: sink name -> micro-batches the sink's query committed in total.
    :param watermarks: sink name -> event-time watermark (epoch ms) of the last micro-batch.
    :param seconds: wall time of the spark-submit.
    """

    job: str
    checkpoint: str
    tables: Mapping[str, str]
    rows: Mapping[str, int]
    batches: Mapping[str, int]
    watermarks: Mapping[str, int]
    seconds: float


@contextmanager
def lake_env(lake_dir: str | Path | None) -> Iterator[None]:
    """Set ``KAPPA_LAKE`` to ``lake_dir`` for the block (kappa.yaml expands ``${KAPPA_LAKE}``).

    :param lake_dir: the lake folder, or None to leave the environment alone.
    """
    if lake_dir is None:
        yield
        return
    old = os.environ.get(LAKE_ENV)
    os.environ[LAKE_ENV] = str(Path(lake_dir).expanduser().resolve())
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(LAKE_ENV, None)
        else:
            os.environ[LAKE_ENV] = old


def reference_conf(
    cfg: JobConfig, catalogs_file: str | Path, checkpoint: str, *, files_per_batch: int = 1
) -> dict[str, str]:
    """The Spark conf of a live reference run: :func:`~airflow_provider_kappa.engine.launch.live_conf`
    with the ``availableNow`` trigger, every job source on its ``iceberg`` candidate (tail mode)
    and at most ``files_per_batch`` data files per micro-batch (at least one snapshot is read).

    :param cfg: the job config.
    :param catalogs_file: path written by :func:`~airflow_provider_kappa.engine.launch.write_catalogs_file`.
    :param checkpoint: the run's checkpoint folder.
    :param files_per_batch: reader option ``max_files_per_batch`` of every source.
    """
    if files_per_batch < 1:
        raise KappaConfigError(f"live reference files_per_batch: {files_per_batch!r}; expected at least 1")
    conf = live_conf(cfg, catalogs_file, checkpoint)
    conf[PREFIX + "trigger"] = AVAILABLE_NOW
    for name in cfg.job_sources():
        src = cfg.resolve(name, backfill=False)
        if not isinstance(src, IcebergSourceConfig):
            src = cfg.resolve(name, backfill=True)  # the lake copy of a Kafka source
            assert isinstance(src, IcebergSourceConfig)
            key = f"{PREFIX}source.{name}."
            conf = {k: v for k, v in conf.items() if not k.startswith(key)}
            conf.update(source_conf(name, src, src.name))
        conf[f"{PREFIX}source.{name}.option.max_files_per_batch"] = str(files_per_batch)
    return conf


def kafka_reference_conf(
    cfg: JobConfig, catalogs_file: str | Path, checkpoint: str, max_offsets: Mapping[str, int]
) -> dict[str, str]:
    """The Spark conf of a live reference run from Kafka: :func:`~airflow_provider_kappa.engine.launch.live_conf`
    with the ``availableNow`` trigger, every job source on its ``kafka`` candidate from the earliest
    offset with ``maxOffsetsPerTrigger`` of its topic, the Kafka connector's jars, and the live ledger
    (``job.ledger``) recorded by the sink, as ``kappa run`` records it.

    :param cfg: the job config.
    :param catalogs_file: path written by :func:`~airflow_provider_kappa.engine.launch.write_catalogs_file`.
    :param checkpoint: the run's checkpoint folder.
    :param max_offsets: topic -> records per micro-batch at most.
    :raises KappaConfigError: a job source without a kafka candidate, or a topic without a limit.
    """

    conf = live_conf(cfg, catalogs_file, checkpoint)
    conf[PREFIX + "trigger"] = AVAILABLE_NOW
    for name in cfg.job_sources():
        src = cfg.sources[name]
        kafka = [cfg.sources[c] for c in getattr(src, "candidates", ())]
        found = [c for c in kafka if isinstance(c, KafkaSourceConfig)]
        if len(found) != 1:
            raise KappaConfigError(
                f"sources.{name}: a live run from Kafka needs one 'kafka' candidate; found {len(found)}"
            )
        if found[0].topics not in max_offsets:
            raise KappaConfigError(
                f"sources.{found[0].name}.topics: {found[0].topics!r} has no micro-batch limit; known: {sorted(max_offsets)}"
            )
        key = f"{PREFIX}source.{name}."
        conf = {k: v for k, v in conf.items() if not k.startswith(key)}
        conf.update(source_conf(name, replace(found[0], starting_offsets="earliest"), found[0].name))
        conf[key + "option.maxOffsetsPerTrigger"] = str(max_offsets[found[0].topics])
    conf[PREFIX + "ledger"] = cfg.job.ledger
    return kafka_connector_conf(conf)


def run_live_reference(
    config_path: str | Path,
    *,
    lake_dir: str | Path | None = None,
    checkpoint: str | None = None,
    master: str = "local[2]",
    fresh: bool = False,
    files_per_batch: int = 1,
    extra_conf: Mapping[str, str] | None = None,
    kafka: Mapping[str, int] | None = None,
) -> LiveReference:
    """Run the unchanged job live over the lake until it has caught up; its sinks write
    their target tables (the production output a backfill is compared with).

    Rerunning with the same checkpoint resumes: it reads only snapshots landed since (none:
    the tables are unchanged). ``fresh`` starts over: the checkpoint is removed and the sink
    target tables are dropped first.

    :param config_path: the job's kappa.yaml.
    :param lake_dir: value of ``KAPPA_LAKE`` while the config is loaded (None: the environment's).
    :param checkpoint: checkpoint folder (default ``<checkpoint_root>/<job>/live``, the live one).
    :param master: Spark master of the run.
    :param fresh: drop the sink targets and the checkpoint before running.
    :param files_per_batch: data files each source reads per micro-batch at most (a landing
        is one file per table, so 1 replays the lake landing by landing).
    :param extra_conf: more Spark conf for the run (e.g. an event log), applied last.
    :param kafka: run from Kafka instead (:func:`kafka_reference_conf`): topic -> records per
        micro-batch at most; ``fresh`` then also removes the live ledger.
    :raises KappaConfigError: the config is invalid, or a source has no iceberg (no kafka) candidate.
    """
    with lake_env(lake_dir):
        cfg = load_config(config_path)
    ckpt = checkpoint or live_checkpoint(cfg.job.checkpoint_root, cfg.job.name)
    if fresh:
        _drop_targets(cfg)
        shutil.rmtree(ckpt, ignore_errors=True)
        if kafka is not None:
            shutil.rmtree(cfg.job.ledger, ignore_errors=True)
    private = Path(ckpt) / "_kappa"
    catalogs_file = write_catalogs_file(cfg, private / "catalogs.json")
    if kafka is None:
        conf = reference_conf(cfg, catalogs_file, ckpt, files_per_batch=files_per_batch)
    else:
        conf = kafka_reference_conf(cfg, catalogs_file, ckpt, kafka)
    conf.update(extra_conf or {})
    began = time.monotonic()
    submit(
        cfg.job.application,
        conf,
        properties_file=private / "spark.properties",
        name=f"kappa-{cfg.job.name}-live-reference",
        master=master,
        class_data_sharing=cfg.job.class_data_sharing,
    )
    seconds = time.monotonic() - began
    tables = {name: sink.table for name, sink in cfg.sinks.items()}
    return LiveReference(
        job=cfg.job.name,
        checkpoint=ckpt,
        tables=tables,
        rows={name: _count(cfg, name) for name in cfg.sinks},
        batches={name: len(_batch_files(Path(ckpt) / name / "commits")) for name in cfg.sinks},
        watermarks={name: last_watermark_ms(Path(ckpt) / name) for name in cfg.sinks},
        seconds=seconds,
    )


def _catalog(cfg: JobConfig, name: str) -> Catalog:

    return job_catalogs(cfg)(name)


def _drop_targets(cfg: JobConfig) -> None:
    from pyiceberg.exceptions import NoSuchTableError

    for sink in cfg.sinks.values():
        catalog = _catalog(cfg, sink.catalog)
        try:
            catalog.purge_table(sink.table)
        except NoSuchTableError:
            continue


def _count(cfg: JobConfig, sink_name: str) -> int:
    from pyiceberg.exceptions import NoSuchTableError

    sink = cfg.sink(sink_name)
    try:
        table = _catalog(cfg, sink.catalog).load_table(sink.table)
    except NoSuchTableError:
        return 0
    return int(table.scan().count())


def _batch_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted((p for p in folder.iterdir() if re.fullmatch(r"\d+", p.name)), key=lambda p: int(p.name))


def last_watermark_ms(query_checkpoint: str | Path) -> int:
    """Event-time watermark (epoch milliseconds) of the last micro-batch a query planned,
    read from its checkpoint's offset log (0 before any batch or without a watermark).

    :param query_checkpoint: the query's checkpoint folder (``<checkpoint>/<sink>``).
    """

    files = _batch_files(Path(query_checkpoint) / "offsets")
    if not files:
        return 0
    for line in files[-1].read_text().splitlines()[1:]:
        if line.startswith("{") and "batchWatermarkMs" in line:
            return int(json.loads(line)["batchWatermarkMs"])
    return 0
