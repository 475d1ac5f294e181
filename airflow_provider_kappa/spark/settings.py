"""The ``spark.kappa.*`` Spark conf: the one contract between launchers and the job.

A launcher (``kappa run``/``kappa backfill``, the Airflow slice operator, or any
spark-submit) writes these keys; :func:`read_source` and :func:`write_sink` read them
back through :func:`load_settings`. Pure Python: no pyspark import here. An iceberg source's
keys are read and written by :class:`~airflow_provider_kappa.spark.source.options.IcebergReadSpec`.

Keys (``<src>`` is the name the job passes to ``read_source``, ``<sink>`` to ``write_sink``)::

    spark.kappa.mode                      live | backfill
    spark.kappa.job                       job name
    spark.kappa.checkpoint                checkpoint folder of this run; a sink's query uses <it>/<sink>
    spark.kappa.trigger                   availableNow | processingTime
    spark.kappa.trigger.interval          processing-time interval (live), e.g. 10s
    spark.kappa.catalogs.file             JSON file {catalog: {pyiceberg props}}: credentials live here only
    spark.kappa.catalog.<cat>.<prop>      inline, non-secret pyiceberg properties (merged under the file)
    spark.kappa.read.start / .read.end    backfill read range in ingestion time (ISO-8601)
    spark.kappa.max_misalignment_threshold  ingestion time one micro-batch may advance (e.g. 900s)
    spark.kappa.source.<src>.type         iceberg | kafka
    spark.kappa.source.<src>.candidate    the concrete source chosen for <src>
    spark.kappa.source.<src>.catalog / .table / .ingestion_column / .snapshot_id   (iceberg)
    spark.kappa.source.<src>.plan_file    the launcher's file list of the source for this slice's read
                                          range (backfill; see spark/source/file_list.py)
    spark.kappa.source.<src>.topics / .bootstrap_servers / .schema / .starting_offsets
    spark.kappa.source.<src>.option.<k>   extra source options (Kafka source options; kappa_iceberg
                                          reader options such as max_files_per_batch, which never
                                          override the ones read_source computes)
    spark.kappa.sink.<sink>.catalog / .table / .time_column     the target table
    spark.kappa.sink.<sink>.write_table   table the query writes (staging in a backfill)
    spark.kappa.sink.<sink>.owns.start / .owns.end   time_column range this run owns (backfill)
    spark.kappa.sink.<sink>.slice         slice id stamped on staged commits (backfill)
    spark.kappa.backfill.id               backfill id (backfill)
    spark.kappa.ledger                    the live ledger's folder; a sink's ledger is <it>/<sink>: live, the
                                          sink records each micro-batch's Kafka offsets there; a backfill's
                                          iceberg sources replay those micro-batches (spark/ledger.py)
    spark.kappa.epoch                     the slice attempt's epoch (backfill): the writer commits only to
                                          a staging table created for that epoch (docs/sink.md, fencing)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from pathlib import Path

from airflow_provider_kappa.compat.pyspark import spark_files_root
from airflow_provider_kappa.exceptions import KappaConfigError
from airflow_provider_kappa.spark.conf_keys import AVAILABLE_NOW as AVAILABLE_NOW
from airflow_provider_kappa.spark.conf_keys import BACKFILL as BACKFILL
from airflow_provider_kappa.spark.conf_keys import LIVE as LIVE
from airflow_provider_kappa.spark.conf_keys import PREFIX as PREFIX
from airflow_provider_kappa.spark.conf_keys import PROCESSING_TIME as PROCESSING_TIME
from airflow_provider_kappa.spark.source.options import IcebergReadSpec
from airflow_provider_kappa.timeparse import parse_duration, parse_timestamp


@dataclass(frozen=True)
class IcebergSourceSettings(IcebergReadSpec):
    """A source of the run read by ``kappa_iceberg``: its name, the concrete source chosen for
    it, and its read (bounded at a pinned snapshot or tailing)."""

    name: str = field(kw_only=True)
    candidate: str = field(kw_only=True)

    @staticmethod
    def from_conf(name: str, conf: Mapping[str, str]) -> IcebergSourceSettings:
        """Iceberg source ``name`` of a run's ``spark.kappa.*`` conf (see :meth:`IcebergReadSpec.from_conf`)."""
        spec = IcebergReadSpec.from_conf(name, conf)
        candidate = conf.get(f"{PREFIX}source.{name}.candidate") or name
        read = {f.name: getattr(spec, f.name) for f in fields(IcebergReadSpec)}
        return IcebergSourceSettings(**read, name=name, candidate=candidate)


