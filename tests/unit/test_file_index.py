"""Data files by ingestion bounds from manifest statistics, and the admission grid
(spark/source/file_index.py, grid.py, manifests.py, snapshots.py; real pyiceberg tables, no Spark)."""

from __future__ import annotations

import pickle
from datetime import timedelta
from typing import Any

import pytest
from lake import T0, append_events, create_events_table, event

from airflow_provider_kappa.exceptions import KappaSourceError
from airflow_provider_kappa.spark.source.file_index import FileSpan, SpanIndex
from airflow_provider_kappa.spark.source.grid import Presence, capped_batch_end, grid_batch_end
from airflow_provider_kappa.spark.source.manifests import added_files, file_spans, table_ingestion_range
from airflow_provider_kappa.spark.source.snapshots import snapshots_after
from airflow_provider_kappa.timeparse import to_micros

MIN = 60_000_000
HOUR = 60 * MIN
T0_US = to_micros(T0)


def _append(table: Any, minutes: list[int], first_id: int) -> None:
    append_events(table, [event(first_id + k, T0 + timedelta(minutes=m)) for k, m in enumerate(minutes)])


def _span(lo: int | None, hi: int | None, name: str = "f", rows: int = 10, size: int = 100) -> FileSpan:
    return FileSpan(name, "PARQUET", rows, size, lo, hi)


def test_file_spans_sorted_by_lower_bound_with_exact_bounds(catalog: Any) -> None:
    table = create_events_table(catalog, "raw.events")
    _append(table, [70, 80], 0)  # hour 1
    _append(table, [5, 10, 50], 10)  # hour 0, committed later with earlier ingestion
    spans = file_spans(table, None, "ingestion_ts", None, None)
    assert [(s.lower_micros, s.upper_micros) for s in spans] == [
        (T0_US + 5 * MIN, T0_US + 50 * MIN),
        (T0_US + 70 * MIN, T0_US + 80 * MIN),
    ]
    assert [s.record_count for s in spans] == [3, 2]
    assert all(s.file_format == "PARQUET" and s.file_size_in_bytes > 0 and not s.deletes for s in spans)
    assert table_ingestion_range(table, None, "ingestion_ts") == (T0_US + 5 * MIN, T0_US + 80 * MIN)


def test_file_spans_keeps_only_files_intersecting_the_range(catalog: Any) -> None:
    table = create_events_table(catalog, "raw.events")
    _append(table, [5, 10], 0)
    _append(table, [70, 80], 10)
    _append(table, [130, 140], 20)
    # [T0+10min, T0+70min): the first file (upper == start) and second (lower < end) intersect
    spans = file_spans(table, None, "ingestion_ts", T0_US + 10 * MIN, T0_US + 70 * MIN + 1)
    assert [s.lower_micros for s in spans] == [T0_US + 5 * MIN, T0_US + 70 * MIN]
    # end is exclusive: a file whose lower bound equals the end is out
    spans = file_spans(table, None, "ingestion_ts", T0_US + 11 * MIN, T0_US + 70 * MIN)
    assert spans == []


def test_file_spans_at_a_pinned_snapshot_ignores_later_commits(catalog: Any) -> None:
    table = create_events_table(catalog, "raw.events")
    _append(table, [5], 0)
    pinned = table.current_snapshot().snapshot_id
    _append(table, [6], 1)
    assert len(file_spans(table, pinned, "ingestion_ts", None, None)) == 1
    assert len(file_spans(table, None, "ingestion_ts", None, None)) == 2


def test_files_without_statistics_get_bounds_from_the_hour_partition(catalog: Any) -> None:
    table = create_events_table(catalog, "raw.events")
    with table.transaction() as tx:
        tx.set_properties({"write.metadata.metrics.default": "none"})
    _append(table, [5, 10], 0)
    (span,) = file_spans(table, None, "ingestion_ts", None, None)
    assert (span.lower_micros, span.upper_micros) == (T0_US, T0_US + HOUR - 1)


