"""Snapshots of a source table: which one a read uses, its schema and ingestion column
(the checks behind the reader's table errors), and the snapshots a tailing read follows.

pyiceberg only (imported lazily): no pyspark, no data file opened.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_kappa.exceptions import KappaSourceError

if TYPE_CHECKING:
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot
    from pyiceberg.types import NestedField


def table_name(table: Table) -> str:
    """``namespace.table`` of ``table`` (for messages; its metadata location if it has no name)."""
    try:
        return ".".join(table.name())
    except Exception:  # noqa: BLE001 - a name for messages only; metadata location is the fallback
        return str(table.metadata_location)


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
            f"table {table_name(table)!r}: snapshot {snapshot_id} does not exist (expired or never committed); "
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


@dataclass(frozen=True)
class SnapshotRef:
    """A snapshot a tailing reader may read: its id, sequence number and added data."""

    snapshot_id: int
    sequence_number: int
    operation: str
    added_files: int
    added_records: int
    added_bytes: int


def snapshots_after(
    table: Table, after_snapshot_id: int | None, upto_snapshot_id: int | None = None
) -> list[SnapshotRef]:
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
                f"table {table_name(table)!r}: it has no snapshot but the stream already read snapshot {after_snapshot_id}"
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
            f"table {table_name(table)!r}: snapshot {after_snapshot_id} (the stream's last offset) is not an ancestor "
            f"of snapshot {head.snapshot_id}; it was expired or the table was rolled back"
        )
    chain.reverse()
    return chain