@dataclass(frozen=True)
class KafkaSourceSettings:
    """A read through Spark's built-in Kafka source."""

    name: str
    candidate: str
    topics: str
    bootstrap_servers: str
    schema: str | None = None
    ingestion_column: str | None = None
    starting_offsets: str = "latest"
    options: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SinkSettings:
    """Where ``write_sink`` writes and which rows it keeps."""

    name: str
    catalog: str
    table: str
    time_column: str
    write_table: str
    owns_start: datetime | None = None
    owns_end: datetime | None = None
    slice_id: str | None = None


@dataclass(frozen=True)
class RunSettings:
    """Everything one Spark application run needs, decoded from ``spark.kappa.*``."""

    mode: str
    job: str
    checkpoint: str
    trigger: str
    trigger_interval: timedelta
    catalogs: Mapping[str, Mapping[str, str]]  # inline properties only; secrets are in catalogs_file
    sources: Mapping[str, IcebergSourceSettings | KafkaSourceSettings]
    sinks: Mapping[str, SinkSettings]
    read_start: datetime | None = None
    read_end: datetime | None = None
    backfill_id: str | None = None
    catalogs_file: str | None = None
    epoch: str | None = None
    ledger: str | None = None

    def source(self, name: str) -> IcebergSourceSettings | KafkaSourceSettings:
        """The settings of source ``name`` or a clear error listing what is configured."""
        if name not in self.sources:
            raise KappaConfigError(
                f"read_source: source {name!r} is not in the Spark conf ({PREFIX}source.{name}.*); "
                f"configured: {sorted(self.sources)}"
            )
        return self.sources[name]

    def sink(self, name: str) -> SinkSettings:
        """The settings of sink ``name`` or a clear error listing what is configured."""
        if name not in self.sinks:
            raise KappaConfigError(
                f"write_sink: sink {name!r} is not in the Spark conf ({PREFIX}sink.{name}.*); "
                f"configured: {sorted(self.sinks)}"
            )
        return self.sinks[name]

    def aligned_sources(self) -> list[IcebergSourceSettings]:
        """Every iceberg source of the run, in name order: they share one admission grid."""
        return [s for _, s in sorted(self.sources.items()) if isinstance(s, IcebergSourceSettings)]


def load_settings(conf: Mapping[str, str] | Callable[[], Mapping[str, str]]) -> RunSettings:
    """Decode ``spark.kappa.*`` keys into :class:`RunSettings`.

    :param conf: all Spark conf entries (key -> value), or a callable returning them.
    :raises KappaConfigError: for missing or malformed keys, naming the key.
    """
    entries = conf() if callable(conf) else conf
    kv = {k[len(PREFIX) :]: v for k, v in entries.items() if k.startswith(PREFIX)}
    if not kv:
        raise KappaConfigError(
            f"no {PREFIX}* keys in the Spark conf: launch the job with `kappa run`/`kappa backfill`, "
            "the Airflow operators, or pass the keys with --conf / --properties-file"
        )

    def get(key: str, default: str | None = None) -> str:
        value = kv.get(key, default)
        if value is None or value == "":
            raise KappaConfigError(f"{PREFIX}{key}: missing from the Spark conf")
        return value

    mode = get("mode")
    if mode not in (LIVE, BACKFILL):
        raise KappaConfigError(f"{PREFIX}mode: {mode!r}; allowed: ['live', 'backfill']")
    trigger = get("trigger", AVAILABLE_NOW if mode == BACKFILL else PROCESSING_TIME)
    if trigger not in (AVAILABLE_NOW, PROCESSING_TIME):
        raise KappaConfigError(f"{PREFIX}trigger: {trigger!r}; allowed: ['availableNow', 'processingTime']")
    sources = {name: _source(name, keys, entries) for name, keys in _grouped(kv, "source.").items()}
    sinks = {name: _sink(name, keys) for name, keys in _grouped(kv, "sink.").items()}
    read_start, read_end = _read_range(kv, mode)
    return RunSettings(
        mode=mode,
        job=get("job"),
        checkpoint=get("checkpoint"),
        trigger=trigger,
        trigger_interval=parse_duration(kv.get("trigger.interval", "10s"), f"{PREFIX}trigger.interval"),
        catalogs=_grouped(kv, "catalog."),
        sources=sources,
        sinks=sinks,
        read_start=read_start,
        read_end=read_end,
        backfill_id=kv.get("backfill.id"),
        catalogs_file=kv.get("catalogs.file"),
        epoch=kv.get("epoch") or None,
        ledger=kv.get("ledger") or None,
    )