def test_files_without_statistics_on_an_unpartitioned_table_are_unknown(catalog: Any) -> None:
    from airflow_provider_kappa.demo.lake_schema import RAW_EVENTS_SCHEMA

    catalog.create_namespace_if_not_exists("raw")
    table = catalog.create_table(
        "raw.flat", schema=RAW_EVENTS_SCHEMA, properties={"write.metadata.metrics.default": "none"}
    )
    _append(table, [5, 300], 0)
    (span,) = file_spans(table, None, "ingestion_ts", T0_US + 100 * MIN, T0_US + 101 * MIN)
    assert span.lower_micros is None and span.upper_micros is None and not span.bounded
    # unknown bounds: present everywhere in the range, so no stretch is skipped
    presence = Presence([span], T0_US, T0_US + 10 * HOUR)
    assert presence.first_at_or_after(T0_US + 7 * HOUR) == T0_US + 7 * HOUR


def test_errors_name_table_snapshot_and_column(catalog: Any) -> None:
    table = create_events_table(catalog, "raw.events")
    _append(table, [5], 0)
    with pytest.raises(KappaSourceError, match=r"'raw.events': snapshot 42 does not exist"):
        file_spans(table, 42, "ingestion_ts", None, None)
    with pytest.raises(KappaSourceError, match=r"ingestion column 'landed_at' does not exist"):
        file_spans(table, None, "landed_at", None, None)
    with pytest.raises(KappaSourceError, match=r"ingestion column 'account_id' has type long; expected timestamptz"):
        file_spans(table, None, "account_id", None, None)


def test_snapshots_after_and_added_files_follow_commits(catalog: Any) -> None:
    table = create_events_table(catalog, "raw.events")
    _append(table, [5], 0)
    first = table.current_snapshot().snapshot_id
    _append(table, [70, 130], 1)
    _append(table, [1], 3)  # late: lower ingestion time, committed last
    chain = snapshots_after(table, first)
    assert [r.operation for r in chain] == ["append", "append"]
    assert [r.added_records for r in chain] == [2, 1]
    assert [r.added_files for r in chain] == [2, 1]
    files = added_files(table, [r.snapshot_id for r in chain], "ingestion_ts")
    assert [s.lower_micros for s in files] == [T0_US + 1 * MIN, T0_US + 70 * MIN, T0_US + 130 * MIN]
    assert len(snapshots_after(table, None)) == 3
    with pytest.raises(KappaSourceError, match="is not an ancestor"):
        snapshots_after(table, 12345)


def test_grid_batch_end_skips_empty_stretches_and_stays_on_the_grid() -> None:
    max_misalignment_threshold_micros = 15 * MIN
    presence = Presence(
        [_span(T0_US + 1 * MIN, T0_US + 20 * MIN), _span(T0_US + 5 * HOUR, T0_US + 5 * HOUR)], T0_US, T0_US + 6 * HOUR
    )
    assert grid_batch_end(T0_US, presence, max_misalignment_threshold_micros, T0_US + 6 * HOUR) == T0_US + 15 * MIN
    assert (
        grid_batch_end(T0_US + 15 * MIN, presence, max_misalignment_threshold_micros, T0_US + 6 * HOUR)
        == T0_US + 30 * MIN
    )
    # from 30min the next data is at 5h: one batch [30min, 5h15min)
    assert (
        grid_batch_end(T0_US + 30 * MIN, presence, max_misalignment_threshold_micros, T0_US + 6 * HOUR)
        == T0_US + 5 * HOUR + max_misalignment_threshold_micros
    )
    assert (
        grid_batch_end(
            T0_US + 5 * HOUR + max_misalignment_threshold_micros,
            presence,
            max_misalignment_threshold_micros,
            T0_US + 6 * HOUR,
        )
        is None
    )
    # the read end caps the last batch
    assert grid_batch_end(T0_US, presence, max_misalignment_threshold_micros, T0_US + 10 * MIN) == T0_US + 10 * MIN


