"""Resolution of sources and sinks from ``spark.kappa.*``: the only live-vs-backfill switch."""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import threading

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.streaming.readwriter import DataStreamWriter

from airflow_provider_kappa.compat.pyspark import streaming_source_api
from airflow_provider_kappa.exceptions import KappaConfigError
from airflow_provider_kappa.spark.datasource import SHORT_NAME, KappaIcebergDataSource
from airflow_provider_kappa.spark.ledger import sink_ledger
from airflow_provider_kappa.spark.ledger_stats import LedgerStats, observe_kafka
from airflow_provider_kappa.spark.settings import (
    AVAILABLE_NOW,
    LIVE,
    PREFIX,
    IcebergSourceSettings,
    KafkaSourceSettings,
    RunSettings,
    SinkSettings,
    load_settings,
)
from airflow_provider_kappa.spark.source.options import AVAILABLE_NOW_OPTION
from airflow_provider_kappa.timeparse import to_micros

log = logging.getLogger(__name__)


def settings_of(spark: SparkSession) -> RunSettings:
    """Decode this session's ``spark.kappa.*`` conf: a classic session's context conf (spark-submit's)
    under its runtime conf; a Spark Connect session (no ``sparkContext``) has only the runtime conf,
    where the Connect runner (:mod:`airflow_provider_kappa.engine.connect_runner`) sets the keys."""
    runtime = {k: v for k, v in spark.conf.getAll.items() if k.startswith(PREFIX)}
    if is_connect(spark):
        return load_settings(runtime)
    return load_settings(dict(spark.sparkContext.getConf().getAll()) | runtime)


