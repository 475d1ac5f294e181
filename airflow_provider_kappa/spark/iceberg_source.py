"""The ``kappa_iceberg`` streaming reader: pinned, sliced, aligned, ordered reads of Iceberg.

Two modes (option ``mode``):

``bounded`` (backfill)
    Reads one pinned snapshot, rows whose ingestion column lies in ``[read_start, read_end)``.
    Offsets are ingestion-time positions ``{"pos": micros}``; a micro-batch reads ``[start.pos,
    end.pos)``. Batch ends lie on a grid of multiples of ``max_misalignment_threshold`` from the
    epoch; empty stretches (where no file of any aligned table may hold rows) are skipped inside
    the batch that follows them, so every aligned source computes the same batch ends.

``tail`` (live)
    Follows the snapshots committed to the table. Offsets are ``{"snapshot_id", "sequence_number"}``
    of the last snapshot read; a micro-batch reads every data file added by the snapshots after
    its start offset, up to its end offset, whatever their ingestion times.

How the code is hosted (PySpark 4.2): Spark runs the reader's offset methods (``initialOffset``,
``latestOffset``, ``partitions``, ``commit``...) in ONE long-lived Python process on the driver
per source and query, so the plan (manifests read once) is cached on the reader object there.
The reader is also constructed and pickled for planning and for executors, where only
:meth:`KappaIcebergStreamReader.read` runs: it uses nothing but the pickled partition
(file paths, range, projected schema, FileIO properties). The cached plan is never pickled.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxFiles,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from airflow_provider_kappa.exceptions import KappaConfigError, KappaSourceError
from airflow_provider_kappa.spark import scan_plan, source_plan
from airflow_provider_kappa.spark.scan_plan import FileSpan, Presence, SpanIndex
from airflow_provider_kappa.spark.source_plan import SourcePlan, file_io_properties
from airflow_provider_kappa.timeparse import parse_duration

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table
    from pyiceberg.types import IcebergType

log = logging.getLogger(__name__)

BOUNDED = "bounded"
TAIL = "tail"
DEFAULT_THRESHOLD = "15min"
_NO_SNAPSHOT = -1


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class AlignedTable:
    """One iceberg source of the query that shares the admission grid."""

    catalog: str
    table: str
    ingestion_column: str
    snapshot_id: int | None = None
    catalog_properties: Mapping[str, str] | None = None
    plan_file: str | None = None


@dataclass(frozen=True)
class ReaderOptions:
    """The ``kappa_iceberg`` reader options, validated (see docs/source.md)."""

    catalog: str
    table: str
    ingestion_column: str
    mode: str = BOUNDED
    snapshot_id: int | None = None
    read_start_micros: int | None = None
    read_end_micros: int | None = None
    threshold_micros: int = 15 * 60 * 1_000_000
    align_with: tuple[AlignedTable, ...] = ()
    max_files: int | None = None
    max_rows: int | None = None
    max_bytes: int | None = None
    min_partitions: int = 2
    split_bytes: int = 64 * 1024 * 1024
    starting: str = "earliest"
    tail_non_append: str = "fail"
    plan_file: str | None = None

    @staticmethod
    def parse(options: Mapping[str, str]) -> ReaderOptions:
        """Validate the reader options.

        :param options: the options given to ``spark.readStream.format("kappa_iceberg")``.
        :raises KappaConfigError: naming the option, the bad value and what is expected.
        """
        opts = {str(k): str(v) for k, v in options.items()}

        def req(key: str) -> str:
            value = opts.get(key, "").strip()
            if not value:
                raise KappaConfigError(f"kappa_iceberg: option {key!r} is required")
            return value

        def integer(key: str, minimum: int | None = None) -> int | None:
            value = opts.get(key, "").strip()
            if not value:
                return None
            try:
                number = int(value)
            except ValueError as e:
                raise KappaConfigError(f"kappa_iceberg: option {key}={value!r} is not an integer") from e
            if minimum is not None and number < minimum:
                raise KappaConfigError(f"kappa_iceberg: option {key}={value!r} must be >= {minimum}")
            return number

        def choice(key: str, allowed: Sequence[str], default: str) -> str:
            value = opts.get(key, "").strip() or default
            if value not in allowed:
                raise KappaConfigError(f"kappa_iceberg: option {key}={value!r}; allowed: {list(allowed)}")
            return value

        mode = choice("mode", (BOUNDED, TAIL), BOUNDED)
        threshold = parse_duration(
            opts.get("max_misalignment_threshold") or DEFAULT_THRESHOLD, "kappa_iceberg option max_misalignment_threshold"
        )
        threshold_micros = round(threshold.total_seconds() * 1_000_000)
        start = integer("read_start_micros")
        end = integer("read_end_micros")
        if start is not None and end is not None and end <= start:
            raise KappaConfigError(
                f"kappa_iceberg: read_end_micros={end} must be greater than read_start_micros={start}"
            )
        limits = {k: integer(k, 1) for k in ("max_files_per_batch", "max_rows_per_batch", "max_bytes_per_batch")}
        if sum(v is not None for v in limits.values()) > 1:
            raise KappaConfigError(
                "kappa_iceberg: set at most one of max_files_per_batch, max_rows_per_batch, max_bytes_per_batch "
                f"(got {sorted(k for k, v in limits.items() if v is not None)})"
            )
        plan_file = opts.get("plan_file", "").strip() or None
        if plan_file is not None and mode != BOUNDED:
            raise KappaConfigError(f"kappa_iceberg: option plan_file={plan_file!r} is for mode 'bounded', not {mode!r}")
        return ReaderOptions(
            catalog=req("catalog"),
            table=req("table"),
            ingestion_column=req("ingestion_column"),
            mode=mode,
            snapshot_id=integer("snapshot_id"),
            read_start_micros=start,
            read_end_micros=end,
            threshold_micros=threshold_micros,
            align_with=_parse_align_with(opts.get("align_with", "")),
            max_files=limits["max_files_per_batch"],
            max_rows=limits["max_rows_per_batch"],
            max_bytes=limits["max_bytes_per_batch"],
            min_partitions=integer("min_partitions", 1) or 2,
            split_bytes=integer("split_bytes", 1) or 64 * 1024 * 1024,
            starting=choice("starting", ("earliest", "latest"), "earliest"),
            tail_non_append=choice("tail_non_append", ("fail", "skip"), "fail"),
            plan_file=plan_file,
        )

    def default_limit(self) -> ReadLimit:
        """The :class:`ReadLimit` the options ask for (``ReadAllAvailable`` by default)."""
        if self.max_files is not None:
            return ReadMaxFiles(self.max_files)
        if self.max_rows is not None:
            return ReadMaxRows(self.max_rows)
        if self.max_bytes is not None:
            return ReadMaxBytes(self.max_bytes)
        return ReadAllAvailable()


def _parse_align_with(text: str) -> tuple[AlignedTable, ...]:
    if not text.strip():
        return ()
    try:
        items = json.loads(text)
        if not isinstance(items, list):
            raise ValueError("not a JSON list")
        out = []
        for item in items:
            snap = item.get("snapshot_id")
            out.append(
                AlignedTable(
                    catalog=str(item["catalog"]),
                    table=str(item["table"]),
                    ingestion_column=str(item["ingestion_column"]),
                    snapshot_id=int(snap) if snap not in (None, "") else None,
                    catalog_properties=item.get("catalog_properties"),
                    plan_file=item.get("plan_file") or None,
                )
            )
        return tuple(out)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise KappaConfigError(
            f"kappa_iceberg: option align_with={text!r} must be a JSON list of "
            '{"catalog", "table", "ingestion_column", "snapshot_id"} objects'
        ) from e


# --------------------------------------------------------------------------- schema


def iceberg_to_spark(t: IcebergType, where: str) -> DataType:
    """The Spark type of an Iceberg type (``timestamptz`` -> ``TimestampType``,
    ``timestamp`` -> ``TimestampNTZType``, ``uuid``/``fixed``/``binary`` -> ``BinaryType``).

    :param t: an Iceberg type.
    :param where: the column path, for error messages.
    :raises KappaSourceError: for types Spark cannot hold (``time``, nanosecond timestamps...).
    """
    from pyiceberg import types as it

    simple: list[tuple[type, DataType]] = [
        (it.BooleanType, BooleanType()),
        (it.IntegerType, IntegerType()),
        (it.LongType, LongType()),
        (it.FloatType, FloatType()),
        (it.DoubleType, DoubleType()),
        (it.DateType, DateType()),
        (it.TimestamptzType, TimestampType()),
        (it.TimestampType, TimestampNTZType()),
        (it.StringType, StringType()),
        (it.BinaryType, BinaryType()),
        (it.FixedType, BinaryType()),
        (it.UUIDType, BinaryType()),
    ]
    for cls, spark_type in simple:
        if isinstance(t, cls):
            return spark_type
    if isinstance(t, it.DecimalType):
        return DecimalType(t.precision, t.scale)
    if isinstance(t, it.StructType):
        return StructType(
            [StructField(f.name, iceberg_to_spark(f.field_type, f"{where}.{f.name}"), not f.required) for f in t.fields]
        )
    if isinstance(t, it.ListType):
        return ArrayType(iceberg_to_spark(t.element_type, f"{where}.element"), not t.element_required)
    if isinstance(t, it.MapType):
        return MapType(
            iceberg_to_spark(t.key_type, f"{where}.key"),
            iceberg_to_spark(t.value_type, f"{where}.value"),
            not t.value_required,
        )
    raise KappaSourceError(f"column {where!r} has Iceberg type {t}, which kappa_iceberg cannot map to a Spark type")


def schema_to_spark(schema: Schema) -> StructType:
    """The Spark schema of an Iceberg schema (nullability from ``required``)."""
    return StructType(
        [StructField(f.name, iceberg_to_spark(f.field_type, f.name), not f.required) for f in schema.fields]
    )


def table_spark_schema(options: Mapping[str, str]) -> StructType:
    """The Spark schema of the table a ``kappa_iceberg`` reader is pointed at: the pinned
    snapshot's schema in bounded mode, the current schema in tail mode.

    :param options: the reader options.
    :raises KappaSourceError: missing table, unknown snapshot, bad ingestion column.
    """
    opts = ReaderOptions.parse(options)
    if opts.plan_file is not None:
        plan = source_plan.read(opts.plan_file)
        plan.check(opts.table, opts.snapshot_id, opts.ingestion_column, opts.read_start_micros, opts.read_end_micros)
        return StructType.fromJson(json.loads(plan.spark_schema_json))
    table = _load_table(opts.catalog, opts.table, options)
    snapshot = scan_plan.resolve_snapshot(table, opts.snapshot_id if opts.mode == BOUNDED else None)
    schema = scan_plan.snapshot_schema(table, snapshot)
    scan_plan.ingestion_field(schema, opts.ingestion_column, opts.table)
    return schema_to_spark(schema)


def check_job_schema(given: StructType, table_schema: StructType, table: str) -> None:
    """Check a schema given by the job (``spark.readStream.schema(...)``) against the table:
    every column must exist in the table with the same type (a subset is a projection).

    :raises KappaSourceError: naming the column, its type and the table's.
    """
    by_name = {f.name: f for f in table_schema.fields}
    for f in given.fields:
        if f.name not in by_name:
            raise KappaSourceError(
                f"table {table!r}: the schema given by the job has column {f.name!r}, which the table does not "
                f"have; table columns: {[x.name for x in table_schema.fields]}"
            )
        want = by_name[f.name].dataType
        if f.dataType.simpleString() != want.simpleString():
            raise KappaSourceError(
                f"table {table!r}: the schema given by the job has {f.name!r} as {f.dataType.simpleString()}; "
                f"the table has it as {want.simpleString()}"
            )


# --------------------------------------------------------------------------- catalog access


def _catalog_props(catalog: str, options: Mapping[str, str], inline: Mapping[str, str] | None = None) -> dict[str, str]:
    from airflow_provider_kappa.spark.catalog import catalog_properties

    if catalog == options.get("catalog"):
        return catalog_properties(options)
    scoped = {
        "catalog": catalog,
        "catalog_properties": json.dumps(dict(inline or {})),
        "catalogs_file": options.get("catalogs_file", ""),
    }
    return catalog_properties(scoped)


def _load_table(catalog: str, identifier: str, options: Mapping[str, str], inline: Mapping[str, str] | None = None) -> Table:
    from airflow_provider_kappa.spark.catalog import load_catalog, load_table

    props = _catalog_props(catalog, options, inline)
    if not props:
        raise KappaConfigError(
            f"kappa_iceberg: no properties for catalog {catalog!r} (needed to read {identifier!r}): give them "
            "in the catalogs file, or inline as catalog_properties of its align_with entry"
        )
    return load_table(load_catalog(catalog, props), identifier)


# --------------------------------------------------------------------------- partitions and read


@dataclass(frozen=True)
class ReadContext:
    """What an executor needs to read a table's data files: no catalog, no credentials but
    the FileIO's, no snapshot list."""

    table: str
    location: str
    metadata_json: str
    io_properties: Mapping[str, str]
    columns: tuple[str, ...]
    ingestion_column: str
    #: ``(name, field id)`` of each projected column and of the ingestion column when every one
    #: of them is a top-level primitive (the direct Parquet path); empty: always use pyiceberg.
    field_ids: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class FilePartition(InputPartition):
    """One Spark task: data files read with column projection and the batch's row filter."""

    files: tuple[FileSpan, ...]
    start_micros: int | None
    end_micros: int | None
    context: ReadContext


