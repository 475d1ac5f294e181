"""An Iceberg table's rows as a stream of small Arrow record batches, one data file at a time.

Validate and publish look at windows far bigger than an Airflow worker's memory, so they never
call ``scan().to_arrow()`` (the whole result in memory) nor ``to_arrow_batch_reader()``
(pyiceberg 0.12 decodes every data file of the scan into a list of batches in a thread pool,
so a slow consumer ends up holding most of the table). Here the files are planned with
pyiceberg's public scan (partition and column-metrics pruning by the row filter), then read
one after the other:

- a Parquet file without delete files whose top-level columns carry the table's field ids
  (every file the sink, pyiceberg or Spark writes) is read with pyarrow's ``iter_batches``:
  at most ``batch_rows`` rows decoded at a time, columns renamed by field id and cast to the
  table's current Arrow types;
- any other file (delete files, columns added after it was written, a changed nested type,
  another format) goes through pyiceberg's own reader, ``ArrowScan.to_record_batches`` for
  that one task: exact Iceberg semantics, memory bounded by that file.

The row filter only prunes files: rows of a kept file are all returned (callers mask them,
e.g. with :func:`~airflow_provider_kappa.backfill.validate.in_window_mask`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.table import FileScanTask, Table

DEFAULT_BATCH_ROWS = 65_536
_FIELD_ID = b"PARQUET:field_id"


def plain_schema(table: Table) -> pa.Schema:
    """The table's current Arrow schema, every field nullable and without field metadata."""
    import pyarrow as pa

    return pa.schema([pa.field(f.name, f.type) for f in table.schema().as_arrow()])


def plan(table: Table, row_filter: BooleanExpression | None = None) -> list[FileScanTask]:
    """The data files (scan tasks) of ``table``'s current snapshot that ``row_filter`` may match."""
    from pyiceberg.expressions import AlwaysTrue

    return list(table.scan(row_filter=row_filter or AlwaysTrue()).plan_files())


def table_batches(
    table: Table,
    tasks: Sequence[FileScanTask],
    *,
    columns: Sequence[str] | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
) -> Iterator[pa.RecordBatch]:
    """Rows of ``tasks`` (from :func:`plan`) in batches of at most ``batch_rows`` rows.

    :param table: the table the tasks were planned on.
    :param tasks: its scan tasks.
    :param columns: top-level columns to read (default: all), in this order.
    :param batch_rows: the largest batch decoded at a time (files read directly).
    :return: batches with the table's current column names and Arrow types (see :func:`plain_schema`).
    """
    if batch_rows < 1:
        raise ValueError(f"batch_rows {batch_rows!r} must be at least 1")
    import pyarrow as pa

    schema = plain_schema(table)
    if columns is not None:
        schema = pa.schema([schema.field(c) for c in columns])
    for task in tasks:
        yield from _task_batches(table, task, schema, batch_rows)


def _task_batches(table: Table, task: FileScanTask, schema: pa.Schema, batch_rows: int) -> Iterator[pa.RecordBatch]:
    import pyarrow.parquet as pq
    from pyiceberg.manifest import FileFormat

    if not task.delete_files and task.file.file_format == FileFormat.PARQUET:
        with table.io.new_input(task.file.file_path).open() as stream:
            parquet = pq.ParquetFile(stream)
            names = _direct_columns(parquet.schema_arrow, table, schema)
            if names is not None:
                for batch in parquet.iter_batches(batch_size=batch_rows, columns=names, use_threads=False):
                    yield batch.rename_columns(schema.names).cast(schema)
                return
    yield from _pyiceberg_batches(table, task, schema, batch_rows)


def _direct_columns(file_schema: pa.Schema, table: Table, schema: pa.Schema) -> list[str] | None:
    """The file's column names for ``schema``'s columns, matched by field id; None when pyarrow
    alone cannot give the table's view of the file (missing ids or columns, a changed nested
    type, a primitive type that is neither equal nor a safe widening)."""
    import pyarrow as pa

    by_id: dict[int, pa.Field] = {}
    for field in file_schema:
        fid = (field.metadata or {}).get(_FIELD_ID)
        if fid is None:
            return None
        by_id[int(fid)] = field
    iceberg = table.schema()
    names = []
    for wanted in schema:
        found = by_id.get(iceberg.find_field(wanted.name).field_id)
        if found is None:
            return None
        same = found.type.equals(wanted.type, check_metadata=False)
        widening = (pa.types.is_integer(found.type) and pa.types.is_integer(wanted.type)) or (
            pa.types.is_floating(found.type) and pa.types.is_floating(wanted.type)
        )
        string_like = (pa.types.is_string(found.type) or pa.types.is_large_string(found.type)) and (
            pa.types.is_string(wanted.type) or pa.types.is_large_string(wanted.type)
        )
        if not (same or widening or string_like) or (pa.types.is_nested(wanted.type) and not same):
            return None
        names.append(found.name)
    return names


def _pyiceberg_batches(
    table: Table, task: FileScanTask, schema: pa.Schema, batch_rows: int
) -> Iterator[pa.RecordBatch]:
    """One task through pyiceberg's reader (deletes applied, schema evolution resolved)."""
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan

    scan = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue())
    for batch in scan.to_record_batches([task]):
        batch = batch.select(schema.names).cast(schema)
        for offset in range(0, batch.num_rows, batch_rows):
            yield batch.slice(offset, batch_rows)
