"""The Spark half of airflow-provider-kappa: what the unchanged streaming job imports.

``read_source`` and ``write_sink`` are the only place that chooses live vs backfill;
they read everything from the ``spark.kappa.*`` Spark conf (see :mod:`.settings`).
This package never imports Airflow; pyspark is imported only when they are called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = ["read_source", "write_sink"]


def read_source(spark: SparkSession, name: str) -> DataFrame:
    """A streaming DataFrame of source ``name``, live or backfill as the Spark conf says.

    :param spark: the active SparkSession.
    :param name: a source name of the job's kappa.yaml (for example ``"playbacks"``).
    """
    from airflow_provider_kappa.spark.resolve import read_source as _read

    return _read(spark, name)


def write_sink(df: DataFrame, name: str) -> StreamingQuery:
    """Start the streaming query writing ``df`` to sink ``name``; return it started.

    :param df: the job's streaming output.
    :param name: a sink name of the job's kappa.yaml (for example ``"summary"``).
    """
    from airflow_provider_kappa.spark.resolve import write_sink as _write

    return _write(df, name)
