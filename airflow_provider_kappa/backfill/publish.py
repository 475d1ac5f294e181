"""Publish: one atomic Iceberg commit replacing the target's window by the staged rows.

The commit is one pyiceberg :class:`~pyiceberg.table.Transaction` on the target: a delete of
every row with ``time_column`` in ``[start, end)`` (``Transaction.delete``: whole files
dropped; files that straddle the window rewritten copy-on-write, keeping their rows outside
it) followed by a fast append (``update_snapshot().fast_append().append_data_file``) of the
staged data files. The transaction may hold up to three snapshots (delete, rewrite, append)
but reaches the catalog as ONE metadata swap: a reader of the table's current state sees the
old window or the whole new one, never a mix. Files entirely outside the window are not
touched.

By reference, in O(files): the staging tables are created like the target (same schema,
field ids, partition spec), so their Parquet files are already files of the target. Publish
takes their ``DataFile`` entries (with column metrics and partition values) from the staging
tables' scans and appends those very files, re-labelled with the target's default partition
spec id: no staged row is read or written. Before committing, each such staging table is
marked published (:func:`~airflow_provider_kappa.spark.staging.mark_published`), so that
clearing or dropping it later never deletes a data file the target references. A staging
table whose field ids or partition spec differ from the target's current ones (the target
evolved since the slice ran) or that holds delete files is the exception: its rows are
streamed and written again as target files (bounded memory, a file per batch group).

Staged rows outside the window (or with a null ``time_column``) are refused before anything
is committed; files whose column metrics put them inside the window are not even read (a
scan of the staging tables for rows outside the window prunes them).

Concurrency: the commit asserts the branch head it was built on. When another writer
(the live job) commits first, the catalog refuses it; pyiceberg's transaction then
rebases the commit on the new head itself (``commit.retry.num-retries``) after checking,
at the default ``serializable`` isolation, that the concurrent commits added no data
file the window filter can match. If they did (``ValidationException``), or the catalog
keeps refusing (``CommitFailedException``), the table is refreshed and the whole
transaction rebuilt on the fresh state, at most ``max_attempts`` times. Rows another
writer appended outside the window are therefore kept; rows it appended inside the
window are replaced like the rest of the window (after publish the window holds exactly
the staged rows). Files publish writes itself (rows passed to :func:`replace_window`, or
the exception above) are written once, reused by every attempt, and deleted if none
commits; staged files committed by reference are never deleted by publish.

Gate with :func:`check_min_match` before calling; a dry run simply does not call
:func:`publish_window`. The caller drops staging after a successful publish.
"""

from __future__ import annotations

import logging
import uuid
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from airflow_provider_kappa.backfill.checks import closed_end
from airflow_provider_kappa.backfill.lock import check_lock, load_target, release, release_command, targets
from airflow_provider_kappa.backfill.plan import BackfillPlan, staging_tables
from airflow_provider_kappa.backfill.row_stream import plain_schema, plan, table_batches
from airflow_provider_kappa.backfill.validate import check_min_match, in_window_mask, pinned, window_filter
from airflow_provider_kappa.compat.pyiceberg import check_arrow_schema, write_data_files
from airflow_provider_kappa.exceptions import KappaCatalogUnavailableError, KappaSinkError
from airflow_provider_kappa.faults import (
    RETRY_ATTEMPTS,
    one_line,
    retry_transient,
    root_transient_cause,
    transient_cause,
)
from airflow_provider_kappa.spark.staging import mark_published
from airflow_provider_kappa.timeparse import parse_timestamp

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.catalog import Catalog
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table

    from airflow_provider_kappa.backfill.backfill import Backfill

__all__ = ["PublishResult", "check_min_match", "publish_window", "replace_window", "staged_files"]

