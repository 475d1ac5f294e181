"""launch.py writes spark.kappa.*; spark/settings.py reads back exactly what was meant."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from paths import EXAMPLES

from airflow_provider_kappa.engine.launch import NO_DATA_BATCHES, SliceRun, live_conf, slice_conf, write_catalogs_file
from airflow_provider_kappa.exceptions import KappaConfigError
from airflow_provider_kappa.job.config import load_config
from airflow_provider_kappa.spark.settings import (
    AVAILABLE_NOW,
    PROCESSING_TIME,
    IcebergSourceSettings,
    load_settings,
)

RMI = EXAMPLES / "rmi" / "kappa.yaml"
UTC = timezone.utc


def test_catalogs_file_is_private(tmp_path: Path) -> None:
    cfg = load_config(RMI)
    path = write_catalogs_file(cfg, tmp_path / "c.json")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert json.loads(path.read_text())["lake"]["type"] == "sql"


def test_live_round_trip(tmp_path: Path) -> None:
    cfg = load_config(RMI)
    conf = live_conf(cfg, tmp_path / "c.json", "/ck/live")
    s = load_settings(conf)
    assert s.mode == "live" and s.trigger == PROCESSING_TIME and s.trigger_interval == timedelta(seconds=10)
    assert s.checkpoint == "/ck/live" and s.catalogs_file == str(tmp_path / "c.json")
    imp = s.source("impressions")
    assert isinstance(imp, IcebergSourceSettings)
    assert (imp.candidate, imp.table, imp.snapshot_id) == ("backfill-impressions", "raw.impressions", None)
    sink = s.sink("summary")
    assert sink.write_table == sink.table == "prod.impression_play_summary" and sink.owns_start is None
    assert not any("sqlite" in v for v in conf.values()), "catalog properties must stay out of the conf"


def test_slice_round_trip(tmp_path: Path) -> None:
    cfg = load_config(RMI)
    t0 = datetime(2026, 11, 1, tzinfo=UTC)
    run = SliceRun(
        backfill_id="b1",
        slice_id="s003",
        read_start=t0,
        read_end=t0 + timedelta(hours=1),
        owns_start=t0 + timedelta(minutes=30),
        owns_end=t0 + timedelta(hours=3),
        max_misalignment_threshold=timedelta(minutes=15),
        snapshot_ids={"backfill-impressions": 11, "backfill-playbacks": 22},
        staging_tables={"summary": "kappa_staging.x"},
        checkpoint="/ck/shared",
        sources=("playbacks",),
    )
    s = load_settings(slice_conf(cfg, run, tmp_path / "c.json"))
    assert s.mode == "backfill" and s.trigger == AVAILABLE_NOW and s.backfill_id == "b1"
    assert (s.read_start, s.read_end) == (t0, t0 + timedelta(hours=1))
    assert list(s.sources) == ["playbacks"]
    pb = s.source("playbacks")
    assert isinstance(pb, IcebergSourceSettings) and pb.snapshot_id == 22 and pb.plan_file is None
    assert pb.max_misalignment_threshold_micros == 15 * 60 * 1_000_000
    planned = load_settings(
        slice_conf(cfg, replace(run, file_lists={"backfill-playbacks": "/ck/plans/s003/p.json"}), tmp_path / "c.json")
    )
    assert planned.source("playbacks").plan_file == "/ck/plans/s003/p.json"  # type: ignore[union-attr]
    sink = s.sink("summary")
    assert (sink.write_table, sink.slice_id) == ("kappa_staging.x", "s003")
    assert (sink.owns_start, sink.owns_end) == (t0 + timedelta(minutes=30), t0 + timedelta(hours=3))
    with pytest.raises(KappaConfigError, match=r"source 'impressions' is not in the Spark conf"):
        s.source("impressions")
    # the last slice (and every parallel one) ends on Spark's no-data micro-batch; a sequential
    # slice that later slices continue does not
    assert NO_DATA_BATCHES not in slice_conf(cfg, run, tmp_path / "c.json")
    continued = slice_conf(cfg, replace(run, continued=True), tmp_path / "c.json")
    assert continued[NO_DATA_BATCHES] == "false"


@pytest.mark.parametrize(
    ("conf", "match"),
    [
        ({}, r"no spark.kappa.\* keys"),
        ({"spark.kappa.mode": "replay"}, r"spark.kappa.mode: 'replay'; allowed"),
        (
            {"spark.kappa.mode": "backfill", "spark.kappa.job": "j", "spark.kappa.checkpoint": "/c"},
            r"read.start and spark.kappa.read.end are required",
        ),
        (
            {
                "spark.kappa.mode": "live",
                "spark.kappa.job": "j",
                "spark.kappa.checkpoint": "/c",
                "spark.kappa.source.a.type": "iceberg",
                "spark.kappa.source.a.catalog": "lake",
            },
            r"spark.kappa.source.a.table: missing",
        ),
        (
            {
                "spark.kappa.mode": "live",
                "spark.kappa.job": "j",
                "spark.kappa.checkpoint": "/c",
                "spark.kappa.source.a.type": "kinesis",
            },
            r"spark.kappa.source.a.type: 'kinesis'",
        ),
        (
            {
                "spark.kappa.mode": "live",
                "spark.kappa.job": "j",
                "spark.kappa.checkpoint": "/c",
                "spark.kappa.read.start": "2026-01-01T00:00:00",
            },
            r"read.start: '2026-01-01T00:00:00' is a naive timestamp",
        ),
        ({"spark.kappa.mode": "live", "spark.kappa.checkpoint": "/c"}, r"spark.kappa.job: missing"),
    ],
)
def test_bad_settings(conf: dict[str, str], match: str) -> None:
    with pytest.raises(KappaConfigError, match=match):
        load_settings(conf)


def test_catalog_errors_mask_secrets_and_do_not_chain_the_original(tmp_path: Path) -> None:
    from airflow_provider_kappa.redact import redact_text
    from airflow_provider_kappa.spark.catalog import load_catalog

    props = {
        "uri": "postgresql://kappa:p%40ss@db:5432/cat",
        "credential": "client:s3cr3t",
        "s3.secret-access-key": "AKIASECRET",
        "warehouse": "s3://bucket/w",
    }
    text = "failed: postgresql://kappa:p%40ss@db:5432/cat (p@ss) with client:s3cr3t and AKIASECRET in s3://bucket/w"
    assert (
        redact_text(text, props) == "failed: postgresql://***:***@db:5432/cat (***) with *** and *** in s3://bucket/w"
    )
    # a real failure: the message names the catalog; the original exception is not chained
    # (a traceback would print its text, unmasked, into a task log)
    with pytest.raises(KappaConfigError, match=r"catalog 'lake' cannot be loaded: DatabaseError") as info:
        (tmp_path / "c.db").write_text("not a database " * 100)
        load_catalog("lake", {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "token": "t0k3n"})
    assert info.value.__cause__ is None and info.value.__suppress_context__


@pytest.mark.parametrize("catalog_type", ["sql", None])
def test_a_missing_sqlite_catalog_file_is_refused_not_created(tmp_path: Path, catalog_type: str | None) -> None:
    """No verb creates a catalog: ``sqlite:///path`` of a file that does not exist is a config error
    naming the catalog and the path (pyiceberg would create an empty catalog there)."""
    from pyiceberg.catalog.sql import SqlCatalog

    from airflow_provider_kappa.spark.catalog import load_catalog

    missing = tmp_path / "catalog.db"  # its folder exists: sqlite would create the file
    props = {"uri": f"sqlite:///{missing}", "warehouse": f"file://{tmp_path}/wh"}
    if catalog_type:
        props["type"] = catalog_type
    with pytest.raises(KappaConfigError, match=rf"catalog 'lake': sqlite file '{missing}' does not exist") as info:
        load_catalog("lake", props)
    assert "type: sql" in str(info.value) and not missing.exists()
    # a catalog created on purpose (pyiceberg's SqlCatalog itself) loads
    SqlCatalog("lake", **{k: v for k, v in props.items() if k != "type"}).create_namespace("raw")
    assert load_catalog("lake", props).list_namespaces() == [("raw",)]
    assert load_catalog("mem", {"type": "sql", "uri": "sqlite:///:memory:"}).name == "mem"  # no file


def test_an_iceberg_read_is_written_and_read_back_the_same_through_conf_and_options() -> None:
    from airflow_provider_kappa.spark.source.options import BOUNDED, TAIL, IcebergReadSpec
    from airflow_provider_kappa.timeparse import from_micros

    start, end = 1_790_000_000_000_000, 1_790_003_600_000_000
    spec = IcebergReadSpec(
        "lake",
        "raw.e",
        "ingestion_ts",
        mode=BOUNDED,
        snapshot_id=5,
        read_start_micros=start,
        read_end_micros=end,
        max_misalignment_threshold_micros=900_000_000,
        plan_file="/ck/plans/s0/e.json",
        max_files_per_batch=3,
        options={"x": "y"},
    )
    assert IcebergReadSpec.from_options(spec.to_options()) == spec
    conf = {
        "spark.kappa.mode": "backfill",
        "spark.kappa.read.start": from_micros(start).isoformat(),
        "spark.kappa.read.end": from_micros(end).isoformat(),
        "spark.kappa.max_misalignment_threshold": "900s",
        **spec.to_conf("events", "backfill-events"),
        "spark.kappa.source.events.option.table": "raw.other",  # an extra option never overrides the read's own
    }
    assert conf["spark.kappa.source.events.option.max_files_per_batch"] == "3"
    back = IcebergReadSpec.from_conf("events", conf)
    assert back == replace(spec, align_with=(spec.aligned(),))
    assert IcebergReadSpec.from_options(back.to_options()) == back  # the reader sees the read settings parsed
    # the conf is parsed straight into the spec, with the options' cross checks
    with pytest.raises(KappaConfigError, match=r"set at most one of .* \(got \['max_files_per_batch', 'max_rows_per"):
        IcebergReadSpec.from_conf("events", {**conf, "spark.kappa.source.events.option.max_rows_per_batch": "9"})
    with pytest.raises(KappaConfigError, match=r"read_end_micros=.* must be greater than read_start_micros"):
        IcebergReadSpec.from_conf("events", {**conf, "spark.kappa.read.end": conf["spark.kappa.read.start"]})
    assert json.loads(back.to_options()["align_with"]) == [
        {
            "catalog": "lake",
            "table": "raw.e",
            "ingestion_column": "ingestion_ts",
            "snapshot_id": 5,
            "plan_file": "/ck/plans/s0/e.json",
        }
    ]
    # live: the run's range, snapshot and file list do not apply to a tailing read
    live = IcebergReadSpec.from_conf("events", {**conf, "spark.kappa.mode": "live"})
    assert (live.mode, live.snapshot_id, live.read_start_micros, live.plan_file, live.align_with) == (
        TAIL,
        None,
        None,
        None,
        (),
    )
    with pytest.raises(KappaConfigError, match=r"spark.kappa.source.events.snapshot_id: 'x' is not an integer"):
        IcebergReadSpec.from_conf("events", {**conf, "spark.kappa.source.events.snapshot_id": "x"})
    with pytest.raises(KappaConfigError, match=r"option max_rows_per_batch='0' must be >= 1"):
        IcebergReadSpec.from_options({**spec.to_options(), "max_files_per_batch": "", "max_rows_per_batch": "0"})
