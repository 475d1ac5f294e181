"""The multiset row comparison behind validation: staged rows vs the target's, both already
windowed, compared as multisets of full rows (every column, nulls equal to nulls).

- Row keys and grouping: nested columns (struct/list/map) are compared as their JSON text
  (:func:`jsonable`); :func:`compare_rows` groups two in-memory tables and :func:`compare_grouped`
  reads matched rows, the excess of each side and samples off the grouped rows.
- The hash-partitioned spill (:class:`Spill`): each in-window row is hashed (all its columns)
  to one of ``P`` partitions and appended, with a staged/target marker, to that partition's
  Arrow IPC file in a temporary directory; ``P`` (:func:`partition_count`) is chosen from the
  planned row count so that one partition holds about ``partition_bytes``. Identical rows
  always land in the same partition, so the partitions are then compared one at a time with
  an exact pyarrow ``group_by`` over the full rows (hashes only route rows; equality is
  decided on the values).
- Counting: rows per hour (:func:`hour_counts`, :func:`hourly_counts`) and per output window
  (:class:`WindowCounter`, its result :class:`WindowCounts`), summed batch by batch.

Output windows: the distinct values of ``time_column`` are counted on both sides (a
streaming job's window starts lie on a grid: every 5 minutes, say); the grid step is the
greatest common divisor of their distances. When the values do not lie on a grid of at most
:data:`MAX_WINDOWS` cells over the window, or there are more than :data:`MAX_DISTINCT` of them,
rows are counted in round buckets instead (:func:`~airflow_provider_kappa.timeaxis.round_step`,
about :data:`BUCKETS` of them).

pyarrow, numpy and pandas are imported where they are used: importing this module loads none.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import date, datetime, time
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_provider_kappa.timeaxis import floor_to, round_step
from airflow_provider_kappa.timeparse import from_micros, parse_timestamp, to_micros

if TYPE_CHECKING:
    import pyarrow as pa

#: The marker columns of the spilled and grouped rows (1 on the staged or the target side).
_STAGED = "__kappa_staged"
_TARGET = "__kappa_target"
#: About how many bytes of rows one compared partition holds, by default.
DEFAULT_PARTITION_BYTES = 8 * 1024 * 1024
_MAX_PARTITIONS = 512
#: Most output windows a report keeps per sink (a week of 5-minute windows).
MAX_WINDOWS = 2016
#: Most distinct ``time_column`` values counted before falling back to round buckets.
MAX_DISTINCT = 20_000
#: About how many round buckets cover the window when its values lie on no usable grid.
BUCKETS = 144


@dataclass
class HourCounts:
    """Rows per hour of ``time_column`` on both sides."""

    hour: str
    staged: int
    target: int


@dataclass
class WindowCounts:
    """Rows per output window on both sides: ``staged[i]`` and ``target[i]`` rows have
    ``time_column`` in ``[first + i * step, first + (i + 1) * step)``; ``only_staged[i]`` and
    ``only_target[i]`` of them are on that side only (the multiset difference of that window:
    a window can differ with equal counts, a corrupted value say).

    ``grid`` is True when the step is the grid of the values themselves (each cell is one
    output window of the job), False when they were counted in round buckets.
    """

    first: str
    step_seconds: float
    grid: bool
    staged: list[int] = field(default_factory=list)
    target: list[int] = field(default_factory=list)
    only_staged: list[int] = field(default_factory=list)
    only_target: list[int] = field(default_factory=list)

    def differing(self) -> list[int]:
        """Indexes of the windows whose rows differ."""
        return [i for i, (s, t) in enumerate(zip(self.only_staged, self.only_target)) if s or t]


def jsonable(value: Any) -> Any:
    """``value`` with JSON-safe leaves: times as ISO text, decimals as text, bytes as hex.

    :param value: a Python value as pyarrow returns it (dicts and lists nested).
    """
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    return value


def _row_keys(table: pa.Table) -> pa.Table:
    """``table`` with nested columns (struct/list/map, not groupable) replaced by their JSON text."""
    import pyarrow as pa

    cols = []
    for _name, column in zip(table.column_names, table.columns):
        if pa.types.is_nested(column.type):
            text = [None if v is None else json.dumps(jsonable(v), sort_keys=True) for v in column.to_pylist()]
            cols.append(pa.array(text, pa.string()))
        else:
            cols.append(column)
    return pa.table(cols, names=table.column_names)


def _key_schema(schema: pa.Schema) -> pa.Schema:
    """The schema of :func:`_row_keys`'s result for rows of ``schema``."""
    import pyarrow as pa

    return pa.schema([pa.field(f.name, pa.string() if pa.types.is_nested(f.type) else f.type) for f in schema])


