"""What a Spark task of a ``kappa_iceberg`` micro-batch gets: :class:`FilePartition` (data files,
the batch range, a :class:`ReadContext`), and how a batch's files are grouped into tasks.

A partition is a small picklable value: file paths, sizes, partition values, the batch range,
the projected columns (with their Iceberg field ids), a trimmed copy of the table metadata and
the FileIO properties; never a catalog property.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql.datasource import InputPartition

from airflow_provider_kappa.spark.source.file_index import FileSpan
from airflow_provider_kappa.spark.source.file_list import FileList, direct_field_ids, file_io_properties, top_fields
from airflow_provider_kappa.spark.source.schema import trimmed_metadata_json

if TYPE_CHECKING:
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table


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
    #: replaying the live ledger (:mod:`.replay`): ``(topic, partition, start, end)`` offset ranges;
    #: only rows inside one of them are read (empty: no such filter)
    kafka_ranges: tuple[tuple[str, int, int, int], ...] = ()


def read_context(table: Table, schema: Schema, columns: Sequence[str], ingestion_column: str) -> ReadContext:
    """The :class:`ReadContext` of ``table`` read with ``schema``, projected to ``columns``."""
    return ReadContext(
        table=".".join(table.name()),
        location=table.metadata.location,
        metadata_json=trimmed_metadata_json(table, schema),
        io_properties=file_io_properties(table.io.properties),
        columns=tuple(columns),
        ingestion_column=ingestion_column,
        field_ids=direct_field_ids(top_fields(schema), [*columns, ingestion_column]),
    )


def file_list_read_context(files: FileList, io_properties: Mapping[str, str], columns: Sequence[str]) -> ReadContext:
    """The :class:`ReadContext` of a table read from a launcher's file list (:mod:`.file_list`)."""
    return ReadContext(
        table=files.table,
        location=files.location,
        metadata_json=files.metadata_json,
        io_properties=file_io_properties(io_properties),
        columns=tuple(columns),
        ingestion_column=files.ingestion_column,
        field_ids=files.top_field_ids([*columns, files.ingestion_column]),
    )


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
