"""Windows and inputs refused before any lock or tag (issue 25 items 1 and 2), on a real sqlite
SqlCatalog: a window of part of a day of a DATE ``time_column``, a window before the data, an
application that does not compile, an unreachable ``job.connect`` server; and a refusal raised
after the lock and the tag gives both back. Each exits 2 and leaves no tag on the source and no
lock on the target."""

from __future__ import annotations

import socket
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import airflow_env  # noqa: F401  (sets AIRFLOW_HOME before Airflow is imported)
import pytest
import yaml
from airflow_env import write_job_config
from lake import INCIDENT_END, INCIDENT_START, append_events, create_events_table, event, seed_sessions_incident

from airflow_provider_kappa.backfill.backfill import Backfill
from airflow_provider_kappa.backfill.checks import check_tables
from airflow_provider_kappa.backfill.snapshot import snapshot
from airflow_provider_kappa.cli import main
from airflow_provider_kappa.exceptions import KappaConfigError, KappaSourceError
from airflow_provider_kappa.job.config import load_config

SESSIONS = "prod.playback_sessions"
DAY1 = datetime(2026, 3, 1, tzinfo=timezone.utc)


def assert_nothing_taken(catalog: Any, source: str, target: str) -> None:
    assert not [k for k in catalog.load_table(target).properties if k.startswith("kappa.backfill.lock.")]
    assert not [r for r in catalog.load_table(source).metadata.refs if r.startswith("kappa-")]


def backfill_refused(capsys: pytest.CaptureFixture[str], config: Path, argv: list[str]) -> str:
    code = main(["backfill", "--config", str(config), *argv])
    _, err = capsys.readouterr()
    assert code == 2 and err.startswith("kappa backfill: error: "), err
    return err


# --------------------------------------------------------------------------- a DATE time_column


def date_job(tmp_path: Path, catalog: Any, catalog_props: dict[str, str]) -> Path:
    """A source with events on 2026-03-01..03 and a target whose ``time_column`` ``day`` is a DATE
    (24 rows on 2026-03-01); returns kappa.yaml."""
    import pyarrow as pa
    from pyiceberg.schema import Schema
    from pyiceberg.types import DateType, LongType, NestedField

    append_events(
        create_events_table(catalog, "raw.playbacks"), [event(i, DAY1 + i * timedelta(hours=1)) for i in range(72)]
    )
    catalog.create_namespace_if_not_exists("prod")
    target = catalog.create_table(
        "prod.daily", Schema(NestedField(1, "day", DateType(), required=False), NestedField(2, "n", LongType()))
    )
    rows = [{"day": DAY1.date(), "n": i} for i in range(24)]
    target.append(pa.Table.from_pylist(rows, schema=pa.schema([("day", pa.date32()), ("n", pa.int64())])))
    (tmp_path / "job.py").write_text("# the job's application (not run here)\n")
    raw = {
        "job": {"name": "daily", "application": "job.py", "checkpoint_root": str(tmp_path / "checkpoints")},
        "catalogs": {"lake": dict(catalog_props)},
        "sources": {
            "playbacks": {
                "type": "iceberg",
                "catalog": "lake",
                "table": "raw.playbacks",
                "ingestion_column": "ingestion_ts",
            }
        },
        "sinks": {"daily": {"type": "iceberg", "catalog": "lake", "table": "prod.daily", "time_column": "day"}},
        "backfill": {"slice": "1d", "tail": "0s"},
    }
    path = tmp_path / "kappa.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_a_window_of_part_of_a_day_of_a_date_time_column_is_refused_before_any_lock(
    tmp_path: Path, catalog: Any, catalog_props: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    config = date_job(tmp_path, catalog, catalog_props)
    rows_before = catalog.load_table("prod.daily").scan().to_arrow().num_rows
    err = backfill_refused(
        capsys, config, ["--start", "2026-03-01T12:00:00Z", "--end", "2026-03-03T00:00:00Z", "--slice", "1d"]
    )
    assert "sink daily" in err and "time_column 'day'" in err and "type date: its unit is one UTC day" in err, err
    assert "[2026-03-01T12:00:00+00:00, 2026-03-03T00:00:00+00:00)" in err, err
    assert "[2026-03-01T00:00:00+00:00, 2026-03-03T00:00:00+00:00)" in err, err  # the nearest whole window
    assert catalog.load_table("prod.daily").scan().to_arrow().num_rows == rows_before == 24
    assert_nothing_taken(catalog, "raw.playbacks", "prod.daily")
    assert not (tmp_path / "checkpoints").exists()

    end_inside = backfill_refused(capsys, config, ["--start", "2026-03-01T00:00:00Z", "--end", "2026-03-02T06:00:00Z"])
    assert "nearest covering it is [2026-03-01T00:00:00+00:00, 2026-03-03T00:00:00+00:00)" in end_inside, end_inside


