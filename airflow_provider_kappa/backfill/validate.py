"""Staged backfill output vs the target's current rows for a window: the validation report,
the publish gate (:func:`check_min_match`, :func:`check_gate`), :func:`validate_window` and the
backfill's validate step (:func:`validate`).

Both sides are read with pyiceberg for ``time_column`` in ``[start, end)`` and compared as
multisets of full rows (every column, nulls equal to nulls): a row value staged ``s`` times
and present ``t`` times in the target contributes ``min(s, t)`` matched rows.

``match_rate`` = matched rows / max(staged rows, target rows) * 100. When both sides are
empty it is 100.0 and ``empty`` is True (nothing to compare is not a disagreement, but a
caller may want to refuse it). No Spark, no Airflow.

Bounded memory (:func:`validate_window`): the window is never held by the worker. Both sides
are streamed in batches of at most ``batch_rows`` rows, one data file at a time
(:mod:`~airflow_provider_kappa.backfill.row_stream`), and each in-window row goes to the
hash-partitioned spill of :mod:`~airflow_provider_kappa.backfill.compare`, whose partitions
are compared one at a time with an exact pyarrow ``group_by`` over the full rows: the numbers
are those of one ``group_by`` over the whole window, and the differing rows of the samples are
real rows. Counts per hour, counts per output window
(:class:`~airflow_provider_kappa.backfill.compare.WindowCounts`) and rows outside the window
are summed batch by batch. Peak memory: a few batches, one partition and its ``group_by``,
whatever the window.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_provider_kappa.backfill.checks import closed_end
from airflow_provider_kappa.backfill.compare import (
    DEFAULT_PARTITION_BYTES,
    HourCounts,
    Spill,
    WindowCounter,
    WindowCounts,
    compare_grouped,
    grouped_tables,
    hour_counts,
    hourly_counts,
    jsonable,
    merge_hours,
    partition_count,
)
from airflow_provider_kappa.backfill.plan import BackfillPlan, null_ingestion_warnings, staging_tables
from airflow_provider_kappa.backfill.row_stream import DEFAULT_BATCH_ROWS, plain_schema, plan, table_batches
from airflow_provider_kappa.exceptions import KappaSinkError, KappaValidationError
from airflow_provider_kappa.timeaxis import format_duration_us
from airflow_provider_kappa.timeparse import parse_timestamp

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.catalog import Catalog
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.schema import Schema
    from pyiceberg.table import FileScanTask, Table

    from airflow_provider_kappa.backfill.backfill import Backfill


@dataclass
class ValidationReport:
    """The comparison of staged rows with the target's rows for one window.

    ``match_rate`` is a percentage: matched rows (multiset intersection) / max(staged_rows,
    target_rows) * 100; 100.0 with ``empty=True`` when both sides are empty.
    ``staged_outside_window`` counts staged rows outside ``[start, end)`` (publish refuses them).
    """

    target_table: str
    staging_tables: list[str]
    time_column: str
    window_start: str
    window_end: str
    staged_rows: int
    target_rows: int
    matched_rows: int
    match_rate: float
    empty: bool
    only_staged_rows: int
    only_target_rows: int
    staged_outside_window: int
    per_hour: list[HourCounts] = field(default_factory=list)
    only_staged_sample: list[dict[str, Any]] = field(default_factory=list)
    only_target_sample: list[dict[str, Any]] = field(default_factory=list)
    windows: WindowCounts | None = None
    #: notes on the backfill's input and window (rows of a source with a null ingestion time,
    #: which no slice reads; a window clipped by ``allow_open_end``), set by the validate step
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-safe Python values."""
        return jsonable(asdict(self))  # type: ignore[no-any-return]

    def to_json(self) -> str:
        """The report as JSON (for XCom, files and machines)."""
        return json.dumps(self.to_dict(), sort_keys=True)

    def to_text(self) -> str:
        """A short human report: counts, match rate, hours that differ, a few differing rows."""
        lines = [
            f"validation of {self.target_table} window [{self.window_start}, {self.window_end}) on {self.time_column}",
            f"  staged rows   {self.staged_rows:>10}   ({len(self.staging_tables)} staging table(s))",
            f"  target rows   {self.target_rows:>10}",
            f"  matched rows  {self.matched_rows:>10}",
            f"  match rate    {self.match_rate:>10.3f} %" + ("   (both sides empty)" if self.empty else ""),
            f"  only staged   {self.only_staged_rows:>10}",
            f"  only target   {self.only_target_rows:>10}",
        ]
        if self.staged_outside_window:
            lines.append(f"  staged rows outside the window: {self.staged_outside_window} (publish refuses them)")
        lines.extend(f"  warning: {w}" for w in self.warnings)
        differing = [h for h in self.per_hour if h.staged != h.target]
        lines.append(f"  hours: {len(self.per_hour)}, differing: {len(differing)}")
        for h in differing[:24]:
            lines.append(f"    {h.hour}  staged {h.staged:>8}  target {h.target:>8}  diff {h.staged - h.target:+d}")
        if self.windows is not None:
            w = self.windows
            kind = "output windows" if w.grid else "buckets"
            lines.append(
                f"  {kind} of {format_duration_us(w.step_seconds * 1e6)}: {len(w.staged)}, differing: {len(w.differing())}"
            )
        for title, rows in (("only in staged", self.only_staged_sample), ("only in target", self.only_target_sample)):
            if rows:
                lines.append(f"  sample {title}:")
                lines.extend(f"    {json.dumps(jsonable(r), sort_keys=True)}" for r in rows)
        return "\n".join(lines)


