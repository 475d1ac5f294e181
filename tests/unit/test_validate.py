"""Validation against a hand-computed case on a real sqlite SqlCatalog."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import pytest
from lake import T0, create_summary_table, summary_row, summary_table

from airflow_provider_kappa.exceptions import KappaConfigError, KappaSinkError, KappaValidationError
from airflow_provider_kappa.spark.staging import ensure_staging_table, staging_table_name
from airflow_provider_kappa.backfill.validate import HourCounts, check_min_match, validate_window

TARGET = "prod.summary"
H = timedelta(hours=1)


@pytest.fixture()
def seeded(catalog: Any) -> list[str]:
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
    s1, s2 = (staging_table_name(TARGET, "bf", s) for s in ("s1", "s2"))
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


def test_numbers_of_a_differing_window_match_the_hand_computation(catalog: Any, seeded: list[str]) -> None:
    report = validate_window(catalog, TARGET, seeded, "window_start", T0, T0 + 2 * H)
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


def test_sample_size_is_bounded(catalog: Any, seeded: list[str]) -> None:
    report = validate_window(catalog, TARGET, seeded, "window_start", T0, T0 + 2 * H, sample=1)
    assert len(report.only_staged_sample) == 1 and len(report.only_target_sample) == 1
    assert report.only_staged_rows == 2


def test_a_matching_window_is_100_percent_and_an_empty_one_is_flagged(catalog: Any, seeded: list[str]) -> None:
    same = validate_window(catalog, TARGET, seeded, "window_start", T0 + 3 * H, T0 + 4 * H)
    assert (same.staged_rows, same.target_rows, same.matched_rows, same.match_rate) == (2, 2, 2, 100.0)
    assert same.only_staged_sample == [] and same.only_target_sample == [] and not same.empty
    empty = validate_window(catalog, TARGET, seeded, "window_start", T0 + 10 * H, T0 + 11 * H)
    assert (empty.staged_rows, empty.target_rows, empty.match_rate, empty.empty) == (0, 0, 100.0, True)
    assert empty.per_hour == []


def test_one_empty_side_is_zero_percent(catalog: Any, seeded: list[str]) -> None:
    report = validate_window(catalog, TARGET, [], "window_start", T0, T0 + 2 * H)
    assert (report.staged_rows, report.target_rows, report.matched_rows, report.match_rate) == (0, 5, 0, 0.0)
    assert report.only_target_rows == 5


def test_json_and_text_reports(catalog: Any, seeded: list[str]) -> None:
    report = validate_window(catalog, TARGET, seeded, "window_start", T0, T0 + 2 * H)
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


def test_check_min_match_gates(catalog: Any, seeded: list[str]) -> None:
    report = validate_window(catalog, TARGET, seeded, "window_start", T0, T0 + 2 * H)
    check_min_match(report, 60.0)
    with pytest.raises(KappaValidationError, match=r"match rate 60.000% is below min_match 99.9%"):
        check_min_match(report, 99.9)
    with pytest.raises(KappaValidationError, match="between 0 and 100"):
        check_min_match(report, 150)


def test_bad_inputs_are_named(catalog: Any, seeded: list[str]) -> None:
    with pytest.raises(KappaSinkError, match="time_column 'nope' is not a column"):
        validate_window(catalog, TARGET, seeded, "nope", T0, T0 + H)
    with pytest.raises(KappaSinkError, match="time_column 'show_id' has type long"):
        validate_window(catalog, TARGET, seeded, "show_id", T0, T0 + H)
    with pytest.raises(KappaSinkError, match="target table 'prod.missing' does not exist"):
        validate_window(catalog, "prod.missing", seeded, "window_start", T0, T0 + H)
    with pytest.raises(KappaSinkError, match="staging table 'kappa_staging.gone' does not exist"):
        validate_window(catalog, TARGET, ["kappa_staging.gone"], "window_start", T0, T0 + H)
    with pytest.raises(KappaConfigError, match="naive timestamp"):
        validate_window(catalog, TARGET, seeded, "window_start", datetime(2026, 11, 1), T0 + H)
    with pytest.raises(KappaSinkError, match="must be after window start"):
        validate_window(catalog, TARGET, seeded, "window_start", T0 + H, T0)
