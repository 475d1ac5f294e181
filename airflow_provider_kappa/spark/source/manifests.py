"""A snapshot's data files by ingestion time, from manifest statistics only: :func:`file_spans`.

Used by the ``kappa_iceberg`` reader (driver side, when it has no file list), by the launcher's
file lists (:mod:`.file_list`) and by the backfill's planner. Reads the manifest list and each
data manifest once per process (:func:`manifest_entries`: the checks, the plan and the file lists of
one backfill share them); no data file is opened. pyiceberg only (imported lazily): no pyspark.
"""

from __future__ import annotations

import struct
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from airflow_provider_kappa.exceptions import KappaSourceError
from airflow_provider_kappa.spark.source.file_index import DeleteRef, FileSpan, spans_range
from airflow_provider_kappa.spark.source.snapshots import ingestion_field, resolve_snapshot, snapshot_schema, table_name

if TYPE_CHECKING:
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.manifest import DataFile, ManifestEntry, ManifestFile
    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table
    from pyiceberg.types import NestedField

_I64 = struct.Struct("<q")
#: The most manifest entries :func:`manifest_entries` keeps per process (least recently used
#: manifests go first): a planner reads a snapshot's manifests once, not once per check and plan.
CACHED_ENTRIES = 50_000
_entries: OrderedDict[tuple[str, bool], list[ManifestEntry]] = OrderedDict()
_entries_count = 0
_entries_lock = threading.Lock()
_HOUR = 3_600_000_000
_DAY = 24 * _HOUR
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def file_spans(
    table: Table,
    snapshot_id: int | None,
    ingestion_column: str,
    start_micros: int | None,
    end_micros: int | None,
) -> list[FileSpan]:
    """Every live data file of a snapshot that may hold rows with the ingestion column in
    ``[start_micros, end_micros)``, sorted by lower bound (files of unknown bounds first).

    Reads the manifest list and each data manifest once (manifests whose partition summaries
    exclude the range are skipped); no data file is opened. Position deletes are attached to
    the files they apply to; equality deletes are refused.

    :param table: a loaded pyiceberg table.
    :param snapshot_id: the snapshot to read, ``None`` for the current one.
    :param ingestion_column: a ``timestamptz``/``timestamp`` column.
    :param start_micros: inclusive lower end of the range (``None``: unbounded).
    :param end_micros: exclusive upper end of the range (``None``: unbounded).
    :raises KappaSourceError: unknown snapshot, missing or non-timestamp column, equality deletes.
    """
    snapshot = resolve_snapshot(table, snapshot_id)
    schema = snapshot_schema(table, snapshot)
    field = ingestion_field(schema, ingestion_column, table_name(table))
    if snapshot is None:
        return []
    manifests = list(snapshot.manifests(table.io))
    return _manifest_spans(table, schema, field, manifests, start_micros, end_micros)


def manifest_entries(manifest: ManifestFile, io: Any, *, discard_deleted: bool = True) -> list[ManifestEntry]:
    """The entries of a manifest file, read once per process (:data:`CACHED_ENTRIES` at most are
    kept): a manifest file is never rewritten (a change writes a new one), so its path names its
    content. The entries are shared: read them, do not change them.

    :param manifest: the manifest (from a snapshot's manifest list).
    :param io: the table's FileIO.
    :param discard_deleted: leave out the entries of files the manifest marks deleted.
    """
    global _entries_count
    key = (manifest.manifest_path, discard_deleted)
    with _entries_lock:
        found = _entries.get(key)
        if found is not None:
            _entries.move_to_end(key)
            return found
    entries = list(manifest.fetch_manifest_entry(io, discard_deleted=discard_deleted))
    with _entries_lock:
        if key not in _entries:
            _entries[key] = entries
            _entries_count += len(entries)
        while _entries_count > CACHED_ENTRIES and len(_entries) > 1:
            _entries_count -= len(_entries.popitem(last=False)[1])
    return entries


