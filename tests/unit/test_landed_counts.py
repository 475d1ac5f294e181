"""Pre-flight of a ledger replay (``backfill/landed_counts.py``): every replayed live batch's records
are landed at the pinned snapshot, count for count, transaction markers accounted for; refused
before any lock or tag otherwise, naming the batch and the partition. A real sqlite SqlCatalog, a
landed table with the Kafka columns, a real ledger folder."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from lake import T0, append_events, create_events_table, create_summary_table, event, summary_row, summary_table
from test_cli_output import write_config

from airflow_provider_kappa.backfill.backfill import Backfill
from airflow_provider_kappa.backfill.landed_counts import check_landed_counts, check_replay_landed
from airflow_provider_kappa.backfill.snapshot import pin, snapshot
from airflow_provider_kappa.cli import main
from airflow_provider_kappa.exceptions import KappaSourceError
from airflow_provider_kappa.job.config import load_config
from airflow_provider_kappa.spark.ledger import LedgerEntry, sink_ledger
from airflow_provider_kappa.timeparse import to_micros

MIN = timedelta(minutes=1)
EVENTS = 24  # one every 10 minutes from T0


def offset(i: int) -> int:
    """Event i's Kafka offset: offset 12 is a transaction's commit marker (never a record)."""
    return i if i < 12 else i + 1


def land(table: Any, events: range) -> None:
    """Append events ``events`` with their Kafka columns (topic t, partition 0) as one snapshot."""
    import pyarrow as pa

    from airflow_provider_kappa.demo.lake_schema import RAW_EVENTS_ARROW

    rows = [event(i, T0 + i * 10 * MIN) for i in events]
    arrow = pa.Table.from_pylist(rows, schema=RAW_EVENTS_ARROW)
    arrow = arrow.append_column("kafka_topic", pa.array(["t"] * len(rows), pa.string()))
    arrow = arrow.append_column("kafka_partition", pa.array([0] * len(rows), pa.int32()))
    arrow = arrow.append_column("kafka_offset", pa.array([offset(i) for i in events], pa.int64()))
    table.append(arrow)


@pytest.fixture()
def config(tmp_path: Path, catalog: Any, catalog_props: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Path:
    """Landed events with their Kafka positions; a live ledger caught up as a backlog: 12 batches of
    two events each, all triggered at one wall-clock instant (T0 + 10h), placed by their data."""
    from pyiceberg.types import IntegerType, LongType, StringType

    monkeypatch.setenv("COLUMNS", "200")
    source = create_events_table(catalog, "raw.playbacks")
    append_events(source, [])  # a first snapshot of the plain schema
    with source.update_schema() as update:
        update.add_column("kafka_topic", StringType())
        update.add_column("kafka_partition", IntegerType())
        update.add_column("kafka_offset", LongType())
    create_summary_table(catalog, "prod.summary").append(summary_table([summary_row(60, 1, 5)]))
    path = write_config(tmp_path, catalog_props)
    folder = Path(sink_ledger(load_config(path).job.ledger, "summary"))
    folder.mkdir(parents=True)
    wall = int(to_micros(T0 + 10 * 60 * MIN) // 1000)
    for b in range(EVENTS // 2):
        first, last = 2 * b, 2 * b + 1
        start = 0 if b == 0 else offset(first - 1) + 1  # batch 6 reads offsets 12..14: 2 records, one marker
        entry = LedgerEntry(
            "q",
            b,
            wall + b,
            None if b == 0 else wall + b - 1,
            0,
            {"t": {0: (start, offset(last) + 1)}},
            first_record_ms=int(to_micros(T0 + first * 10 * MIN) // 1000),
            last_record_ms=int(to_micros(T0 + last * 10 * MIN) // 1000),
            counts={"t": {0: 2}},
            source_rows={"KafkaV2[Subscribe[t]]": 2},
        )
        (folder / entry.name).write_text(entry.to_json())
    return path


def backfill(config: Path) -> Backfill:
    window = {"start": (T0 + 60 * MIN).isoformat(), "end": (T0 + 180 * MIN).isoformat(), "tail": "10min"}
    return Backfill.create(load_config(config), window)


def test_a_replay_whose_records_are_all_landed_passes_markers_accounted_for(config: Path, catalog: Any) -> None:
    land(catalog.load_table("raw.playbacks"), range(EVENTS))
    bf = backfill(config)
    # the range read [1h, 3h10): batches 3..8 (placed at their last records: 1h10, 1h30 .. 2h50)
    assert check_replay_landed(bf, pin(bf, tag=False)) == 6
    ledger = sink_ledger(bf.cfg.job.ledger, "summary")
    assert check_landed_counts(bf, pin(bf, tag=False), ledger) == 6  # batch 6: 3 offsets, 2 records, 2 landed


def test_kappa_plan_counts_the_ledger_entries_as_well_as_the_files(
    config: Path, catalog: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    land(catalog.load_table("raw.playbacks"), range(EVENTS))
    window = ["--start", (T0 + 60 * MIN).isoformat(), "--end", (T0 + 180 * MIN).isoformat(), "--tail", "10min"]
    assert main(["plan", "--config", str(config), *window]) == 0
    out = capsys.readouterr().out
    assert "exactness: exact: the live ledger covers" in out, out
    assert (
        " file(s) to read in 3 slice(s) (estimates from manifest statistics); 6 live ledger entr(ies) replayed, " in out
    ), out
    assert "holding 12 Kafka record(s) (their recorded counts)" in out, out
    assert main(["plan", "--config", str(config), *window, "--ledger", "false"]) == 0
    out = capsys.readouterr().out
    assert "; 6 live ledger entr(ies) in the range read, not replayed, holding 12 Kafka record(s)" in out, out


def test_a_replay_whose_landing_lags_is_refused_before_any_lock_naming_batch_and_partition(
    config: Path, catalog: Any
) -> None:
    source = catalog.load_table("raw.playbacks")
    land(source, range(15))  # the landing lags live: events 15.. (batch 7 on) not landed yet
    bf = backfill(config)
    with pytest.raises(KappaSourceError) as refused:
        snapshot(bf)
    message = str(refused.value)
    assert "replayed batches' records are not landed at the pinned snapshot" in message, message
    assert (
        "batch 7 (query q, entry" in message
        and "partition t/0 offsets [15, 17): live read 2 record(s), 1 landed" in message
    ), message
    assert "batch 8 (query q" in message and "offsets [17, 19): live read 2 record(s), 0 landed" in message
    # refused before the lock and the tag: nothing taken
    assert bf.tag not in catalog.load_table("raw.playbacks").metadata.refs
    target = catalog.load_table("prod.summary")
    assert not [k for k in target.properties if bf.id in k or "lock" in k], target.properties
    # a duplicate landing (the same records twice) is refused too: count for count
    land(source, range(15, EVENTS))
    land(source, range(6, 8))
    with pytest.raises(KappaSourceError, match=r"batch 3 \(query q.*live read 2 record\(s\), 4 landed"):
        check_landed_counts(bf, pin(bf, tag=False), sink_ledger(bf.cfg.job.ledger, "summary"))


def test_the_plan_step_takes_the_pre_flights_plan_at_the_snapshots_it_checked(config: Path, catalog: Any) -> None:
    from airflow_provider_kappa.backfill.plan import plan

    table = catalog.load_table("raw.playbacks")
    land(table, range(EVENTS))
    bf = backfill(config)
    pinned = snapshot(bf)  # the pre-flight plans once (no pin) at the current snapshots, then the tag pins them
    (checked,) = bf.plans.values()
    assert bf.store().pinned("ledger") is None and bf.store().exactness() is None
    made = plan(bf, pinned, pin=True)
    assert made is checked and sum(s.ledger_batches or 0 for s in made.slices) == 6  # the batches checked
    assert made.exactness is not None and made.exactness.exact
    assert bf.store().pinned("ledger") == {
        "ledger": made.exactness.ledger,
        "from_ms": to_micros(bf.params.read_start) // 1000,
    }
    assert bf.store().exactness() == made.exactness.to_dict()
    # other snapshots (a landing committed between the pre-flight and the tag): planned anew
    land(table, range(0))
    other = plan(bf, {"playbacks": int(catalog.load_table("raw.playbacks").current_snapshot().snapshot_id)}, pin=True)
    assert other is not checked and other.exactness == made.exactness