def compare_grouped(grouped: pa.Table, sample: int) -> tuple[int, list[dict[str, Any]], list[dict[str, Any]], int, int]:
    """Matched rows, samples and excess counts of a ``group_by(rows).aggregate(staged sum, target sum)``.

    :param grouped: the grouped rows with both sides' counts (``<marker>_sum`` columns).
    :param sample: how many differing rows to keep per side.
    :return: (matched rows, sample only in staged, sample only in target,
        rows only in staged, rows only in target).
    """
    import pyarrow.compute as pc

    s, t = grouped[f"{_STAGED}_sum"], grouped[f"{_TARGET}_sum"]
    matched = int(pc.sum(pc.min_element_wise(s, t)).as_py() or 0)
    excess_staged = pc.subtract(s, t)
    only_staged = grouped.filter(pc.greater(excess_staged, 0))
    only_target = grouped.filter(pc.less(excess_staged, 0))

    def sample_of(rows: pa.Table, mine: str, other: str) -> list[dict[str, Any]]:
        out = []
        for r in rows.slice(0, sample).to_pylist():
            extra = r.pop(f"{mine}_sum") - r.pop(f"{other}_sum")
            out.append({**r, "_count": extra})
        return out

    n_staged = int(pc.sum(pc.subtract(only_staged[f"{_STAGED}_sum"], only_staged[f"{_TARGET}_sum"])).as_py() or 0)
    n_target = int(pc.sum(pc.subtract(only_target[f"{_TARGET}_sum"], only_target[f"{_STAGED}_sum"])).as_py() or 0)
    return (
        matched,
        sample_of(only_staged, _STAGED, _TARGET),
        sample_of(only_target, _TARGET, _STAGED),
        n_staged,
        n_target,
    )


def _group(both: pa.Table) -> pa.Table:
    keys = [c for c in both.column_names if c not in (_STAGED, _TARGET)]
    return both.group_by(keys, use_threads=False).aggregate([(_STAGED, "sum"), (_TARGET, "sum")])


def compare_rows(
    staged: pa.Table, target: pa.Table, sample: int
) -> tuple[int, list[dict[str, Any]], list[dict[str, Any]], int, int]:
    """Multiset comparison of two tables with the same columns, both held in memory
    (:func:`~airflow_provider_kappa.backfill.validate.validate_window` streams instead).

    :param staged: the staged rows.
    :param target: the target's rows, same columns as ``staged``.
    :param sample: how many differing rows to keep per side.
    :return: (matched rows, sample only in staged, sample only in target,
        rows only in staged, rows only in target).
    """
    grouped = grouped_tables(staged, target)
    return (0, [], [], 0, 0) if grouped is None else compare_grouped(grouped, sample)


def grouped_tables(staged: pa.Table, target: pa.Table) -> pa.Table | None:
    """Both tables' rows grouped, with the count of each on both sides (None when both are empty).

    :param staged: the staged rows.
    :param target: the target's rows, same columns as ``staged``.
    """
    import pyarrow as pa

    left = _row_keys(staged).append_column(_STAGED, pa.repeat(1, staged.num_rows).cast(pa.int64()))
    left = left.append_column(_TARGET, pa.repeat(0, staged.num_rows).cast(pa.int64()))
    right = _row_keys(target).append_column(_STAGED, pa.repeat(0, target.num_rows).cast(pa.int64()))
    right = right.append_column(_TARGET, pa.repeat(1, target.num_rows).cast(pa.int64()))
    both = pa.concat_tables([left, right.cast(left.schema)])
    return None if both.num_rows == 0 else _group(both)