def test_a_window_of_whole_days_passes_the_date_check(
    tmp_path: Path, catalog: Any, catalog_props: dict[str, str]
) -> None:
    cfg = load_config(date_job(tmp_path, catalog, catalog_props))
    bf = Backfill.create(cfg, {"start": "2026-03-01T00:00:00Z", "end": "2026-03-03T00:00:00Z"})
    check_tables(cfg, bf.params.sources, bf.catalog_for, window=(bf.params.start, bf.params.end))
    with pytest.raises(KappaConfigError, match=r"does not cover whole units of its time_column 'day'"):
        check_tables(
            cfg, bf.params.sources, bf.catalog_for, window=(DAY1 + timedelta(minutes=1), DAY1 + timedelta(days=1))
        )


# --------------------------------------------------------------------------- a window before the data


def test_a_window_before_the_data_is_refused_before_any_lock_or_tag(
    tmp_path: Path, catalog_props: dict[str, str], catalog: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_job_config(tmp_path, catalog_props)
    seed_sessions_incident(catalog)
    err = backfill_refused(capsys, config, ["--start", "2025-01-01T00:00:00Z", "--end", "2025-01-01T02:00:00Z"])
    assert "backfill window [2025-01-01T00:00:00+00:00, 2025-01-01T02:00:00+00:00) is outside the tables' data" in err
    assert_nothing_taken(catalog, "raw.playbacks", SESSIONS)
    assert not (tmp_path / "checkpoints").exists()
    # and the lock no longer blocks: an overlapping backfill's snapshot step is free to lock
    bf = Backfill.create(load_config(config), {"start": INCIDENT_START.isoformat(), "end": INCIDENT_END.isoformat()})
    snapshot(bf)
    assert [k for k in catalog.load_table(SESSIONS).properties if k.startswith("kappa.backfill.lock.")]


def test_a_refusal_after_the_lock_and_the_tag_gives_both_back(
    tmp_path: Path, catalog_props: dict[str, str], catalog: Any
) -> None:
    """The snapshot step called without the pre-flight (as a retried task may): its own refusal,
    raised once it locked and tagged, releases the lock and removes the tag."""
    config = write_job_config(tmp_path, catalog_props)
    seed_sessions_incident(catalog)
    bf = Backfill.create(load_config(config), {"start": "2025-01-01T00:00:00Z", "end": "2025-01-01T02:00:00Z"})
    with pytest.raises(KappaSourceError, match="is outside the tables' data"):
        snapshot(bf)
    assert_nothing_taken(catalog, "raw.playbacks", SESSIONS)


# --------------------------------------------------------------------------- the application, the server


def test_an_application_that_does_not_compile_is_refused_naming_file_and_line(
    tmp_path: Path, catalog_props: dict[str, str], catalog: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_job_config(tmp_path, catalog_props)
    app = tmp_path / "broken_job.py"
    app.write_text("import sys\n\ndef main(:\n    pass\n")
    raw = yaml.safe_load(config.read_text())
    raw["job"]["application"] = str(app)
    config.write_text(yaml.safe_dump(raw))
    seed_sessions_incident(catalog)
    err = backfill_refused(capsys, config, ["--start", INCIDENT_START.isoformat(), "--end", INCIDENT_END.isoformat()])
    assert f"job.application: {str(app)!r} does not compile" in err and "at line 3" in err, err
    assert_nothing_taken(catalog, "raw.playbacks", SESSIONS)
    assert not (tmp_path / "checkpoints").exists()


def test_an_unreachable_connect_server_is_refused_before_any_lock(
    tmp_path: Path, catalog_props: dict[str, str], catalog: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = write_job_config(tmp_path, catalog_props, engine="connect", connect_url=f"sc://127.0.0.1:{port}")
    seed_sessions_incident(catalog)
    err = backfill_refused(capsys, config, ["--start", INCIDENT_START.isoformat(), "--end", INCIDENT_END.isoformat()])
    assert f"job.connect.url: the Spark Connect server sc://127.0.0.1:{port} accepts no connection" in err, err
    assert_nothing_taken(catalog, "raw.playbacks", SESSIONS)
    assert not (tmp_path / "checkpoints").exists()
