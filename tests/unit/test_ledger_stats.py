"""The live ledger's record statistics (``spark/ledger_stats.py``) and the placement of entries by
their data (``Ledger.placement``): a backlog live caught up at one wall-clock instant lands in the
slices its records belong to. Real ledger folders and checkpoints as Spark writes them; no Spark."""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest
from pyspark.sql import Row

from airflow_provider_kappa.exceptions import KappaSinkError
from airflow_provider_kappa.spark.ledger import Ledger, LedgerEntry, compact, record_batch
from airflow_provider_kappa.spark.ledger_stats import (
    MAX_PARTITIONS,
    LedgerStats,
    add_stats,
    entry_with_stats,
    merge_observations,
)

QUERY = "5f0c6a2e-0000-4000-8000-000000000002"
MIN = 60_000
HOUR = 60 * MIN
T0 = 1_767_225_600_000  # 2026-01-01T00:00Z


def key(topic: str, partition: int) -> float:
    """The observation's number for a topic partition (as Spark's ``crc32`` computes it)."""
    return float(zlib.crc32(topic.encode()) * MAX_PARTITIONS + partition)


def stats_entry(
    batch: int, trigger_ms: int, first_ms: int | None, last_ms: int | None, n: int, offset: int
) -> LedgerEntry:
    """A version 2 entry reading ``n`` records of partition 0 of topic ``t`` from ``offset``."""
    return LedgerEntry(
        QUERY,
        batch,
        trigger_ms,
        None,
        0,
        {"t": {0: (offset, offset + n)}},
        first_record_ms=first_ms,
        last_record_ms=last_ms,
        counts={"t": {0: n}},
        source_rows={"KafkaV2[Subscribe[t]]": n},
    )


def write(folder: Path, *entries: LedgerEntry) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for e in entries:
        (folder / e.name).write_text(e.to_json())


def test_observations_become_the_entry_s_counts_and_record_time_range(tmp_path: Path) -> None:
    """Two Kafka sources of one query, a transactional partition (offsets 10..20 hold 8 records: two
    markers), a partition with no record read: counted 0."""
    entry = LedgerEntry(QUERY, 3, T0, T0 - 10_000, 5, {"a": {0: (10, 20), 1: (4, 4)}, "b": {2: (0, 3)}})
    observations = [
        {"first_ms": T0 - 9_000, "last_ms": T0 - 2_000, "records": 8, "partitions": [{"x": key("a", 0), "y": 8.0}]},
        {"first_ms": T0 - 12_000, "last_ms": T0 - 5_000, "records": 3, "partitions": [{"x": key("b", 2), "y": 3.0}]},
        {"first_ms": None, "last_ms": None, "records": 0, "partitions": None},
    ]
    first, last, by_key = merge_observations(observations)
    assert merge_observations([*observations, observations[0]]) == (first, last, by_key)  # topic a read twice
    assert (first, last) == (T0 - 12_000, T0 - 2_000)
    full = entry_with_stats(entry, first, last, by_key, {"KafkaV2[Subscribe[a]]": 8, "KafkaV2[Subscribe[b]]": 3})
    assert full.counts == {"a": {0: 8, 1: 0}, "b": {2: 3}}
    assert (full.records, full.rows) == (11, 13)  # offsets are not counts
    assert LedgerEntry.from_json(full.to_json(), "x") == full
    with pytest.raises(KappaSinkError, match=r"per-partition counts 2 != records 3"):
        merge_observations([{"first_ms": 1, "last_ms": 2, "records": 3, "partitions": [{"x": key("a", 0), "y": 2.0}]}])
    with pytest.raises(KappaSinkError, match=r"batch 3 read 1 record\(s\) of a partition its offsets do not hold"):
        entry_with_stats(entry, 1, 2, {int(key("c", 0)): 1}, {})


def test_the_listener_adds_a_committed_batch_s_stats_to_its_entry_and_compaction_keeps_them(tmp_path: Path) -> None:
    cp, ledger = tmp_path / "cp", tmp_path / "ledger"
    (cp / "offsets").mkdir(parents=True)
    (cp / "metadata").write_text(json.dumps({"id": QUERY}) + "\n")
    (cp / "sources" / "0").mkdir(parents=True)
    (cp / "sources" / "0" / "0").write_text('\x00v1\n{"t":{"0":0}}')
    for batch in range(12):
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": T0 + batch}
        (cp / "offsets" / str(batch)).write_text(
            "\n".join(["v1", json.dumps(meta), json.dumps({"t": {"0": 5 * (batch + 1)}})])
        )
        assert record_batch(str(cp), str(ledger), batch) is not None
        assert Ledger(str(ledger)).entry(f"{T0 + batch:013d}-{batch}.json").counts is None  # before the listener

        observed = {
            "first_ms": T0 - HOUR + batch * MIN,
            "last_ms": T0 - HOUR + batch * MIN + 59_000,
            "records": 5,
            "partitions": [{"x": key("t", 0), "y": 5.0}],
        }
        progress = SimpleNamespace(  # the listener's view of Spark's StreamingQueryProgress
            name="kappa_job_summary",
            batchId=batch,
            sources=[SimpleNamespace(description="Kafka", numInputRows=5)],
            observedMetrics={"kappa_ledger_events": Row(**observed), "another_observation": Row(n=1)},
        )
        listener = LedgerStats()
        listener.watch("kappa_job_summary", str(cp), str(ledger))
        listener.onQueryProgress(SimpleNamespace(progress=progress))
    book = Ledger(str(ledger))
    entry = book.entry(book.keys[4][2])
    assert (entry.first_record_ms, entry.last_record_ms, entry.counts, entry.source_rows) == (
        T0 - HOUR + 4 * MIN,
        T0 - HOUR + 4 * MIN + 59_000,
        {"t": {0: 5}},
        {"Kafka": 5},
    )
    entries = [book.entry(n) for _, _, n in book.keys]
    assert all(e.counts == {"t": {0: 5}} for e in entries)
    assert compact(str(ledger), chunk=10, keep_newest=2) == 10
    again = Ledger(str(ledger))
    assert [again.entry(n) for _, _, n in again.keys] == entries
    # a batch of a query reading no Kafka, or whose entry is compacted already: nothing to add to
    assert add_stats(str(cp), str(ledger), 3, [], {}) is None


