"""The ``kappa_iceberg`` streaming reader, by concern (this package imports nothing itself).

Pure Python (no pyspark; the launcher imports these):

- :mod:`.options`     :class:`~.options.IcebergReadSpec`: one iceberg read, to and from the
  ``spark.kappa.*`` conf and the reader options
- :mod:`.file_index`  :class:`~.file_index.FileSpan` (a data file and its ingestion bounds) and
  :class:`~.file_index.SpanIndex`
- :mod:`.grid`        the admission grid: :class:`~.grid.Presence`, batch ends
- :mod:`.snapshots`   snapshot and ingestion-column checks, the snapshots a tailing read follows (pyiceberg)
- :mod:`.manifests`   a snapshot's data files by ingestion bounds, from manifest statistics (pyiceberg)
- :mod:`.file_list`   the launcher's per-slice file list of a source (JSON file, option ``plan_file``)

Spark side:

- :mod:`.schema`      Iceberg -> Spark types, the job's schema check, trimmed table metadata
- :mod:`.tables`      catalog access of a reader, the stream's schema (``DataSource.schema()``)
- :mod:`.partitions`  what an executor gets: :class:`~.partitions.ReadContext`, :class:`~.partitions.FilePartition`
- :mod:`.read`        the executors' two read paths (direct Parquet, pyiceberg ``ArrowScan``)
- :mod:`.offsets`     offsets and read limits
- :mod:`.bounded`, :mod:`.tail`   the driver-side state of the two modes
- :mod:`.replay`      the driver-side state of a bounded read replaying the live ledger (option ``ledger``)
- :mod:`.reader`      :class:`~.reader.KappaIcebergStreamReader`
"""
