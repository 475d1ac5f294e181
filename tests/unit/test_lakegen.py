"""The lake generator: shapes, determinism and landing, against a real sqlite SqlCatalog."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet
import pytest

from airflow_provider_kappa.demo.lakegen import (
    LANDED_UNTIL,
    LANDING_START,
    LakeSpec,
    append_landing,
    generate_lake,
    landed_events,
    landed_until,
)
from airflow_provider_kappa.exceptions import KappaConfigError, KappaSourceError

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
SECOND = 1_000_000


@pytest.fixture(scope="module")
def hour_of_events() -> tuple[pa.Table, pa.Table]:
    """One hour of the default lake (pure generation, no catalog)."""
    return landed_events(LakeSpec(hours=1.0, start=T0))


def micros(col: Any) -> np.ndarray:
    return np.asarray(pc.cast(col, pa.int64()))


def delays_s(t: pa.Table) -> np.ndarray:
    return (micros(t["ingestion_ts"]) - micros(t["event_ts"])) / SECOND


def test_same_spec_same_rows_and_seed_changes_them() -> None:
    spec = LakeSpec(hours=0.25, rate=5.0, start=T0, seed=11)
    a, b = landed_events(spec), landed_events(LakeSpec(hours=0.25, rate=5.0, start=T0, seed=11))
    assert a[0].equals(b[0]) and a[1].equals(b[1])
    other = landed_events(LakeSpec(hours=0.25, rate=5.0, start=T0, seed=12))
    assert not other[0].equals(a[0])
    assert not set(other[1]["account_id"].to_pylist()) == set(a[1]["account_id"].to_pylist())


def test_ten_to_one_volume(hour_of_events: tuple[pa.Table, pa.Table]) -> None:
    imp, play = hour_of_events
    assert abs(imp.num_rows - 20.0 * 3600) / (20.0 * 3600) < 0.02
    assert 9.5 < imp.num_rows / play.num_rows < 10.5


def test_delay_is_seconds_mostly_a_tail_of_minutes_and_a_few_beyond_the_watermark(
    hour_of_events: tuple[pa.Table, pa.Table],
) -> None:
    for t in hour_of_events:
        d = delays_s(t)
        assert d.min() > 0 and d.max() <= 30 * 60
        assert np.median(d) < 5
        assert (d < 60).mean() > 0.95
        assert 0.01 < ((d >= 60) & (d < 600)).mean() < 0.06
        beyond = (d > 600).sum()
        assert 0.002 * len(d) < beyond < 0.01 * len(d)


def test_rows_are_in_ingestion_order_and_inside_the_range(hour_of_events: tuple[pa.Table, pa.Table]) -> None:
    for t in hour_of_events:
        ing = micros(t["ingestion_ts"])
        assert (np.diff(ing) >= 0).all()
        assert ing.min() >= micros(pa.array([T0]))[0]
        assert ing.max() < micros(pa.array([T0 + timedelta(hours=1)]))[0]
        assert len(set(t["event_id"].to_pylist())) == t.num_rows


def test_heavy_hitters(hour_of_events: tuple[pa.Table, pa.Table]) -> None:
    imp, play = hour_of_events

    def top_share(col: pa.ChunkedArray, top: int) -> float:
        counts = np.sort(np.asarray(pc.value_counts(col).field("counts")))[::-1]
        return float(counts[:top].sum() / counts.sum())

    assert top_share(imp["account_id"], 50) > 0.3  # 1% of 5000 accounts: a third of the impressions
    assert top_share(imp["show_id"], 3) > 0.25  # 1% of 300 shows
    assert top_share(play["show_id"], 3) > 0.25
    # accounts that play are capped (4 sessions/hour expected), so their sessions stay sessions
    per_account = np.asarray(pc.value_counts(play["account_id"]).field("counts"))
    assert per_account.max() < 4 * 4 * 4


def test_plays_follow_impressions_and_come_in_sessions(hour_of_events: tuple[pa.Table, pa.Table]) -> None:
    import pandas as pd

    imp, play = (t.to_pandas() for t in hour_of_events)
    m = play.merge(imp, on=["account_id", "show_id"], suffixes=("_p", "_i"))
    m = m[(m.event_ts_p >= m.event_ts_i) & (m.event_ts_p <= m.event_ts_i + pd.Timedelta("30min"))]
    assert m.event_id_p.nunique() / len(play) > 0.5  # the rmi join attributes most plays

    play = play.sort_values(["account_id", "event_ts"])
    new = (play.groupby("account_id").event_ts.diff() > pd.Timedelta("5min")) | (
        play.groupby("account_id").cumcount() == 0
    )
    sizes = play.groupby(new.cumsum()).size()
    assert sizes.median() >= 2 and (sizes >= 3).mean() > 0.3
    assert len(sizes) > play.account_id.nunique()  # accounts come back after gaps: several sessions each


@pytest.mark.heavy
def test_generate_lake_lands_one_snapshot_per_interval_in_ingestion_order(catalog: Any) -> None:
    # four landings of 2 minutes across the hour (00:55-01:03: one landing spans two partitions)
    spec = LakeSpec(hours=8 / 60, rate=4.0, start=T0 + timedelta(minutes=55), landing_interval=timedelta(minutes=2))
    summary = generate_lake(catalog, spec)
    assert summary.landings == 4 and summary.snapshots == 8
    expected = landed_events(spec)
    assert (summary.impressions, summary.playbacks) == (expected[0].num_rows, expected[1].num_rows)
    for ident, rows in (("raw.impressions", expected[0]), ("raw.playbacks", expected[1])):
        table = catalog.load_table(ident)
        snaps = list(table.snapshots())
        assert len(snaps) == 4
        edges = [T0 + timedelta(minutes=55 + 2 * k) for k in range(5)]
        for k, snap in enumerate(snaps):  # commit order = ingestion order
            props = snap.summary.additional_properties
            assert props[LANDING_START] == edges[k].isoformat() and props[LANDED_UNTIL] == edges[k + 1].isoformat()
            added = table.scan(snapshot_id=snap.snapshot_id).to_arrow()
            assert added.num_rows == int(props.get("total-records", 0))
            in_range = pc.and_(
                pc.greater_equal(rows["ingestion_ts"], pa.scalar(edges[k], pa.timestamp("us", "UTC"))),
                pc.less(rows["ingestion_ts"], pa.scalar(edges[k + 1], pa.timestamp("us", "UTC"))),
            )
            assert int(props.get("added-records", 0)) == pc.sum(in_range).as_py()
        landed = table.scan().to_arrow().sort_by("event_id")
        assert landed.equals(rows.sort_by("event_id"))
        assert landed_until(table) == spec.end


def test_tables_are_partitioned_by_ingestion_hour(catalog: Any) -> None:
    spec = LakeSpec(hours=0.25, rate=4.0, start=T0 + timedelta(minutes=55), landing_interval=timedelta(minutes=5))
    generate_lake(catalog, spec)
    table = catalog.load_table("raw.playbacks")
    field = table.spec().fields[0]
    assert str(field.transform) == "hour" and table.schema().find_field(field.source_id).name == "ingestion_ts"
    files = table.inspect.files().to_pylist()
    t0_hour = int(T0.timestamp()) // 3600
    assert {f["partition"]["ingestion_hour"] for f in files} == {t0_hour, t0_hour + 1}  # 00:55-01:10
    for f in files:  # every row of a file is in its partition's hour
        data = pa.parquet.read_table(f["file_path"].removeprefix("file://"))
        hours = set((micros(data["ingestion_ts"]) // (3600 * SECOND)).tolist())
        assert hours == {f["partition"]["ingestion_hour"]}
    assert sum(f["record_count"] for f in files) == table.scan().to_arrow().num_rows


@pytest.mark.heavy
def test_append_landing_continues_the_same_stream(catalog: Any, tmp_path: Any) -> None:
    from pyiceberg.catalog import load_catalog

    # 3 landings of 4 minutes, then 2 more (fewer commits than the 2-minute default; the grid is the subject)
    spec = LakeSpec(hours=0.2, rate=3.0, start=T0, seed=3, landing_interval=timedelta(minutes=4))
    generate_lake(catalog, spec)
    more = append_landing(catalog, spec, T0 + timedelta(minutes=20))
    assert more.start == spec.end and more.landings == 2
    whole = landed_events(spec, T0, T0 + timedelta(minutes=20))
    for ident, rows in zip(("raw.impressions", "raw.playbacks"), whole):
        table = catalog.load_table(ident)
        assert len(list(table.snapshots())) == 5
        assert table.scan().to_arrow().sort_by("event_id").equals(rows.sort_by("event_id"))

    with pytest.raises(KappaSourceError, match="already holds lakegen landings up to 2026-11-01T00:20"):
        generate_lake(catalog, spec)
    other = load_catalog("lake", type="sql", uri=f"sqlite:///{tmp_path}/other.db", warehouse=f"file://{tmp_path}")
    with pytest.raises(KappaSourceError, match="'raw.impressions' does not exist"):
        append_landing(other, spec, T0 + timedelta(hours=1))


def test_bad_specs_are_refused() -> None:
    with pytest.raises(KappaConfigError, match="LakeSpec.start: .*expected an aware datetime"):
        LakeSpec(start=datetime(2026, 11, 1))
    with pytest.raises(KappaConfigError, match="LakeSpec.rate: -1.0"):
        LakeSpec(rate=-1.0)
    with pytest.raises(KappaConfigError, match="LakeSpec.late_fraction: 1.5"):
        LakeSpec(late_fraction=1.5)
