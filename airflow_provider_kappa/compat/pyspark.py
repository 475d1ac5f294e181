"""pyspark's private names kappa relies on: the one module that names them.

- ``SparkFiles._is_running_on_worker`` and ``SparkFiles._sc``: whether ``SparkFiles`` can answer in
  this process. ``SparkFiles.get`` and ``getRootDirectory`` are public, but they need a SparkContext
  (a classic driver) or a Python worker's files folder (an executor), and pyspark has no public test
  for either: ``getRootDirectory`` fails on an ``assert`` elsewhere (a Spark Connect client, a plain
  process). ``TaskContext.get()`` and ``SparkSession.getActiveSession()`` do not serve: a Python
  planning process of a data source has its files folder but no task, and a Connect session has no
  SparkContext.
- :data:`WORKER_MODULES`: the modules of pyspark that Spark runs as ``python -m MODULE`` for a query's
  Python (the daemon, its workers, a Python data source's planning, reads, writes and commits). The
  warm daemon (:mod:`airflow_provider_kappa.spark.warm_daemon`) imports them once, before it forks;
  only ``pyspark.daemon`` is public (``spark.python.daemon.module``'s default). A name missing from a
  release only makes the processes that run it start cold.

And the Python streaming source API, which differs between the supported releases
(:func:`streaming_source_api`):

- pyspark 4.2 and later have ``pyspark.sql.streaming.datasource`` (``ReadLimit`` and its kinds,
  ``SupportsTriggerAvailableNow``) and call ``DataSourceStreamReader.latestOffset(start, limit)``,
  ``getDefaultReadLimit()`` and ``prepareForTriggerAvailableNow()``.
- pyspark 4.0 and 4.1 have none of them: Spark calls ``latestOffset()`` with no argument, on every
  trigger, and a Python source under ``Trigger.AvailableNow`` is wrapped so that the whole query is
  ONE micro-batch (``AvailableNowDataStreamWrapper`` fetches one latest offset). kappa then runs such
  queries on the default trigger and stops them once drained (:mod:`airflow_provider_kappa.spark.resolve`);
  the reader keeps its own start offset (:mod:`airflow_provider_kappa.spark.source.reader`). Stand-ins
  of the missing names are defined here (pure Python, what 4.2 defines).
- ``DataSourceStreamArrowWriter`` (a streaming writer fed Arrow record batches) is new in 4.1; 4.0 feeds
  record batches to a streaming writer that is also a ``DataSourceArrowWriter`` (:func:`stream_arrow_writer`).
- ``pyspark.sql.pandas.types.to_arrow_schema`` takes ``timezone=`` from 4.2 on, ``timestamp_utc=`` before
  (:func:`arrow_schema`).

``tests/unit/test_compat_pyspark.py`` checks them against the installed pyspark. pyspark is imported
inside the functions: this module loads in Spark's Python workers and in the warm daemon's stub.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

#: pyspark's modules a Spark Connect server runs for a query's Python processes (see the module doc)
WORKER_MODULES = (
    "pyspark.daemon",
    "pyspark.worker",
    "pyspark.sql.worker.create_data_source",
    "pyspark.sql.worker.lookup_data_sources",
    "pyspark.sql.worker.plan_data_source_read",
    "pyspark.sql.worker.write_into_data_source",
    "pyspark.sql.worker.commit_data_source_write",
    "pyspark.sql.worker.python_streaming_sink_runner",
    "pyspark.sql.streaming.python_streaming_source_runner",
)


def spark_files_root() -> str | None:
    """The folder of the files shipped with the application (``spark.files``) in this process, when
    ``SparkFiles`` knows one: a Python worker's (an executor, a data source's planning process) or a
    classic driver's, from its SparkContext; ``None`` elsewhere (a Spark Connect client, a plain process)."""
    from pyspark import SparkFiles

    if SparkFiles._is_running_on_worker or SparkFiles._sc is not None:
        return SparkFiles.getRootDirectory()
    return None


