"""``kappa land``'s steps as plain Python: which sources land where, the checks before Spark
starts, and the ``spark.kappa.*`` conf of the landing application
(:mod:`airflow_provider_kappa.spark.landing`).

A landing reads a dynamic source's ``kafka`` candidate and appends to its ``iceberg`` candidate's
table: the JSON ``value`` parsed by the kafka source's ``schema``, the iceberg candidate's
``ingestion_column`` set to the Kafka record's timestamp, and the record's topic, partition and
offset in :data:`KAFKA_COLUMNS`. No pyspark import; pyiceberg only inside :func:`check_tables`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from airflow_provider_kappa.engine.launch import common_conf, source_conf
from airflow_provider_kappa.exceptions import KappaConfigError, KappaSourceError
from airflow_provider_kappa.job import checkpoints
from airflow_provider_kappa.job.catalogs import CatalogFor
from airflow_provider_kappa.job.config import DynamicSourceConfig, IcebergSourceConfig, JobConfig, KafkaSourceConfig
from airflow_provider_kappa.spark.conf_keys import (
    AVAILABLE_NOW,
    KAFKA_COLUMNS,
    LAND_SOURCES,
    LIVE,
    PREFIX,
    PROCESSING_TIME,
)
from airflow_provider_kappa.timeparse import format_duration

__all__ = [
    "KAFKA_COLUMNS",
    "Landing",
    "check_tables",
    "describe",
    "land_checkpoint",
    "land_conf",
    "landings",
    "selected",
]


@dataclass(frozen=True)
class Landing:
    """One landed source: the dynamic source's name, its kafka candidate and its iceberg candidate."""

    source: str
    kafka: KafkaSourceConfig
    iceberg: IcebergSourceConfig


def _candidates(cfg: JobConfig, src: DynamicSourceConfig) -> tuple[list[KafkaSourceConfig], list[IcebergSourceConfig]]:
    kafka = [c for c in (cfg.sources[n] for n in src.candidates) if isinstance(c, KafkaSourceConfig)]
    iceberg = [c for c in (cfg.sources[n] for n in src.candidates) if isinstance(c, IcebergSourceConfig)]
    return kafka, iceberg


def landings(cfg: JobConfig, names: Sequence[str] = ()) -> list[Landing]:
    """The landings of ``names`` (default: every dynamic source with a kafka and an iceberg candidate).

    :param cfg: the job config.
    :param names: dynamic source names (``--sources``).
    :raises KappaConfigError: a name that is not a dynamic source with one kafka and one iceberg
        candidate, a kafka candidate without ``schema``, or nothing to land.
    """
    if not names:
        names = [n for n, s in cfg.sources.items() if isinstance(s, DynamicSourceConfig) and all(_candidates(cfg, s))]
        if not names:
            raise KappaConfigError(
                f"{cfg.path}: no dynamic source has both a 'kafka' and an 'iceberg' candidate; kappa land has nothing to land"
            )
    out = []
    for name in names:
        src = cfg.sources.get(name)
        if not isinstance(src, DynamicSourceConfig):
            dynamic = sorted(n for n, s in cfg.sources.items() if isinstance(s, DynamicSourceConfig))
            raise KappaConfigError(
                f"--sources: {name!r} is not a dynamic source of {cfg.path}; dynamic sources: {dynamic}"
            )
        kafka, iceberg = _candidates(cfg, src)
        if len(kafka) != 1 or len(iceberg) != 1:
            raise KappaConfigError(
                f"sources.{name}.candidates: {list(src.candidates)} must hold exactly one 'kafka' and one 'iceberg' "
                f"candidate to land (found {len(kafka)} kafka, {len(iceberg)} iceberg)"
            )
        if not kafka[0].schema:
            raise KappaConfigError(
                f"sources.{kafka[0].name}.schema: missing; kappa land parses the Kafka value (JSON) into the columns of "
                f"{iceberg[0].table} by it (a Spark DDL schema, e.g. 'event_id STRING, event_ts TIMESTAMP')"
            )
        out.append(Landing(name, kafka[0], iceberg[0]))
    return out


def land_checkpoint(cfg: JobConfig) -> str:
    """``<checkpoint_root>/<job>/land``: one streaming checkpoint per landed source below it."""
    return checkpoints.land_checkpoint(cfg.job.checkpoint_root, cfg.job.name)