def read_context(table: Table, schema: Schema, columns: Sequence[str], ingestion_column: str) -> ReadContext:
    """The :class:`ReadContext` of ``table`` read with ``schema``, projected to ``columns``."""
    return ReadContext(
        table=".".join(table.name()),
        location=table.metadata.location,
        metadata_json=trimmed_metadata_json(table, schema),
        io_properties=file_io_properties(table.io.properties),
        columns=tuple(columns),
        ingestion_column=ingestion_column,
        field_ids=source_plan.direct_field_ids(source_plan.top_fields(schema), [*columns, ingestion_column]),
    )


def plan_read_context(plan: SourcePlan, io_properties: Mapping[str, str], columns: Sequence[str]) -> ReadContext:
    """The :class:`ReadContext` of a table read from a launcher's plan (:mod:`.source_plan`)."""
    return ReadContext(
        table=plan.table,
        location=plan.location,
        metadata_json=plan.metadata_json,
        io_properties=file_io_properties(io_properties),
        columns=tuple(columns),
        ingestion_column=plan.ingestion_column,
        field_ids=plan.top_field_ids([*columns, plan.ingestion_column]),
    )


def trimmed_metadata_json(table: Table, schema: Schema) -> str:
    """``table``'s metadata without snapshots, history or refs, ``schema`` as its current schema:
    what executors need to read data files with pyiceberg, small whatever the table's history."""
    metadata = table.metadata.model_copy(
        update={
            "snapshots": [],
            "snapshot_log": [],
            "metadata_log": [],
            "refs": {},
            "current_snapshot_id": None,
            "statistics": [],
            "partition_statistics": [],
            "current_schema_id": schema.schema_id,
        }
    )
    return str(metadata.model_dump_json())


