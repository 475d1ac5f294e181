"""Planning of an Iceberg table's data files by ingestion time, from manifest statistics only.

Used by the ``kappa_iceberg`` stream reader (driver side) and by the Airflow planner.
pyiceberg only: no pyspark import, no data file is opened here.

A :class:`FileSpan` is one live data file with the closed range ``[lower_micros, upper_micros]``
of its ingestion column, read from the manifest's column statistics (``lower_bounds`` /
``upper_bounds``). When a file has no statistics for the column, its bounds are derived from
its partition value if the table is partitioned by a time transform of the column (identity,
hour, day, month, year); otherwise they are *unknown* (``None``): such a file is treated as
possibly holding rows at any time, so it is read by every batch and filtered row by row.

The admission grid (:func:`grid_batch_end`, :class:`Presence`) lives here too, so that the
reader and the planner compute the very same batch boundaries.
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from airflow_provider_kappa.exceptions import KappaSourceError

if TYPE_CHECKING:
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.manifest import DataFile, ManifestEntry, ManifestFile
    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot
    from pyiceberg.types import NestedField

_I64 = struct.Struct("<q")
_HOUR = 3_600_000_000
_DAY = 24 * _HOUR
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True, slots=True)
class DeleteRef:
    """A position-delete file (or deletion vector) that applies to a data file."""

    path: str
    file_format: str


@dataclass(frozen=True, slots=True)
class FileSpan:
    """One live data file of a snapshot and the ingestion-time range it covers.

    :param path: the data file's location.
    :param file_format: ``PARQUET``, ``ORC`` or ``AVRO``.
    :param record_count: rows in the file (before deletes).
    :param file_size_in_bytes: the file's size.
    :param lower_micros: smallest ingestion value in the file (inclusive), ``None`` when unknown.
    :param upper_micros: largest ingestion value in the file (inclusive), ``None`` when unknown.
    :param spec_id: partition spec id the file was written with.
    :param partition: the file's partition values, in spec order (primitives).
    :param deletes: position-delete files that apply to it (empty for append-only tables).
    """

    path: str
    file_format: str
    record_count: int
    file_size_in_bytes: int
    lower_micros: int | None
    upper_micros: int | None
    spec_id: int = 0
    partition: tuple[Any, ...] = ()
    deletes: tuple[DeleteRef, ...] = ()

    @property
    def bounded(self) -> bool:
        """Whether both bounds are known."""
        return self.lower_micros is not None and self.upper_micros is not None

    def intersects(self, start_micros: int | None, end_micros: int | None) -> bool:
        """Whether rows of this file may lie in ``[start_micros, end_micros)`` (``None`` = open)."""
        if end_micros is not None and self.lower_micros is not None and self.lower_micros >= end_micros:
            return False
        if start_micros is not None and self.upper_micros is not None and self.upper_micros < start_micros:
            return False
        return True

    def sort_key(self) -> tuple[int, int, str]:
        """Order of dispatch: lower bound first (unknown first), then upper bound, then path."""
        lo = self.lower_micros if self.lower_micros is not None else -(2**63)
        hi = self.upper_micros if self.upper_micros is not None else 2**63
        return (lo, hi, self.path)


# --------------------------------------------------------------------------- validation


def resolve_snapshot(table: Table, snapshot_id: int | None) -> Snapshot | None:
    """The snapshot ``snapshot_id`` of ``table`` (its current snapshot when ``None``).

    :param table: a loaded pyiceberg table.
    :param snapshot_id: a snapshot id, or ``None`` for the current snapshot.
    :returns: the snapshot, or ``None`` when the table has no snapshot yet (and none was asked).
    :raises KappaSourceError: when ``snapshot_id`` is not a snapshot of the table.
    """
    if snapshot_id is None:
        return table.current_snapshot()
    snap = table.snapshot_by_id(snapshot_id)
    if snap is None:
        known = [s.snapshot_id for s in table.metadata.snapshots][-5:]
        raise KappaSourceError(
            f"table {_name(table)!r}: snapshot {snapshot_id} does not exist (expired or never committed); "
            f"latest snapshots: {known}"
        )
    return snap


def snapshot_schema(table: Table, snapshot: Snapshot | None) -> Schema:
    """The schema a read of ``snapshot`` uses (the snapshot's own schema, else the current one)."""
    if snapshot is not None and snapshot.schema_id is not None:
        for schema in table.metadata.schemas:
            if schema.schema_id == snapshot.schema_id:
                return schema
    return table.schema()


def ingestion_field(schema: Schema, column: str, table_name: str = "?") -> NestedField:
    """The ingestion column of ``schema``, checked to be a ``timestamp`` or ``timestamptz``.

    :param schema: the table schema read.
    :param column: the ingestion column name.
    :param table_name: used in error messages.
    :raises KappaSourceError: when the column is missing or of another type.
    """
    from pyiceberg.types import TimestampType, TimestamptzType

    try:
        field = schema.find_field(column, case_sensitive=True)
    except ValueError as e:
        names = [f.name for f in schema.fields]
        raise KappaSourceError(
            f"table {table_name!r}: ingestion column {column!r} does not exist; columns: {names}"
        ) from e
    if not isinstance(field.field_type, (TimestampType, TimestamptzType)):
        raise KappaSourceError(
            f"table {table_name!r}: ingestion column {column!r} has type {field.field_type}; "
            "expected timestamptz (or timestamp), in microseconds"
        )
    return field


# --------------------------------------------------------------------------- planning


def plan_files(
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
    field = ingestion_field(schema, ingestion_column, _name(table))
    if snapshot is None:
        return []
    manifests = list(snapshot.manifests(table.io))
    return _plan(table, schema, field, manifests, start_micros, end_micros)


def _plan(
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
        for entry in manifest.fetch_manifest_entry(io, discard_deleted=True):
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
            for entry in manifest.fetch_manifest_entry(io, discard_deleted=True):
                content = entry.data_file.content
                if content == DataFileContent.EQUALITY_DELETES:
                    raise KappaSourceError(
                        f"table {_name(table)!r}: equality delete file {entry.data_file.file_path!r} is not "
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
    from dataclasses import replace

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


# --------------------------------------------------------------------------- tail mode


@dataclass(frozen=True)
class SnapshotRef:
    """A snapshot a tailing reader may read: its id, sequence number and added data."""

    snapshot_id: int
    sequence_number: int
    operation: str
    added_files: int
    added_records: int
    added_bytes: int


def snapshots_after(table: Table, after_snapshot_id: int | None, upto_snapshot_id: int | None = None) -> list[SnapshotRef]:
    """Snapshots committed after ``after_snapshot_id`` (exclusive) up to ``upto_snapshot_id``
    (inclusive; default the current snapshot), oldest first, along the current lineage.

    :param table: a loaded (refreshed) pyiceberg table.
    :param after_snapshot_id: the last snapshot already read, ``None`` to start from the first.
    :param upto_snapshot_id: the newest snapshot to include.
    :raises KappaSourceError: when ``after_snapshot_id`` is not an ancestor (expired or rolled back).
    """
    from pyiceberg.table.snapshots import ancestors_of

    head = resolve_snapshot(table, upto_snapshot_id)
    if head is None:
        if after_snapshot_id is not None:
            raise KappaSourceError(
                f"table {_name(table)!r}: it has no snapshot but the stream already read snapshot {after_snapshot_id}"
            )
        return []
    chain: list[SnapshotRef] = []
    found = after_snapshot_id is None
    for snap in ancestors_of(head, table.metadata):
        if snap.snapshot_id == after_snapshot_id:
            found = True
            break
        summary = snap.summary
        op = summary.operation.value if summary is not None else "append"

        def get(key: str, summary: Any = summary) -> int:
            return int(summary.get(key) or 0) if summary is not None else 0

        chain.append(
            SnapshotRef(
                snapshot_id=snap.snapshot_id,
                sequence_number=snap.sequence_number or 0,
                operation=op,
                added_files=get("added-data-files"),
                added_records=get("added-records"),
                added_bytes=get("added-files-size"),
            )
        )
    if not found:
        raise KappaSourceError(
            f"table {_name(table)!r}: snapshot {after_snapshot_id} (the stream's last offset) is not an ancestor "
            f"of snapshot {head.snapshot_id}; it was expired or the table was rolled back"
        )
    chain.reverse()
    return chain


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
        raise KappaSourceError(f"table {_name(table)!r}: snapshots {sorted(ids)} do not exist")
    schema = snapshot_schema(table, newest)
    field = ingestion_field(schema, ingestion_column, _name(table))
    manifests = [m for m in newest.manifests(table.io) if m.added_snapshot_id in ids]

    def added(entry: ManifestEntry) -> bool:
        return entry.status == ManifestEntryStatus.ADDED and entry.snapshot_id in ids

    return _plan(table, schema, field, manifests, None, None, entry_filter=added)


# --------------------------------------------------------------------------- ranges and grid


def table_ingestion_range(table: Table, snapshot_id: int | None, ingestion_column: str) -> tuple[int, int] | None:
    """``(min lower, max upper)`` ingestion micros of a snapshot's files with known bounds
    (``None`` when it has no such file).

    :param table: a loaded pyiceberg table.
    :param snapshot_id: the snapshot, ``None`` for the current one.
    :param ingestion_column: the ingestion column.
    """
    return spans_range(plan_files(table, snapshot_id, ingestion_column, None, None))


def spans_range(spans: Iterable[FileSpan]) -> tuple[int, int] | None:
    """``(min lower, max upper)`` over spans with known bounds, ``None`` if there is none."""
    known = [(s.lower_micros, s.upper_micros) for s in spans if s.bounded]
    if not known:
        return None
    return min(lo for lo, _ in known if lo is not None), max(hi for _, hi in known if hi is not None)


def spans_between(spans: Iterable[FileSpan], start_micros: int | None, end_micros: int | None) -> list[FileSpan]:
    """The spans that may hold rows in ``[start_micros, end_micros)``, in the given order."""
    return [s for s in spans if s.intersects(start_micros, end_micros)]


class Presence:
    """Where in ingestion time any of several tables may hold rows: the union of their files'
    closed ranges, clipped to ``[start, end)``, as sorted disjoint intervals."""

    def __init__(self, spans: Iterable[FileSpan], start_micros: int, end_micros: int) -> None:
        intervals = []
        for s in spans:
            lo = start_micros if s.lower_micros is None else max(s.lower_micros, start_micros)
            hi = end_micros - 1 if s.upper_micros is None else min(s.upper_micros, end_micros - 1)
            if lo <= hi:
                intervals.append((lo, hi))
        intervals.sort()
        merged: list[list[int]] = []
        for lo, hi in intervals:
            if merged and lo <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        self.lowers = [m[0] for m in merged]
        self.uppers = [m[1] for m in merged]

    def first_at_or_after(self, pos: int) -> int | None:
        """The first ingestion instant ``>= pos`` that may hold rows, or ``None``."""
        i = bisect.bisect_left(self.uppers, pos)
        if i == len(self.uppers):
            return None
        return max(self.lowers[i], pos)

    def __len__(self) -> int:
        return len(self.lowers)


def grid_batch_end(pos: int, presence: Presence, threshold_micros: int, end_micros: int) -> int | None:
    """The end of the next micro-batch starting at ``pos``: the grid line (a multiple of the
    threshold from the epoch) after the first instant ``>= pos`` holding data, capped at
    ``end_micros``. Empty stretches are skipped in the same batch. ``None`` when no data is left.

    :param pos: where the batch starts (the previous batch's end).
    :param presence: where data may be (the union over every aligned table).
    :param threshold_micros: the grid step (``max_misalignment_threshold``).
    :param end_micros: the exclusive end of the read range.
    """
    if pos >= end_micros:
        return None
    first = presence.first_at_or_after(pos)
    if first is None or first >= end_micros:
        return None
    return min((first // threshold_micros + 1) * threshold_micros, end_micros)


def _name(table: Table) -> str:
    try:
        return ".".join(table.name())
    except Exception:  # noqa: BLE001 - a name for messages only; metadata location is the fallback
        return str(table.metadata_location)


class SpanIndex:
    """Fast lookup of the spans that may hold rows in a range, for one planned table.

    Spans of known bounds are kept sorted by lower bound with a running maximum of upper
    bounds, so a lookup costs a bisection plus the spans it returns (and the few files that
    straddle the range start); spans of unknown bounds are always candidates.
    """

    def __init__(self, spans: Iterable[FileSpan]) -> None:
        ordered = sorted(spans, key=FileSpan.sort_key)
        self.unbounded = [s for s in ordered if not s.bounded]
        self.bounded = [s for s in ordered if s.bounded]
        self.lowers = [s.lower_micros if s.lower_micros is not None else 0 for s in self.bounded]
        running: list[int] = []
        top = -(2**63)
        for s in self.bounded:
            top = max(top, s.upper_micros if s.upper_micros is not None else top)
            running.append(top)
        self.max_upper = running

    def __len__(self) -> int:
        return len(self.unbounded) + len(self.bounded)

    def all(self) -> list[FileSpan]:
        """Every span, unknown bounds first, then by lower bound."""
        return self.unbounded + self.bounded

    def between(self, start_micros: int, end_micros: int) -> list[FileSpan]:
        """Spans that may hold rows in ``[start_micros, end_micros)``: unknown bounds first,
        then by lower bound."""
        first = bisect.bisect_left(self.max_upper, start_micros)
        stop = bisect.bisect_left(self.lowers, end_micros)
        found = [s for s in self.bounded[first:stop] if s.upper_micros is not None and s.upper_micros >= start_micros]
        return [s for s in self.unbounded if s.intersects(start_micros, end_micros)] + found


def capped_batch_end(
    candidates: Sequence[FileSpan],
    pos: int,
    grid_end: int,
    *,
    max_files: int | None = None,
    max_rows: int | None = None,
    max_bytes: int | None = None,
) -> int:
    """Where a batch starting at ``pos`` must end so that it reads at most ``max_files`` files
    (``max_rows`` rows, ``max_bytes`` bytes), admitting whole files in lower-bound order and
    never going past ``grid_end``.

    Files are grouped by their effective start ``max(lower, pos)`` (files straddling ``pos``
    all start at ``pos``); at least the first group is admitted so the stream always advances.
    The batch ends at the effective start of the first group not admitted.

    :param candidates: the spans intersecting ``[pos, grid_end)`` (see :meth:`SpanIndex.between`).
    :param pos: the batch start.
    :param grid_end: the uncapped batch end (:func:`grid_batch_end`).
    """
    if max_files is None and max_rows is None and max_bytes is None:
        return grid_end
    groups: dict[int, list[FileSpan]] = {}
    for s in candidates:
        start = pos if s.lower_micros is None else max(s.lower_micros, pos)
        groups.setdefault(start, []).append(s)
    files = rows = size = 0
    for i, start in enumerate(sorted(groups)):
        members = groups[start]
        files += len(members)
        rows += sum(s.record_count for s in members)
        size += sum(s.file_size_in_bytes for s in members)
        over = (
            (max_files is not None and files > max_files)
            or (max_rows is not None and rows > max_rows)
            or (max_bytes is not None and size > max_bytes)
        )
        if over and i > 0:
            return start
    return grid_end
