"""How an executor reads a ``kappa_iceberg`` partition: :func:`read_partition`.

Two paths, giving the same rows: a Parquet data file without delete files is read with
``pyarrow.parquet`` alone (:func:`read_parquet_direct`: columns by Iceberg field id, row groups
pruned by the ingestion column's statistics, the rest filtered with ``pyarrow.compute``); anything
else (position deletes, ORC/Avro, columns missing from the file, nested columns, files without
field ids) goes through pyiceberg's ``ArrowScan``, file by file. The direct path keeps pyiceberg,
pydantic and pandas out of the executors' Python workers.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from pyspark.sql.types import StructType

from airflow_provider_kappa.compat.pyspark import arrow_schema
from airflow_provider_kappa.spark.conf_keys import KAFKA_COLUMNS
from airflow_provider_kappa.spark.source.file_index import FileSpan
from airflow_provider_kappa.spark.source.manifests import range_filter
from airflow_provider_kappa.spark.source.partitions import FilePartition, ReadContext

if TYPE_CHECKING:
    import pyarrow as pa


@lru_cache(maxsize=8)
def _metadata(metadata_json: str) -> Any:
    from pyiceberg.table.metadata import TableMetadataUtil

    return TableMetadataUtil.parse_raw(metadata_json)


@lru_cache(maxsize=8)
def _file_io(items: tuple[tuple[str, str], ...], location: str) -> Any:
    from pyiceberg.io import load_file_io

    return load_file_io(dict(items), location)


def read_partition(partition: FilePartition, spark_schema: StructType) -> Iterator[pa.RecordBatch]:
    """Read one partition's files (on an executor): projected columns, rows whose ingestion
    column is in the partition's range, position deletes applied; Arrow batches typed exactly
    as ``spark_schema``.

    Parquet files without deletes whose columns are all found by field id are read directly
    with ``pyarrow.parquet`` (:func:`read_parquet_direct`: row groups pruned by the ingestion
    column's statistics, the range filter applied with ``pyarrow.compute``); anything else
    (position deletes, other formats, columns missing from the file, nested columns, files
    without field ids) goes through pyiceberg's ``ArrowScan``. Both give the same rows.

    :param partition: from :meth:`~.reader.KappaIcebergStreamReader.partitions`.
    :param spark_schema: the stream's schema.
    """
    import pyarrow as pa

    target: pa.Schema = arrow_schema(spark_schema)  # type: ignore[assignment]
    for span in partition.files:
        table = None
        if partition.context.field_ids and not span.deletes and span.file_format == "PARQUET":
            table = read_parquet_direct(span.path, partition.context, partition.start_micros, partition.end_micros)
        batches = table.to_batches() if table is not None else _read_with_pyiceberg(partition, span)
        for batch in batches:
            if partition.kafka_ranges:
                batch = batch.filter(kafka_filter(batch, partition.kafka_ranges))
            if batch.num_rows == 0:
                continue
            arrays = [batch.column(f.name).cast(f.type) for f in target]
            yield pa.RecordBatch.from_arrays(arrays, schema=target)


def kafka_filter(batch: pa.RecordBatch, ranges: tuple[tuple[str, int, int, int], ...]) -> pa.Array:
    """The mask of the rows of ``batch`` inside one of ``ranges``: ``kafka_topic == topic``,
    ``kafka_partition == partition`` and ``start <= kafka_offset < end`` (``start`` -1: no lower
    bound). Rows with a null Kafka column are outside every range.

    :param batch: rows with the ``kafka_topic``, ``kafka_partition`` and ``kafka_offset`` columns.
    :param ranges: ``(topic, partition, start, end)`` (a replayed live micro-batch, :mod:`.replay`).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    topic_col, partition_col, offset_col = (batch.column(c) for c in KAFKA_COLUMNS)
    mask = pa.array([False] * batch.num_rows, type=pa.bool_())
    for topic, part, start, end in ranges:
        inside = pc.and_(pc.equal(topic_col, topic), pc.equal(partition_col, part))
        inside = pc.and_(inside, pc.less(offset_col, end))
        if start >= 0:
            inside = pc.and_(inside, pc.greater_equal(offset_col, start))
        mask = pc.or_(mask, pc.fill_null(inside, False))
    return mask


def read_parquet_direct(
    path: str, context: ReadContext, start_micros: int | None, end_micros: int | None
) -> pa.Table | None:
    """Read one Parquet data file with ``pyarrow.parquet`` only: the context's columns found by
    their Iceberg field ids (renamed to the table's current names), row groups whose ingestion
    statistics exclude ``[start_micros, end_micros)`` skipped, the rest filtered to the range
    (rows with a null ingestion value are dropped when a bound is given).

    :param path: the data file's location.
    :param context: the read context (``field_ids`` must be set).
    :param start_micros: inclusive start of the batch range (``None``: open).
    :param end_micros: exclusive end of the batch range (``None``: open).
    :returns: the rows as a table of the projected columns, or ``None`` when the file cannot be
        read this way (a column's field id is absent, the ingestion column is not a microsecond
        timestamp): the caller then reads it with pyiceberg.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    local = _local_path(path)
    stream = None
    if local is None:
        stream = _file_io(tuple(sorted(context.io_properties.items())), context.location).new_input(path).open()
    pf = pq.ParquetFile(local if local is not None else stream)
    try:
        by_id: dict[int, str] = {}
        for f in pf.schema_arrow:
            raw = (f.metadata or {}).get(b"PARQUET:field_id")
            if raw is not None:
                by_id[int(raw)] = f.name
        names = {name: by_id.get(fid) for name, fid in context.field_ids}
        if any(v is None for v in names.values()):
            return None
        ing_name = str(names[context.ingestion_column])
        ing_type = pf.schema_arrow.field(ing_name).type
        if not pa.types.is_timestamp(ing_type) or ing_type.unit != "us":
            return None
        bounded = start_micros is not None or end_micros is not None
        groups = _row_groups(pf, ing_name, start_micros, end_micros) if bounded else None
        read_cols = sorted({str(v) for v in names.values()})
        if groups is None:
            table = pf.read(columns=read_cols, use_threads=False)
        else:
            table = pf.read_row_groups(groups[0], columns=read_cols, use_threads=False)
    finally:
        pf.close()
        if stream is not None:
            stream.close()
    if groups is not None and not groups[1]:
        col = table.column(ing_name)
        mask = None
        if start_micros is not None:
            mask = pc.greater_equal(col, pa.scalar(start_micros, type=ing_type))
        if end_micros is not None:
            below = pc.less(col, pa.scalar(end_micros, type=ing_type))
            mask = below if mask is None else pc.and_(mask, below)
        table = table.filter(mask)
    return pa.table([table.column(str(names[name])) for name in context.columns], names=list(context.columns))


def _row_groups(pf: Any, column: str, start: int | None, end: int | None) -> tuple[list[int], bool]:
    """Row groups of ``pf`` that may hold ``column`` values in ``[start, end)``, and whether
    every row of them certainly does (statistics inside the range, no nulls: no filter needed)."""
    meta = pf.metadata
    leaf = next((j for j in range(meta.num_columns) if meta.schema.column(j).path == column), None)
    keep: list[int] = []
    all_inside = True
    for i in range(meta.num_row_groups):
        stats = meta.row_group(i).column(leaf).statistics if leaf is not None else None
        if stats is None or not stats.has_min_max or stats.physical_type != "INT64":
            keep.append(i)
            all_inside = False
            continue
        lo, hi = stats.min_raw, stats.max_raw
        if (end is not None and lo >= end) or (start is not None and hi < start):
            continue
        keep.append(i)
        inside = (start is None or lo >= start) and (end is None or hi < end)
        if not inside or not stats.has_null_count or stats.null_count > 0:
            all_inside = False
    return keep, all_inside


def _local_path(path: str) -> str | None:
    """The local file system path of ``path`` (a ``file:`` URI or a bare path), else ``None``."""
    parsed = urlparse(path)
    if parsed.scheme == "file":
        return unquote(parsed.path)
    if parsed.scheme == "":
        return path
    return None


def _read_with_pyiceberg(partition: FilePartition, span: FileSpan) -> Iterator[pa.RecordBatch]:
    """Read one data file with pyiceberg's ``ArrowScan`` (position deletes, schema evolution,
    name mapping, other formats)."""
    from pyiceberg.io.pyarrow import ArrowScan
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.table import FileScanTask
    from pyiceberg.typedef import Record

    ctx = partition.context
    metadata = _metadata(ctx.metadata_json)
    io = _file_io(tuple(sorted(ctx.io_properties.items())), ctx.location)
    projected = metadata.schema().select(*ctx.columns, case_sensitive=True)
    row_filter = range_filter(ctx.ingestion_column, partition.start_micros, partition.end_micros)
    data_file = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=span.path,
        file_format=FileFormat[span.file_format],
        partition=Record(*span.partition),
        record_count=span.record_count,
        file_size_in_bytes=span.file_size_in_bytes,
    )
    data_file.spec_id = span.spec_id
    deletes = set()
    for ref in span.deletes:
        delete_file = DataFile.from_args(
            content=DataFileContent.POSITION_DELETES,
            file_path=ref.path,
            file_format=FileFormat[ref.file_format],
            partition=Record(*span.partition),
            record_count=0,
            file_size_in_bytes=0,
        )
        delete_file.spec_id = span.spec_id
        deletes.add(delete_file)
    scan = ArrowScan(metadata, io, projected, row_filter)
    return scan.to_record_batches([FileScanTask(data_file, delete_files=deletes)])
