"""The driver-side state of a tailing (live) ``kappa_iceberg`` read: :class:`TailState`.

Follows the snapshots committed to the table. Offsets are ``{"snapshot_id", "sequence_number"}``
of the last snapshot read; a micro-batch reads every data file added by the ``append`` snapshots
after its start offset, up to its end offset, whatever their ingestion times.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import StructType

from airflow_provider_kappa.exceptions import KappaSourceError
from airflow_provider_kappa.spark.source.manifests import added_files
from airflow_provider_kappa.spark.source.offsets import NO_SNAPSHOT, caps, offset_field
from airflow_provider_kappa.spark.source.options import TAIL, IcebergReadSpec
from airflow_provider_kappa.spark.source.partitions import FilePartition, make_partitions, read_context
from airflow_provider_kappa.spark.source.schema import check_job_schema, schema_to_spark
from airflow_provider_kappa.spark.source.snapshots import SnapshotRef, ingestion_field, snapshot_schema, snapshots_after
from airflow_provider_kappa.spark.source.tables import load_source_table

if TYPE_CHECKING:
    from pyspark.sql.streaming.datasource import ReadLimit

log = logging.getLogger(__name__)


class TailState:
    """Driver-side state of a tailing read: the table, refreshed at each ``latestOffset``."""

    def __init__(self, schema: StructType, opts: IcebergReadSpec, options: Mapping[str, str]) -> None:
        self.opts = opts
        self.table = load_source_table(opts.catalog, opts.table, options)
        current = self.table.current_snapshot()
        iceberg_schema = snapshot_schema(self.table, current)
        ingestion_field(iceberg_schema, opts.ingestion_column, opts.table)
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
        return self._offset(NO_SNAPSHOT, NO_SNAPSHOT)

    def _after(self, start: dict[str, Any], upto: int | None) -> list[SnapshotRef]:
        after = offset_field(start, "snapshot_id", TAIL)
        return snapshots_after(self.table, None if after == NO_SNAPSHOT else after, upto)

    def latest_offset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        if self.target is None:
            self.table = self.table.refresh()
        chain = self._after(start, self.target)
        if not chain:
            return start
        limits = caps(limit)
        taken = chain[:1]
        files, rows, size = chain[0].added_files, chain[0].added_records, chain[0].added_bytes
        for ref in chain[1:]:
            files, rows, size = files + ref.added_files, rows + ref.added_records, size + ref.added_bytes
            if (
                (limits.get("max_files") is not None and files > (limits["max_files"] or 0))
                or (limits.get("max_rows") is not None and rows > (limits["max_rows"] or 0))
                or (limits.get("max_bytes") is not None and size > (limits["max_bytes"] or 0))
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
        end_id = offset_field(end, "snapshot_id", TAIL)
        if end_id == NO_SNAPSHOT or end_id == offset_field(start, "snapshot_id", TAIL):
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
                log.warning(
                    "kappa_iceberg %s: skipping %s snapshot %d", self.opts.table, ref.operation, ref.snapshot_id
                )
            else:
                raise KappaSourceError(
                    f"table {self.opts.table!r}: snapshot {ref.snapshot_id} is an {ref.operation!r} commit; a tailing "
                    "read follows appends only (set option tail_non_append=skip to skip such commits)"
                )
        spans = added_files(self.table, ids, self.opts.ingestion_column)
        return make_partitions(spans, None, None, self.context, self.opts.min_partitions, self.opts.split_bytes)