log = logging.getLogger(__name__)

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
    drop_until: datetime | None = None,
) -> PublishResult:
    """Replace the target's rows with ``time_column`` in ``[start, end)`` by the staged rows,
    committing the staging tables' data files by reference.

    :param catalog: the pyiceberg catalog holding target and staging tables.
    :param target_table: the sink's target table.
    :param staging: the backfill's staging tables; their union is published.
    :param time_column: the sink's ``time_column``.
    :param start: window start (aware).
    :param end: window end (aware).
    :param max_attempts: commits tried when other writers commit concurrently.
    :param snapshot_properties: extra properties for the snapshot summaries (e.g. the backfill id).
    :param drop_until: the end of the window the backfill owns when ``end`` clips it (a window
        past the landed data, ``allow_open_end``): staged rows in ``[end, drop_until)`` are left
        out (their staging tables' rows are written again, filtered), not refused.
    :raises KappaSinkError: when a table is missing, staged rows fall outside the window,
        or the commit still conflicts after ``max_attempts``.
    """
    from pyiceberg.exceptions import NoSuchTableError

    try:
        table = catalog.load_table(target_table)
    except NoSuchTableError as e:
        raise KappaSinkError(
            f"publish: target table {target_table!r} does not exist in catalog {catalog.name!r}"
        ) from e
    staged = staged_files(catalog, staging, table, time_column, start, end, drop_until=drop_until)
    props = {STAGING_PROPERTY: ",".join(staging)[:2000], **(snapshot_properties or {})}
    return _commit_window(table, staged, time_column, start, end, max_attempts=max_attempts, snapshot_properties=props)


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
    """Replace ``table``'s window by ``staged``, rows already held in memory, in one commit
    retried on conflicts (the rows are written as data files of ``table`` once).

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
    import pyarrow.compute as pc

    lo, hi = parse_timestamp(start, "window start"), parse_timestamp(end, "window end")
    window_filter(table.schema(), time_column, lo, hi)
    outside = staged.num_rows - int(pc.sum(in_window_mask(staged, time_column, lo, hi)).as_py() or 0)
    _refuse_outside(outside, time_column, lo, hi)
    return _commit_window(
        table,
        _Staged(rows=[staged] if staged.num_rows else []),
        time_column,
        start,
        end,
        max_attempts=max_attempts,
        snapshot_properties=snapshot_properties,
    )


@dataclass
class _Staged:
    """What a publish appends: staging tables whose files go in by reference and rows (or
    staging tables) to write as new target files."""

    by_reference: list[tuple[Table, list[DataFile]]] = field(default_factory=list)
    rewrite: list[Table] = field(default_factory=list)
    rows: list[pa.Table] = field(default_factory=list)
    written: list[DataFile] = field(default_factory=list)
    written_for: tuple[int, int] | None = None

    def files_for(self, table: Table) -> list[DataFile]:
        """The data files to append to ``table`` (its current schema and spec)."""
        spec_id = table.metadata.default_spec_id
        shape = (table.metadata.current_schema_id, spec_id)
        if self.written_for != shape:
            self.discard(table)
            moved = [t for t, _ in self.by_reference if not _same_layout(t, table)]
            if moved:  # the target's schema or spec changed since staging was prepared
                self.by_reference = [(t, f) for t, f in self.by_reference if t not in moved]
                self.rewrite.extend(moved)
            self.written = _write_rows(table, self.rows, self.rewrite)
            self.written_for = shape
        files = []
        for _, staged in self.by_reference:
            for data_file in staged:
                data_file.spec_id = spec_id  # same fields as the staging spec (checked by _same_layout)
                files.append(data_file)
        return files + self.written

    def discard(self, table: Table) -> None:
        """Delete the files publish wrote itself (never the staged files taken by reference)."""
        for data_file in self.written:
            table.io.delete(data_file.file_path)
        self.written = []
        self.written_for = None


def staged_files(
    catalog: Catalog,
    staging: Iterable[str],
    table: Table,
    time_column: str,
    start: datetime,
    end: datetime,
    *,
    drop_until: datetime | None = None,
) -> _Staged:
    """The staging tables' data files to publish into ``table``, after checking that no staged
    row falls outside the window (only files whose metrics do not prove it are read, and only
    their ``time_column``).

    :param drop_until: staged rows in ``[end, drop_until)`` are left out rather than refused
        (see :func:`publish_window`).
    :raises KappaSinkError: for a missing staging table or staged rows outside the window.
    """
    from pyiceberg.exceptions import NoSuchTableError

    lo, hi = parse_timestamp(start, "window start"), parse_timestamp(end, "window end")
    owned = parse_timestamp(drop_until, "window owned end") if drop_until is not None and drop_until > hi else hi
    outside_filter = _outside(window_filter(table.schema(), time_column, lo, owned), time_column)
    dropped = window_filter(table.schema(), time_column, hi, owned) if owned > hi else None
    staged = _Staged()
    outside = 0
    for identifier in staging:
        try:
            source = catalog.load_table(identifier)
        except NoSuchTableError as e:
            raise KappaSinkError(f"staging table {identifier!r} does not exist in catalog {catalog.name!r}") from e
        if time_column not in source.schema().column_names:
            raise KappaSinkError(f"staging table {identifier!r} has no column {time_column!r}, unlike the target")
        for batch in table_batches(source, plan(source, outside_filter), columns=[time_column]):
            outside += batch.num_rows - int(_count_true(in_window_mask(batch, time_column, lo, owned)))
        if dropped is not None and _has_rows(source, dropped, time_column, hi, owned):
            schema = plain_schema(table)  # its rows in [start, end) only, written again as target files
            rows = source.scan(row_filter=window_filter(table.schema(), time_column, lo, hi)).to_arrow()
            staged.rows.append(rows.select(schema.names).cast(schema))
            continue
        tasks = plan(source)
        if any(task.delete_files for task in tasks) or not _same_layout(source, table):
            staged.rewrite.append(source)
        elif tasks:
            staged.by_reference.append((source, [task.file for task in tasks]))
    _refuse_outside(outside, time_column, lo, hi)
    return staged


def _has_rows(source: Table, row_filter: BooleanExpression, time_column: str, lo: datetime, hi: datetime) -> bool:
    """Whether ``source`` holds a row with ``time_column`` in ``[lo, hi)`` (files whose metrics
    exclude it are not read; the others, only their ``time_column``)."""
    for batch in table_batches(source, plan(source, row_filter), columns=[time_column]):
        if _count_true(in_window_mask(batch, time_column, lo, hi)):
            return True
    return False


def _outside(window: BooleanExpression, time_column: str) -> BooleanExpression:
    from pyiceberg.expressions import IsNull, Not, Or

    return Or(Not(window), IsNull(time_column))  # type: ignore[call-arg, arg-type]


def _count_true(mask: pa.Array | pa.ChunkedArray) -> int:
    import pyarrow.compute as pc

    return int(pc.sum(mask).as_py() or 0)


def _refuse_outside(outside: int, time_column: str, lo: datetime, hi: datetime) -> None:
    if outside:
        raise KappaSinkError(
            f"publish: {outside} staged row(s) have {time_column} outside the window "
            f"[{lo.isoformat()}, {hi.isoformat()}) or null; refusing to publish rows the window does not own"
        )


def _same_layout(staged: Table, target: Table) -> bool:
    """Whether ``staged``'s data files are files of ``target`` as they are: same format version,
    same schema with the same field ids, same partition fields as the target's default spec."""

    def spec(t: Table) -> list[tuple[int, str]]:
        return [(f.source_id, str(f.transform)) for f in t.spec().fields]

    return (
        staged.format_version == target.format_version
        and staged.schema().as_struct() == target.schema().as_struct()
        and spec(staged) == spec(target)
    )