def check_min_match(report: ValidationReport, min_match: float) -> None:
    """The publish gate: raise unless the report's match rate reaches ``min_match``.

    :param report: the validation report of the window.
    :param min_match: the lowest acceptable match rate, in percent (0..100).
    :raises KappaValidationError: when ``report.match_rate < min_match``, with the numbers.
    """
    if not 0.0 <= min_match <= 100.0:
        raise KappaValidationError(f"min_match: {min_match!r} must be a percentage between 0 and 100")
    if report.match_rate < min_match:
        raise KappaValidationError(
            f"validation of {report.target_table} [{report.window_start}, {report.window_end}): match rate "
            f"{report.match_rate:.3f}% is below min_match {min_match}% (staged {report.staged_rows}, "
            f"target {report.target_rows}, matched {report.matched_rows}); the target was not changed"
        )


def window_filter(schema: Schema, time_column: str, start: datetime, end: datetime) -> BooleanExpression:
    """The pyiceberg row filter ``start <= time_column < end``.

    :param schema: the table's schema (decides how the bounds are written as literals).
    :param time_column: a ``timestamptz``, ``timestamp`` or ``date`` column.
    :param start: window start, offset-aware.
    :param end: window end, offset-aware, after ``start``.
    :raises KappaSinkError: if the column is missing or not a time column.
    """
    from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan
    from pyiceberg.types import DateType, TimestampType, TimestamptzType

    lo, hi = parse_timestamp(start, "window start"), parse_timestamp(end, "window end")
    if hi <= lo:
        raise KappaSinkError(f"window end {hi.isoformat()} must be after window start {lo.isoformat()}")
    found = schema.find_field(time_column) if time_column in schema.column_names else None
    if found is None:
        raise KappaSinkError(
            f"time_column {time_column!r} is not a column of the table; columns: {schema.column_names}"
        )
    ftype = found.field_type
    if isinstance(ftype, TimestamptzType):
        bounds = (lo.isoformat(), hi.isoformat())
    elif isinstance(ftype, TimestampType):
        bounds = (lo.replace(tzinfo=None).isoformat(), hi.replace(tzinfo=None).isoformat())
    elif isinstance(ftype, DateType):
        bounds = (lo.date().isoformat(), hi.date().isoformat())
    else:
        raise KappaSinkError(f"time_column {time_column!r} has type {ftype}; expected timestamptz, timestamp or date")
    # pyiceberg's predicates take (term, literal) positionally; their pydantic signature hides it from mypy
    lower = GreaterThanOrEqual(time_column, bounds[0])  # type: ignore[call-arg, arg-type]
    upper = LessThan(time_column, bounds[1])  # type: ignore[call-arg, arg-type]
    return And(lower, upper)


def read_window(table: Table, time_column: str, start: datetime, end: datetime) -> pa.Table:
    """Rows of ``table`` with ``time_column`` in ``[start, end)``, at its current snapshot.

    :param table: a pyiceberg table.
    :param time_column: the window column.
    :param start: window start (aware).
    :param end: window end (aware).
    """
    return table.scan(row_filter=window_filter(table.schema(), time_column, start, end)).to_arrow()