def _manifest_spans(
    table: Table,
    schema: Schema,
    field: NestedField,
    manifests: Sequence[ManifestFile],
    start_micros: int | None,
    end_micros: int | None,
    entry_filter: Any = None,
) -> list[FileSpan]:
    from pyiceberg.manifest import DataFileContent, ManifestContent
    from pyiceberg.table.delete_file_index import DeleteFileIndex
    from pyiceberg.utils.concurrent import ExecutorFactory

    io = table.io
    specs = table.metadata.specs()
    keep = _manifest_filter(schema, specs, field.name, start_micros, end_micros)
    data_manifests = [m for m in manifests if m.content == ManifestContent.DATA and keep(m)]
    delete_manifests = [m for m in manifests if m.content == ManifestContent.DELETES]
    derive = {spec_id: _partition_bounds_fn(spec, field.field_id) for spec_id, spec in specs.items()}
    fid = field.field_id

    def read(manifest: ManifestFile) -> list[tuple[FileSpan, Any]]:
        out: list[tuple[FileSpan, Any]] = []
        for entry in manifest_entries(manifest, io):
            if entry_filter is not None and not entry_filter(entry):
                continue
            span = _span(entry.data_file, fid, derive)
            if span is not None and span.intersects(start_micros, end_micros):
                out.append((span, entry if delete_manifests else None))
        return out

    executor = ExecutorFactory.get_or_create()
    found = [pair for chunk in executor.map(read, data_manifests) for pair in chunk]

    if delete_manifests:
        index = DeleteFileIndex()
        for manifest in delete_manifests:
            for entry in manifest_entries(manifest, io):
                content = entry.data_file.content
                if content == DataFileContent.EQUALITY_DELETES:
                    raise KappaSourceError(
                        f"table {table_name(table)!r}: equality delete file {entry.data_file.file_path!r} is not "
                        "supported; rewrite the table's data files (compaction) before reading it"
                    )
                index.add_delete_file(entry, partition_key=entry.data_file.partition)
        spans = []
        for span, entry in found:
            df: DataFile = entry.data_file
            seq = entry.sequence_number or 0
            applies = sorted(index.for_data_file(seq, df, partition_key=df.partition), key=lambda d: d.file_path)
            refs = tuple(DeleteRef(d.file_path, d.file_format.name) for d in applies)
            spans.append(_replace_deletes(span, refs))
    else:
        spans = [span for span, _ in found]
    spans.sort(key=FileSpan.sort_key)
    return spans


def _replace_deletes(span: FileSpan, refs: tuple[DeleteRef, ...]) -> FileSpan:
    return replace(span, deletes=refs) if refs else span


def _span(df: DataFile, fid: int, derive: dict[int, Any]) -> FileSpan | None:
    """The :class:`FileSpan` of a data file, or ``None`` when it holds no ingestion value at all."""
    lowers = df.lower_bounds or {}
    uppers = df.upper_bounds or {}
    lo_raw = lowers.get(fid)
    hi_raw = uppers.get(fid)
    spec_id = df.spec_id or 0
    record = df.partition
    partition: tuple[Any, ...] = tuple(record[i] for i in range(len(record))) if record is not None else ()
    lo: int | None = _I64.unpack(lo_raw)[0] if lo_raw is not None and len(lo_raw) == 8 else None
    hi: int | None = _I64.unpack(hi_raw)[0] if hi_raw is not None and len(hi_raw) == 8 else None
    if lo is None or hi is None:
        nulls = (df.null_value_counts or {}).get(fid)
        values = (df.value_counts or {}).get(fid)
        if nulls is not None and values is not None and nulls >= values:
            return None  # every value of the column is null: no row is ever in a range
        fn = derive.get(spec_id)
        if fn is not None:
            p_lo, p_hi = fn(partition)
            lo = p_lo if lo is None else lo
            hi = p_hi if hi is None else hi
    return FileSpan(
        path=df.file_path,
        file_format=df.file_format.name,
        record_count=df.record_count,
        file_size_in_bytes=df.file_size_in_bytes,
        lower_micros=lo,
        upper_micros=hi,
        spec_id=spec_id,
        partition=partition,
    )


def _manifest_filter(
    schema: Schema, specs: dict[int, PartitionSpec], column: str, start: int | None, end: int | None
) -> Any:
    """A predicate on manifests: ``False`` when partition summaries exclude ``[start, end)``."""
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.expressions.visitors import inclusive_projection, manifest_evaluator

    expr = range_filter(column, start, end)
    if isinstance(expr, AlwaysTrue):
        return lambda _m: True
    evaluators = {
        spec_id: manifest_evaluator(spec, schema, inclusive_projection(schema, spec)(expr), True)
        for spec_id, spec in specs.items()
    }
    return lambda m: evaluators[m.partition_spec_id](m) if m.partition_spec_id in evaluators else True


def range_filter(column: str, start_micros: int | None, end_micros: int | None) -> BooleanExpression:
    """The pyiceberg row filter ``start <= column < end`` (``None`` ends are open).

    :param column: the ingestion column.
    :param start_micros: inclusive start, epoch microseconds.
    :param end_micros: exclusive end, epoch microseconds.
    """
    from pyiceberg.expressions import AlwaysTrue, And, GreaterThanOrEqual, LessThan, Reference
    from pyiceberg.expressions.literals import literal

    expr: BooleanExpression = AlwaysTrue()
    if start_micros is not None:
        expr = And(expr, GreaterThanOrEqual(term=Reference(column), value=literal(start_micros)))
    if end_micros is not None:
        expr = And(expr, LessThan(term=Reference(column), value=literal(end_micros)))
    return expr