def _commit_window(
    table: Table,
    staged: _Staged,
    time_column: str,
    start: datetime,
    end: datetime,
    *,
    max_attempts: int,
    snapshot_properties: Mapping[str, str] | None,
) -> PublishResult:
    from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException, ValidationException

    if max_attempts < 1:
        raise KappaSinkError(f"publish: max_attempts {max_attempts!r} must be at least 1")
    lo, hi = parse_timestamp(start, "window start"), parse_timestamp(end, "window end")
    row_filter = window_filter(table.schema(), time_column, lo, hi)
    props = {
        WINDOW_START_PROPERTY: lo.isoformat(),
        WINDOW_END_PROPERTY: hi.isoformat(),
        TIME_COLUMN_PROPERTY: time_column,
        **(snapshot_properties or {}),
    }
    publish_id = str(uuid.uuid4())
    props = {PUBLISH_ID_PROPERTY: publish_id, **props}
    last: Exception | None = None
    try:
        for attempt in range(1, max_attempts + 1):
            files = staged.files_for(table)
            for source, _ in staged.by_reference:
                mark_published(source, ".".join(table.name()))
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
            added = sum(f.record_count for f in files)
            return PublishResult(
                snapshot_id=None if snapshot is None else snapshot.snapshot_id,
                rows_deleted=_rows_deleted(table, publish_id, added),
                rows_added=added,
                attempts=attempt,
            )
    except BaseException as e:
        if not isinstance(e, CommitStateUnknownException):  # the files may be committed: keep them
            staged.discard(table)
        raise
    staged.discard(table)
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


_REWRITE_ROWS = 1_000_000


