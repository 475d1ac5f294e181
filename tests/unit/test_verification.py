"""A verification's summary (backfill/verify.py): the drifting windows of a validation report,
capped per sink with their total, the min_match a verification uses, and its text."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from airflow_env import write_job_config
from lake import T0, summary_row, summary_table

from airflow_provider_kappa.backfill.backfill import Backfill
from airflow_provider_kappa.backfill.validate import build_report
from airflow_provider_kappa.backfill.verify import MAX_DRIFT_WINDOWS, drift_text, verification
from airflow_provider_kappa.job.config import load_config

START, END = T0, T0 + timedelta(hours=4)


def _report(changed: list[int]) -> Any:
    """Live: 2 rows per 5-minute window over [START, END); the replay differs in the windows at
    the ``changed`` minutes (one row with another play count)."""
    live = [summary_row(m, show, 3) for m in range(0, 240, 5) for show in (1, 2)]
    replay = [summary_row(m, show, 4 if m in changed and show == 1 else 3) for m in range(0, 240, 5) for show in (1, 2)]
    return build_report(
        target_table="prod.summary",
        staging=["staging.s0"],
        time_column="window_start",
        start=START,
        end=END,
        staged=summary_table(replay),
        target=summary_table(live),
    )


def _verification(tmp_path: Path, catalog_props: dict[str, str], **params: Any) -> Backfill:
    cfg = load_config(write_job_config(tmp_path, catalog_props))
    return Backfill.create(cfg, {"start": START.isoformat(), "end": END.isoformat(), "publish": False, **params})


def test_one_drifting_window_is_listed_with_both_sides_counts(tmp_path: Path, catalog_props: dict[str, str]) -> None:
    bf = _verification(tmp_path, catalog_props)
    summary = verification(bf, {"sessions": _report([35])}, report_url="file:///r/report.html")
    assert summary["drift"] and summary["min_match"] == 100.0 and summary["report"] == "file:///r/report.html"
    assert (summary["start"], summary["end"]) == (START.isoformat(), END.isoformat())
    sink = summary["sinks"]["sessions"]
    assert sink["drift"] and sink["drifting_windows"] == 1 and sink["window_seconds"] == 300 and sink["grid"]
    assert sink["windows"] == [
        {
            "start": (T0 + timedelta(minutes=35)).isoformat(),
            "end": (T0 + timedelta(minutes=40)).isoformat(),
            "live_rows": 2,
            "replayed_rows": 2,
            "only_live": 1,
            "only_replayed": 1,
        }
    ]
    assert sink["match_rate"] == 100.0 * 95 / 96
    text = drift_text(summary)
    assert "sink sessions (prod.summary): DRIFT, match rate 98.958% (min_match 100.0%)" in text
    assert f"[{sink['windows'][0]['start']}, {sink['windows'][0]['end']})  live 2  replayed 2" in text


def test_windows_are_capped_and_their_total_kept(tmp_path: Path, catalog_props: dict[str, str]) -> None:
    bf = _verification(tmp_path, catalog_props)
    changed = list(range(0, 5 * (MAX_DRIFT_WINDOWS + 5), 5))
    sink = verification(bf, {"s": _report(changed)})["sinks"]["s"]
    assert sink["drifting_windows"] == MAX_DRIFT_WINDOWS + 5
    assert [w["start"] for w in sink["windows"]] == [(T0 + timedelta(minutes=m)).isoformat() for m in changed[:20]]
    assert f"the first {MAX_DRIFT_WINDOWS} listed" in drift_text(verification(bf, {"s": _report(changed)}))


def test_min_match_unset_is_100_and_a_given_one_decides(tmp_path: Path, catalog_props: dict[str, str]) -> None:
    params = _verification(tmp_path, catalog_props).params
    assert params.min_match_for(False, verification=True) == 100.0  # no ledger replayed: still 100
    assert params.min_match_for(True, verification=True) == 100.0
    lenient = _verification(tmp_path, catalog_props, min_match=98.5)
    summary = verification(lenient, {"s": _report([35])})
    assert not summary["drift"] and summary["min_match"] == 98.5
    assert summary["sinks"]["s"]["drifting_windows"] == 1  # listed, below the tolerance
    clean = verification(_verification(tmp_path, catalog_props), {"s": _report([])})
    assert not clean["drift"] and clean["sinks"]["s"]["windows"] == [] and "no drift" in drift_text(clean)


@pytest.mark.airflow
def test_wait_for_landing_pokes_until_the_landed_data_passes_end_plus_tail(
    tmp_path: Path, catalog: Any, catalog_props: dict[str, str]
) -> None:
    """A run that starts when its interval ends waits for its tail: the sensor says no while the
    sources' landed data stops before ``end + tail``, yes once it passes it (a new snapshot), and
    yes at once with ``allow_open_end``."""
    from lake import append_events, create_events_table, event

    from airflow_provider_kappa.operators.landed import KappaLandedSensor

    config = str(write_job_config(tmp_path, catalog_props))
    playbacks = create_events_table(catalog, "raw.playbacks")
    append_events(playbacks, [event(i, T0 + timedelta(minutes=10 * i)) for i in range(24)])  # 00:00-03:50
    window = {"start": T0.isoformat(), "end": (T0 + timedelta(hours=4)).isoformat(), "tail": "15min"}

    def landed(**params: Any) -> bool:
        sensor = KappaLandedSensor(task_id="wait_for_landing", config_path=config, backfill_params={**window, **params})
        return bool(sensor.poke({}))  # type: ignore[arg-type]

    assert not landed()  # end + tail = 04:15, landed through 04:00
    assert landed(allow_open_end=True)
    assert landed(end=(T0 + timedelta(hours=3)).isoformat())  # 03:15: landed
    append_events(playbacks, [event(100, T0 + timedelta(hours=4, minutes=20))])
    assert landed()


@pytest.mark.airflow
def test_a_bad_wait_for_landing_is_refused_naming_it(tmp_path: Path, catalog_props: dict[str, str]) -> None:
    import pytest

    from airflow_provider_kappa.dag import kappa_verify_dag
    from airflow_provider_kappa.exceptions import KappaConfigError

    config = str(write_job_config(tmp_path, catalog_props))
    with pytest.raises(KappaConfigError, match=r"wait_for_landing: 'soon' is not a duration; expected"):
        kappa_verify_dag(config, wait_for_landing="soon")
    with pytest.raises(
        KappaConfigError, match=r"wait_for_landing: 3600 is not a positive duration; expected e.g. '6h'"
    ):
        kappa_verify_dag(config, wait_for_landing=3600)
    assert "wait_for_landing" not in kappa_verify_dag(config, wait_for_landing=None).task_dict
    assert kappa_verify_dag(config, wait_for_landing="90min").task_dict["wait_for_landing"].timeout == 5400
