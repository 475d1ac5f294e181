"""The live ledger (``spark/ledger.py``) from checkpoints laid out as Spark writes them, and the
pieces of the replaying read that need no Spark: the reader option, file pruning, the row filter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_provider_kappa.exceptions import KappaConfigError, KappaSinkError, KappaSourceError
from airflow_provider_kappa.spark.conf_keys import PREFIX
from airflow_provider_kappa.spark.ledger import Ledger, LedgerEntry, batch_entry, compact, record_batch, trim
from airflow_provider_kappa.spark.source.options import IcebergReadSpec

QUERY = "5f0c6a2e-0000-4000-8000-000000000001"


def offsets(checkpoint: Path, batch: int, timestamp_ms: int, *sources: object, watermark_ms: int = 0) -> None:
    """``offsets/<batch>`` as Spark writes it: version, metadata, one line per source (``-``: none)."""
    meta = {
        "batchWatermarkMs": watermark_ms,
        "batchTimestampMs": timestamp_ms,
        "conf": {"spark.sql.shuffle.partitions": "2"},
    }
    lines = ["v1", json.dumps(meta), *(s if isinstance(s, str) else json.dumps(s) for s in sources)]
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    (checkpoint / "offsets" / str(batch)).write_text("\n".join(lines))


@pytest.fixture()
def checkpoint(tmp_path: Path) -> Path:
    cp = tmp_path / "cp"
    cp.mkdir()
    (cp / "metadata").write_text(json.dumps({"id": QUERY}) + "\n")
    (cp / "sources" / "0").mkdir(parents=True)
    (cp / "sources" / "0" / "0").write_text('\x00v1\n{"clicks":{"0":5,"1":7}}')  # the Kafka source's starting offsets
    (cp / "sources" / "1").mkdir(parents=True)
    offsets(cp, 0, 1_700_000_000_000, {"clicks": {"0": 9, "1": 7}}, {"pos": 12})
    offsets(cp, 1, 1_700_000_002_500, {"clicks": {"0": 30, "1": 8, "2": 4}}, "-", watermark_ms=1_699_999_990_000)
    offsets(cp, 2, 1_700_000_004_000, {"clicks": {"0": 30, "1": 8, "2": 4}}, "-")  # a no-data batch
    return cp


def test_each_batch_s_kafka_ranges_are_recorded_from_the_offset_log(checkpoint: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    first = record_batch(str(checkpoint), str(ledger), 0)
    second = record_batch(str(checkpoint), str(ledger), 1)
    third = record_batch(str(checkpoint), str(ledger), 2)
    assert third is not None and third.rows == 0  # a no-data batch: replayed too (it moves the late-event watermark)
    assert third.ranges == {"clicks": {0: (30, 30), 1: (8, 8), 2: (4, 4)}}

    assert first is not None and second is not None
    assert first.ranges == {"clicks": {0: (5, 9), 1: (7, 7)}}  # batch 0 starts where the source started
    assert (first.start_ms, first.end_ms, first.query_id, first.rows) == (None, 1_700_000_000_000, QUERY, 4)
    # a partition new in batch 1 starts at its beginning (None); the others where batch 0 ended
    assert second.ranges == {"clicks": {0: (9, 30), 1: (7, 8), 2: (None, 4)}}
    assert (second.start_ms, second.watermark_ms, second.rows) == (1_700_000_000_000, 1_699_999_990_000, None)

    read = Ledger(str(ledger))
    assert [k[:2] for k in read.keys] == [(1_700_000_000_000, 0), (1_700_000_002_500, 1), (1_700_000_004_000, 2)]
    assert [read.entry(name) for _, _, name in read.keys] == [first, second, third]
    before = sorted(p.read_text() for p in ledger.iterdir())
    assert record_batch(str(checkpoint), str(ledger), 1) == second  # a replayed batch writes the same entry
    assert sorted(p.read_text() for p in ledger.iterdir()) == before


def test_an_entry_round_trips_through_json() -> None:
    entry = LedgerEntry(
        QUERY, 7, 1_700_000_000_000, 1_699_999_999_000, 5, {"a": {0: (None, 3), 2: (4, 9)}, "b": {1: (0, 1)}}
    )
    assert LedgerEntry.from_json(entry.to_json(), "x") == entry
    with pytest.raises(KappaSourceError, match="live ledger entry x is not a kappa ledger entry"):
        LedgerEntry.from_json('{"version": 9}', "x")


def test_a_query_without_kafka_records_nothing(tmp_path: Path) -> None:
    cp = tmp_path / "cp"
    offsets(cp, 0, 1_700_000_000_000, {"snapshot_id": 3, "sequence_number": 1})
    assert batch_entry(str(cp), 0) is None


def test_bad_offset_logs_and_disagreeing_sources_are_refused_naming_the_file(tmp_path: Path) -> None:
    cp = tmp_path / "cp"
    (cp / "offsets").mkdir(parents=True)
    (cp / "offsets" / "0").write_text("v2\n{}")
    with pytest.raises(KappaSinkError, match=r"offset log '.*/offsets/0' is not Spark's offset log"):
        batch_entry(str(cp), 0)
    with pytest.raises(KappaSinkError, match="batch 3 has no offsets"):
        batch_entry(str(cp), 3)
    offsets(cp, 1, 1_700_000_000_000, {"t": {"0": 1}}, {"t": {"0": 2}})
    with pytest.raises(KappaSinkError, match="two Kafka sources of the query read topic 't' to different offsets"):
        batch_entry(str(cp), 1)


def test_a_missing_ledger_is_refused_saying_what_records_it(tmp_path: Path) -> None:
    with pytest.raises(KappaSourceError, match="live ledger .*nowhere' does not exist: `kappa run` records it"):
        Ledger(str(tmp_path / "nowhere"))


def conf(**extra: str) -> dict[str, str]:
    base = {
        PREFIX + "mode": "backfill",
        PREFIX + "source.events.type": "iceberg",
        PREFIX + "source.events.catalog": "lake",
        PREFIX + "source.events.table": "raw.events",
        PREFIX + "source.events.ingestion_column": "ingestion_ts",
        PREFIX + "sink.summary.table": "prod.summary",
        PREFIX + "read.start": "2026-11-01T00:00:00+00:00",
        PREFIX + "read.end": "2026-11-01T01:00:00+00:00",
    }
    return {**base, **{PREFIX + k.replace("__", "."): v for k, v in extra.items()}}


def test_the_reader_replays_the_ledger_of_the_run_s_one_sink() -> None:
    spec = IcebergReadSpec.from_conf("events", conf(ledger="/lake/ledger/"))
    assert spec.ledger == "/lake/ledger/summary"
    assert IcebergReadSpec.from_options(spec.to_options()).ledger == "/lake/ledger/summary"
    assert IcebergReadSpec.from_conf("events", conf()).ledger is None
    with pytest.raises(
        KappaConfigError, match=r"spark.kappa.ledger: '/l' is kept per sink .* sinks \['a', 'summary'\]"
    ):
        IcebergReadSpec.from_conf("events", conf(ledger="/l", sink__a__table="x.a"))
    with pytest.raises(KappaConfigError, match="option ledger='/l' is for mode 'bounded', not 'tail'"):
        IcebergReadSpec.from_options(
            {"catalog": "c", "table": "t.t", "ingestion_column": "i", "mode": "tail", "ledger": "/l"}
        )


def test_files_are_pruned_by_their_kafka_statistics() -> None:
    from airflow_provider_kappa.spark.source.replay import may_hold

    ranges = [("t", 0, 100, 200), ("t", 3, -1, 10)]
    assert may_hold(None, ranges)  # no statistics: may hold anything
    assert may_hold((0, 0, 150, 400), ranges)
    assert not may_hold((0, 0, 200, 400), ranges)  # end is exclusive
    assert not may_hold((1, 2, 0, 10_000), ranges)  # partitions the batch did not read
    assert may_hold((2, 5, 0, 3), ranges)  # partition 3 from its beginning
    assert not may_hold((0, 3, 10, 99), ranges)
    assert may_hold((None, None, None, None), ranges)


def test_executors_keep_the_rows_inside_the_batch_s_ranges() -> None:
    import pyarrow as pa

    from airflow_provider_kappa.spark.source.read import kafka_filter

    batch = pa.RecordBatch.from_pydict(
        {
            "kafka_topic": ["t", "t", "t", "u", "t", None, "t"],
            "kafka_partition": [0, 0, 1, 0, 3, 0, 0],
            "kafka_offset": [99, 100, 150, 150, 2, 150, 200],
        }
    )
    kept = batch.filter(kafka_filter(batch, (("t", 0, 100, 200), ("t", 3, -1, 10))))
    assert list(zip(*(kept.column(i).to_pylist() for i in range(3)))) == [("t", 0, 100), ("t", 3, 2)]


def test_the_ledger_parameter_needs_a_job_with_one_sink(tmp_path: Path) -> None:
    from dataclasses import replace

    import airflow_provider_kappa.examples as examples
    from airflow_provider_kappa.backfill.params import backfill_id, parse_params
    from airflow_provider_kappa.job.config import load_config

    cfg = load_config(Path(examples.__file__).parent / "rmi" / "kappa.yaml")
    window = {"start": "2026-11-01T00:00:00+00:00", "end": "2026-11-01T02:00:00+00:00"}
    with_ledger = parse_params(cfg, {**window, "ledger": True})
    auto, off = parse_params(cfg, window), parse_params(cfg, {**window, "ledger": "false"})
    assert (with_ledger.ledger, auto.ledger, off.ledger) == ("true", "auto", "false")
    ids = {backfill_id(cfg, p) for p in (with_ledger, auto, off)}
    assert len(ids) == 3  # each its own staging and checkpoints
    assert cfg.job.ledger == f"{cfg.job.checkpoint_root}/rmi/ledger"
    two = replace(cfg, sinks={**cfg.sinks, "other": replace(cfg.sinks["summary"], name="other")})
    with pytest.raises(KappaConfigError, match=r"backfill parameter ledger: .* has sinks \['other', 'summary'\]"):
        parse_params(two, {**window, "ledger": "true"})


def write_entries(ledger: Path, count: int, first_ms: int = 1_700_000_000_000) -> list[LedgerEntry]:
    """``count`` entries 10 s apart, batch ids 0.., each reading 10 offsets of partition 0."""
    ledger.mkdir(parents=True, exist_ok=True)
    out = []
    for batch in range(count):
        entry = LedgerEntry(
            QUERY,
            batch,
            first_ms + batch * 10_000,
            None if batch == 0 else first_ms + (batch - 1) * 10_000,
            0,
            {"clicks": {0: (batch * 10, batch * 10 + 10)}},
        )
        (ledger / entry.name).write_text(entry.to_json())
        out.append(entry)
    return out


def test_compaction_keeps_every_entry_readable_in_order_and_leaves_the_newest_alone(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    entries = write_entries(ledger, 25)
    assert compact(str(ledger), chunk=10, keep_newest=4) == 20  # two full runs of 10; 5 left (4 newest + 1)
    files = sorted(p.name for p in ledger.iterdir())
    assert files[:2] == [
        f"{entries[0].name[:-5]}_{entries[9].name}l",
        f"{entries[10].name[:-5]}_{entries[19].name}l",
    ]
    assert files[2:] == [e.name for e in entries[20:]]
    read = Ledger(str(ledger))
    assert [read.entry(name) for _, _, name in read.keys] == entries
    assert read.count(entries[5].end_ms, entries[12].end_ms) == 7
    assert compact(str(ledger), chunk=10, keep_newest=4) == 0  # nothing new to compact


def test_a_compaction_stopped_before_deleting_its_single_files_reads_each_entry_once(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    entries = write_entries(ledger, 12)
    kept = {e.name: (ledger / e.name).read_text() for e in entries}
    compact(str(ledger), chunk=10, keep_newest=0)
    for name, text in kept.items():  # as if the compaction stopped after moving its file into place
        (ledger / name).write_text(text)
    read = Ledger(str(ledger))
    assert [read.entry(name) for _, _, name in read.keys] == entries
    assert len(read) == 12


def test_a_corrupt_compacted_file_is_refused_naming_its_line(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    write_entries(ledger, 10)
    compact(str(ledger), chunk=10, keep_newest=0)
    (chunk,) = ledger.iterdir()
    chunk.write_text(chunk.read_text().replace('"version":2', '"version":9', 1))
    with pytest.raises(KappaSourceError, match=r"line 1 is not a kappa ledger entry: version 9"):
        Ledger(str(ledger))


def test_trim_deletes_only_entries_before_the_cut_and_keeps_a_straddling_compacted_file(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    entries = write_entries(ledger, 30)
    compact(str(ledger), chunk=10, keep_newest=5)  # entries 0-9 and 10-19 compacted
    cut = entries[15].end_ms  # inside the second compacted file
    assert trim(str(ledger), cut) == 10  # the first file only; the second straddles the cut
    read = Ledger(str(ledger))
    assert [read.entry(name) for _, _, name in read.keys] == entries[10:]
    assert trim(str(ledger), entries[25].end_ms) == 10 + 5  # the second file, then singles 20-24
    assert [k[0] for k in Ledger(str(ledger)).keys] == [e.end_ms for e in entries[25:]]
