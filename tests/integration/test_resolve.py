"""Source and sink resolution from spark.kappa.* against a real local SparkSession."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from paths import EXAMPLES

from airflow_provider_kappa.engine.launch import SliceRun, live_conf, slice_conf
from airflow_provider_kappa.exceptions import KappaConfigError
from airflow_provider_kappa.job.config import load_config
from airflow_provider_kappa.spark.resolve import (
    iceberg_source_options,
    kafka_source_options,
    parse_kafka_value,
    settings_of,
    sink_writer_options,
)
from airflow_provider_kappa.spark.settings import KafkaSourceSettings, load_settings

UTC = timezone.utc


@pytest.fixture()
def kappa_conf(spark: Any) -> Iterator[Any]:
    """Set spark.kappa.* on the shared session for one test, then remove it."""
    set_keys: list[str] = []

    def apply(conf: dict[str, str]) -> None:
        for k, v in conf.items():
            if k.startswith("spark.kappa."):
                spark.conf.set(k, v)
                set_keys.append(k)

    yield apply
    for k in set_keys:
        spark.conf.unset(k)


def test_kafka_option_mapping() -> None:
    src = KafkaSourceSettings(
        name="impressions",
        candidate="live-impressions",
        topics="impressions",
        bootstrap_servers="kafka:9092",
        starting_offsets="earliest",
        options={"kafka.security.protocol": "SSL", "maxOffsetsPerTrigger": "1000"},
    )
    assert kafka_source_options(src) == {
        "kafka.bootstrap.servers": "kafka:9092",
        "subscribe": "impressions",
        "startingOffsets": "earliest",
        "kafka.security.protocol": "SSL",
        "maxOffsetsPerTrigger": "1000",
    }


def test_kafka_records_parse_to_landed_columns(spark: Any) -> None:
    """Kafka's value/timestamp become the same columns the iceberg candidate has."""
    src = KafkaSourceSettings(
        name="impressions",
        candidate="live-impressions",
        topics="impressions",
        bootstrap_servers="kafka:9092",
        schema="event_id STRING, account_id BIGINT, show_id BIGINT, event_ts TIMESTAMP",
        ingestion_column="ingestion_ts",
    )
    value = json.dumps({"event_id": "e1", "account_id": 7, "show_id": 3, "event_ts": "2026-11-01T00:00:01Z"})
    kafka_like = spark.createDataFrame(
        [(None, bytearray(value.encode()), "impressions", 0, 42, datetime(2026, 11, 1, 0, 0, 2, tzinfo=UTC))],
        "key BINARY, value BINARY, topic STRING, partition INT, offset LONG, timestamp TIMESTAMP",
    )
    rows = parse_kafka_value(kafka_like, src).collect()
    assert parse_kafka_value(kafka_like, src).columns == [
        "event_id",
        "account_id",
        "show_id",
        "event_ts",
        "ingestion_ts",
    ]
    assert (rows[0].event_id, rows[0].account_id, rows[0].show_id) == ("e1", 7, 3)
    assert rows[0].ingestion_ts == datetime(2026, 11, 1, 0, 0, 2)


def test_kafka_candidate_without_connector_is_explained(spark: Any, kappa_conf: Any, tmp_path: Path) -> None:
    from airflow_provider_kappa.spark import read_source

    cfg = load_config(EXAMPLES / "rmi" / "kappa.yaml")
    conf = live_conf(cfg, tmp_path / "c.json", str(tmp_path / "ck"))
    conf["spark.kappa.source.impressions.type"] = "kafka"
    conf["spark.kappa.source.impressions.topics"] = "impressions"
    conf["spark.kappa.source.impressions.bootstrap_servers"] = "127.0.0.1:9"
    kappa_conf(conf)
    with pytest.raises(KappaConfigError, match=r"spark-sql-kafka-0-10"):
        read_source(spark, "impressions")


def test_backfill_resolution_from_session_conf(spark: Any, kappa_conf: Any, tmp_path: Path) -> None:
    cfg = load_config(EXAMPLES / "rmi" / "kappa.yaml")
    t0 = datetime(2026, 11, 1, tzinfo=UTC)
    run = SliceRun(
        backfill_id="b1",
        slice_id="s0",
        read_start=t0,
        read_end=t0.replace(hour=1),
        owns_start=t0,
        owns_end=t0.replace(hour=2),
        max_misalignment_threshold=__import__("datetime").timedelta(minutes=15),
        snapshot_ids={"backfill-impressions": 5, "backfill-playbacks": 6},
        staging_tables={"summary": "kappa_staging.prod__summary__b1__s0"},
        checkpoint=str(tmp_path / "ck"),
        file_lists={"backfill-impressions": "/ck/plans/s0/i.json", "backfill-playbacks": "/ck/plans/s0/p.json"},
    )
    kappa_conf(slice_conf(cfg, run, tmp_path / "catalogs.json"))
    settings = settings_of(spark)
    opts = iceberg_source_options(settings, settings.source("impressions"))  # type: ignore[arg-type]
    assert opts["mode"] == "bounded" and opts["snapshot_id"] == "5" and opts["table"] == "raw.impressions"
    assert opts["read_start_micros"] == str(int(t0.timestamp() * 1_000_000))
    assert opts["max_misalignment_threshold"] == "900s"
    assert opts["catalogs_file"] == str(tmp_path / "catalogs.json") and opts["catalog_properties"] == "{}"
    aligned = json.loads(opts["align_with"])
    assert [a["table"] for a in aligned] == ["raw.impressions", "raw.playbacks"]
    assert [a["snapshot_id"] for a in aligned] == [5, 6]
    assert opts["plan_file"] == "/ck/plans/s0/i.json"
    assert [a["plan_file"] for a in aligned] == ["/ck/plans/s0/i.json", "/ck/plans/s0/p.json"]
    w = sink_writer_options(settings, settings.sink("summary"))
    assert (w["table"], w["target_table"], w["slice"], w["mode"]) == (
        "kappa_staging.prod__summary__b1__s0",
        "prod.impression_play_summary",
        "s0",
        "backfill",
    )
    assert w["writer_id"].startswith("rmi/summary/")


def test_live_resolution_uses_tail_mode(tmp_path: Path) -> None:
    cfg = load_config(EXAMPLES / "playback_sessions" / "kappa.yaml")
    settings = load_settings(live_conf(cfg, tmp_path / "c.json", "/ck"))
    opts = iceberg_source_options(settings, settings.source("playbacks"))  # type: ignore[arg-type]
    assert opts["mode"] == "tail" and "snapshot_id" not in opts and "read_end_micros" not in opts
    assert sink_writer_options(settings, settings.sink("sessions"))["table"] == "prod.playback_sessions"
