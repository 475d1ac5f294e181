"""Durations and timestamps as DESIGN.md writes them."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from airflow_provider_kappa.exceptions import KappaConfigError
from airflow_provider_kappa.timeparse import format_duration, from_micros, parse_duration, parse_timestamp, to_micros


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30s", timedelta(seconds=30)),
        ("15min", timedelta(minutes=15)),
        ("1h", timedelta(hours=1)),
        ("2d", timedelta(days=2)),
        ("500ms", timedelta(milliseconds=500)),
        ("PT15M", timedelta(minutes=15)),
        ("P1DT2H", timedelta(days=1, hours=2)),
        ("pt1h30m", timedelta(hours=1, minutes=30)),
    ],
)
def test_durations(text: str, expected: timedelta) -> None:
    assert parse_duration(text, "k") == expected
    assert parse_duration(format_duration(expected), "k") == expected


def test_zero_only_where_allowed() -> None:
    assert parse_duration("0s", "warmup", allow_zero=True) == timedelta(0)
    with pytest.raises(KappaConfigError, match=r"slice: '0s' must be positive"):
        parse_duration("0s", "slice")
    with pytest.raises(KappaConfigError, match=r"tail: 'PT' is not a duration"):
        parse_duration("PT", "tail", allow_zero=True)
    with pytest.raises(KappaConfigError, match=r"slice: '15' is not a duration"):
        parse_duration("15", "slice")


def test_timestamps() -> None:
    ts = parse_timestamp("2026-11-01T02:00:00+02:00", "start")
    assert ts == datetime(2026, 11, 1, 0, 0, tzinfo=timezone.utc)
    assert parse_timestamp("2026-11-01T00:00:00Z", "start") == ts
    # the forms Python 3.11's fromisoformat reads and 3.10's does not, read alike on every Python
    for same in ("2026-11-01T00:00:00z", "2026-11-01T02:00:00+0200", "2026-11-01T02:00:00+02", "2026-11-01 00:00Z"):
        assert parse_timestamp(same, "start") == ts, same
    assert parse_timestamp("2026-11-01T00:00:00.5Z", "start") == ts + timedelta(milliseconds=500)
    assert parse_timestamp("2026-11-01T00:00:00.1234567+00:00", "start") == ts + timedelta(microseconds=123456)
    assert from_micros(to_micros(ts)) == ts
    with pytest.raises(KappaConfigError, match=r"start: '2026-11-01T00:00:00' is a naive timestamp"):
        parse_timestamp("2026-11-01T00:00:00", "start")
    with pytest.raises(KappaConfigError, match=r"end: 'yesterday' is not an ISO-8601 timestamp"):
        parse_timestamp("yesterday", "end")