def in_window_mask(
    rows: pa.Table | pa.RecordBatch, time_column: str, start: datetime, end: datetime
) -> pa.ChunkedArray:
    """Boolean mask of ``rows`` whose ``time_column`` is in ``[start, end)`` (null is outside).

    :param rows: Arrow rows with a timestamp (with or without zone) or date ``time_column``.
    :param time_column: the window column.
    :param start: window start (aware).
    :param end: window end (aware).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    lo, hi = parse_timestamp(start, "window start"), parse_timestamp(end, "window end")
    column = rows[time_column]
    ctype = column.type
    if pa.types.is_timestamp(ctype):
        if ctype.tz is None:
            lo, hi = lo.replace(tzinfo=None), hi.replace(tzinfo=None)
        bounds = pa.scalar(lo, type=ctype), pa.scalar(hi, type=ctype)
    elif pa.types.is_date(ctype):
        bounds = pa.scalar(lo.date(), type=ctype), pa.scalar(hi.date(), type=ctype)
    else:
        raise KappaSinkError(f"time_column {time_column!r} has Arrow type {ctype}; expected a timestamp or date")
    mask = pc.and_(pc.greater_equal(column, bounds[0]), pc.less(column, bounds[1]))
    return pc.fill_null(mask, False)


def read_staged(
    catalog: Catalog, staging: Iterable[str], schema: pa.Schema, row_filter: BooleanExpression | None = None
) -> pa.Table:
    """The union of the staging tables' rows (optionally filtered), cast to ``schema``.

    :param catalog: the pyiceberg catalog.
    :param staging: staging table identifiers.
    :param schema: the target's Arrow schema (column order and types of the result).
    :param row_filter: a pyiceberg row filter, or None for every row.
    """
    import pyarrow as pa
    from pyiceberg.exceptions import NoSuchTableError
    from pyiceberg.expressions import AlwaysTrue

    parts = [schema.empty_table()]
    for identifier in staging:
        try:
            table = catalog.load_table(identifier)
        except NoSuchTableError as e:
            raise KappaSinkError(f"staging table {identifier!r} does not exist in catalog {catalog.name!r}") from e
        rows = table.scan(row_filter=row_filter or AlwaysTrue()).to_arrow()
        try:
            parts.append(rows.select(schema.names).cast(schema))
        except (KeyError, ValueError, pa.ArrowInvalid) as e:
            raise KappaSinkError(
                f"staging table {identifier!r} has schema {rows.schema}, which does not match the target's {schema}"
            ) from e
    return pa.concat_tables(parts)


def _report(
    *,
    target_table: str,
    staging: list[str],
    time_column: str,
    start: datetime,
    end: datetime,
    staged_rows: int,
    target_rows: int,
    compared: tuple[int, list[dict[str, Any]], list[dict[str, Any]], int, int],
    per_hour: list[HourCounts],
    staged_outside_window: int,
    windows: WindowCounts | None = None,
) -> ValidationReport:
    matched, only_s, only_t, n_only_s, n_only_t = compared
    denominator = max(staged_rows, target_rows)
    empty = denominator == 0
    return ValidationReport(
        target_table=target_table,
        staging_tables=list(staging),
        time_column=time_column,
        window_start=parse_timestamp(start, "window start").isoformat(),
        window_end=parse_timestamp(end, "window end").isoformat(),
        staged_rows=staged_rows,
        target_rows=target_rows,
        matched_rows=matched,
        match_rate=100.0 if empty else matched * 100.0 / denominator,
        empty=empty,
        only_staged_rows=n_only_s,
        only_target_rows=n_only_t,
        staged_outside_window=staged_outside_window,
        per_hour=per_hour,
        only_staged_sample=only_s,
        only_target_sample=only_t,
        windows=windows,
    )


def build_report(
    *,
    target_table: str,
    staging: list[str],
    time_column: str,
    start: datetime,
    end: datetime,
    staged: pa.Table,
    target: pa.Table,
    staged_outside_window: int = 0,
    sample: int = 5,
) -> ValidationReport:
    """A :class:`ValidationReport` from rows already read (both sides already windowed).

    :param target_table: target identifier (for the report).
    :param staging: staging identifiers (for the report).
    :param time_column: the window column.
    :param start: window start.
    :param end: window end.
    :param staged: staged rows in the window.
    :param target: target rows in the window, same columns as ``staged``.
    :param staged_outside_window: staged rows found outside the window.
    :param sample: how many differing rows to keep per side.
    """
    windows = WindowCounter(start, end)
    windows.add(staged, time_column, staged=True)
    windows.add(target, time_column, staged=False)
    grouped = grouped_tables(staged, target)
    if grouped is not None:
        windows.add_differences(grouped, time_column)
    return _report(
        target_table=target_table,
        staging=staging,
        time_column=time_column,
        start=start,
        end=end,
        staged_rows=staged.num_rows,
        target_rows=target.num_rows,
        compared=(0, [], [], 0, 0) if grouped is None else compare_grouped(grouped, sample),
        per_hour=hourly_counts(staged, target, time_column),
        staged_outside_window=staged_outside_window,
        windows=windows.result(),
    )


def validate_window(
    catalog: Catalog,
    target_table: str,
    staging: list[str],
    time_column: str,
    start: datetime,
    end: datetime,
    sample: int = 5,
    *,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    partition_bytes: int = DEFAULT_PARTITION_BYTES,
    spill_dir: str | Path | None = None,
) -> ValidationReport:
    """Compare a backfill's staged rows with the target's current rows for ``[start, end)``,
    with memory bounded whatever the window's size (see the module docstring).

    :param catalog: the pyiceberg catalog holding target and staging tables.
    :param target_table: the sink's target table.
    :param staging: the backfill's staging tables (see :func:`staging.staging_tables`).
    :param time_column: the sink's ``time_column``.
    :param start: window start (aware).
    :param end: window end (aware).
    :param sample: how many rows only in staged / only in target to include.
    :param batch_rows: the most rows read from a data file at a time.
    :param partition_bytes: about how many bytes of rows one compared partition holds.
    :param spill_dir: where the partitions are written (a temporary directory inside it,
        removed at the end); default: the system's temporary directory.
    :raises KappaSinkError: if a table is missing or a staging table does not match the target.
    """
    return _validate(
        catalog,
        target_table,
        staging,
        time_column,
        start,
        end,
        sample,
        batch_rows=batch_rows,
        partition_bytes=partition_bytes,
        spill_dir=spill_dir,
    )[0]


def _validate(
    catalog: Catalog,
    target_table: str,
    staging: list[str],
    time_column: str,
    start: datetime,
    end: datetime,
    sample: int,
    *,
    batch_rows: int,
    partition_bytes: int,
    spill_dir: str | Path | None,
) -> tuple[ValidationReport, Spill]:
    """:func:`validate_window`'s work; the spill is returned too (its sizes show the memory bound)."""
    from pyiceberg.exceptions import NoSuchTableError

    try:
        target = catalog.load_table(target_table)
    except NoSuchTableError as e:
        raise KappaSinkError(
            f"validate: target table {target_table!r} does not exist in catalog {catalog.name!r}"
        ) from e
    row_filter = window_filter(target.schema(), time_column, start, end)
    schema = plain_schema(target)
    target_tasks = plan(target, row_filter)
    staged_plans = _staged_plans(catalog, staging)
    planned = sum(t.file.record_count for t in target_tasks) + sum(
        t.file.record_count for *_, ts in staged_plans for t in ts
    )
    counts = {"staged": 0, "target": 0, "outside": 0}
    hours: dict[str, dict[str, int]] = {"staged": {}, "target": {}}
    windows = WindowCounter(start, end)

    def count_hours(side: str, rows: pa.RecordBatch) -> None:
        for h, n in hour_counts(rows, time_column).items():
            hours[side][h] = hours[side].get(h, 0) + n

    with tempfile.TemporaryDirectory(prefix="kappa-validate-", dir=spill_dir) as work:
        spill = Spill(Path(work), schema, partition_count(schema, planned, partition_bytes))
        for batch in table_batches(target, target_tasks, batch_rows=batch_rows):
            inside = batch.filter(in_window_mask(batch, time_column, start, end))
            counts["target"] += inside.num_rows
            count_hours("target", inside)
            windows.add(inside, time_column, staged=False)
            spill.add(inside, staged=False)
        for identifier, table, tasks in staged_plans:
            for batch in _as_target(identifier, table_batches(table, tasks, batch_rows=batch_rows), schema):
                inside = batch.filter(in_window_mask(batch, time_column, start, end))
                counts["staged"] += inside.num_rows
                counts["outside"] += batch.num_rows - inside.num_rows
                count_hours("staged", inside)
                windows.add(inside, time_column, staged=True)
                spill.add(inside, staged=True)
        matched = n_staged = n_target = 0
        only_s: list[dict[str, Any]] = []
        only_t: list[dict[str, Any]] = []
        for grouped in spill.grouped():
            m, s_rows, t_rows, n_s, n_t = compare_grouped(grouped, sample)
            windows.add_differences(grouped, time_column)
            matched, n_staged, n_target = matched + m, n_staged + n_s, n_target + n_t
            only_s.extend(s_rows[: sample - len(only_s)])
            only_t.extend(t_rows[: sample - len(only_t)])
    report = _report(
        target_table=target_table,
        staging=staging,
        time_column=time_column,
        start=start,
        end=end,
        staged_rows=counts["staged"],
        target_rows=counts["target"],
        compared=(matched, only_s, only_t, n_staged, n_target),
        per_hour=merge_hours(hours["staged"], hours["target"]),
        staged_outside_window=counts["outside"],
        windows=windows.result(),
    )
    return report, spill


