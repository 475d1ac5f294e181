"""A reduced ``kappa demo`` end to end, as a user runs it: the real CLI in its own process
(real Spark, a real sqlite Iceberg catalog, a real Airflow ``dag.test()`` run), both example
jobs, both modes: the published window equals the live reference row for row."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kappa.demo import WARMUP, explained_by, incident_window, nodata_boundaries
from airflow_provider_kappa.exceptions import KappaConfigError

JOBS = ("rmi", "playback_sessions")
MODES = ("sequential", "parallel")
# The module's demo run (10 spark-submits: 2 live runs, 2 slices per job and mode) is shared by
# its tests; its set-up alone exceeds the suite's default 900 s on a loaded 2-core machine.
pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """One reduced demo: 2 hours at 4 impressions/s landed every 15 minutes (fewer micro-batches
    than the default 5 minutes; the backfill threshold follows the landing interval), both jobs,
    both modes, one live reference at a time (one extra JVM at a time on the shared machine)."""
    tmp_path = tmp_path_factory.mktemp("demo")
    workdir = tmp_path / "demo"
    kappa = Path(sys.executable).parent / "kappa"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    done = subprocess.run(
        [str(kappa), "demo", "--workdir", str(workdir), "--hours", "2", "--rate", "4", "--landing", "15min",
         "--jobs", ",".join(JOBS), "--modes", ",".join(MODES), "--live-concurrency", "1"],
        capture_output=True, text=True, timeout=1500, env=env, cwd=tmp_path,
    )  # fmt: skip
    return done, workdir


def outcomes(workdir: Path) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["job"], o["mode"]): o for o in json.loads((workdir / "report.json").read_text())}


def test_reduced_demo_prints_the_report(demo: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    done, workdir = demo
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Kappa backfill demo" in done.stdout
    assert "time by stage" in done.stdout
    assert f"HTML report: {workdir / 'report.html'}" in done.stdout
    assert (workdir / "report.html").read_text().count("<svg") == 2
    assert sorted(outcomes(workdir)) == sorted((j, m) for j in JOBS for m in MODES)


@pytest.mark.parametrize("job", JOBS)
@pytest.mark.parametrize("mode", MODES)
def test_published_window_equals_live(demo: tuple[subprocess.CompletedProcess[str], Path], job: str, mode: str) -> None:
    done, workdir = demo
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    o = outcomes(workdir)[(job, mode)]
    assert o["slices"] >= 2, o  # the window is cut into slices in both modes
    assert o["reference_rows"] > 20, o
    # threshold = landing interval: the backfill cuts micro-batches where live did, so every
    # row equals live; the only admitted remainder is a row a sequential slice boundary closed
    # early (a no-data micro-batch live never ran), each one listed and matched to its boundary
    differing = o["only_live"] + o["only_backfill"]
    assert o["unexplained_rows"] == 0, o
    if mode == "parallel" or not o["nodata_boundaries"]:
        assert o["match_rate"] == 100.0, o
        assert differing == [] and o["published_rows"] == o["reference_rows"]
    else:
        assert o["match_rate"] >= 98.0, o
        assert f"{job} {mode}: only in live" in done.stdout or f"{job} {mode}: only in the backfill" in done.stdout


def test_incident_window_leaves_a_warmup_and_a_tail_of_lake() -> None:
    t0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
    assert incident_window(t0, t0 + timedelta(hours=2)) == (t0 + WARMUP, t0 + timedelta(hours=1, minutes=45))
    with pytest.raises(KappaConfigError, match="too short"):
        incident_window(t0, t0 + timedelta(minutes=40))


def _progress(rows: int, watermark: str) -> dict[str, Any]:
    return {"sources": [{"numInputRows": rows}], "eventTime": {"watermark": watermark}}


def test_a_no_data_batch_ending_a_sequential_slice_explains_rows_fed_by_events_it_made_late() -> None:
    progress = {
        "s0000": [_progress(10, "2026-11-01T00:29:58.000Z"), _progress(12, "2026-11-01T00:39:59.000Z"),
                  _progress(0, "2026-11-01T00:49:56.000Z")],
        "s0001": [_progress(11, "2026-11-01T00:49:56.000Z"), _progress(0, "2026-11-01T01:49:58.000Z")],
    }  # fmt: skip
    boundaries = nodata_boundaries(progress, "sequential", ["s0000", "s0001"])
    # the last slice's closing batch is live's too (the live run ends with one): not a boundary
    assert boundaries == [{"slice": "s0000", "from": "2026-11-01T00:39:59.000Z", "to": "2026-11-01T00:49:56.000Z"}]
    assert nodata_boundaries(progress, "parallel", ["s0000", "s0001"]) == []
    t0 = datetime(2026, 11, 1, tzinfo=timezone.utc)

    def window(minute: int) -> dict[str, Any]:
        return {"window_start": t0 + timedelta(minutes=minute), "window_end": t0 + timedelta(minutes=minute + 5)}

    # a play made late (event time in (00:39:59, 00:49:56]) joins impressions up to 30 minutes older
    assert explained_by(window(35), "rmi", boundaries) == boundaries[0]
    assert explained_by(window(10), "rmi", boundaries) == boundaries[0]
    assert explained_by(window(0), "rmi", boundaries) is None
    assert explained_by(window(50), "rmi", boundaries) is None
    session = {"session_start": t0 + timedelta(minutes=20), "session_end": t0 + timedelta(minutes=39)}
    assert explained_by(session, "playback_sessions", boundaries) is None
    session["session_end"] = t0 + timedelta(minutes=41)
    assert explained_by(session, "playback_sessions", boundaries) == boundaries[0]