def make_partitions(
    spans: Sequence[FileSpan],
    start_micros: int | None,
    end_micros: int | None,
    context: ReadContext,
    min_partitions: int,
    split_bytes: int,
) -> list[FilePartition]:
    """Group files (kept in lower-bound order) into contiguous partitions of about equal work:
    at least ``min(min_partitions, len(spans))``, at most ``split_bytes`` each when possible.

    The work of a file is its size times the share of its ingestion range inside
    ``[start_micros, end_micros)`` (:func:`in_range_bytes`): a file that straddles the batch
    start (late rows of the previous cell) costs little, since most of its rows are filtered out
    or skipped by row-group statistics.
    """
    if not spans:
        return []
    weights = [in_range_bytes(s, start_micros, end_micros) for s in spans]
    total = sum(weights)
    count = min(len(spans), max(min_partitions, -(-total // split_bytes)))
    target = total / count
    groups: list[list[FileSpan]] = [[]]
    acc = 0.0
    for s, w in zip(spans, weights):
        if groups[-1] and acc + w / 2 > target * len(groups) and len(groups) < count:
            groups.append([])
        groups[-1].append(s)
        acc += w
    return [FilePartition(tuple(g), start_micros, end_micros, context) for g in groups if g]


def in_range_bytes(span: FileSpan, start_micros: int | None, end_micros: int | None) -> int:
    """Estimated bytes of ``span`` holding rows in ``[start_micros, end_micros)``: its size times
    the share of its closed ingestion range ``[lower, upper]`` inside the range (rows assumed
    spread evenly; the whole size when a bound is unknown); at least 1."""
    size = max(span.file_size_in_bytes, 1)
    lo, hi = span.lower_micros, span.upper_micros
    if lo is None or hi is None or hi <= lo:
        return size
    a = lo if start_micros is None else max(lo, start_micros)
    b = hi if end_micros is None else min(hi, end_micros - 1)
    if b < a:
        return 1
    return max(1, round(size * (b - a + 1) / (hi - lo + 1)))


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

    :param partition: from :meth:`KappaIcebergStreamReader.partitions`.
    :param spark_schema: the stream's schema.
    """
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    target = to_arrow_schema(spark_schema, timezone="UTC")
    for span in partition.files:
        table = None
        if partition.context.field_ids and not span.deletes and span.file_format == "PARQUET":
            table = read_parquet_direct(span.path, partition.context, partition.start_micros, partition.end_micros)
        batches = table.to_batches() if table is not None else _read_with_pyiceberg(partition, span)
        for batch in batches:
            if batch.num_rows == 0:
                continue
            arrays = [batch.column(f.name).cast(f.type) for f in target]
            yield pa.RecordBatch.from_arrays(arrays, schema=target)


def read_parquet_direct(path: str, context: ReadContext, start_micros: int | None, end_micros: int | None) -> pa.Table | None:
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
    from urllib.parse import unquote, urlparse

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
    row_filter = scan_plan.range_filter(ctx.ingestion_column, partition.start_micros, partition.end_micros)
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


# --------------------------------------------------------------------------- the reader


class KappaIcebergStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The ``kappa_iceberg`` stream reader (see the module docstring for the two modes).

    :param schema: the stream's schema (the table's, or a projection given by the job).
    :param options: the reader options (docs/architecture.md, "kappa_iceberg reader options").
    """

    def __init__(self, schema: StructType, options: Mapping[str, str]) -> None:
        self.schema = schema
        self.options = {str(k): str(v) for k, v in options.items()}
        self.opts = ReaderOptions.parse(self.options)
        self._state: _BoundedState | _TailState | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_state"] = None  # the driver-side plan never travels to executors
        return state

    def _driver(self) -> _BoundedState | _TailState:
        if self._state is None:
            self._state = (_BoundedState if self.opts.mode == BOUNDED else _TailState)(self.schema, self.opts, self.options)
        return self._state

    def initialOffset(self) -> dict[str, Any]:
        return self._driver().initial_offset()

    def getDefaultReadLimit(self) -> ReadLimit:
        return self.opts.default_limit()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        return self._driver().latest_offset(start, limit)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return self._driver().report_latest()

    def prepareForTriggerAvailableNow(self) -> None:
        self._driver().prepare_available_now()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return self._driver().partitions(start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, FilePartition):
            raise KappaSourceError(f"kappa_iceberg: unexpected partition type {type(partition).__name__}")
        return read_partition(partition, self.schema)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the plan is immutable for the query."""

    def stop(self) -> None:
        self._state = None


def _aligned_spans(other: AlignedTable, opts: ReaderOptions, options: Mapping[str, str]) -> list[FileSpan]:
    """The files of an aligned table that may hold rows in the read range (where its data is
    decides the shared grid), from its plan file when the launcher wrote one."""
    start, end = opts.read_start_micros, opts.read_end_micros
    if other.plan_file is not None:
        plan = source_plan.read(other.plan_file)
        plan.check(other.table, other.snapshot_id, other.ingestion_column, start, end)
        return scan_plan.spans_between(plan.spans, start, end)
    table = _load_table(other.catalog, other.table, options, other.catalog_properties)
    return scan_plan.plan_files(table, other.snapshot_id, other.ingestion_column, start, end)


def _field(offset: dict[str, Any], key: str, mode: str) -> int:
    """``offset[key]`` as an int, or a clear error for an offset written by another mode/source."""
    try:
        return int(offset[key])
    except (KeyError, TypeError, ValueError) as e:
        raise KappaSourceError(
            f"kappa_iceberg ({mode} mode): offset {offset!r} from the checkpoint has no integer {key!r}; "
            "it was written by another source or mode: use a fresh checkpoint"
        ) from e


def _caps(limit: ReadLimit) -> dict[str, int | None]:
    if isinstance(limit, ReadMaxFiles):
        return {"max_files": limit.max_files}
    if isinstance(limit, ReadMaxRows):
        return {"max_rows": limit.max_rows}
    if isinstance(limit, ReadMaxBytes):
        return {"max_bytes": limit.max_bytes}
    return {}


class _BoundedState:
    """Driver-side state of a bounded read: the plans of this table and of every aligned one,
    from the launcher's plan files when given (option ``plan_file``), else from the catalog."""

    snapshot_id: int | None
    context: ReadContext

    def __init__(self, schema: StructType, opts: ReaderOptions, options: Mapping[str, str]) -> None:
        began = time.monotonic()
        self.opts = opts
        if opts.plan_file is not None:
            own = self._from_plan(schema, opts, options)
        else:
            own = self._from_catalog(schema, opts, options)
        everything = list(own)
        for other in opts.align_with:
            if (other.catalog, other.table, other.ingestion_column) == (opts.catalog, opts.table, opts.ingestion_column):
                continue
            everything += _aligned_spans(other, opts, options)
        start, end = opts.read_start_micros, opts.read_end_micros
        if start is None or end is None:
            known = scan_plan.spans_range(everything)
            if any(not s.bounded for s in everything) or known is None:
                if known is None and not everything:
                    known = (0, 0)
                else:
                    raise KappaConfigError(
                        f"kappa_iceberg: table {opts.table!r} has data files without ingestion statistics; "
                        "give read_start_micros and read_end_micros"
                    )
            start = known[0] if start is None else start
            end = known[1] + 1 if end is None else end
        self.start, self.end = start, end
        self.index = SpanIndex(own)
        self.presence = Presence(everything, start, max(end, start + 1))
        log.info(
            "kappa_iceberg %s@%s: planned %d files (%d aligned tables, %d with data) in %.2fs%s",
            opts.table,
            self.snapshot_id,
            len(own),
            len(opts.align_with),
            len(everything),
            time.monotonic() - began,
            " from the launcher's plan" if opts.plan_file else "",
        )

    def _from_catalog(self, schema: StructType, opts: ReaderOptions, options: Mapping[str, str]) -> list[FileSpan]:
        """Plan from the catalog: load the table, check the snapshot and schema, read manifests."""
        table = _load_table(opts.catalog, opts.table, options)
        snapshot = scan_plan.resolve_snapshot(table, opts.snapshot_id)
        iceberg_schema = scan_plan.snapshot_schema(table, snapshot)
        scan_plan.ingestion_field(iceberg_schema, opts.ingestion_column, opts.table)
        check_job_schema(schema, schema_to_spark(iceberg_schema), opts.table)
        self.snapshot_id = snapshot.snapshot_id if snapshot is not None else None
        self.context = read_context(table, iceberg_schema, schema.fieldNames(), opts.ingestion_column)
        return scan_plan.plan_files(table, self.snapshot_id, opts.ingestion_column, opts.read_start_micros, opts.read_end_micros)

    def _from_plan(self, schema: StructType, opts: ReaderOptions, options: Mapping[str, str]) -> list[FileSpan]:
        """Plan from the launcher's plan file: no catalog, no manifest, no pyiceberg import."""
        assert opts.plan_file is not None
        plan = source_plan.read(opts.plan_file)
        plan.check(opts.table, opts.snapshot_id, opts.ingestion_column, opts.read_start_micros, opts.read_end_micros)
        check_job_schema(schema, StructType.fromJson(json.loads(plan.spark_schema_json)), opts.table)
        self.snapshot_id = plan.snapshot_id
        self.context = plan_read_context(plan, _catalog_props(opts.catalog, options), schema.fieldNames())
        return scan_plan.spans_between(plan.spans, opts.read_start_micros, opts.read_end_micros)

    def initial_offset(self) -> dict[str, Any]:
        return {"pos": self.start}

    def latest_offset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        pos = max(_field(start, "pos", BOUNDED), self.start)
        grid_end = scan_plan.grid_batch_end(pos, self.presence, self.opts.threshold_micros, self.end)
        if grid_end is None:
            return start
        caps = _caps(limit)
        if caps:
            grid_end = scan_plan.capped_batch_end(self.index.between(pos, grid_end), pos, grid_end, **caps)
        return {"pos": grid_end}

    def report_latest(self) -> dict[str, Any]:
        return {"pos": self.end}

    def prepare_available_now(self) -> None:
        """Nothing to record: the pinned snapshot and ``read_end`` already bound the query."""

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[FilePartition]:
        lo = max(_field(start, "pos", BOUNDED), self.start)
        hi = min(_field(end, "pos", BOUNDED), self.end)
        if lo >= hi:
            return []
        spans = self.index.between(lo, hi)
        return make_partitions(spans, lo, hi, self.context, self.opts.min_partitions, self.opts.split_bytes)


class _TailState:
    """Driver-side state of a tailing read: the table, refreshed at each ``latestOffset``."""

    def __init__(self, schema: StructType, opts: ReaderOptions, options: Mapping[str, str]) -> None:
        self.opts = opts
        self.table = _load_table(opts.catalog, opts.table, options)
        current = self.table.current_snapshot()
        iceberg_schema = scan_plan.snapshot_schema(self.table, current)
        scan_plan.ingestion_field(iceberg_schema, opts.ingestion_column, opts.table)
        check_job_schema(schema, schema_to_spark(iceberg_schema), opts.table)
        self.context = read_context(self.table, iceberg_schema, schema.fieldNames(), opts.ingestion_column)
        self.target: int | None = None  # availableNow: the newest snapshot this query may read

    @staticmethod
    def _offset(snapshot_id: int, sequence_number: int) -> dict[str, Any]:
        return {"snapshot_id": snapshot_id, "sequence_number": sequence_number}

    def initial_offset(self) -> dict[str, Any]:
        current = self.table.current_snapshot()
        if self.opts.starting == "latest" and current is not None:
            return self._offset(current.snapshot_id, current.sequence_number or 0)
        return self._offset(_NO_SNAPSHOT, _NO_SNAPSHOT)

    def _after(self, start: dict[str, Any], upto: int | None) -> list[scan_plan.SnapshotRef]:
        after = _field(start, "snapshot_id", TAIL)
        return scan_plan.snapshots_after(self.table, None if after == _NO_SNAPSHOT else after, upto)

    def latest_offset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        if self.target is None:
            self.table = self.table.refresh()
        chain = self._after(start, self.target)
        if not chain:
            return start
        caps = _caps(limit)
        taken = chain[:1]
        files, rows, size = chain[0].added_files, chain[0].added_records, chain[0].added_bytes
        for ref in chain[1:]:
            files, rows, size = files + ref.added_files, rows + ref.added_records, size + ref.added_bytes
            if (
                (caps.get("max_files") is not None and files > (caps["max_files"] or 0))
                or (caps.get("max_rows") is not None and rows > (caps["max_rows"] or 0))
                or (caps.get("max_bytes") is not None and size > (caps["max_bytes"] or 0))
            ):
                break
            taken.append(ref)
        last = taken[-1]
        return self._offset(last.snapshot_id, last.sequence_number)

    def report_latest(self) -> dict[str, Any] | None:
        current = self.table.current_snapshot()
        return None if current is None else self._offset(current.snapshot_id, current.sequence_number or 0)

    def prepare_available_now(self) -> None:
        self.table = self.table.refresh()
        current = self.table.current_snapshot()
        self.target = current.snapshot_id if current is not None else None

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[FilePartition]:
        end_id = _field(end, "snapshot_id", TAIL)
        if end_id == _NO_SNAPSHOT or end_id == _field(start, "snapshot_id", TAIL):
            return []
        if self.table.snapshot_by_id(end_id) is None:
            self.table = self.table.refresh()
        chain = self._after(start, end_id)
        ids = []
        for ref in chain:
            if ref.operation == "append":
                ids.append(ref.snapshot_id)
            elif ref.operation == "replace":
                continue  # compaction: the same rows, rewritten
            elif self.opts.tail_non_append == "skip":
                log.warning("kappa_iceberg %s: skipping %s snapshot %d", self.opts.table, ref.operation, ref.snapshot_id)
            else:
                raise KappaSourceError(
                    f"table {self.opts.table!r}: snapshot {ref.snapshot_id} is an {ref.operation!r} commit; a tailing "
                    "read follows appends only (set option tail_non_append=skip to skip such commits)"
                )
        spans = scan_plan.added_files(self.table, ids, self.opts.ingestion_column)
        return make_partitions(spans, None, None, self.context, self.opts.min_partitions, self.opts.split_bytes)