# --------------------------------------------------------------------------- streaming source API


class ReadLimit:
    """Stand-in of pyspark 4.2's ``ReadLimit`` where pyspark lacks it (4.0, 4.1)."""


@dataclass
class ReadAllAvailable(ReadLimit):
    """Stand-in of pyspark 4.2's ``ReadAllAvailable``."""


@dataclass
class ReadMaxRows(ReadLimit):
    """Stand-in of pyspark 4.2's ``ReadMaxRows``."""

    max_rows: int


@dataclass
class ReadMaxFiles(ReadLimit):
    """Stand-in of pyspark 4.2's ``ReadMaxFiles``."""

    max_files: int


@dataclass
class ReadMaxBytes(ReadLimit):
    """Stand-in of pyspark 4.2's ``ReadMaxBytes``."""

    max_bytes: int


class SupportsTriggerAvailableNow:
    """Stand-in of pyspark 4.2's mixin: Spark never calls it where pyspark lacks the real one."""

    def prepareForTriggerAvailableNow(self) -> None:
        """Nothing by default (the reader overrides it)."""


@dataclass(frozen=True)
class StreamingSourceAPI:
    """The names of the Python streaming source API kappa's reader uses, from the installed pyspark
    or the stand-ins above, and whether Spark passes offsets and read limits to ``latestOffset`` and
    honours ``Trigger.AvailableNow`` for a Python source (``admission_control``)."""

    admission_control: bool
    ReadLimit: type
    ReadAllAvailable: type
    ReadMaxRows: type
    ReadMaxFiles: type
    ReadMaxBytes: type
    SupportsTriggerAvailableNow: type


@functools.cache
def streaming_source_api() -> StreamingSourceAPI:
    """The installed pyspark's streaming source API (see the module docstring): its own names when
    ``pyspark.sql.streaming.datasource`` exists (4.2+), else the stand-ins with ``admission_control`` false."""
    try:
        from pyspark.sql.streaming import datasource as api
    except ImportError:
        return StreamingSourceAPI(
            False, ReadLimit, ReadAllAvailable, ReadMaxRows, ReadMaxFiles, ReadMaxBytes, SupportsTriggerAvailableNow
        )
    return StreamingSourceAPI(
        True,
        api.ReadLimit,
        api.ReadAllAvailable,
        api.ReadMaxRows,
        api.ReadMaxFiles,
        api.ReadMaxBytes,
        api.SupportsTriggerAvailableNow,
    )


def arrow_schema(schema: object) -> object:
    """The Arrow schema of a Spark ``StructType``, timestamps in UTC (``timestamp[us, tz=UTC]``): pyspark's
    ``to_arrow_schema(schema, timezone="UTC")`` (4.2+), ``to_arrow_schema(schema, timestamp_utc=True)``
    before (4.0, 4.1)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    if "timezone" in inspect.signature(to_arrow_schema).parameters:
        return to_arrow_schema(schema, timezone="UTC")  # type: ignore[arg-type]
    return to_arrow_schema(schema, timestamp_utc=True)  # type: ignore[arg-type,call-arg]


@functools.cache
def stream_arrow_writer() -> type:
    """The base class of a streaming writer whose ``write`` gets Arrow record batches: pyspark's
    ``DataSourceStreamArrowWriter`` (4.1+); on 4.0 a ``DataSourceStreamWriter`` that is also a
    ``DataSourceArrowWriter`` (4.0's ``write_into_data_source`` worker checks the latter for streams too)."""
    from pyspark.sql import datasource

    if hasattr(datasource, "DataSourceStreamArrowWriter"):
        return datasource.DataSourceStreamArrowWriter  # type: ignore[no-any-return]

    class DataSourceStreamArrowWriter(datasource.DataSourceStreamWriter, datasource.DataSourceArrowWriter):
        """pyspark 4.0: a streaming writer fed Arrow record batches."""

    return DataSourceStreamArrowWriter
