"""The planner: aligned slice grid, per-slice estimates from a real table's manifests,
warnings, and the refusal of a window outside the data."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from lake import T0, append_events, create_events_table, event
from paths import EXAMPLES

from airflow_provider_kappa.backfill import backfill as backfills
from airflow_provider_kappa.backfill import plan as planning
from airflow_provider_kappa.backfill import snapshot
from airflow_provider_kappa.backfill.params import parse_params
from airflow_provider_kappa.backfill.plan import BackfillPlan, SlicePlan, aligned_grid, slice_bounds, slice_id
from airflow_provider_kappa.exceptions import KappaSourceError
from airflow_provider_kappa.job.config import load_config

UTC = timezone.utc


def at(h: int, m: int = 0) -> datetime:
    return T0 + timedelta(hours=h, minutes=m)


def test_grid_is_aligned_to_multiples_of_the_slice_from_the_epoch() -> None:
    cells = aligned_grid(at(0, 40), at(3, 10), timedelta(hours=1))
    assert cells == [(at(0, 40), at(1)), (at(1), at(2)), (at(2), at(3)), (at(3), at(3, 10))]
    # 7-minute slices: boundaries are multiples of 7 minutes since 1970, not since the range start
    cells = aligned_grid(at(0), at(0, 30), timedelta(minutes=7))
    assert all(int(b.timestamp()) % 420 == 0 for _, b in cells[:-1])
    assert cells[0][0] == at(0) and cells[-1][1] == at(0, 30)
    assert all(a < b for a, b in cells) and all(cells[i][1] == cells[i + 1][0] for i in range(len(cells) - 1))


@pytest.fixture()
def sessions_cfg(lake_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("KAPPA_LAKE", str(lake_dir))
    return load_config(EXAMPLES / "playback_sessions" / "kappa.yaml")


def test_sequential_slices_cut_the_read_range_and_own_the_window(sessions_cfg: Any) -> None:
    p = parse_params(
        sessions_cfg, {"start": at(1).isoformat(), "end": at(3).isoformat(), "warmup": "30min", "tail": "15min"}
    )
    bounds = slice_bounds(p)
    assert [(r0, r1) for r0, r1, _, _ in bounds] == [
        (at(0, 30), at(1)),
        (at(1), at(2)),
        (at(2), at(3)),
        (at(3), at(3, 15)),
    ]
    assert {(o0, o1) for _, _, o0, o1 in bounds} == {(at(1), at(3))}


def test_parallel_slices_cut_the_window_and_read_warmup_and_tail_around_it(sessions_cfg: Any) -> None:
    p = parse_params(
        sessions_cfg,
        {"start": at(1).isoformat(), "end": at(3).isoformat(), "warmup": "30min", "tail": "15min", "mode": "parallel"},
    )
    assert slice_bounds(p) == [
        (at(0, 30), at(2, 15), at(1), at(2)),
        (at(1, 30), at(3, 15), at(2), at(3)),
    ]


def test_slice_ids_sort_in_order() -> None:
    assert [slice_id(i, 3) for i in range(3)] == ["s0000", "s0001", "s0002"]
    assert slice_id(12345, 20000) == "s12345"


@pytest.fixture()
def playbacks(catalog: Any) -> Any:
    table = create_events_table(catalog, "raw.playbacks")
    append_events(table, [event(1, at(0, 5)), event(2, at(0, 10)), event(3, at(0, 50))])  # one file, hour 0
    append_events(table, [event(4, at(1, 30)), event(5, at(1, 31))])  # one file, hour 1
    append_events(table, [event(100 + i, at(3, i)) for i in range(40)])  # one file, hour 3
    return table


def _backfill(cfg: Any, catalog: Any, **raw: Any) -> backfills.Backfill:
    base = {"start": at(0).isoformat(), "end": at(4).isoformat(), "warmup": "0s", "tail": "0s"}
    return backfills.Backfill.create(cfg, {**base, **raw}, catalog_for=lambda _name: catalog)


def test_plan_estimates_each_slice_from_manifests_and_warns(sessions_cfg: Any, catalog: Any, playbacks: Any) -> None:
    bf = _backfill(sessions_cfg, catalog)
    snaps = snapshot.snapshot(bf, tag=False)
    assert snaps == {"backfill-playbacks": playbacks.current_snapshot().snapshot_id}
    assert bf.tag not in playbacks.refresh().metadata.refs  # planning writes nothing
    plan = planning.plan(bf, snaps)
    assert [s.slice_id for s in plan.slices] == ["s0000", "s0001", "s0002", "s0003"]
    assert [(s.files, s.rows) for s in plan.slices] == [(1, 3), (1, 2), (0, 0), (1, 40)]
    assert all(s.stats[0].source == "playbacks" and s.snapshot_ids == snaps for s in plan.slices)
    assert plan.slices[0].bytes > 0
    assert plan.slices[2].warnings == ("no source data in this slice: it only advances the watermark",)
    assert any(w.startswith("outsized: ~40 rows") for w in plan.slices[3].warnings)
    assert plan.warnings == ("1 of 4 slice(s) have no source data",)
    # sequential: every slice but the last with data ends like a stream that goes on
    assert [s.continued for s in plan.slices] == [True, True, True, False]
    # the whole plan and each slice fit XCom (JSON) and come back identical
    data = json.loads(json.dumps(plan.to_dict()))
    assert BackfillPlan.from_dict(data) == plan
    assert SlicePlan.from_dict(data["slices"][1]) == plan.slices[1]


def test_a_slice_continues_only_while_later_slices_have_data(sessions_cfg: Any, catalog: Any, playbacks: Any) -> None:
    bf = _backfill(sessions_cfg, catalog, end=at(3).isoformat())  # hours 0, 1, 2: the last is empty
    plan = planning.plan(bf, snapshot.snapshot(bf, tag=False))
    assert [(s.files, s.continued) for s in plan.slices] == [(1, True), (1, False), (0, False)]
    par = _backfill(sessions_cfg, catalog, mode="parallel")
    assert not any(s.continued for s in planning.plan(par, snapshot.snapshot(par, tag=False)).slices)


def test_rows_of_a_file_spanning_slices_are_prorated(sessions_cfg: Any, catalog: Any, playbacks: Any) -> None:
    bf = _backfill(sessions_cfg, catalog, slice="30min", max_misalignment_threshold="5min", end=at(1).isoformat())
    plan = planning.plan(bf, snapshot.snapshot(bf, tag=False))
    # the hour-0 file spans 00:05..00:50: both half-hour slices may read it, rows are shared by time
    assert [s.files for s in plan.slices] == [1, 1]
    assert sum(s.rows for s in plan.slices) == 3


def test_a_window_outside_the_data_is_refused(sessions_cfg: Any, catalog: Any, playbacks: Any) -> None:
    bf = _backfill(sessions_cfg, catalog, start=at(10).isoformat(), end=at(12).isoformat())
    with pytest.raises(KappaSourceError) as err:
        planning.plan(bf, snapshot.snapshot(bf, tag=False))
    msg = str(err.value)
    assert "is outside the tables' data" in msg
    assert "playbacks: data from 2026-11-01T00:05:00+00:00 to 2026-11-01T03:39:00+00:00" in msg


def test_a_source_table_without_snapshot_is_refused(sessions_cfg: Any, catalog: Any) -> None:
    create_events_table(catalog, "raw.playbacks")
    bf = _backfill(sessions_cfg, catalog)
    with pytest.raises(KappaSourceError, match=r"table 'raw.playbacks' has no snapshot \(it holds no data\)"):
        snapshot.snapshot(bf)


def test_a_missing_source_table_is_refused(sessions_cfg: Any, catalog: Any) -> None:
    bf = _backfill(sessions_cfg, catalog)
    with pytest.raises(KappaSourceError, match="table 'raw.playbacks' does not exist in catalog 'lake'"):
        snapshot.snapshot(bf)