def test_a_backlog_caught_up_at_one_instant_is_placed_by_its_data_into_the_right_slices(tmp_path: Path) -> None:
    """Live ran until T0 + 1h, stopped for 2 h, and caught the backlog up in 4 batches that share one
    wall-clock instant (T0 + 3h) but hold the records of [T0 + 1h, T0 + 3h): each sits at its last
    record, so hourly slices replay the batches of their own hour, in live's order."""
    folder = tmp_path / "ledger"
    before = [
        stats_entry(b, T0 + b * 10 * MIN + 9 * MIN + 30_000, T0 + b * 10 * MIN, T0 + b * 10 * MIN + 9 * MIN, 10, 10 * b)
        for b in range(6)
    ]
    caught_up = T0 + 3 * HOUR
    backlog = [
        stats_entry(6 + i, caught_up, T0 + HOUR + i * 30 * MIN, T0 + HOUR + i * 30 * MIN + 29 * MIN, 50, 60 + 50 * i)
        for i in range(4)
    ]
    no_data = stats_entry(10, caught_up + 5, None, None, 0, 260)  # the watermark moved: closes the last windows
    after = stats_entry(11, caught_up + 10 * MIN, caught_up + MIN, caught_up + 9 * MIN, 10, 260)
    write(folder, *before, *backlog, no_data, after)
    book = Ledger(str(folder))
    at = book.placement()
    assert at == sorted(at) and len(set(at)) == len(at)
    assert [book.keys[i][1] for i in range(len(at))] == list(range(12))  # live's order
    by_wall_clock = sum(1 for end_ms, _, _ in book.keys if T0 + HOUR <= end_ms < T0 + 2 * HOUR)
    assert by_wall_clock == 0  # before: the backlog all sat at T0 + 3h, in the slice after its data
    assert [book.count(T0 + h * HOUR, T0 + (h + 1) * HOUR) for h in range(4)] == [6, 2, 3, 1]
    assert book.records(T0 + HOUR, T0 + 2 * HOUR) == 100
    assert at[10] == at[9] + 1  # the no-data batch right after the last backlog batch
    assert book.gap(T0 + HOUR, T0 + 3 * HOUR, None, T0 + 3 * HOUR) is None  # covered, and nothing straddles
    # the batch holding [2h30, 3h) read from [T0 + 2h30): a window ending at 2h45 would miss its closing
    gap = book.gap(T0 + HOUR, T0 + 2 * HOUR + 30 * MIN, None, T0 + 2 * HOUR + 45 * MIN)
    assert gap is not None and gap.startswith("live's batch 9, placed at 2026-01-01T02:59:00+00:00"), gap


def test_old_entries_without_stats_are_placed_at_their_trigger_time(tmp_path: Path) -> None:
    """A version 1 entry (no statistics) sits at its trigger time, as before; a version 2 one at
    its data; placements never go back, so live's order holds in a mixed ledger."""
    folder = tmp_path / "ledger"
    folder.mkdir()
    old = {
        "version": 1,
        "query_id": QUERY,
        "batch_id": 0,
        "end_ms": T0,
        "start_ms": None,
        "watermark_ms": 0,
        "ranges": {"t": {"0": [0, 4]}},
    }
    (folder / f"{T0:013d}-0.json").write_text(json.dumps(old))
    write(
        folder,
        stats_entry(1, T0 + HOUR, T0 - HOUR, T0 - 30 * MIN, 4, 4),
        stats_entry(2, T0 + HOUR + 1, T0 + 2 * MIN, T0 + 3 * MIN, 4, 8),
    )
    book = Ledger(str(folder))
    first = book.entry(book.keys[0][2])
    assert (first.counts, first.first_record_ms, first.records, first.rows) == (None, None, None, 4)
    assert book.placement() == [T0 * 1000, T0 * 1000 + 1, (T0 + 3 * MIN) * 1000]
    assert book.records(T0, T0 + HOUR) is None  # an entry without counts