def test_presence_is_the_clipped_union_of_spans() -> None:
    presence = Presence([_span(0, 10), _span(5, 20), _span(22, 30), _span(21, 21), _span(100, 200)], 0, 150)
    assert (presence.lowers, presence.uppers) == ([0, 100], [30, 149])
    assert presence.first_at_or_after(31) == 100
    assert presence.first_at_or_after(120) == 120


def test_span_index_between_matches_a_linear_scan() -> None:
    spans = [_span(i * 10, i * 10 + (25 if i % 7 == 0 else 5), f"f{i}") for i in range(200)]
    spans.append(_span(None, None, "unknown"))
    index = SpanIndex(spans)
    for start, end in [(0, 10), (33, 95), (1000, 1500), (1995, 3000), (5, 6)]:
        expected = {s.path for s in spans if s.intersects(start, end)}
        got = index.between(start, end)
        assert {s.path for s in got} == expected
        assert got[0].path == "unknown"


def test_capped_batch_end_admits_whole_files_in_lower_bound_order() -> None:
    a, b, c, d = _span(0, 100, "a"), _span(10, 20, "b"), _span(10, 15, "c"), _span(40, 50, "d")
    # one file per batch: a alone, then the batch ends where b and c start
    assert capped_batch_end([a, b, c, d], 0, 60, max_files=1) == 10
    # from 10, a (straddling) and b, c all start at 10: the group is admitted whole
    assert capped_batch_end([a, b, c, d], 10, 60, max_files=1) == 40
    assert capped_batch_end([a, b, c, d], 0, 60, max_files=3) == 40
    assert capped_batch_end([a, b, c, d], 0, 60, max_files=10) == 60
    assert capped_batch_end([a, b, c, d], 0, 60, max_rows=25) == 10
    assert capped_batch_end([a, b, c, d], 0, 60) == 60


def test_file_spans_are_small_and_picklable(catalog: Any) -> None:
    table = create_events_table(catalog, "raw.events")
    _append(table, [5, 70], 0)
    spans = file_spans(table, None, "ingestion_ts", None, None)
    assert pickle.loads(pickle.dumps(spans)) == spans


def test_a_process_reads_each_manifest_once_and_keeps_a_bounded_number_of_entries(
    catalog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checks, the plan and the first slice's file lists all ask for the same snapshot's files:
    each manifest file is read once per process (a manifest is never rewritten), the range is still
    applied to every answer, and at most ``CACHED_ENTRIES`` entries are kept."""
    from pyiceberg.manifest import ManifestFile

    import airflow_provider_kappa.spark.source.manifests as manifests

    table = create_events_table(catalog, "raw.events")
    _append(table, [5, 10], 0)
    _append(table, [70, 80], 10)
    _append(table, [130, 140], 20)
    reads: list[str] = []
    real = ManifestFile.fetch_manifest_entry

    def counted(self: ManifestFile, io: Any, discard_deleted: bool = True) -> Any:
        reads.append(self.manifest_path)
        return real(self, io, discard_deleted=discard_deleted)

    monkeypatch.setattr(ManifestFile, "fetch_manifest_entry", counted)
    every = file_spans(table, None, "ingestion_ts", None, None)
    assert len(every) == 3 and len(reads) == 3
    assert file_spans(table, None, "ingestion_ts", T0_US + 60 * MIN, T0_US + 120 * MIN) == every[1:2]
    assert table_ingestion_range(table, None, "ingestion_ts") == (T0_US + 5 * MIN, T0_US + 140 * MIN)
    assert len(reads) == 3  # answered from the entries read first
    monkeypatch.setattr(manifests, "CACHED_ENTRIES", 2)
    _append(table, [190], 30)
    assert len(file_spans(table, None, "ingestion_ts", None, None)) == 4  # the new manifest read
    assert len(reads) > 3
    # the least recently used manifests' entries dropped (pyiceberg reads manifests on threads, so which
    # ones were dropped, and how many the scan then read again, depends on their order)
    assert manifests._entries_count <= 2