def _write_rows(table: Table, rows: list[pa.Table], rewrite: list[Table]) -> list[DataFile]:
    """Write ``rows`` and the rows of the ``rewrite`` staging tables (streamed, at most
    ``_REWRITE_ROWS`` rows held at a time) as data files of ``table``.

    pyiceberg has no public API that writes data files without committing them
    (``Transaction.append`` writes and commits in one step, so a retried publish would write
    the rows again and leave the files of every refused attempt behind); its private writer and
    schema check are used here (:mod:`airflow_provider_kappa.compat.pyiceberg`), only for rows that
    cannot go in by reference.
    """
    import pyarrow as pa

    schema = plain_schema(table)
    written: list[DataFile] = []

    def write(part: pa.Table) -> None:
        try:
            check_arrow_schema(table.schema(), part.schema, table.metadata.format_version)
        except ValueError as e:
            raise KappaSinkError(
                f"publish: staged rows do not match the schema of {'.'.join(table.name())}: {e}"
            ) from e
        written.extend(write_data_files(table.metadata, part, table.io))

    try:
        for part in rows:
            write(part)
        for source in rewrite:
            log.warning(
                "publish: staging table %s does not share the layout of %s (schema ids or partition spec changed): "
                "its rows are written again instead of committed by reference",
                ".".join(source.name()),
                ".".join(table.name()),
            )
            held: list[pa.RecordBatch] = []
            for batch in table_batches(source, plan(source)):
                try:
                    held.append(batch.select(schema.names).cast(schema))
                except (KeyError, ValueError, pa.ArrowInvalid) as e:
                    raise KappaSinkError(
                        f"staging table {'.'.join(source.name())!r} has schema {batch.schema}, which does not match the target's {schema}"
                    ) from e
                if sum(b.num_rows for b in held) >= _REWRITE_ROWS:
                    write(pa.Table.from_batches(held, schema))
                    held = []
            if held:
                write(pa.Table.from_batches(held, schema))
    except BaseException:
        for data_file in written:
            table.io.delete(data_file.file_path)
        raise
    return written


# --------------------------------------------------------------------------- the publish step


def publish(bf: Backfill, plan: BackfillPlan) -> dict[str, PublishResult]:
    """Replace every sink's window with its staged rows, one atomic Iceberg commit per sink, then
    release the backfill's lock on the targets.

    Before its commit, each target is checked to hold no other backfill's live lock over an
    overlapping window: two backfills never interleave their publishes.

    :param bf: the backfill.
    :param plan: the plan whose slices staged the rows.
    :returns: sink name -> result.
    :raises KappaConcurrencyError: another backfill holds an overlapping window of a target.
    """

    bf.store().touch_heartbeat()  # running: cleanup keeps it (until its publish commit, which is newer)
    p = bf.params
    end = closed_end(bf, pinned(plan))  # allow_open_end: only what the landed data closes
    results: dict[str, PublishResult] = {}

    def checked() -> None:
        for catalog, table in targets(bf):
            check_lock(load_target(bf, catalog, table), bf.id, p.start, p.end)

    def one(name: str) -> PublishResult:
        sink = bf.cfg.sinks[name]
        return publish_window(
            bf.catalog_for(sink.catalog),
            sink.table,
            staging_tables(bf, sink, plan),
            sink.time_column,
            p.start,
            end,
            snapshot_properties={"kappa.backfill-id": bf.id},
            drop_until=p.end if end < p.end else None,
        )

    try:
        retry_transient(checked, f"backfill {bf.id}: lock check before publish")
        for name in bf.cfg.sinks:  # a repeated publish of a sink commits the same window again
            log.info("sink %s: publishing [%s, %s)", name, p.start.isoformat(), end.isoformat())
            results[name] = retry_transient(lambda name=name: one(name), f"publish of sink {name}")  # type: ignore[misc]
            log.info("sink %s: published %s", name, results[name])
        released = retry_transient(lambda: release(bf), f"backfill {bf.id}: release of its lock")
    except Exception as e:
        cause = transient_cause(e)
        if cause is None:
            raise
        raise KappaCatalogUnavailableError(_publish_failure(bf, results, cause)) from e
    if released:
        log.info("backfill %s: released its lock on %s", bf.id, released)
    return results


def _publish_failure(bf: Backfill, results: Mapping[str, Any], cause: BaseException) -> str:
    """The one-line message of a publish stopped by a transient catalog or storage fault."""

    cause = root_transient_cause(cause) or cause
    left = [name for name in bf.cfg.sinks if name not in results]
    fault = f"backfill {bf.id}: publish stopped by a catalog fault that outlasted {RETRY_ATTEMPTS} attempts ({one_line(cause)})"
    if not left:
        return (
            f"{fault}: every sink was published, but its lock on the targets could not be released; "
            f"release it: {release_command(bf)}"
        )
    done = f"sink(s) {sorted(results)} published, " if results else ""
    return (
        f"{fault}; {done}sink(s) {left} not changed. The backfill keeps its lock on the targets for a rerun: run the "
        "same kappa backfill command again with --resume (or clear the publish task in Airflow) once the catalog is "
        f"free; to abandon the backfill instead, release the lock: {release_command(bf)}"
    )
