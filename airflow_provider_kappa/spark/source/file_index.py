"""Data files by ingestion time: :class:`FileSpan` and lookups over spans. Pure Python.

A :class:`FileSpan` is one live data file with the closed range ``[lower_micros, upper_micros]``
of its ingestion column, read from the manifest's column statistics (``lower_bounds`` /
``upper_bounds``, see :mod:`.manifests`). When a file has no statistics for the column, its bounds
are derived from its partition value if the table is partitioned by a time transform of the
column (identity, hour, day, month, year); otherwise they are *unknown* (``None``): such a file
is treated as possibly holding rows at any time, so it is read by every batch and filtered row
by row. :func:`span_to_list` / :func:`span_from_list` are a span's JSON form (:mod:`.file_list`).
"""

from __future__ import annotations

import base64
import bisect
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any

from airflow_provider_kappa.exceptions import KappaSourceError


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


def spans_range(spans: Iterable[FileSpan]) -> tuple[int, int] | None:
    """``(min lower, max upper)`` over spans with known bounds, ``None`` if there is none."""
    known = [(s.lower_micros, s.upper_micros) for s in spans if s.bounded]
    if not known:
        return None
    return min(lo for lo, _ in known if lo is not None), max(hi for _, hi in known if hi is not None)


def spans_between(spans: Iterable[FileSpan], start_micros: int | None, end_micros: int | None) -> list[FileSpan]:
    """The spans that may hold rows in ``[start_micros, end_micros)``, in the given order."""
    return [s for s in spans if s.intersects(start_micros, end_micros)]


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


def span_to_list(s: FileSpan) -> list[Any]:
    """``s`` as a JSON list (partition values of non-JSON types are tagged)."""
    return [
        s.path,
        s.file_format,
        s.record_count,
        s.file_size_in_bytes,
        s.lower_micros,
        s.upper_micros,
        s.spec_id,
        [_encode(v) for v in s.partition],
        [[d.path, d.file_format] for d in s.deletes],
    ]


def span_from_list(item: Sequence[Any]) -> FileSpan:
    """The inverse of :func:`span_to_list`."""
    path, fmt, records, size, lo, hi, spec_id, partition, deletes = item
    return FileSpan(
        path=path,
        file_format=fmt,
        record_count=int(records),
        file_size_in_bytes=int(size),
        lower_micros=lo,
        upper_micros=hi,
        spec_id=int(spec_id),
        partition=tuple(_decode(v) for v in partition),
        deletes=tuple(DeleteRef(p, f) for p, f in deletes),
    )


_TAGS: dict[str, Any] = {
    "bytes": (bytes, lambda v: base64.b64encode(v).decode(), base64.b64decode),
    "decimal": (Decimal, str, Decimal),
    "uuid": (uuid.UUID, str, uuid.UUID),
    "datetime": (datetime, datetime.isoformat, datetime.fromisoformat),
    "date": (date, date.isoformat, date.fromisoformat),
    "time": (time, time.isoformat, time.fromisoformat),
}


def _encode(value: Any) -> Any:
    """A partition value as JSON: primitives as they are, others as ``{"$<type>": text}``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    for tag, (cls, dump, _) in _TAGS.items():  # datetime before date: a datetime is a date
        if isinstance(value, cls):
            return {f"${tag}": dump(value)}
    raise KappaSourceError(f"partition value {value!r} of type {type(value).__name__} cannot be kept in a file list")


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        ((key, text),) = value.items()
        return _TAGS[key[1:]][2](text)
    return value
