"""``kappa land``: a real Kafka broker (KRaft, from the jars fetched at install), real spark-submit
runs of the landing application, a real sqlite Iceberg catalog. Events produced with explicit record
timestamps into two partitions land exactly once, stamped with the Kafka timestamp and keeping
partition and offset; a second run restarts from the checkpoint and lands only the new events; a
landing without ``--available-now`` runs until SIGTERM and stops cleanly; bad config and a table
without kappa's columns are refused before Spark starts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from servers.kafka import create_topic, produce, write_kafka_job_config

from airflow_provider_kappa.cli import main

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
SCHEMA = "event_id STRING, account_id BIGINT, event_ts TIMESTAMP"


def write_config(
    tmp_path: Path, catalog_props: dict[str, str], bootstrap: str, topic: str, *, land: str = "{interval: 2s}"
) -> Path:
    return write_kafka_job_config(tmp_path, catalog_props, bootstrap, topic, name="landtest", schema=SCHEMA, land=land)


def events(start: int, count: int) -> list[tuple[int, datetime, dict[str, Any]]]:
    """``count`` events from id ``start``: alternate partitions, record timestamps a second apart."""
    out = []
    for i in range(start, start + count):
        ts = T0 + timedelta(seconds=i)
        out.append(
            (i % 2, ts, {"event_id": f"e{i}", "account_id": i, "event_ts": (ts - timedelta(seconds=3)).isoformat()})
        )
    return out


def landed(catalog: Any) -> list[dict[str, Any]]:
    return sorted(catalog.load_table("raw.events").scan().to_arrow().to_pylist(), key=lambda r: r["event_id"])


def check(
    rows: list[dict[str, Any]], sent: list[tuple[int, datetime, dict[str, Any]]], acks: list[tuple[int, int, int]]
) -> None:
    assert len(rows) == len(sent), (len(rows), len(sent))
    by_id = {r["event_id"]: r for r in rows}
    assert len(by_id) == len(rows), "an event landed twice"
    for (_partition, ts, value), (ack_partition, offset, _) in zip(sent, acks):
        row = by_id[value["event_id"]]
        assert row["ingestion_ts"] == ts, (row, ts)  # the Kafka record timestamp
        assert (row["kafka_topic"], row["kafka_partition"], row["kafka_offset"]) == (
            row["kafka_topic"],
            ack_partition,
            offset,
        )
        assert row["account_id"] == value["account_id"] and row["event_ts"] == ts - timedelta(seconds=3)


def test_landing_lands_each_event_once_and_a_restart_lands_only_new_ones(
    kafka_broker: Any, tmp_path: Path, catalog_props: dict[str, str], catalog: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = f"events-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_broker.bootstrap_servers, topic, partitions=2)
    config = write_config(tmp_path, catalog_props, kafka_broker.bootstrap_servers, topic)
    first = events(0, 30)
    acks = produce(kafka_broker.bootstrap_servers, topic, first)

    assert main(["land", "--config", str(config), "--available-now"]) == 0, capsys.readouterr()
    rows = landed(catalog)
    check(rows, first, acks)
    assert {r["kafka_topic"] for r in rows} == {topic}
    assert sorted((r["kafka_partition"], r["kafka_offset"]) for r in rows) == sorted((p, o) for p, o, _ in acks)
    table = catalog.load_table("raw.events")
    assert [f.name for f in table.spec().fields] == ["ingestion_ts_day"]  # created by the landing
    snapshots = len(table.snapshots())

    second = events(30, 20)
    acks += produce(kafka_broker.bootstrap_servers, topic, second)
    assert main(["land", "--config", str(config), "--available-now"]) == 0, capsys.readouterr()
    check(landed(catalog), first + second, acks)
    assert len(catalog.load_table("raw.events").snapshots()) > snapshots
    assert (tmp_path / "checkpoints" / "landtest" / "land" / "events" / "offsets").is_dir()

    # nothing new: a third run commits nothing
    table = catalog.load_table("raw.events")
    before = table.current_snapshot().snapshot_id
    assert main(["land", "--config", str(config), "--available-now", "--sources", "events"]) == 0
    assert catalog.load_table("raw.events").current_snapshot().snapshot_id == before


def test_a_running_landing_lands_per_interval_and_sigterm_stops_it_cleanly(
    kafka_broker: Any, tmp_path: Path, catalog_props: dict[str, str], catalog: Any
) -> None:
    topic = f"events-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_broker.bootstrap_servers, topic, partitions=2)
    config = write_config(tmp_path, catalog_props, kafka_broker.bootstrap_servers, topic)
    sent = events(0, 10)
    acks = produce(kafka_broker.bootstrap_servers, topic, sent)
    log = (tmp_path / "land.log").open("w")
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "kappa"), "land", "--config", str(config)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not catalog.table_exists("raw.events") or len(landed(catalog)) < 10:
            assert proc.poll() is None, (tmp_path / "land.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (tmp_path / "land.log").read_text()[-3000:]
            time.sleep(1)
        more = events(10, 5)
        acks += produce(kafka_broker.bootstrap_servers, topic, more)
        sent += more
        while len(landed(catalog)) < 15:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "land.log").read_text()[-3000:]
            time.sleep(1)
        os.kill(proc.pid, signal.SIGTERM)  # kappa itself only: it stops its spark-submit
        assert proc.wait(timeout=120) == 0, (tmp_path / "land.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    check(landed(catalog), sent, acks)
    text = (tmp_path / "land.log").read_text()
    assert "every 2s" in text and "stopped; a restart lands from the checkpoint" in text
    time.sleep(2)
    leftovers = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert not leftovers, f"processes of the landing still run: {leftovers}"


@pytest.mark.parametrize(
    ("land", "reason"),
    [
        ("{interval: 0s}", "land.interval: '0s' must be positive"),
        ("{interval: soon}", "land.interval: 'soon' is not a duration"),
        ("{interval: 1min, every: 2}", "land: unknown key(s) ['every']"),
        ("{starting_offsets: yesterday}", "land.starting_offsets: 'yesterday' is not a starting position"),
    ],
)
def test_bad_land_config_is_refused_naming_the_key(
    tmp_path: Path, catalog_props: dict[str, str], capsys: pytest.CaptureFixture[str], land: str, reason: str
) -> None:
    config = write_config(tmp_path, catalog_props, "127.0.0.1:9", "t", land=land)
    assert main(["land", "--config", str(config), "--available-now"]) == 2
    assert reason in capsys.readouterr().err


def test_a_table_without_the_kafka_columns_is_refused_naming_them(
    tmp_path: Path, catalog_props: dict[str, str], catalog: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import pyarrow as pa

    catalog.create_namespace("raw")
    catalog.create_table(
        "raw.events",
        schema=pa.schema(
            [("event_id", pa.string()), ("ingestion_ts", pa.timestamp("us", tz="UTC")), ("kafka_offset", pa.int64())]
        ),
    )
    config = write_config(tmp_path, catalog_props, "127.0.0.1:9", "t")
    assert main(["land", "--config", str(config), "--available-now"]) == 2
    err = capsys.readouterr().err
    assert "table 'raw.events'" in err and "missing column(s) ['kafka_topic', 'kafka_partition']" in err, err
    assert not (tmp_path / "checkpoints").exists()


def test_unknown_or_unlandable_sources_are_refused(
    tmp_path: Path, catalog_props: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, catalog_props, "127.0.0.1:9", "t")
    assert main(["land", "--config", str(config), "--sources", "lake-events"]) == 2
    assert "--sources: 'lake-events' is not a dynamic source" in capsys.readouterr().err
