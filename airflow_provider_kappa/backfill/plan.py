"""The backfill plan: the read range cut into slices on an aligned grid, with per-slice
file/row/byte estimates from manifest statistics only (no data file is opened).

Grid: boundaries are multiples of ``slice`` from the Unix epoch, the same for every source.

- ``sequential``: the read range ``[start - warmup, end + tail)`` is cut on the grid; slice k
  reads its cell and owns the whole window ``[start, end)`` (state flows through one checkpoint).
- ``parallel``: the window ``[start, end)`` is cut on the grid; slice k reads
  ``[cell_start - warmup, cell_end + tail)`` and owns only its cell.

A plan is small and JSON-able (:meth:`BackfillPlan.to_dict`); its slices
(:meth:`SlicePlan.to_dict`) feed Airflow's dynamic task mapping. Pure Python except for the
``spans_of`` callable the caller passes (backed by :func:`airflow_provider_kappa.spark.source.manifests.file_spans`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from airflow_provider_kappa.backfill.exactness import Exactness, decide
from airflow_provider_kappa.backfill.params import PARALLEL, SEQUENTIAL, BackfillParams
from airflow_provider_kappa.exceptions import KappaSourceError
from airflow_provider_kappa.spark.catalog import load_table
from airflow_provider_kappa.spark.source.manifests import file_spans, null_ingestion_rows
from airflow_provider_kappa.timeparse import from_micros, parse_timestamp, to_micros

if TYPE_CHECKING:
    from airflow_provider_kappa.backfill.backfill import Backfill
    from airflow_provider_kappa.job.config import IcebergSinkConfig

#: A slice is "outsized" when its estimated rows exceed this many times the median slice.
OUTSIZED_FACTOR = 3.0


class Span(Protocol):
    """What the planner needs of a data file (``spark.source.file_index.FileSpan`` has it)."""

    @property
    def record_count(self) -> int: ...

    @property
    def file_size_in_bytes(self) -> int: ...

    @property
    def lower_micros(self) -> int | None: ...

    @property
    def upper_micros(self) -> int | None: ...


#: ``spans_of(source, start_micros, end_micros)``: data files of a source's pinned snapshot that may
#: hold ingestion times in ``[start_micros, end_micros)`` (``None`` = unbounded).
SpansOf = Callable[[str, "int | None", "int | None"], Sequence[Span]]


@dataclass(frozen=True)
class SourceStats:
    """Estimated input of one source in one slice.

    ``rows`` and ``bytes`` prorate each file by the share of its ingestion range inside the
    slice (files of unknown bounds count whole); ``files`` counts every file that may be read.
    """

    source: str
    files: int
    rows: int
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return {"source": self.source, "files": self.files, "rows": self.rows, "bytes": self.bytes}


@dataclass(frozen=True)
class SlicePlan:
    """One slice: what it reads (ingestion time) and owns (sink ``time_column``)."""

    backfill_id: str
    mode: str
    index: int
    count: int
    slice_id: str
    read_start: datetime
    read_end: datetime
    owns_start: datetime
    owns_end: datetime
    snapshot_ids: Mapping[str, int]
    stats: tuple[SourceStats, ...] = ()
    warnings: tuple[str, ...] = ()
    continued: bool = False
    """Sequential only: a later slice of the plan reads source data, so this slice's run must
    end like a live stream that goes on (without a final no-data micro-batch; see
    :func:`airflow_provider_kappa.engine.launch.slice_conf`)."""
    ledger_batches: int | None = None
    """The live batches the slice replays from the live ledger (their trigger times in its read
    range); ``None``: it does not replay the ledger (micro-batches aligned to the grid)."""

    @property
    def rows(self) -> int:
        """Estimated rows read, all sources."""
        return sum(s.rows for s in self.stats)

    @property
    def bytes(self) -> int:
        """Estimated bytes read, all sources."""
        return sum(s.bytes for s in self.stats)

    @property
    def files(self) -> int:
        """Data files that may be read, all sources."""
        return sum(s.files for s in self.stats)

    @property
    def label(self) -> str:
        """A short human label: ``s0002 [01:00, 02:00)``."""
        return f"{self.slice_id} [{self.read_start:%Y-%m-%d %H:%M}, {self.read_end:%Y-%m-%d %H:%M})"

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (an XCom value and a mapped task's argument)."""
        return {
            "backfill_id": self.backfill_id,
            "mode": self.mode,
            "index": self.index,
            "count": self.count,
            "slice_id": self.slice_id,
            "read_start": self.read_start.isoformat(),
            "read_end": self.read_end.isoformat(),
            "owns_start": self.owns_start.isoformat(),
            "owns_end": self.owns_end.isoformat(),
            "snapshot_ids": {k: int(v) for k, v in self.snapshot_ids.items()},
            "stats": [s.to_dict() for s in self.stats],
            "warnings": list(self.warnings),
            "continued": self.continued,
            "ledger_batches": self.ledger_batches,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SlicePlan:
        """Inverse of :meth:`to_dict`.

        :param data: a dict made by :meth:`to_dict`.
        :raises KappaSourceError: a malformed slice (names the missing key).
        """
        try:
            return cls(
                backfill_id=str(data["backfill_id"]),
                mode=str(data["mode"]),
                index=int(data["index"]),
                count=int(data["count"]),
                slice_id=str(data["slice_id"]),
                read_start=parse_timestamp(data["read_start"], "slice.read_start"),
                read_end=parse_timestamp(data["read_end"], "slice.read_end"),
                owns_start=parse_timestamp(data["owns_start"], "slice.owns_start"),
                owns_end=parse_timestamp(data["owns_end"], "slice.owns_end"),
                snapshot_ids={str(k): int(v) for k, v in data["snapshot_ids"].items()},
                stats=tuple(SourceStats(**s) for s in data.get("stats", [])),
                warnings=tuple(data.get("warnings", [])),
                continued=bool(data.get("continued", False)),
                ledger_batches=None if data.get("ledger_batches") is None else int(data["ledger_batches"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise KappaSourceError(f"slice plan: {dict(data)!r} is malformed ({type(e).__name__}: {e})") from e


@dataclass(frozen=True)
class BackfillPlan:
    """Every slice of one backfill, in order, and plan-level warnings."""

    backfill_id: str
    mode: str
    slices: tuple[SlicePlan, ...]
    warnings: tuple[str, ...] = field(default_factory=tuple)
    exactness: Exactness | None = None
    """Live's batches replayed from the ledger, or aligned to the grid (set by the plan step)."""
    data_last_micros: int | None = field(default=None, compare=False)
    """The last landed ingestion time in the range read, from manifest statistics (``None``:
    unknown); not kept in :meth:`to_dict`."""

    @property
    def rows(self) -> int:
        """Estimated rows read over all slices (parallel slices overlap by warmup + tail)."""
        return sum(s.rows for s in self.slices)

    def to_text(self) -> str:
        """The slice table as plain text (task logs)."""
        lines = [f"backfill {self.backfill_id}: {len(self.slices)} {self.mode} slice(s), ~{self.rows} rows"]
        for s in self.slices:
            per_source = ", ".join(f"{x.source} {x.files} files/~{x.rows} rows/~{x.bytes} B" for x in s.stats)
            lines.append(
                f"  {s.slice_id}  read [{s.read_start.isoformat()}, {s.read_end.isoformat()})  "
                f"owns [{s.owns_start.isoformat()}, {s.owns_end.isoformat()})  {per_source}"
                + "".join(f"  WARNING {w}" for w in s.warnings)
            )
        lines.extend(f"  WARNING {w}" for w in self.warnings)
        if self.exactness is not None:
            lines.append(f"  exactness: {self.exactness.statement}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return {
            "backfill_id": self.backfill_id,
            "mode": self.mode,
            "slices": [s.to_dict() for s in self.slices],
            "warnings": list(self.warnings),
            "exactness": None if self.exactness is None else self.exactness.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BackfillPlan:
        """Inverse of :meth:`to_dict`."""
        exactness = data.get("exactness")
        return cls(
            backfill_id=str(data["backfill_id"]),
            mode=str(data["mode"]),
            slices=tuple(SlicePlan.from_dict(s) for s in data["slices"]),
            warnings=tuple(data.get("warnings", [])),
            exactness=None if exactness is None else Exactness.from_dict(exactness),
        )

    @property
    def replays_ledger(self) -> bool:
        """Whether the slices replay the live ledger (the DAG's tasks get the slices alone)."""
        return any(s.ledger_batches is not None for s in self.slices)

    @property
    def exactness_line(self) -> str:
        """How exact to expect the backfill, in one line (the plan step's statement when known)."""
        if self.exactness is not None:
            return self.exactness.statement
        if self.replays_ledger:
            return f"live ledger replayed: {sum(s.ledger_batches or 0 for s in self.slices)} live batch(es)"
        return "micro-batches aligned to the ingestion grid (the live ledger is not replayed)"


def aligned_grid(range_start: datetime, range_end: datetime, step: timedelta) -> list[tuple[datetime, datetime]]:
    """Cut ``[range_start, range_end)`` at multiples of ``step`` from the Unix epoch.

    The first and last cells are clipped to the range, so every cell is non-empty.

    :param range_start: aware start (inclusive).
    :param range_end: aware end (exclusive), after ``range_start``.
    :param step: positive cell length.
    """
    lo, hi = to_micros(range_start), to_micros(range_end)
    size = round(step.total_seconds() * 1_000_000)
    if size <= 0 or hi <= lo:
        raise ValueError(f"aligned_grid: range [{range_start}, {range_end}) / step {step} is empty")
    cells = []
    boundary = (lo // size) * size
    while boundary < hi:
        cells.append((from_micros(max(boundary, lo)), from_micros(min(boundary + size, hi))))
        boundary += size
    return cells


def slice_count(params: BackfillParams) -> int:
    """How many slices :func:`slice_bounds` gives, computed without building them.

    :param params: validated backfill parameters.
    """
    size = round(params.slice.total_seconds() * 1_000_000)
    if params.mode == PARALLEL:
        lo, hi = to_micros(params.start), to_micros(params.end)
    else:
        lo, hi = to_micros(params.read_start), to_micros(params.read_end)
    return -(-hi // size) - lo // size


def slice_bounds(params: BackfillParams) -> list[tuple[datetime, datetime, datetime, datetime]]:
    """``(read_start, read_end, owns_start, owns_end)`` of every slice, in order.

    :param params: validated backfill parameters.
    """
    if params.mode == PARALLEL:
        return [
            (cs - params.warmup, ce + params.tail, cs, ce)
            for cs, ce in aligned_grid(params.start, params.end, params.slice)
        ]
    return [
        (cs, ce, params.start, params.end) for cs, ce in aligned_grid(params.read_start, params.read_end, params.slice)
    ]


def slice_id(index: int, count: int) -> str:
    """The id of slice ``index`` of ``count``: ``s0000``, ``s0001``, … (sortable)."""
    return f"s{index:0{max(4, len(str(count - 1)))}d}"


def _estimate(spans: Sequence[Span], lo: int, hi: int) -> tuple[int, float, float]:
    files, rows, size = 0, 0.0, 0.0
    for s in spans:
        if s.lower_micros is not None and s.lower_micros >= hi:
            continue
        if s.upper_micros is not None and s.upper_micros < lo:
            continue
        files += 1
        if s.lower_micros is None or s.upper_micros is None:
            share = 1.0
        else:
            width = s.upper_micros - s.lower_micros + 1
            inside = min(s.upper_micros + 1, hi) - max(s.lower_micros, lo)
            share = max(0.0, min(1.0, inside / width))
        rows += s.record_count * share
        size += s.file_size_in_bytes * share
    return files, rows, size


def _extent(spans: Sequence[Span]) -> str:
    if not spans:
        return "no data files"
    lowers = [s.lower_micros for s in spans if s.lower_micros is not None]
    uppers = [s.upper_micros for s in spans if s.upper_micros is not None]
    if not lowers or not uppers:
        return f"{len(spans)} data file(s) without ingestion statistics"
    return f"data from {from_micros(min(lowers)).isoformat()} to {from_micros(max(uppers)).isoformat()}"


def plan_backfill(
    params: BackfillParams,
    backfill_id: str,
    snapshot_ids: Mapping[str, int],
    sources: Mapping[str, str],
    spans_of: SpansOf,
) -> BackfillPlan:
    """Plan a backfill from manifest statistics.

    :param params: validated backfill parameters.
    :param backfill_id: the backfill's id (see :func:`airflow_provider_kappa.backfill.params.backfill_id`).
    :param snapshot_ids: concrete iceberg source name -> pinned snapshot id.
    :param sources: job source name -> concrete iceberg source name, for the sources read.
    :param spans_of: data files of a concrete source in an ingestion range (manifests only).
    :raises KappaSourceError: when no source has any data in the range read (the window is
        outside the tables' data), naming each table's data extent.
    """
    bounds = slice_bounds(params)
    lo_all = to_micros(min(b[0] for b in bounds))
    hi_all = to_micros(max(b[1] for b in bounds))
    spans = {name: list(spans_of(concrete, lo_all, hi_all)) for name, concrete in sources.items()}
    if not any(spans.values()):
        extents = "; ".join(f"{name}: {_extent(spans_of(concrete, None, None))}" for name, concrete in sources.items())
        raise KappaSourceError(
            f"backfill window [{params.start.isoformat()}, {params.end.isoformat()}) is outside the tables' data: "
            f"no source has rows ingested in [{from_micros(lo_all).isoformat()}, {from_micros(hi_all).isoformat()}) "
            f"at the pinned snapshots ({extents}); nothing would be published"
        )
    count = len(bounds)
    slices = []
    for index, (rs, re_, os_, oe) in enumerate(bounds):
        stats = []
        for name in sources:
            files, rows, size = _estimate(spans[name], to_micros(rs), to_micros(re_))
            stats.append(SourceStats(name, files, round(rows), round(size)))
        warnings = []
        if all(s.files == 0 for s in stats):
            warnings.append("no source data in this slice: it only advances the watermark")
        else:
            warnings.extend(f"source {s.source} has no data in this slice" for s in stats if s.files == 0)
        slices.append(
            SlicePlan(
                backfill_id=backfill_id,
                mode=params.mode,
                index=index,
                count=count,
                slice_id=slice_id(index, count),
                read_start=rs,
                read_end=re_,
                owns_start=os_,
                owns_end=oe,
                snapshot_ids=dict(snapshot_ids),
                stats=tuple(stats),
                warnings=tuple(warnings),
            )
        )
    _mark_continued(params, slices)
    sized = [s.rows for s in slices if s.rows > 0]
    plan_warnings = []
    if len(sized) >= 2:
        median = statistics.median(sized)
        for i, s in enumerate(slices):
            if median > 0 and s.rows > OUTSIZED_FACTOR * median:
                note = f"outsized: ~{s.rows} rows, {s.rows / median:.1f}x the median slice ({median:.0f}); consider a smaller slice"
                slices[i] = SlicePlan(**{**s.__dict__, "warnings": s.warnings + (note,)})
    empty = sum(1 for s in slices if s.files == 0)
    if empty:
        plan_warnings.append(f"{empty} of {count} slice(s) have no source data")
    for name, found in spans.items():
        if not found:
            plan_warnings.append(f"source {name} has no data in the range read")
    uppers = [x.upper_micros for found in spans.values() for x in found]
    last = None if None in uppers or not uppers else min(hi_all - 1, max(u for u in uppers if u is not None))
    return BackfillPlan(backfill_id, params.mode, tuple(slices), tuple(plan_warnings), data_last_micros=last)


def _mark_continued(params: BackfillParams, slices: list[SlicePlan]) -> None:
    """Sequential: mark each slice followed by a slice that runs (see :attr:`SlicePlan.continued`)."""
    if params.mode == SEQUENTIAL:
        for i, s in enumerate(slices):
            later = any(not slice_is_empty(t) for t in slices[i + 1 :])
            slices[i] = replace(s, continued=later)


def slice_is_empty(sp: SlicePlan) -> bool:
    """Whether no source has a data file that may hold rows in ``sp``'s read range (from the
    plan's manifest statistics; a file without ingestion bounds counts as possibly holding rows),
    and the slice replays no live batch (a no-data batch of live's still closes windows)."""
    return bool(sp.stats) and all(s.files == 0 for s in sp.stats) and not sp.ledger_batches


def staging_tables(bf: Backfill, sink: IcebergSinkConfig, plan: BackfillPlan) -> list[str]:
    """Staging tables of ``sink`` for every slice of ``plan`` that reads data, in slice order
    (an empty slice creates none: validate and publish count it as zero rows).

    :param bf: the backfill.
    :param sink: one of its sinks.
    :param plan: its plan.
    """
    return [bf.staging_table(sink, s.slice_id) for s in plan.slices if not slice_is_empty(s)]


# --------------------------------------------------------------------------- the plan step


def spans_loader(bf: Backfill, snapshot_ids: Mapping[str, int]) -> Callable[[str, int | None, int | None], list[Any]]:
    """``spans_of(concrete_source, start_micros, end_micros)`` for the planner, from manifests.

    :param bf: the backfill.
    :param snapshot_ids: concrete source name -> pinned snapshot id.
    """

    concrete = {src.name: src for src in bf.sources().values()}

    def spans_of(name: str, start: int | None, end: int | None) -> list[Any]:
        src = concrete[name]
        table = load_table(bf.catalog_for(src.catalog), src.table)
        return file_spans(table, snapshot_ids.get(name), src.ingestion_column, start, end)

    return spans_of


def plan(bf: Backfill, snapshot_ids: Mapping[str, int], *, pin: bool = False) -> BackfillPlan:
    """Cut the backfill into slices, estimate each from manifests, and decide whether they replay
    the live ledger (:func:`~airflow_provider_kappa.backfill.exactness.decide`; then each slice
    counts the live batches it replays).

    :param bf: the backfill.
    :param snapshot_ids: from :func:`~airflow_provider_kappa.backfill.snapshot.snapshot`.
    :param pin: pin the ledger choice in the backfill's folder (the backfill's plan step; ``kappa
        plan`` writes nothing).

    A plan made without ``pin`` (the ledger replay's pre-flight,
    :func:`~airflow_provider_kappa.backfill.landed_counts.check_replay_landed`) is kept on ``bf``: a
    plan at the same snapshots takes it instead of planning again (and of reading the ledger again:
    the slices replay the batches the pre-flight checked).
    """
    key = tuple(sorted(snapshot_ids.items()))
    earlier = bf.plans.get(key)
    if earlier is not None and (not pin or _pin_earlier(bf, earlier)):
        return earlier
    sources = {name: src.name for name, src in bf.sources().items()}
    missing = sorted(set(sources.values()) - set(snapshot_ids))
    if missing:
        raise KappaSourceError(f"plan: no pinned snapshot for source(s) {missing}; got {dict(snapshot_ids)}")
    planned = plan_backfill(bf.params, bf.id, snapshot_ids, sources, spans_loader(bf, snapshot_ids))
    exactness, book = decide(bf, planned.data_last_micros, pin=pin)
    if pin:
        bf.store().record_exactness(exactness.to_dict())
    slices = list(planned.slices)
    if book is not None:
        ms = [(to_micros(s.read_start) // 1000, to_micros(s.read_end) // 1000) for s in slices]
        slices = [replace(s, ledger_batches=book.count(lo, hi)) for s, (lo, hi) in zip(slices, ms)]
        _mark_continued(bf.params, slices)
    warnings = planned.warnings + tuple(null_ingestion_warnings(bf, snapshot_ids))
    made = replace(planned, slices=tuple(slices), warnings=warnings, exactness=exactness)
    if not pin:
        bf.plans[key] = made  # the pre-flight's plan: the plan step at the same snapshots takes it
    return made


def _pin_earlier(bf: Backfill, earlier: BackfillPlan) -> bool:
    """Pin the ledger choice of a plan made without pinning (the pre-flight's, at the snapshots the
    plan step pins) and record its exactness, as :func:`plan` with ``pin`` would; ``False`` (nothing
    recorded) when an earlier run pinned another choice: the plan step then plans anew."""
    if earlier.exactness is None:
        return False
    start_ms = to_micros(bf.params.read_start) // 1000
    chosen = bf.store().pin("ledger", {"ledger": earlier.exactness.ledger, "from_ms": start_ms})["ledger"]
    if chosen != earlier.exactness.ledger:
        return False
    bf.store().record_exactness(earlier.exactness.to_dict())
    return True


def null_ingestion_warnings(bf: Backfill, snapshot_ids: Mapping[str, int]) -> list[str]:
    """One warning per source table holding rows with a null ingestion column at its pinned
    snapshot (or without the statistic to tell): no slice reads such rows (docs/source.md).

    :param bf: the backfill.
    :param snapshot_ids: concrete source name -> pinned snapshot id.
    """

    out = []
    for src in {s.name: s for s in bf.sources().values()}.values():
        table = load_table(bf.catalog_for(src.catalog), src.table)
        nulls = null_ingestion_rows(table, snapshot_ids.get(src.name), src.ingestion_column)
        if nulls is None:
            out.append(
                f"source {src.name}: some data files of {src.table} have no null count for {src.ingestion_column}; "
                "rows with a null ingestion time, if any, are not read"
            )
        elif nulls:
            out.append(
                f"source {src.name}: {nulls} row(s) of {src.table} have a null {src.ingestion_column}; "
                "no slice reads them (a row without an ingestion time belongs to no slice)"
            )
    return out
