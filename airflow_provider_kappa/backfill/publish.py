"""Publish: one atomic Iceberg commit replacing the target's window by the staged rows.

The commit is one pyiceberg :class:`~pyiceberg.table.Transaction` on the target: a delete of
every row with ``time_column`` in ``[start, end)`` (whole files dropped; files that straddle
the window rewritten copy-on-write, keeping their rows outside it) followed by a fast
append of the staged rows. The transaction may hold up to three snapshots (delete,
rewrite, append) but reaches the catalog as ONE metadata swap: a reader of the table's
current state sees the old window or the whole new one, never a mix.

Concurrency: the commit asserts the branch head it was built on. When another writer
(the live job) commits first, the catalog refuses it; pyiceberg's transaction then
rebases the commit on the new head itself (``commit.retry.num-retries``) after checking,
at the default ``serializable`` isolation, that the concurrent commits added no data
file the window filter can match. If they did (``ValidationException``), or the catalog
keeps refusing (``CommitFailedException``), the table is refreshed and the whole
transaction rebuilt on the fresh state, at most ``max_attempts`` times. Rows another
writer appended outside the window are therefore kept; rows it appended inside the
window are replaced like the rest of the window (after publish the window holds exactly
the staged rows). The staged rows are written as Parquet data files once and reused by
every attempt; they are deleted if no attempt commits.

Gate with :func:`check_min_match` before calling; a dry run simply does not call
:func:`publish_window`. The caller drops staging after a successful publish.
"""

from __future__ import annotations

import uuid
import warnings
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Mapping

from airflow_provider_kappa.exceptions import KappaSinkError
from airflow_provider_kappa.timeparse import parse_timestamp
from airflow_provider_kappa.backfill.validate import check_min_match, in_window_mask, read_staged, window_filter

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.catalog import Catalog
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table

__all__ = ["PublishResult", "check_min_match", "publish_window", "replace_window"]

WINDOW_START_PROPERTY = "kappa.publish.window-start"
WINDOW_END_PROPERTY = "kappa.publish.window-end"
TIME_COLUMN_PROPERTY = "kappa.publish.time-column"
STAGING_PROPERTY = "kappa.publish.staging-tables"
PUBLISH_ID_PROPERTY = "kappa.publish.id"


@dataclass(frozen=True)
class PublishResult:
    """What a publish committed.

    ``snapshot_id`` is the target's current snapshot after the commit; ``rows_deleted``
    the target rows removed from the window; ``rows_added`` the staged rows appended;
    ``attempts`` how many commits were tried (1 without conflicts).
    """

    snapshot_id: int | None
    rows_deleted: int
    rows_added: int
    attempts: int


def publish_window(
    catalog: Catalog,
    target_table: str,
    staging: list[str],
    time_column: str,
    start: datetime,
    end: datetime,
    *,
    max_attempts: int = 5,
    snapshot_properties: Mapping[str, str] | None = None,
) -> PublishResult:
    """Replace the target's rows with ``time_column`` in ``[start, end)`` by the staged rows.

    :param catalog: the pyiceberg catalog holding target and staging tables.
    :param target_table: the sink's target table.
    :param staging: the backfill's staging tables; their union is published.
    :param time_column: the sink's ``time_column``.
    :param start: window start (aware).
    :param end: window end (aware).
    :param max_attempts: commits tried when other writers commit concurrently.
    :param snapshot_properties: extra properties for the snapshot summaries (e.g. the backfill id).
    :raises KappaSinkError: when a table is missing, staged rows fall outside the window,
        or the commit still conflicts after ``max_attempts``.
    """
    from pyiceberg.exceptions import NoSuchTableError

    try:
        table = catalog.load_table(target_table)
    except NoSuchTableError as e:
        raise KappaSinkError(f"publish: target table {target_table!r} does not exist in catalog {catalog.name!r}") from e
    staged = read_staged(catalog, staging, table.schema().as_arrow())
    props = {STAGING_PROPERTY: ",".join(staging)[:2000], **(snapshot_properties or {})}
    return replace_window(
        table, staged, time_column, start, end, max_attempts=max_attempts, snapshot_properties=props
    )


