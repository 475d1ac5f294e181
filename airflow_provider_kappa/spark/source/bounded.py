"""The driver-side state of a bounded (backfill) ``kappa_iceberg`` read: :class:`BoundedState`.

Reads one pinned snapshot, the rows whose ingestion column lies in ``[read_start, read_end)``.
Offsets are ingestion positions ``{"pos": micros}``; a micro-batch reads ``[start.pos, end.pos)``.
Batch ends lie on the admission grid (:mod:`.grid`) over the files of every aligned table, so
every aligned source computes the same batch ends. The files come from the launcher's file lists
when given (option ``plan_file``), else from the catalog's manifests, once per query.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import StructType

from airflow_provider_kappa.exceptions import KappaConfigError
from airflow_provider_kappa.spark.catalog import catalog_properties
from airflow_provider_kappa.spark.source import file_list
from airflow_provider_kappa.spark.source.file_index import FileSpan, SpanIndex, spans_between, spans_range
from airflow_provider_kappa.spark.source.grid import Presence, capped_batch_end, grid_batch_end
from airflow_provider_kappa.spark.source.manifests import file_spans
from airflow_provider_kappa.spark.source.offsets import caps, offset_field
from airflow_provider_kappa.spark.source.options import BOUNDED, AlignedTable, IcebergReadSpec
from airflow_provider_kappa.spark.source.partitions import (
    FilePartition,
    ReadContext,
    file_list_read_context,
    make_partitions,
    read_context,
)
from airflow_provider_kappa.spark.source.schema import check_job_schema, schema_to_spark
from airflow_provider_kappa.spark.source.snapshots import ingestion_field, resolve_snapshot, snapshot_schema
from airflow_provider_kappa.spark.source.tables import load_source_table

if TYPE_CHECKING:
    from pyspark.sql.streaming.datasource import ReadLimit

log = logging.getLogger(__name__)


def aligned_spans(other: AlignedTable, opts: IcebergReadSpec, options: Mapping[str, str]) -> list[FileSpan]:
    """The files of an aligned table that may hold rows in the read range (where its data is
    decides the shared grid), from its file list when the launcher wrote one."""
    start, end = opts.read_start_micros, opts.read_end_micros
    if other.plan_file is not None:
        files = file_list.read(other.plan_file)
        files.check(other.table, other.snapshot_id, other.ingestion_column, start, end)
        return spans_between(files.spans, start, end)
    table = load_source_table(other.catalog, other.table, options, other.catalog_properties)
    return file_spans(table, other.snapshot_id, other.ingestion_column, start, end)


class BoundedState:
    """Driver-side state of a bounded read: the files of this table and of every aligned one,
    from the launcher's file lists when given (option ``plan_file``), else from the catalog."""

    snapshot_id: int | None
    context: ReadContext

    def __init__(self, schema: StructType, opts: IcebergReadSpec, options: Mapping[str, str]) -> None:
        began = time.monotonic()
        self.opts = opts
        if opts.plan_file is not None:
            own = self._from_file_list(schema, opts, options)
        else:
            own = self._from_catalog(schema, opts, options)
        everything = list(own)
        for other in opts.align_with:
            if (other.catalog, other.table, other.ingestion_column) == (
                opts.catalog,
                opts.table,
                opts.ingestion_column,
            ):
                continue
            everything += aligned_spans(other, opts, options)
        start, end = opts.read_start_micros, opts.read_end_micros
        if start is None or end is None:
            known = spans_range(everything)
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
            "kappa_iceberg %s@%s: listed %d files (%d aligned tables, %d with data) in %.2fs%s",
            opts.table,
            self.snapshot_id,
            len(own),
            len(opts.align_with),
            len(everything),
            time.monotonic() - began,
            " from the launcher's file list" if opts.plan_file else "",
        )

    def _from_catalog(self, schema: StructType, opts: IcebergReadSpec, options: Mapping[str, str]) -> list[FileSpan]:
        """From the catalog: load the table, check the snapshot and schema, read manifests."""
        table = load_source_table(opts.catalog, opts.table, options)
        snapshot = resolve_snapshot(table, opts.snapshot_id)
        iceberg_schema = snapshot_schema(table, snapshot)
        ingestion_field(iceberg_schema, opts.ingestion_column, opts.table)
        check_job_schema(schema, schema_to_spark(iceberg_schema), opts.table)
        self.snapshot_id = snapshot.snapshot_id if snapshot is not None else None
        self.context = read_context(table, iceberg_schema, schema.fieldNames(), opts.ingestion_column)
        return file_spans(table, self.snapshot_id, opts.ingestion_column, opts.read_start_micros, opts.read_end_micros)

    def _from_file_list(self, schema: StructType, opts: IcebergReadSpec, options: Mapping[str, str]) -> list[FileSpan]:
        """From the launcher's file list: no catalog, no manifest, no pyiceberg import."""
        assert opts.plan_file is not None
        files = file_list.read(opts.plan_file)
        files.check(opts.table, opts.snapshot_id, opts.ingestion_column, opts.read_start_micros, opts.read_end_micros)
        check_job_schema(schema, StructType.fromJson(json.loads(files.spark_schema_json)), opts.table)
        self.snapshot_id = files.snapshot_id
        self.context = file_list_read_context(files, catalog_properties(options, opts.catalog), schema.fieldNames())
        return spans_between(files.spans, opts.read_start_micros, opts.read_end_micros)

    def initial_offset(self) -> dict[str, Any]:
        return {"pos": self.start}

    def latest_offset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        pos = max(offset_field(start, "pos", BOUNDED), self.start)
        grid_end = grid_batch_end(pos, self.presence, self.opts.max_misalignment_threshold_micros_or_default, self.end)
        if grid_end is None:
            return start
        limits = caps(limit)
        if limits:
            grid_end = capped_batch_end(self.index.between(pos, grid_end), pos, grid_end, **limits)
        return {"pos": grid_end}

    def report_latest(self) -> dict[str, Any]:
        return {"pos": self.end}

    def prepare_available_now(self) -> None:
        """Nothing to record: the pinned snapshot and ``read_end`` already bound the query."""

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[FilePartition]:
        lo = max(offset_field(start, "pos", BOUNDED), self.start)
        hi = min(offset_field(end, "pos", BOUNDED), self.end)
        if lo >= hi:
            return []
        spans = self.index.between(lo, hi)
        return make_partitions(spans, lo, hi, self.context, self.opts.min_partitions, self.opts.split_bytes)
