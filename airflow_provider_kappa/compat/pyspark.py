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

``tests/unit/test_compat_pyspark.py`` checks them against the installed pyspark. pyspark is imported
inside the functions: this module loads in Spark's Python workers and in the warm daemon's stub.
"""

from __future__ import annotations

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