def replace_window(
    table: Table,
    staged: pa.Table,
    time_column: str,
    start: datetime,
    end: datetime,
    *,
    max_attempts: int = 5,
    snapshot_properties: Mapping[str, str] | None = None,
) -> PublishResult:
    """Replace ``table``'s window by ``staged`` in one commit, retried on conflicts.

    ``table`` may be stale (loaded before other writers committed): a conflicting commit is
    refused by the catalog, the table refreshed and the commit rebuilt.

    :param table: the target table.
    :param staged: the rows to publish, all with ``time_column`` in ``[start, end)``.
    :param time_column: the window column.
    :param start: window start (aware).
    :param end: window end (aware).
    :param max_attempts: at least 1.
    :param snapshot_properties: extra snapshot summary properties.
    :raises KappaSinkError: for staged rows outside the window, a schema mismatch, or
        conflicts on every attempt.
    """
    from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException, ValidationException

    if max_attempts < 1:
        raise KappaSinkError(f"publish: max_attempts {max_attempts!r} must be at least 1")
    lo, hi = parse_timestamp(start, "window start"), parse_timestamp(end, "window end")
    row_filter = window_filter(table.schema(), time_column, lo, hi)
    import pyarrow.compute as pc

    outside = staged.num_rows - int(pc.sum(in_window_mask(staged, time_column, lo, hi)).as_py() or 0)
    if outside:
        raise KappaSinkError(
            f"publish: {outside} staged row(s) have {time_column} outside the window "
            f"[{lo.isoformat()}, {hi.isoformat()}) or null; refusing to publish rows the window does not own"
        )
    props = {
        WINDOW_START_PROPERTY: lo.isoformat(),
        WINDOW_END_PROPERTY: hi.isoformat(),
        TIME_COLUMN_PROPERTY: time_column,
        **(snapshot_properties or {}),
    }
    publish_id = str(uuid.uuid4())
    props = {PUBLISH_ID_PROPERTY: publish_id, **props}
    files: list[DataFile] = []
    written_for: tuple[int, int] | None = None
    last: Exception | None = None
    try:
        for attempt in range(1, max_attempts + 1):
            shape = (table.metadata.current_schema_id, table.metadata.default_spec_id)
            if staged.num_rows and written_for != shape:
                _delete_files(table, files)
                files, written_for = _write_files(table, staged), shape
            try:
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message="Delete operation did not match any records")
                    with table.transaction() as tx:
                        tx.delete(row_filter, snapshot_properties=props)
                        if files:
                            with tx.update_snapshot(snapshot_properties=props).fast_append() as append:
                                for data_file in files:
                                    append.append_data_file(data_file)
            except (CommitFailedException, ValidationException) as e:
                last = e
                table = table.refresh()
                continue
            snapshot = table.current_snapshot()
            return PublishResult(
                snapshot_id=None if snapshot is None else snapshot.snapshot_id,
                rows_deleted=_rows_deleted(table, publish_id, staged.num_rows if files else 0),
                rows_added=staged.num_rows,
                attempts=attempt,
            )
    except BaseException as e:
        if not isinstance(e, CommitStateUnknownException):  # the files may be committed: keep them
            _delete_files(table, files)
        raise
    _delete_files(table, files)
    raise KappaSinkError(
        f"publish: commit to {'.'.join(table.name())} conflicted {max_attempts} time(s) with other writers "
        f"({type(last).__name__}: {last}); the target was not changed (retry the publish)"
    ) from last


def _rows_deleted(table: Table, publish_id: str, appended: int) -> int:
    """Target rows this publish removed: records deleted minus records re-added by copy-on-write
    rewrites, over the snapshots stamped with ``publish_id`` (the commit may hold several)."""
    deleted = added = 0
    for snapshot in table.snapshots():
        summary = snapshot.summary
        if summary is not None and summary.get(PUBLISH_ID_PROPERTY) == publish_id:
            deleted += int(summary.get("deleted-records") or 0)
            added += int(summary.get("added-records") or 0)
    return deleted - (added - appended)


def _write_files(table: Table, staged: pa.Table) -> list[DataFile]:
    from pyiceberg.io.pyarrow import _check_pyarrow_schema_compatible, _dataframe_to_data_files

    try:
        _check_pyarrow_schema_compatible(
            table.schema(), provided_schema=staged.schema, format_version=table.metadata.format_version
        )
    except ValueError as e:
        raise KappaSinkError(f"publish: staged rows do not match the schema of {'.'.join(table.name())}: {e}") from e
    return list(_dataframe_to_data_files(table_metadata=table.metadata, df=staged, io=table.io, write_uuid=uuid.uuid4()))


def _delete_files(table: Table, files: list[DataFile]) -> None:
    for data_file in files:
        table.io.delete(data_file.file_path)
    files.clear()
