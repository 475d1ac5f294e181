"""A window whose ``end + tail`` lies past the landed data (issue 18 item 5): refused before any
lock or tag, or, with ``allow_open_end``, validated and published only up to what the landed
data closes (the target keeps its rows after that); rows with a null ingestion time reported by
validate (item 7); transient faults told in one line and retried (item 6). No Spark: staged rows
are appended with pyiceberg, as a slice run would stage them."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from airflow_env import write_job_config
from lake import (
    T0,
    append_events,
    create_events_table,
    create_sessions_table,
    event,
    expected_sessions,
    sessions_arrow,
    sorted_rows,
)

from airflow_provider_kappa.backfill import plan as planning
from airflow_provider_kappa.backfill import publish as publishing
from airflow_provider_kappa.backfill import summary as summaries
from airflow_provider_kappa.backfill import validate as validation
from airflow_provider_kappa.backfill.backfill import Backfill
from airflow_provider_kappa.backfill.checks import check_inputs, check_landed, closed_end, landed_end
from airflow_provider_kappa.backfill.lock import read_locks
from airflow_provider_kappa.backfill.snapshot import snapshot
from airflow_provider_kappa.cli import main
from airflow_provider_kappa.exceptions import KappaCatalogUnavailableError, KappaSourceError
from airflow_provider_kappa.faults import one_line, retry_transient, root_transient_cause
from airflow_provider_kappa.job.config import load_config
from airflow_provider_kappa.spark.staging import ensure_staging_table

SOURCE = "raw.playbacks"
TARGET = "prod.playback_sessions"


def at(h: int, m: int = 0, s: int = 0) -> datetime:
    return T0 + timedelta(hours=h, minutes=m, seconds=s)


#: playbacks from 04:00 to 05:59 (account 7 every 6 minutes; a few sessions of other accounts)
EVENTS = [event(700 + i, at(4, 6 * i), account=7, show=7) for i in range(20)] + [
    event(100 + i, at(5, m), account=a, show=a)
    for i, (a, m) in enumerate([(1, 20), (1, 22), (1, 24), (2, 41), (2, 43), (3, 57), (3, 59)])
]
#: the issue's case: a window to the next day over data ending at 06:00
OPEN = {
    "start": at(5).isoformat(),
    "end": at(24).isoformat(),
    "slice": "6h",
    "warmup": "30min",
    "tail": "20min",
    "max_misalignment_threshold": "1h",
}


@pytest.fixture()
def lake(tmp_path: Path, catalog: Any, catalog_props: dict[str, str]) -> dict[str, Any]:
    append_events(create_events_table(catalog, SOURCE), EVENTS)
    oracle = expected_sessions(EVENTS)  # what live, going on past 06:00, wrote
    create_sessions_table(catalog, TARGET).append(pa.Table.from_pylist(oracle, schema=sessions_arrow()))
    return {"config": write_job_config(tmp_path, catalog_props), "oracle": oracle}


def test_a_window_past_the_landed_data_is_refused_before_any_lock_or_tag(
    lake: dict[str, Any], catalog: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    before = sorted_rows(catalog.load_table(TARGET))
    argv = [
        "--start",
        OPEN["start"],
        "--end",
        OPEN["end"],
        "--slice",
        "6h",
        "--warmup",
        "30min",
        "--tail",
        "20min",
        "--max-misalignment",
        "1h",
    ]
    code = main(["backfill", "--config", str(lake["config"]), *argv])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2, err
    assert err.startswith(
        "kappa backfill: error: backfill window [2026-11-01T05:00:00+00:00, 2026-11-02T00:00:00+00:00) with tail 20min"
    )
    assert (
        "end + tail = 2026-11-02T00:20:00+00:00, past the landed data: source backfill-playbacks (raw.playbacks" in err
    )
    assert "holds ingestion times up to 2026-11-01T05:59:00+00:00, landed through 2026-11-01T06:00:00+00:00" in err
    assert "Use an end of at most 2026-11-01T05:40:00+00:00" in err and "--allow-open-end" in err
    # nothing written: no tag, no lock, no checkpoint, the target's correct rows untouched
    assert not [r for r in catalog.load_table(SOURCE).metadata.refs if r.startswith("kappa-")]
    assert read_locks(catalog.load_table(TARGET)) == []
    assert not (lake["config"].parent / "checkpoints").exists()
    assert sorted_rows(catalog.load_table(TARGET)) == before


def test_the_check_follows_end_plus_tail_and_the_threshold_grid(lake: dict[str, Any]) -> None:
    cfg = load_config(lake["config"])
    landed = landed_end(Backfill.create(cfg, OPEN))
    assert landed is not None and (landed.end, landed.last, landed.table) == (at(6), at(5, 59), SOURCE)
    # end + tail within the landed data (the last file's 1h threshold cell): accepted as it is
    within = Backfill.create(cfg, {**OPEN, "end": at(5, 40), "slice": "1h"})
    assert check_landed(within) == landed
    check_inputs(within)
    # a threshold of 1min: the landed data ends with the minute of its last row
    fine = Backfill.create(cfg, {**OPEN, "end": at(5, 40), "max_misalignment_threshold": "1min", "slice": "1h"})
    with pytest.raises(
        KappaSourceError, match=r"landed through 2026-11-01T06:00:00\+00:00 .*Use an end of at most 2026-11-01T05:40:00"
    ):
        check_landed(
            Backfill.create(cfg, {**OPEN, "end": at(5, 41), "max_misalignment_threshold": "1min", "slice": "1h"})
        )
    assert check_landed(fine) is not None
    # a window the landed data closes no part of is refused even with the flag
    with pytest.raises(
        KappaSourceError, match=r"closes no part of the window \(it would need data up to 2026-11-01T06:10"
    ):
        check_landed(Backfill.create(cfg, {**OPEN, "start": at(5, 50), "allow_open_end": True}))


def test_allow_open_end_publishes_only_what_the_landed_data_closes(lake: dict[str, Any], catalog: Any) -> None:
    """The staged output of the open window (sessions the watermark closed, and one it could not
    close correctly) replaces the target only up to 05:40; rows after it stay as they are."""
    cfg = load_config(lake["config"])
    bf = Backfill.create(cfg, {**OPEN, "allow_open_end": True})
    check_inputs(bf)
    plan = planning.plan(bf, snapshot(bf))
    assert closed_end(bf, validation.pinned(plan)) == at(5, 40)
    oracle = lake["oracle"]
    # the damaged target: account 1's session (05:20) miscounted
    target = catalog.load_table(TARGET)
    damaged = [dict(s, plays=99) if s["account_id"] == 1 else s for s in oracle]
    target.overwrite(pa.Table.from_pylist(damaged, schema=sessions_arrow()))
    # staged: every session that starts in the window and closed before the data ends, and a
    # wrong row for the session still open at 05:57 (what an open end stages)
    closed = [s for s in oracle if at(5) <= s["session_start"] and s["account_id"] != 3]
    stuck = {
        "account_id": 3,
        "session_start": at(5, 56, 59),
        "session_end": at(6, 1, 59),
        "plays": 1,
        "last_play_ts": at(5, 56, 59),
    }
    sink = cfg.sinks["sessions"]
    for i, sp in enumerate(plan.slices):
        table = ensure_staging_table(catalog, TARGET, bf.staging_table(sink, sp.slice_id))
        if i == 0:
            table.append(pa.Table.from_pylist([*closed, stuck], schema=sessions_arrow()))
    reports = validation.validate(bf, plan)
    report = reports["sessions"]
    assert report.window_end == at(5, 40).isoformat() and report.only_target_rows == 1 and report.only_staged_rows == 1
    assert any("published [2026-11-01T05:00:00+00:00, 2026-11-01T05:40:00+00:00)" in w for w in report.warnings), (
        report.warnings
    )
    assert "warning: allow_open_end: end + tail lies past the landed data" in report.to_text()
    validation.check_gate(bf, plan, reports)
    results = publishing.publish(bf, plan)
    assert results["sessions"].rows_added == len([s for s in closed if s["session_start"] < at(5, 40)])
    # the window up to 05:40 repaired, the rows after it (correct, closed by live) kept: none lost
    assert sorted_rows(catalog.load_table(TARGET)) == sorted_rows(pa.Table.from_pylist(oracle, schema=sessions_arrow()))
    assert read_locks(catalog.load_table(TARGET)) == []
    text = summaries.summary(bf, plan, [], {k: r.to_dict() for k, r in reports.items()}, {})
    assert "staged rows from 2026-11-01T05:40:00+00:00 on are not published" in text


def test_validate_reports_rows_with_a_null_ingestion_time(lake: dict[str, Any], catalog: Any) -> None:
    append_events(catalog.load_table(SOURCE), [{**event(900 + i, at(5, 30)), "ingestion_ts": None} for i in range(3)])
    bf = Backfill.create(load_config(lake["config"]), {**OPEN, "end": at(5, 40), "slice": "1h"})
    plan = planning.plan(bf, snapshot(bf, tag=False))
    for sp in plan.slices:
        ensure_staging_table(catalog, TARGET, bf.staging_table(bf.cfg.sinks["sessions"], sp.slice_id))
    (report,) = validation.validate(bf, plan).values()
    expected = "source backfill-playbacks: 3 row(s) of raw.playbacks have a null ingestion_ts; no slice reads them"
    assert any(w.startswith(expected) for w in report.warnings), report.warnings
    assert f"warning: {expected}" in report.to_text() and report.to_dict()["warnings"] == report.warnings


def test_a_transient_fault_is_retried_and_told_in_one_line() -> None:
    import sqlite3

    from sqlalchemy.exc import OperationalError

    locked = OperationalError("UPDATE iceberg_tables SET ...", {"p": 1}, sqlite3.OperationalError("database is locked"))
    assert one_line(locked) == "OperationalError: database is locked"
    assert one_line(ValueError("first\nsecond")) == "ValueError: first"
    try:
        try:
            raise locked
        except OperationalError as e:
            raise KappaCatalogUnavailableError("catalog 'lake' cannot be reached for now") from e
    except KappaCatalogUnavailableError as wrapped:
        assert root_transient_cause(wrapped) is locked and root_transient_cause(ValueError("x")) is None
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise locked
        return "done"

    assert retry_transient(flaky, "test", attempts=3, delay=0.01) == "done" and len(calls) == 3

    def down() -> None:
        calls.append(1)
        raise locked

    calls.clear()
    with pytest.raises(OperationalError):
        retry_transient(down, "test", attempts=2, delay=0.01)
    assert len(calls) == 2  # the last transient fault is raised as it is

    def bad() -> None:
        calls.append(1)
        raise ValueError("permanent")

    calls.clear()
    with pytest.raises(ValueError):
        retry_transient(bad, "test", attempts=3, delay=0.01)
    assert len(calls) == 1  # permanent: not retried