def _grouped(kv: Mapping[str, str], prefix: str) -> dict[str, dict[str, str]]:
    """The keys under ``prefix`` by the name after it: ``{name: {rest of the key: value}}``."""
    out: dict[str, dict[str, str]] = {}
    for key, value in kv.items():
        if key.startswith(prefix):
            name, _, rest = key[len(prefix) :].partition(".")
            out.setdefault(name, {})[rest] = value
    return out


def _source(
    name: str, keys: Mapping[str, str], entries: Mapping[str, str]
) -> IcebergSourceSettings | KafkaSourceSettings:
    """Source ``name`` from its keys (``spark.kappa.source.<name>.`` removed); an iceberg source
    reads the whole conf (:meth:`IcebergReadSpec.from_conf`: the run's range and its aligned sources)."""
    where = f"{PREFIX}source.{name}"
    stype = keys.get("type")
    if stype == "iceberg":
        return IcebergSourceSettings.from_conf(name, entries)
    if stype != "kafka":
        raise KappaConfigError(f"{where}.type: {stype!r}; allowed: ['iceberg', 'kafka']")
    for req in ("topics", "bootstrap_servers"):
        if not keys.get(req):
            raise KappaConfigError(f"{where}.{req}: missing from the Spark conf")
    return KafkaSourceSettings(
        name=name,
        candidate=keys.get("candidate", name),
        topics=keys["topics"],
        bootstrap_servers=keys["bootstrap_servers"],
        schema=keys.get("schema"),
        ingestion_column=keys.get("ingestion_column"),
        starting_offsets=keys.get("starting_offsets", "latest"),
        options={k[len("option.") :]: v for k, v in keys.items() if k.startswith("option.")},
    )


def _sink(name: str, keys: Mapping[str, str]) -> SinkSettings:
    """Sink ``name`` from its keys (``spark.kappa.sink.<name>.`` removed)."""
    where = f"{PREFIX}sink.{name}"
    for req in ("catalog", "table", "time_column"):
        if not keys.get(req):
            raise KappaConfigError(f"{where}.{req}: missing from the Spark conf")
    return SinkSettings(
        name=name,
        catalog=keys["catalog"],
        table=keys["table"],
        time_column=keys["time_column"],
        write_table=keys.get("write_table", keys["table"]),
        owns_start=parse_timestamp(keys["owns.start"], f"{where}.owns.start") if "owns.start" in keys else None,
        owns_end=parse_timestamp(keys["owns.end"], f"{where}.owns.end") if "owns.end" in keys else None,
        slice_id=keys.get("slice"),
    )


def _read_range(kv: Mapping[str, str], mode: str) -> tuple[datetime | None, datetime | None]:
    """``read.start`` and ``read.end`` (both required in a backfill, the end after the start)."""
    read_start = parse_timestamp(kv["read.start"], f"{PREFIX}read.start") if "read.start" in kv else None
    read_end = parse_timestamp(kv["read.end"], f"{PREFIX}read.end") if "read.end" in kv else None
    if mode == BACKFILL and (read_start is None or read_end is None):
        raise KappaConfigError(f"{PREFIX}read.start and {PREFIX}read.end are required when mode is 'backfill'")
    if read_start is not None and read_end is not None and read_end <= read_start:
        raise KappaConfigError(f"{PREFIX}read.end: {kv['read.end']!r} must be after read.start {kv['read.start']!r}")
    return read_start, read_end


def _local_or_shipped(path: str) -> Path:
    """``path`` when it exists here, else its copy shipped with the application: in this Spark
    process's ``SparkFiles`` folder (``spark.files``: standalone, Kubernetes, local), else in the
    working directory (YARN localizes ``spark.files`` into each container's)."""
    local = Path(path)
    if local.exists():
        return local
    root = spark_files_root()
    if root is not None:
        shipped = Path(root).absolute() / local.name
        if shipped.exists():
            return shipped
    in_cwd = Path.cwd() / local.name
    return in_cwd if in_cwd.exists() else local


def read_catalogs_file(path: str) -> dict[str, dict[str, str]]:
    """Read the catalogs file a launcher wrote (JSON ``{catalog: {prop: value}}``).

    :param path: the file named by ``spark.kappa.catalogs.file``; where that path is not this machine's
        (a driver or executor on a cluster), the copy shipped with the application in ``spark.files``
        (``SparkFiles``, :mod:`airflow_provider_kappa.engine.submit_args`).
    """
    try:
        data = json.loads(_local_or_shipped(path).read_text())
    except (OSError, ValueError) as e:
        raise KappaConfigError(f"{PREFIX}catalogs.file: {path!r} cannot be read as JSON: {e}") from e
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise KappaConfigError(f"{PREFIX}catalogs.file: {path!r} must hold {{catalog: {{property: value}}}}")
    return {str(c): {str(k): str(v) for k, v in props.items()} for c, props in data.items()}
