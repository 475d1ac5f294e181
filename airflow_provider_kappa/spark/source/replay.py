"""The driver-side state of a bounded read that replays live's micro-batches: :class:`ReplayState`.

Used instead of :class:`~.bounded.BoundedState` when the reader has option ``ledger`` (the live
ledger, :mod:`airflow_provider_kappa.spark.ledger`). Live micro-batch k read, per Kafka topic
partition, the offsets ``[start, end)`` its ledger entry holds; the landed table keeps each record's
``kafka_topic``, ``kafka_partition`` and ``kafka_offset``. So micro-batch k of the backfill reads
exactly the landed rows inside entry k's ranges, whatever their ingestion times: live's batches,
row for row, late events included, every source of the query on the same batches.

Live's no-data batches (run to apply a watermark that advanced) are replayed too, as micro-batches
reading nothing: Spark drops late events by the watermark of the batch before, so the sequence of
batches, not only their contents, decides which late events count.

Offsets stay ingestion positions ``{"pos": micros}``: the placement of the last live batch read (by
its data: its last record's time, :meth:`~airflow_provider_kappa.spark.ledger.Ledger.placement`).
A slice reading ``[read_start, read_end)`` replays the live batches placed in it
(a sequential slice goes on from the checkpoint's position, so a batch of a slice the plan skipped
is replayed by the next slice that runs). ``max_misalignment_threshold`` and read limits do not
apply: the batches are live's.

Data files are chosen by the statistics of ``kafka_partition`` and ``kafka_offset`` (every file of
the pinned snapshot whose bounds may hold a range of the batch); executors keep the rows inside
the ranges (:func:`~.read.kafka_filter`).
"""

from __future__ import annotations

import bisect
import logging
import struct
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import StructType

from airflow_provider_kappa.exceptions import KappaSourceError
from airflow_provider_kappa.spark.conf_keys import KAFKA_COLUMNS
from airflow_provider_kappa.spark.ledger import Ledger, LedgerEntry
from airflow_provider_kappa.spark.source.file_index import FileSpan
from airflow_provider_kappa.spark.source.manifests import file_spans, manifest_entries
from airflow_provider_kappa.spark.source.offsets import offset_field
from airflow_provider_kappa.spark.source.options import BOUNDED, IcebergReadSpec
from airflow_provider_kappa.spark.source.partitions import FilePartition, make_partitions, read_context
from airflow_provider_kappa.spark.source.schema import check_job_schema, schema_to_spark
from airflow_provider_kappa.spark.source.snapshots import ingestion_field, resolve_snapshot, snapshot_schema
from airflow_provider_kappa.spark.source.tables import load_source_table

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyspark.sql.streaming.datasource import ReadLimit

log = logging.getLogger(__name__)

_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
#: a start offset the ledger does not know (a partition's beginning)
FROM_BEGINNING = -1
#: ``(topic, partition, start offset (FROM_BEGINNING: none), end offset)``
KafkaRange = tuple[str, int, int, int]
#: per data file: ``(lowest partition, highest partition, lowest offset, highest offset)``, ``None`` unknown
KafkaBounds = tuple[int | None, int | None, int | None, int | None]


def kafka_bounds(table: Table, snapshot_id: int | None) -> dict[str, KafkaBounds]:
    """Data file path -> the bounds of its ``kafka_partition`` and ``kafka_offset`` columns, from the
    manifests' column statistics (no data file is opened).

    :param table: the landed table.
    :param snapshot_id: the pinned snapshot.
    """
    snapshot = resolve_snapshot(table, snapshot_id)
    if snapshot is None:
        return {}
    schema = snapshot_schema(table, snapshot)
    _, partition_col, offset_col = KAFKA_COLUMNS
    pid, oid = schema.find_field(partition_col).field_id, schema.find_field(offset_col).field_id

    def value(raw: bytes | None, codec: struct.Struct) -> int | None:
        return codec.unpack(raw)[0] if raw is not None and len(raw) == codec.size else None

    from pyiceberg.manifest import ManifestContent

    out: dict[str, KafkaBounds] = {}
    for manifest in snapshot.manifests(table.io):
        if manifest.content != ManifestContent.DATA:
            continue
        for entry in manifest_entries(manifest, table.io):
            df = entry.data_file
            lo, hi = df.lower_bounds or {}, df.upper_bounds or {}
            out[df.file_path] = (
                value(lo.get(pid), _I32),
                value(hi.get(pid), _I32),
                value(lo.get(oid), _I64),
                value(hi.get(oid), _I64),
            )
    return out