def _partition_bounds_fn(spec: PartitionSpec, fid: int) -> Any:
    """For a spec partitioning by a time transform of field ``fid``: partition -> (lo, hi) micros."""
    from pyiceberg.transforms import DayTransform, HourTransform, IdentityTransform, MonthTransform, YearTransform

    for pos, pf in enumerate(spec.fields):
        if pf.source_id != fid:
            continue
        t = pf.transform
        if isinstance(t, IdentityTransform):
            return lambda p, pos=pos: (p[pos], p[pos]) if p[pos] is not None else (None, None)
        if isinstance(t, HourTransform):
            return lambda p, pos=pos: (p[pos] * _HOUR, (p[pos] + 1) * _HOUR - 1) if p[pos] is not None else (None, None)
        if isinstance(t, DayTransform):
            return lambda p, pos=pos: (p[pos] * _DAY, (p[pos] + 1) * _DAY - 1) if p[pos] is not None else (None, None)
        if isinstance(t, MonthTransform):
            return lambda p, pos=pos: _months(p[pos]) if p[pos] is not None else (None, None)
        if isinstance(t, YearTransform):
            return lambda p, pos=pos: _months(p[pos] * 12, 12) if p[pos] is not None else (None, None)
    return None


def _months(months: int, count: int = 1) -> tuple[int, int]:
    def start(m: int) -> int:
        year, month = divmod(m, 12)
        delta = datetime(1970 + year, month + 1, 1, tzinfo=timezone.utc) - _EPOCH
        return (delta.days * 86_400 + delta.seconds) * 1_000_000

    return start(months), start(months + count) - 1


def added_files(table: Table, snapshot_ids: Iterable[int], ingestion_column: str) -> list[FileSpan]:
    """Data files added by the given snapshots (append or overwrite), sorted by lower bound.

    :param table: a loaded pyiceberg table holding the snapshots.
    :param snapshot_ids: snapshots whose added files to return.
    :param ingestion_column: the ingestion column (its statistics order the files).
    """
    from pyiceberg.manifest import ManifestEntryStatus

    ids = set(snapshot_ids)
    if not ids:
        return []
    newest = max((table.snapshot_by_id(i) for i in ids), key=lambda s: s.sequence_number or 0 if s else -1)
    if newest is None:
        raise KappaSourceError(f"table {table_name(table)!r}: snapshots {sorted(ids)} do not exist")
    schema = snapshot_schema(table, newest)
    field = ingestion_field(schema, ingestion_column, table_name(table))
    manifests = [m for m in newest.manifests(table.io) if m.added_snapshot_id in ids]

    def added(entry: ManifestEntry) -> bool:
        return entry.status == ManifestEntryStatus.ADDED and entry.snapshot_id in ids

    return _manifest_spans(table, schema, field, manifests, None, None, entry_filter=added)


def table_ingestion_range(table: Table, snapshot_id: int | None, ingestion_column: str) -> tuple[int, int] | None:
    """``(min lower, max upper)`` ingestion micros of a snapshot's files with known bounds
    (``None`` when it has no such file).

    :param table: a loaded pyiceberg table.
    :param snapshot_id: the snapshot, ``None`` for the current one.
    :param ingestion_column: the ingestion column.
    """
    return spans_range(file_spans(table, snapshot_id, ingestion_column, None, None))


def null_ingestion_rows(table: Table, snapshot_id: int | None, ingestion_column: str) -> int | None:
    """Rows of a snapshot whose ingestion column is null, from the manifests' null-value counts
    (no data file is opened); ``None`` when a live data file has no such statistic.

    A row without an ingestion time belongs to no ingestion range, so no slice reads it: the
    plan reports their count instead of dropping them silently (docs/source.md).

    :param table: a loaded pyiceberg table.
    :param snapshot_id: the snapshot, ``None`` for the current one.
    :param ingestion_column: the ingestion column.
    """
    from pyiceberg.manifest import ManifestContent

    snapshot = resolve_snapshot(table, snapshot_id)
    field = ingestion_field(snapshot_schema(table, snapshot), ingestion_column, table_name(table))
    if snapshot is None:
        return 0
    total = 0
    for manifest in snapshot.manifests(table.io):
        if manifest.content != ManifestContent.DATA:
            continue
        for entry in manifest_entries(manifest, table.io):
            nulls = (entry.data_file.null_value_counts or {}).get(field.field_id)
            if nulls is None:
                return None
            total += int(nulls)
    return total
