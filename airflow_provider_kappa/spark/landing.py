"""The landing application of ``kappa land``: Kafka topics -> the Iceberg tables a backfill reads.

Run by spark-submit like a job (``python <this file>``), from the ``spark.kappa.*`` conf that
:func:`airflow_provider_kappa.engine.landing.land_conf` writes: for every source named in
``spark.kappa.land.sources``, one streaming query reads its Kafka topics with Spark's Kafka source
and appends through the ``kappa_iceberg`` sink (exactly once: one Iceberg append per micro-batch,
stamped with the writer id and batch id, a replayed batch skipped) to the sink of the same name.
Each landed row holds the fields of the JSON ``value`` parsed by the source's ``schema``, the
ingestion column (the Kafka record's timestamp), and ``kafka_topic``, ``kafka_partition``,
``kafka_offset``. One micro-batch per ``spark.kappa.trigger.interval`` (``land.interval``), or
``availableNow``. The query's checkpoint is ``<spark.kappa.checkpoint>/<source>``: a restart lands
from where the last committed batch ended.
"""

from __future__ import annotations

import logging

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from airflow_provider_kappa.exceptions import KappaConfigError
from airflow_provider_kappa.spark.conf_keys import KAFKA_COLUMNS, LAND_SOURCES
from airflow_provider_kappa.spark.resolve import kafka_source_options, settings_of, write_sink
from airflow_provider_kappa.spark.settings import KafkaSourceSettings

log = logging.getLogger(__name__)


def landed_frame(spark: SparkSession, src: KafkaSourceSettings) -> DataFrame:
    """The landed rows of Kafka source ``src``: its value's fields, the ingestion column, topic,
    partition and offset.

    :param spark: the session.
    :param src: a kafka source with ``schema`` and ``ingestion_column``.
    :raises KappaConfigError: no schema or ingestion column, or no Kafka connector on the classpath.
    """
    if not src.schema or not src.ingestion_column:
        raise KappaConfigError(
            f"kappa land: source {src.name!r} needs a schema and an ingestion column "
            f"(got schema={src.schema!r}, ingestion_column={src.ingestion_column!r})"
        )
    try:
        records = spark.readStream.format("kafka").options(**kafka_source_options(src)).load()
    except Exception as e:
        if "kafka" in str(e).lower() and "find" in str(e).lower():
            raise KappaConfigError(
                "kappa land: this Spark has no Kafka connector (org.apache.spark:spark-sql-kafka-0-10): "
                "kappa land puts it on spark.jars.packages (Spark resolves it through Ivy; `kappa jars` fills that cache)"
            ) from e
        raise
    topic, partition, offset = KAFKA_COLUMNS
    return records.select(
        F.from_json(F.col("value").cast("string"), src.schema).alias("v"),
        F.col("timestamp").alias(src.ingestion_column),
        F.col("topic").alias(topic),
        F.col("partition").alias(partition),
        F.col("offset").alias(offset),
    ).select("v.*", src.ingestion_column, topic, partition, offset)


def start(spark: SparkSession) -> list[StreamingQuery]:
    """Start one landing query per source of ``spark.kappa.land.sources``."""
    conf = {k: v for k, v in spark.sparkContext.getConf().getAll()}
    names = [n for n in (spark.conf.get(LAND_SOURCES, None) or conf.get(LAND_SOURCES, "")).split(",") if n]
    if not names:
        raise KappaConfigError(f"{LAND_SOURCES}: missing from the Spark conf; run the landing with `kappa land`")
    settings = settings_of(spark)
    queries = []
    for name in names:
        src = settings.source(name)
        if not isinstance(src, KafkaSourceSettings):
            raise KappaConfigError(f"kappa land: source {name!r} is of type iceberg in the Spark conf; expected kafka")
        queries.append(write_sink(landed_frame(spark, src), name))
    return queries


def run(spark: SparkSession) -> None:
    """Land until every query ends (``availableNow``) or one fails or is stopped; a failure stops the others."""
    queries = start(spark)
    try:
        while any(q.isActive for q in queries):
            spark.streams.awaitAnyTermination()
            spark.streams.resetTerminated()
            for q in queries:
                if not q.isActive and q.exception() is not None:
                    raise RuntimeError(f"landing query {q.name} failed: {q.exception()}")
    finally:
        for q in queries:
            if q.isActive:
                q.stop()


if __name__ == "__main__":
    run(SparkSession.builder.getOrCreate())