def is_connect(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect client session (``pyspark.sql.connect``)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def _register(spark: SparkSession) -> None:
    spark.dataSource.register(KappaIcebergDataSource)


def catalog_options(settings: RunSettings, catalog: str) -> dict[str, str]:
    """Reader/writer options that locate catalog ``catalog``: its inline (non-secret)
    properties and the path of the catalogs file, never the file's contents."""
    opts = {"catalog_properties": json.dumps(dict(settings.catalogs.get(catalog, {})))}
    if settings.catalogs_file:
        opts["catalogs_file"] = settings.catalogs_file
    return opts


def iceberg_source_options(settings: RunSettings, src: IcebergSourceSettings) -> dict[str, str]:
    """Options of the ``kappa_iceberg`` reader for ``src`` under ``settings``: its read
    (:meth:`~airflow_provider_kappa.spark.source.options.IcebergReadSpec.to_options`) and where
    its catalog is.

    Credentials are never put in options: the reader gets the catalogs file's path
    (see :func:`catalog_options`), so they stay out of Spark query plans and logs.
    """
    opts = {**src.to_options(), **catalog_options(settings, src.catalog)}
    if drains_instead_of_available_now(settings):
        opts[AVAILABLE_NOW_OPTION] = "true"  # the reader prepares for availableNow itself
    return opts


def drains_instead_of_available_now(settings: RunSettings) -> bool:
    """Whether this run's ``availableNow`` queries run on the default trigger and are stopped once drained
    (:func:`stop_when_drained`): where pyspark's Python sources have no availableNow (4.0, 4.1; Spark
    would read all they hold as ONE micro-batch) and the run reads a ``kappa_iceberg`` source. Kafka-only
    runs (``kappa land --available-now``) keep Spark's own availableNow, which Kafka's connector has."""
    return (
        settings.trigger == AVAILABLE_NOW
        and not streaming_source_api().admission_control
        and any(isinstance(s, IcebergSourceSettings) for s in settings.sources.values())
    )


def stop_when_drained(query: StreamingQuery) -> threading.Thread:
    """Stop ``query`` once a trigger finds nothing to run: no source has new data and no no-data
    micro-batch is due (``processAllAvailable`` returns then; Spark's availableNow ends the query at that
    same point). A query that failed or was stopped meanwhile is left as it is (``awaitTermination``
    reports it). Runs in a daemon thread of the driver (a Spark Connect client's, too)."""

    def drain() -> None:
        try:
            query.processAllAvailable()
        except Exception as e:  # the query failed: its own awaitTermination raises it to the job
            log.debug("kappa: query %s ended before it drained: %s", query.name, e)
            return
        if query.isActive:
            log.info("kappa: query %s read all its sources hold; stopping it (availableNow)", query.name)
            query.stop()

    thread = threading.Thread(target=drain, name=f"kappa-drain-{query.name}", daemon=True)
    thread.start()
    return thread


def kafka_source_options(src: KafkaSourceSettings) -> dict[str, str]:
    """Options of Spark's built-in Kafka source for ``src`` (needs ``spark-sql-kafka-0-10``)."""
    opts = {
        "kafka.bootstrap.servers": src.bootstrap_servers,
        "subscribe": src.topics,
        "startingOffsets": src.starting_offsets,
    }
    opts.update(src.options)
    return opts


def read_source(spark: SparkSession, name: str) -> DataFrame:
    """See :func:`airflow_provider_kappa.spark.read_source`."""
    settings = settings_of(spark)
    src = settings.source(name)
    if isinstance(src, IcebergSourceSettings):
        _register(spark)
        return spark.readStream.format(SHORT_NAME).options(**iceberg_source_options(settings, src)).load()
    try:
        df = spark.readStream.format("kafka").options(**kafka_source_options(src)).load()
    except Exception as e:
        if "kafka" in str(e).lower() and "find" in str(e).lower():
            raise KappaConfigError(
                f"source {name!r} (candidate {src.candidate!r}) is type 'kafka', but this Spark has no Kafka "
                "connector: add the org.apache.spark:spark-sql-kafka-0-10 package matching your Spark version "
                "(spark.jars.packages), or select an iceberg candidate"
            ) from e
        raise
    if records_stats(spark, settings):
        df = observe_kafka(df, name)  # each batch's record times and counts, for its ledger entry
    return parse_kafka_value(df, src)


def records_stats(spark: SparkSession, settings: RunSettings) -> bool:
    """Whether a live query records its batches' statistics in the ledger (:mod:`~airflow_provider_kappa.spark.ledger_stats`):
    live with a ledger, on a classic session (kappa registers no listener with Spark Connect)."""
    return settings.mode == LIVE and settings.ledger is not None and not is_connect(spark)


def parse_kafka_value(df: DataFrame, src: KafkaSourceSettings) -> DataFrame:
    """Turn Kafka records into the landed-table columns: JSON ``value`` by ``schema``,
    Kafka's ``timestamp`` as the ingestion column. Without a schema, the raw records."""
    if not src.schema:
        return df
    cols = [F.from_json(F.col("value").cast("string"), src.schema).alias("v")]
    if src.ingestion_column:
        cols.append(F.col("timestamp").alias(src.ingestion_column))
    parsed = df.select(*cols)
    return parsed.select("v.*", *([src.ingestion_column] if src.ingestion_column else []))


def sink_writer_options(settings: RunSettings, sink: SinkSettings) -> dict[str, str]:
    """Options of the ``kappa_iceberg`` writer for ``sink``."""
    opts = {
        "catalog": sink.catalog,
        "table": sink.write_table,
        "target_table": sink.table,
        "time_column": sink.time_column,
        "mode": settings.mode,
        **catalog_options(settings, sink.catalog),
    }
    if sink.slice_id is not None:
        opts["slice"] = sink.slice_id
    if sink.owns_start is not None:
        opts["owns_start_micros"] = str(to_micros(sink.owns_start))
    if sink.owns_end is not None:
        opts["owns_end_micros"] = str(to_micros(sink.owns_end))
    if settings.backfill_id is not None:
        opts["backfill_id"] = settings.backfill_id
    if settings.epoch is not None:
        opts["epoch"] = settings.epoch
    if settings.ledger is not None and settings.mode == LIVE:
        opts["ledger"] = sink_ledger(settings.ledger, sink.name)  # live: record the batches (spark/ledger.py)
    digest = hashlib.sha1(settings.checkpoint.encode()).hexdigest()[:12]
    opts["writer_id"] = f"{settings.job}/{sink.name}/{digest}"
    return opts


def write_sink(df: DataFrame, name: str) -> StreamingQuery:
    """See :func:`airflow_provider_kappa.spark.write_sink`."""
    spark = df.sparkSession
    settings = settings_of(spark)
    sink = settings.sink(name)
    _register(spark)
    query_name = f"kappa_{settings.job}_{name}".replace("-", "_")
    writer = (
        df.writeStream.format(SHORT_NAME)
        .options(**sink_writer_options(settings, sink))
        .outputMode("append")
        .queryName(query_name)
        .option("checkpointLocation", f"{settings.checkpoint.rstrip('/')}/{name}")
    )
    if settings.mode == LIVE and not is_connect(spark) and id(spark) not in _PROGRESS_PRINTED:
        _PROGRESS_PRINTED.add(id(spark))
        spark.streams.addListener(LiveProgress())
    if records_stats(spark, settings):
        assert settings.ledger is not None
        if id(spark) not in _LEDGER_STATS:
            _LEDGER_STATS[id(spark)] = LedgerStats()
            spark.streams.addListener(_LEDGER_STATS[id(spark)])
        checkpoint = f"{settings.checkpoint.rstrip('/')}/{name}"
        _LEDGER_STATS[id(spark)].watch(query_name, checkpoint, sink_ledger(settings.ledger, name))
        query = _start(writer, settings)
        atexit.register(_LEDGER_STATS[id(spark)].flush, query)  # before pyspark's own exit hooks run
        return query
    return _start(writer, settings)


def _start(writer: DataStreamWriter, settings: RunSettings) -> StreamingQuery:
    """Start the sink's query on the run's trigger."""
    if settings.trigger == AVAILABLE_NOW:
        return start_available_now(writer, drain=drains_instead_of_available_now(settings))
    return writer.trigger(processingTime=f"{settings.trigger_interval.total_seconds():g} seconds").start()


def start_available_now(writer: DataStreamWriter, *, drain: bool | None = None) -> StreamingQuery:
    """Start ``writer``'s query to read what its sources hold now, in their own micro-batches, then end:
    on ``Trigger.AvailableNow``, or, with ``drain`` (default: pyspark's Python sources have no
    availableNow, 4.0 and 4.1), on the default trigger, stopped once drained (:func:`stop_when_drained`).
    The micro-batches are the same: the ``kappa_iceberg`` reader advances one batch per trigger, and
    the no-data micro-batch a watermark asks for runs before a trigger finds nothing to do."""
    if drain is None:
        drain = not streaming_source_api().admission_control
    if not drain:
        return writer.trigger(availableNow=True).start()
    query = writer.trigger(processingTime="0 seconds").start()
    stop_when_drained(query)
    return query


#: the sessions whose live queries print their progress (one listener per session)
_PROGRESS_PRINTED: set[int] = set()
#: each session's listener adding the batches' statistics to the live ledger
_LEDGER_STATS: dict[int, LedgerStats] = {}


class LiveProgress(StreamingQueryListener):
    """``kappa run``'s own line per micro-batch, on the driver's output (Spark itself logs at WARN
    there: ``spark.log.level``, :func:`airflow_provider_kappa.engine.launch.live_conf`)."""

    def onQueryStarted(self, event: object) -> None:
        """Nothing: ``kappa run`` said it started."""

    def onQueryProgress(self, event: object) -> None:
        """One line: the query, its batch, rows read, how long it took, the watermark."""
        p = event.progress  # type: ignore[attr-defined]
        watermark = (p.eventTime or {}).get("watermark", "none")
        print(
            f"kappa run: {p.name} batch {p.batchId}: {p.numInputRows} rows in {p.batchDuration} ms, "
            f"watermark {watermark}",
            flush=True,
        )

    def onQueryIdle(self, event: object) -> None:
        """Nothing: an idle trigger reads nothing."""

    def onQueryTerminated(self, event: object) -> None:
        """Nothing: ``kappa run`` says how it stopped."""