def may_hold(bounds: KafkaBounds | None, ranges: list[KafkaRange]) -> bool:
    """Whether a data file of these bounds may hold a row inside one of ``ranges``."""
    if bounds is None:
        return True
    p_lo, p_hi, o_lo, o_hi = bounds
    for _, partition, start, end in ranges:
        if (p_lo is not None and partition < p_lo) or (p_hi is not None and partition > p_hi):
            continue
        if (o_lo is not None and o_lo >= end) or (o_hi is not None and o_hi < start):
            continue
        return True
    return False


class ReplayState:
    """Driver-side state of a bounded read replaying the live ledger (see the module docstring)."""

    def __init__(self, schema: StructType, opts: IcebergReadSpec, options: Mapping[str, str]) -> None:
        began = time.monotonic()
        assert opts.ledger is not None
        self.opts = opts
        if opts.read_start_micros is None or opts.read_end_micros is None:
            raise KappaSourceError(
                f"kappa_iceberg: option ledger={opts.ledger!r} needs read_start_micros and read_end_micros "
                "(the live batches replayed are those live started in that range)"
            )
        self.start, self.end = opts.read_start_micros, opts.read_end_micros
        table = load_source_table(opts.catalog, opts.table, options)
        snapshot = resolve_snapshot(table, opts.snapshot_id)
        iceberg_schema = snapshot_schema(table, snapshot)
        ingestion_field(iceberg_schema, opts.ingestion_column, opts.table)
        check_job_schema(schema, schema_to_spark(iceberg_schema), opts.table)
        missing = [c for c in KAFKA_COLUMNS if c not in schema.fieldNames()]
        if missing:
            raise KappaSourceError(
                f"kappa_iceberg: table {opts.table!r} read with the live ledger {opts.ledger!r} has no column(s) "
                f"{missing}: replaying live's micro-batches needs each landed row's kafka_topic, kafka_partition "
                "and kafka_offset (what kappa land writes; docs/landing.md)"
            )
        self.snapshot_id = snapshot.snapshot_id if snapshot is not None else None
        self.context = read_context(table, iceberg_schema, schema.fieldNames(), opts.ingestion_column)
        self.spans: list[FileSpan] = file_spans(table, self.snapshot_id, opts.ingestion_column, None, None)
        self.bounds = kafka_bounds(table, self.snapshot_id)
        self.ledger = Ledger(opts.ledger)
        self.positions = self.ledger.placement()  # by data, in live's order
        log.info(
            "kappa_iceberg %s@%s: replaying the live ledger %s (%d batches recorded), %d files, in %.2fs",
            opts.table,
            self.snapshot_id,
            opts.ledger,
            len(self.ledger),
            len(self.spans),
            time.monotonic() - began,
        )

    def initial_offset(self) -> dict[str, Any]:
        return {"pos": self.start - 1}

    def latest_offset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """One live batch per micro-batch: the first one placed after ``start``, if before the end."""
        pos = offset_field(start, "pos", BOUNDED)
        i = bisect.bisect_right(self.positions, pos)
        if i == len(self.positions) or self.positions[i] >= self.end:
            return start
        return {"pos": self.positions[i]}

    def report_latest(self) -> dict[str, Any]:
        i = bisect.bisect_left(self.positions, self.end)
        return {"pos": self.positions[i - 1] if i else self.start - 1}

    def prepare_available_now(self) -> None:
        """Nothing to record: the pinned snapshot and the ledger already bound the query."""

    def entries(self, lo: int, hi: int) -> list[tuple[int, LedgerEntry]]:
        """``(index, entry)`` of the live batches placed in ``(lo, hi]`` (micros)."""
        first, stop = bisect.bisect_right(self.positions, lo), bisect.bisect_right(self.positions, hi)
        return [(i, self.ledger.entry(self.ledger.keys[i][2])) for i in range(first, stop)]

    def ranges(self, index: int, entry: LedgerEntry) -> list[KafkaRange]:
        """Entry ``index``'s ranges; a start the entry does not know (its query's offset log no longer
        held the batch before) is the previous entry's end of that partition, else the beginning."""
        previous = self.ledger.entry(self.ledger.keys[index - 1][2]) if index > 0 else None
        out = []
        for topic, parts in entry.ranges.items():
            for partition, (start, end) in parts.items():
                if start is None and previous is not None and partition in previous.ranges.get(topic, {}):
                    start = previous.ranges[topic][partition][1]
                out.append((topic, partition, FROM_BEGINNING if start is None else start, end))
        return sorted(out)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[FilePartition]:
        lo, hi = offset_field(start, "pos", BOUNDED), offset_field(end, "pos", BOUNDED)
        ranges = sorted({r for i, entry in self.entries(lo, hi) for r in self.ranges(i, entry)})
        if not ranges:
            return []
        spans = [s for s in self.spans if may_hold(self.bounds.get(s.path), ranges)]
        parts = make_partitions(spans, None, None, self.context, self.opts.min_partitions, self.opts.split_bytes)
        return [replace(p, kafka_ranges=tuple(ranges)) for p in parts]
