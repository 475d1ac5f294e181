"""Validation against a hand-computed case on a real sqlite SqlCatalog."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from lake import T0, create_summary_table, summary_row, summary_table

from airflow_provider_kappa.backfill.compare import HourCounts
from airflow_provider_kappa.backfill.validate import check_min_match, validate_window
from airflow_provider_kappa.exceptions import KappaConfigError, KappaSinkError, KappaValidationError
from airflow_provider_kappa.spark.staging import ensure_staging_table, staging_table_name
from airflow_provider_kappa.timeparse import to_micros

TARGET = "prod.summary"
H = timedelta(hours=1)
#: the two slice staging tables of the seeded lake
SEEDED_STAGING = [staging_table_name(TARGET, "bf", s) for s in ("s1", "s2")]


def _seed(catalog: Any) -> list[str]:
    """Target and two slice staging tables; window [T0, T0+2h) differs, [T0+3h, T0+4h) matches."""
    target = create_summary_table(catalog, TARGET)
    target.append(
        summary_table(
            [
                summary_row(0, 1, 3),
                summary_row(0, 1, 3),  # duplicate: a multiset, not a set
                summary_row(5, 1, 4),
                summary_row(60, 2, 7),
                summary_row(65, 2, 1),
                summary_row(120, 1, 9),  # outside the window
                summary_row(180, 5, 5),
                summary_row(185, 5, 6),
            ]
        )
    )
    s1, s2 = SEEDED_STAGING
    ensure_staging_table(catalog, TARGET, s1).append(
        summary_table([summary_row(-5, 1, 1), summary_row(0, 1, 3), summary_row(5, 1, 4)])
    )
    ensure_staging_table(catalog, TARGET, s2).append(
        summary_table(
            [
                summary_row(60, 2, 7),
                summary_row(65, 2, 2),
                summary_row(70, 3, 1),
                summary_row(180, 5, 5),
                summary_row(185, 5, 6),
            ]
        )
    )
    return [s1, s2]


def _snapshots(catalog: Any, tables: list[str]) -> dict[str, int | None]:
    return {t: getattr(catalog.load_table(t).current_snapshot(), "snapshot_id", None) for t in tables}


@pytest.fixture(scope="module")
def seeded_catalog(module_lake_dir: Path) -> Iterator[Any]:
    """The catalog of :func:`_seed`'s lake, built once for the tests here that only validate it (a
    real file-backed sqlite SqlCatalog, like ``catalog``); after them, every table is checked to
    be at the snapshot it was seeded at."""
    from airflow_provider_kappa.demo.lakegen import local_catalog

    catalog = local_catalog(module_lake_dir)
    tables = [TARGET, *_seed(catalog)]
    seeded_at = _snapshots(catalog, tables)
    yield catalog
    assert _snapshots(catalog, tables) == seeded_at, "a test changed the shared seeded lake"


@pytest.fixture()
def seeded(seeded_catalog: Any) -> list[str]:
    """The staging tables of the seeded lake (``seeded_catalog``)."""
    return list(SEEDED_STAGING)


def test_numbers_of_a_differing_window_match_the_hand_computation(seeded_catalog: Any, seeded: list[str]) -> None:
    report = validate_window(seeded_catalog, TARGET, seeded, "window_start", T0, T0 + 2 * H)
    # target in window: (0,1,3)x2, (5,1,4), (60,2,7), (65,2,1)            -> 5 rows
    # staged in window: (0,1,3), (5,1,4), (60,2,7), (65,2,2), (70,3,1)   -> 5 rows (+3 outside)
    # matched: (0,1,3) min(1,2)=1, (5,1,4) 1, (60,2,7) 1                  -> 3; rate 3/5 = 60 %
    assert (report.staged_rows, report.target_rows, report.matched_rows) == (5, 5, 3)
    assert report.match_rate == pytest.approx(60.0)
    assert report.empty is False
    assert (report.only_staged_rows, report.only_target_rows) == (2, 2)
    assert report.staged_outside_window == 3  # -5 min, 180 and 185 min
    assert report.per_hour == [
        HourCounts(hour=T0.isoformat(), staged=2, target=3),
        HourCounts(hour=(T0 + H).isoformat(), staged=3, target=2),
    ]

    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r["window_start"], r["show_id"], r["attributed_plays"], r["_count"])

    assert sorted(map(key, report.only_staged_sample)) == [
        (T0 + timedelta(minutes=65), 2, 2, 1),
        (T0 + timedelta(minutes=70), 3, 1, 1),
    ]
    assert sorted(map(key, report.only_target_sample)) == [(T0, 1, 3, 1), (T0 + timedelta(minutes=65), 2, 1, 1)]


def test_sample_size_is_bounded(seeded_catalog: Any, seeded: list[str]) -> None:
    report = validate_window(seeded_catalog, TARGET, seeded, "window_start", T0, T0 + 2 * H, sample=1)
    assert len(report.only_staged_sample) == 1 and len(report.only_target_sample) == 1
    assert report.only_staged_rows == 2


def test_a_matching_window_is_100_percent_and_an_empty_one_is_flagged(seeded_catalog: Any, seeded: list[str]) -> None:
    same = validate_window(seeded_catalog, TARGET, seeded, "window_start", T0 + 3 * H, T0 + 4 * H)
    assert (same.staged_rows, same.target_rows, same.matched_rows, same.match_rate) == (2, 2, 2, 100.0)
    assert same.only_staged_sample == [] and same.only_target_sample == [] and not same.empty
    empty = validate_window(seeded_catalog, TARGET, seeded, "window_start", T0 + 10 * H, T0 + 11 * H)
    assert (empty.staged_rows, empty.target_rows, empty.match_rate, empty.empty) == (0, 0, 100.0, True)
    assert empty.per_hour == []


def test_one_empty_side_is_zero_percent(seeded_catalog: Any, seeded: list[str]) -> None:
    report = validate_window(seeded_catalog, TARGET, [], "window_start", T0, T0 + 2 * H)
    assert (report.staged_rows, report.target_rows, report.matched_rows, report.match_rate) == (0, 5, 0, 0.0)
    assert report.only_target_rows == 5


def test_json_and_text_reports(seeded_catalog: Any, seeded: list[str]) -> None:
    report = validate_window(seeded_catalog, TARGET, seeded, "window_start", T0, T0 + 2 * H)
    data = json.loads(report.to_json())
    assert data["match_rate"] == 60.0 and data["staged_rows"] == 5 and data["empty"] is False
    assert data["window_start"] == T0.isoformat()
    assert data["per_hour"][0] == {"hour": T0.isoformat(), "staged": 2, "target": 3}
    assert data["only_target_sample"][0]["window_start"].startswith("2026-11-01T00:")
    text = report.to_text()
    assert "match rate        60.000 %" in text
    assert "differing: 2" in text
    assert "outside the window: 3" in text
    assert "sample only in staged" in text


def test_check_min_match_gates(seeded_catalog: Any, seeded: list[str]) -> None:
    report = validate_window(seeded_catalog, TARGET, seeded, "window_start", T0, T0 + 2 * H)
    check_min_match(report, 60.0)
    with pytest.raises(KappaValidationError, match=r"match rate 60.000% is below min_match 99.9%"):
        check_min_match(report, 99.9)
    with pytest.raises(KappaValidationError, match="between 0 and 100"):
        check_min_match(report, 150)


def test_bad_inputs_are_named(seeded_catalog: Any, seeded: list[str]) -> None:
    with pytest.raises(KappaSinkError, match="time_column 'nope' is not a column"):
        validate_window(seeded_catalog, TARGET, seeded, "nope", T0, T0 + H)
    with pytest.raises(KappaSinkError, match="time_column 'show_id' has type long"):
        validate_window(seeded_catalog, TARGET, seeded, "show_id", T0, T0 + H)
    with pytest.raises(KappaSinkError, match="target table 'prod.missing' does not exist"):
        validate_window(seeded_catalog, "prod.missing", seeded, "window_start", T0, T0 + H)
    with pytest.raises(KappaSinkError, match="staging table 'kappa_staging.gone' does not exist"):
        validate_window(seeded_catalog, TARGET, ["kappa_staging.gone"], "window_start", T0, T0 + H)
    with pytest.raises(KappaConfigError, match="naive timestamp"):
        validate_window(seeded_catalog, TARGET, seeded, "window_start", datetime(2026, 11, 1), T0 + H)
    with pytest.raises(KappaSinkError, match="must be after window start"):
        validate_window(seeded_catalog, TARGET, seeded, "window_start", T0 + H, T0)


# --- bounded memory: the window is streamed and compared partition by partition ---------------------


def _key(r: dict[str, Any]) -> str:
    return json.dumps({k: str(v) for k, v in r.items()}, sort_keys=True)


def test_tiny_batches_and_many_partitions_give_the_same_report(seeded_catalog: Any, seeded: list[str]) -> None:
    from airflow_provider_kappa.backfill.validate import _validate

    whole = validate_window(seeded_catalog, TARGET, seeded, "window_start", T0, T0 + 2 * H)
    report, spill = _validate(
        seeded_catalog,
        TARGET,
        seeded,
        "window_start",
        T0,
        T0 + 2 * H,
        5,
        batch_rows=1,
        partition_bytes=1,
        spill_dir=None,
    )
    assert spill.partitions > 1
    assert spill.largest_batch_rows == 1  # never more than batch_rows rows read at a time
    assert spill.largest_partition_rows < report.staged_rows + report.target_rows  # one partition at a time
    small, full = report.to_dict(), whole.to_dict()
    for side in ("only_staged_sample", "only_target_sample"):
        assert sorted(map(_key, small.pop(side))) == sorted(map(_key, full.pop(side)))
    assert small == full


@pytest.mark.heavy
def test_the_peak_memory_of_validate_does_not_hold_the_window(catalog: Any, lake_dir: Any) -> None:
    """Arrow's peak allocation in a fresh process validating a 400k-row window (both sides ~13 MB
    of Arrow each) stays a small fraction of the window: batches and partitions, never the whole.

    The lake is written here (vectorised, in this process); only the validation runs in the fresh
    process whose memory pool's high-water mark is read."""
    import subprocess
    import sys

    import numpy as np
    import pyarrow as pa
    from lake import summary_arrow

    n = 400_000
    i = np.arange(n, dtype=np.int64)
    # window_start = T0 + (i mod 8 h) seconds; one row in 1000 differs on the staged side
    start = pa.array(to_micros(T0) + (i % 28_800) * 1_000_000, pa.timestamp("us", tz="UTC"))

    def rows(shift: int) -> Any:
        return pa.table([start, start, pa.array(i), pa.array(i % 97 + shift * (i % 1000 == 0))], schema=summary_arrow())

    window = rows(0)
    create_summary_table(catalog, TARGET).append(window)
    staging = staging_table_name(TARGET, "bf", "s1")
    ensure_staging_table(catalog, TARGET, staging).append(rows(1))
    probe = r"""
import sys, json
from datetime import datetime, timedelta, timezone
import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog
from airflow_provider_kappa.backfill.validate import validate_window
d, target, staging, t0 = sys.argv[1:]
catalog = SqlCatalog("lake", uri=f"sqlite:///{d}/catalog.db", warehouse=f"file://{d}/warehouse")
t0 = datetime.fromisoformat(t0)
before = pa.default_memory_pool().max_memory()
report = validate_window(catalog, target, [staging], "window_start", t0, t0 + timedelta(hours=8),
                         batch_rows=8192, partition_bytes=256 * 1024)
print(json.dumps({"peak": pa.default_memory_pool().max_memory(), "before": before,
                  "matched": report.matched_rows, "staged": report.staged_rows, "target": report.target_rows}))
"""
    ran = subprocess.run(
        [sys.executable, "-c", probe, str(lake_dir), TARGET, staging, T0.isoformat()],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr
    out = json.loads(ran.stdout.strip().splitlines()[-1])
    assert (out["staged"], out["target"], out["matched"]) == (n, n, n - n // 1000)
    assert out["peak"] < window.nbytes / 4, (out, window.nbytes)


def test_row_stream_reads_files_of_older_schemas_and_bounds_its_batches(catalog: Any) -> None:
    from pyiceberg.types import StringType

    from airflow_provider_kappa.backfill.row_stream import plan, table_batches

    target = create_summary_table(catalog, TARGET)
    target.append(summary_table([summary_row(m, 1, m) for m in range(10)]))  # before the new column
    with target.update_schema() as update:
        update.add_column("note", StringType())
        update.rename_column("show_id", "show")
    target = catalog.load_table(TARGET)
    import pyarrow as pa

    newer = summary_table([summary_row(m, 2, m) for m in range(10, 15)]).rename_columns(
        ["window_start", "window_end", "show", "attributed_plays"]
    )
    target.append(newer.append_column("note", pa.array(["x"] * 5, pa.large_string())))
    batches = list(table_batches(target, plan(target), batch_rows=3))
    assert max(b.num_rows for b in batches) <= 3
    rows = pa.Table.from_batches(batches).to_pylist()
    assert sorted((r["attributed_plays"], r["show"], r["note"]) for r in rows) == [(m, 1, None) for m in range(10)] + [
        (m, 2, "x") for m in range(10, 15)
    ]