def check_tables(cfg: JobConfig, items: Sequence[Landing], catalog_for: CatalogFor) -> None:
    """Refuse a landed table that exists without the columns kappa land writes: the ingestion column
    (a timestamp with zone) and :data:`KAFKA_COLUMNS`. A missing table is fine: the landing creates it
    (every column optional, partitioned by day of the ingestion column). Other columns are checked
    against the parsed value when the landing starts (the sink names any mismatch).

    :param cfg: the job config.
    :param items: the landings.
    :param catalog_for: opens a catalog of the job by name.
    :raises KappaSourceError: naming the table, the missing or mistyped columns and what they must be.
    """
    from pyiceberg.exceptions import NoSuchTableError
    from pyiceberg.types import IntegerType, LongType, StringType, TimestamptzType

    wanted = dict(zip(KAFKA_COLUMNS, (StringType(), IntegerType(), LongType())))
    for item in items:
        try:
            table = catalog_for(item.iceberg.catalog).load_table(item.iceberg.table)
        except NoSuchTableError:
            continue
        fields = {f.name: f.field_type for f in table.schema().fields}
        need = {item.iceberg.ingestion_column: TimestamptzType(), **wanted}
        missing = [c for c in need if c not in fields]
        mistyped = [f"{c} ({fields[c]}, expected {need[c]})" for c in need if c in fields and fields[c] != need[c]]
        if missing or mistyped:
            problems = ([f"missing column(s) {missing}"] if missing else []) + (
                [f"mistyped {mistyped}"] if mistyped else []
            )
            raise KappaSourceError(
                f"sources.{item.iceberg.name}: table {item.iceberg.table!r} cannot take the landing of "
                f"{item.kafka.name!r}: {'; '.join(problems)}. kappa land writes {item.iceberg.ingestion_column} "
                f"(timestamptz, the Kafka record timestamp), kafka_topic (string), kafka_partition (int) and "
                "kafka_offset (long): add them (e.g. ALTER TABLE ... ADD COLUMN) or land into a new table (docs/landing.md)"
            )


def land_conf(
    cfg: JobConfig,
    items: Sequence[Landing],
    catalogs_file: str | Path,
    *,
    checkpoint: str | None = None,
    available_now: bool = False,
) -> dict[str, str]:
    """The Spark conf of the landing application: the job's ``spark_conf``, a live run whose source
    ``<s>`` is the kafka candidate (its ingestion column the iceberg candidate's) and whose sink ``<s>``
    is the iceberg candidate's table (``time_column`` = the ingestion column), one micro-batch per
    ``land.interval`` (or ``availableNow``).

    :param cfg: the job config.
    :param items: the landings (:func:`landings`).
    :param catalogs_file: the run's 0600 catalogs file.
    :param checkpoint: the landing's checkpoint folder (default :func:`land_checkpoint`).
    :param available_now: land what the topics hold now, then stop.
    """
    conf = common_conf(cfg, LIVE, checkpoint or land_checkpoint(cfg), catalogs_file)
    conf.update(
        {
            PREFIX + "trigger": AVAILABLE_NOW if available_now else PROCESSING_TIME,
            PREFIX + "trigger.interval": format_duration(cfg.land.interval),
            LAND_SOURCES: ",".join(i.source for i in items),
        }
    )
    for item in items:
        conf.update(source_conf(item.source, item.kafka, item.kafka.name))
        key = f"{PREFIX}source.{item.source}."
        conf[key + "ingestion_column"] = item.iceberg.ingestion_column
        conf[key + "starting_offsets"] = cfg.land.starting_offsets
        sink = f"{PREFIX}sink.{item.source}."
        conf[sink + "catalog"] = item.iceberg.catalog
        conf[sink + "table"] = item.iceberg.table
        conf[sink + "time_column"] = item.iceberg.ingestion_column
        conf[sink + "write_table"] = item.iceberg.table
    return conf


def selected(names: str | None) -> list[str]:
    """``--sources a,b`` -> ``['a', 'b']`` (empty: every landable source)."""
    return [n.strip() for n in (names or "").split(",") if n.strip()]


def describe(items: Sequence[Landing]) -> str:
    """One line per landing, for the command's output."""
    return "\n".join(
        f"  {i.source}: kafka {i.kafka.topics} @ {i.kafka.bootstrap_servers} -> {i.iceberg.table}" for i in items
    )