def hour_counts(rows: pa.Table | pa.RecordBatch, time_column: str) -> dict[str, int]:
    """Rows per hour of ``time_column`` (UTC; ISO text, ``null`` for a null value).

    :param rows: Arrow rows.
    :param time_column: a timestamp or date column of ``rows``.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if rows.num_rows == 0:
        return {}
    column = rows[time_column]
    if pa.types.is_date(column.type):
        column = column.cast(pa.timestamp("us"))
    hours = pa.table({"h": pc.floor_temporal(column, unit="hour")})
    counted = hours.group_by(["h"], use_threads=False).aggregate([([], "count_all")])
    out = {}
    for h, n in zip(counted["h"].to_pylist(), counted["count_all"].to_pylist()):
        out["null" if h is None else h.isoformat()] = int(n)
    return out


def merge_hours(s: dict[str, int], t: dict[str, int]) -> list[HourCounts]:
    """Both sides' counts per hour side by side, hours in order.

    :param s: staged rows per hour (:func:`hour_counts`).
    :param t: target rows per hour.
    """
    return [HourCounts(hour=h, staged=s.get(h, 0), target=t.get(h, 0)) for h in sorted(set(s) | set(t))]


def hourly_counts(staged: pa.Table, target: pa.Table, time_column: str) -> list[HourCounts]:
    """Rows per hour of ``time_column`` (UTC) on both sides, hours in order.

    :param staged: the staged rows.
    :param target: the target's rows.
    :param time_column: the window column.
    """
    return merge_hours(hour_counts(staged, time_column), hour_counts(target, time_column))


class WindowCounter:
    """Rows per distinct ``time_column`` value (epoch microseconds) on both sides, folded into
    round buckets once more than :data:`MAX_DISTINCT` values are seen (memory stays bounded)."""

    def __init__(self, start: datetime, end: datetime) -> None:
        self.lo = to_micros(parse_timestamp(start, "window start"))
        self.hi = to_micros(parse_timestamp(end, "window end"))
        self.bucket: int | None = None
        self.counts: dict[int, list[int]] = {}  # value -> [staged, target, only staged, only target]

    def add(self, rows: pa.Table | pa.RecordBatch, time_column: str, staged: bool) -> None:
        """Count ``rows`` (already windowed: no null ``time_column``) of one side."""
        import numpy as np

        if rows.num_rows == 0:
            return
        micros = _micros(rows[time_column])
        if self.bucket is None:
            values, counts = np.unique(micros, return_counts=True)
            if len(self.counts) + len(values) > MAX_DISTINCT:
                self._fold(round_step((self.hi - self.lo) / BUCKETS))
        if self.bucket is not None:
            values, counts = np.unique(micros // self.bucket * self.bucket, return_counts=True)
        side = 0 if staged else 1
        for value, n in zip(values.tolist(), counts.tolist()):
            self.counts.setdefault(int(value), [0, 0, 0, 0])[side] += int(n)

    def add_differences(self, grouped: pa.Table, time_column: str) -> None:
        """Count the rows on one side only, per window, from grouped rows with both sides' counts
        (their values were all counted by :meth:`add` before)."""
        import numpy as np

        excess = np.asarray(grouped[f"{_STAGED}_sum"].to_numpy(), dtype=np.int64) - np.asarray(
            grouped[f"{_TARGET}_sum"].to_numpy(), dtype=np.int64
        )
        differing = np.nonzero(excess)[0]
        if not len(differing):
            return
        micros = _micros(grouped[time_column].take(differing))
        if self.bucket is not None:
            micros = micros // self.bucket * self.bucket
        values, inverse = np.unique(micros, return_inverse=True)
        excess = excess[differing]
        only_staged = np.bincount(inverse, weights=np.maximum(excess, 0), minlength=len(values))
        only_target = np.bincount(inverse, weights=np.maximum(-excess, 0), minlength=len(values))
        for value, s, t in zip(values.tolist(), only_staged.tolist(), only_target.tolist()):
            cell = self.counts.setdefault(int(value), [0, 0, 0, 0])
            cell[2] += int(s)
            cell[3] += int(t)

    def _fold(self, bucket: int) -> None:
        self.bucket = bucket
        folded: dict[int, list[int]] = {}
        for value, sides in self.counts.items():
            cell = folded.setdefault(floor_to(value, bucket), [0, 0, 0, 0])
            for k, n in enumerate(sides):
                cell[k] += n
        self.counts = folded

    def result(self) -> WindowCounts:
        """The counts per window over the whole window ``[start, end)``, empty windows included."""
        values = sorted(self.counts)
        step, origin, grid = self.bucket, 0, False
        if step is None and len(values) >= 2:
            gcd = 0
            for v in values[1:]:
                gcd = math.gcd(gcd, v - values[0])
            if -(-(self.hi - self.lo) // gcd) <= MAX_WINDOWS:
                step, origin, grid = gcd, values[0], True
        if step is None:
            step = round_step((self.hi - self.lo) / BUCKETS)
            self._fold(step)
            values = sorted(self.counts)
        first = floor_to(self.lo, step, origin)
        if grid and first < self.lo:  # no value lies before lo: the grid's first cell inside the window
            first += step
        n = max(1, -(-(self.hi - first) // step))
        sides: list[list[int]] = [[0] * n for _ in range(4)]
        for v in values:
            i = (v - first) // step
            for k in range(4):
                sides[k][i] += self.counts[v][k]
        return WindowCounts(
            first=from_micros(first).isoformat(),
            step_seconds=step / 1e6,
            grid=grid,
            staged=sides[0],
            target=sides[1],
            only_staged=sides[2],
            only_target=sides[3],
        )


def _micros(column: pa.Array | pa.ChunkedArray) -> Any:
    """A timestamp or date column as int64 epoch microseconds (numpy)."""
    import numpy as np
    import pyarrow as pa

    if pa.types.is_date(column.type):
        column = column.cast(pa.timestamp("us"))
    return np.asarray(column.cast(pa.timestamp("us", tz=column.type.tz)).cast(pa.int64()).to_numpy(), dtype=np.int64)


class Spill:
    """Rows of both sides routed by a hash of the whole row to ``partitions`` Arrow IPC files.

    Each file holds the key columns (nested columns as JSON text) and two int64 markers (1 on the
    staged or the target side). ``largest_batch_rows`` / ``largest_partition_rows`` record
    the biggest pieces held in memory (what the memory bound rests on).
    """

    def __init__(self, directory: Path, schema: pa.Schema, partitions: int) -> None:
        import pyarrow as pa

        self.directory = directory
        self.keys = _key_schema(schema)
        self.schema = self.keys.append(pa.field(_STAGED, pa.int64())).append(pa.field(_TARGET, pa.int64()))
        self.partitions = partitions
        self.writers: dict[int, pa.ipc.RecordBatchStreamWriter] = {}
        self.largest_batch_rows = 0
        self.largest_partition_rows = 0

    def add(self, rows: pa.RecordBatch, staged: bool) -> None:
        """Route ``rows`` (already windowed) of one side to their partitions."""
        import pyarrow as pa

        n = rows.num_rows
        if n == 0:
            return
        self.largest_batch_rows = max(self.largest_batch_rows, n)
        keys = _row_keys(pa.Table.from_batches([rows])).cast(self.keys)
        ones, zeros = pa.repeat(1, n).cast(pa.int64()), pa.repeat(0, n).cast(pa.int64())
        keys = keys.append_column(_STAGED, ones if staged else zeros).append_column(_TARGET, zeros if staged else ones)
        if self.partitions == 1:
            self._write(0, keys)
            return
        import numpy as np

        ids = _partition_ids(keys.select(self.keys.names), self.partitions)
        order = np.argsort(ids, kind="stable")
        bounds = np.searchsorted(ids[order], np.arange(self.partitions + 1))
        routed = keys.take(pa.array(order))
        for p in range(self.partitions):
            if bounds[p + 1] > bounds[p]:
                self._write(p, routed.slice(int(bounds[p]), int(bounds[p + 1] - bounds[p])))

    def _write(self, partition: int, rows: pa.Table) -> None:
        import pyarrow as pa

        writer = self.writers.get(partition)
        if writer is None:
            # a piece is a batch's share of one partition, often a few dozen rows: compressing its
            # buffers on Arrow's thread pool costs ~5x the CPU of compressing them in this thread
            options = pa.ipc.IpcWriteOptions(compression="lz4", use_threads=False)
            writer = pa.ipc.new_stream(str(self.directory / f"p{partition:04d}.arrows"), self.schema, options=options)
            self.writers[partition] = writer
        writer.write_table(rows)

    def grouped(self) -> Iterator[pa.Table]:
        """Each partition's rows grouped: the keys with the sums of both markers."""
        import pyarrow as pa

        for writer in self.writers.values():
            writer.close()
        options = pa.ipc.IpcReadOptions(use_threads=False)  # many small pieces (see _write)
        for partition in sorted(self.writers):
            with pa.ipc.open_stream(str(self.directory / f"p{partition:04d}.arrows"), options=options) as reader:
                rows = reader.read_all()
            self.largest_partition_rows = max(self.largest_partition_rows, rows.num_rows)
            yield _group(rows)
            del rows


def _partition_ids(keys: pa.Table, partitions: int) -> Any:
    """A partition number per row, from a 64-bit hash of all its values (pandas' hash_pandas_object)."""
    import pandas as pd

    frame = keys.to_pandas(date_as_object=False, ignore_metadata=True)
    return pd.util.hash_pandas_object(frame, index=False).to_numpy() % partitions


def partition_count(schema: pa.Schema, rows: int, partition_bytes: int) -> int:
    """Enough partitions for ``rows`` rows of ``schema`` to give about ``partition_bytes`` each.

    :param schema: the rows' Arrow schema.
    :param rows: how many rows are planned (both sides).
    :param partition_bytes: about how many bytes one partition should hold.
    """
    import pyarrow as pa

    width = 16  # the two markers
    for f in _key_schema(schema):
        width += f.type.byte_width if pa.types.is_primitive(f.type) and f.type.bit_width >= 8 else 32
    return max(1, min(_MAX_PARTITIONS, math.ceil(rows * width / max(1, partition_bytes))))