def _staged_plans(catalog: Catalog, staging: Iterable[str]) -> list[tuple[str, Table, list[FileScanTask]]]:
    """Each staging table with the data files of its current snapshot (every row: staged rows
    outside the window are counted too)."""
    from pyiceberg.exceptions import NoSuchTableError

    staged_plans = []
    for identifier in staging:
        try:
            table = catalog.load_table(identifier)
        except NoSuchTableError as e:
            raise KappaSinkError(f"staging table {identifier!r} does not exist in catalog {catalog.name!r}") from e
        staged_plans.append((identifier, table, plan(table)))
    return staged_plans


def _as_target(identifier: str, batches: Iterable[pa.RecordBatch], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """A staging table's batches with the target's columns and types."""
    import pyarrow as pa

    for batch in batches:
        try:
            yield batch.select(schema.names).cast(schema)
        except (KeyError, ValueError, pa.ArrowInvalid) as e:
            raise KappaSinkError(
                f"staging table {identifier!r} has schema {batch.schema}, which does not match the target's {schema}"
            ) from e


# --------------------------------------------------------------------------- the validate step


def validate(bf: Backfill, plan: BackfillPlan) -> dict[str, ValidationReport]:
    """Compare every sink's staged rows with its target's current rows over the window (the
    callers then write the HTML report: :func:`airflow_provider_kappa.report.report.write_report`).

    :param bf: the backfill.
    :param plan: the plan whose slices staged the rows.
    :returns: sink name -> report.
    """
    bf.store().touch_heartbeat()  # running: cleanup keeps it
    end = closed_end(bf, pinned(plan))  # the part of the window published (see publish)
    reports = {
        name: validate_window(
            bf.catalog_for(sink.catalog),
            sink.table,
            staging_tables(bf, sink, plan),
            sink.time_column,
            bf.params.start,
            end,
        )
        for name, sink in bf.cfg.sinks.items()
    }
    notes = null_ingestion_warnings(bf, pinned(plan))  # rows no slice read (docs/source.md)
    if end < bf.params.end:
        notes.append(clipped_note(bf, end))
    for report in reports.values():
        report.warnings = [*report.warnings, *notes]
    return reports


def pinned(plan: BackfillPlan) -> dict[str, int]:
    """Concrete source name -> the snapshot id the plan's slices read.

    :param plan: the backfill's plan.
    """
    return dict(plan.slices[0].snapshot_ids) if plan.slices else {}


def clipped_note(bf: Backfill, end: datetime) -> str:
    """The warning of a window that ``allow_open_end`` clipped at ``end``.

    :param bf: the backfill.
    :param end: where the landed data closes the window (before ``bf.params.end``).
    """
    return (
        f"allow_open_end: end + tail lies past the landed data, which closes the window only up to "
        f"{end.isoformat()}: validated and published [{bf.params.start.isoformat()}, {end.isoformat()}); "
        f"staged rows from {end.isoformat()} on are not published, the target's rows in "
        f"[{end.isoformat()}, {bf.params.end.isoformat()}) are kept as they are"
    )


def check_gate(bf: Backfill, plan: BackfillPlan, reports: Mapping[str, ValidationReport]) -> None:
    """Refuse to go on when a sink's match rate is below ``min_match`` (unset: 100 for a ledger
    replay that does not publish, :meth:`~airflow_provider_kappa.backfill.params.BackfillParams.min_match_for`),
    or when a publish would replace a non-empty window of the target with nothing (say so rather
    than silently empty it).

    :param bf: the backfill.
    :param plan: its plan (whether it replays the live ledger).
    :param reports: from :func:`validate`.
    :raises KappaValidationError: naming the sink and the numbers.
    """
    min_match = bf.params.min_match_for(plan.replays_ledger)
    for name, report in reports.items():
        if min_match > 0:
            check_min_match(report, min_match)
        if report.staged_rows == 0 and report.target_rows > 0:
            raise KappaValidationError(
                f"sink {name}: the backfill staged no rows for [{report.window_start}, {report.window_end}) but "
                f"{report.target_table} holds {report.target_rows} there; refusing to replace the window with nothing "
                "(check the window and the source data)"
            )
