"""A reduced ``kappa demo`` end to end, as a user runs it: the real CLI in its own process
(a real Kafka broker, ``kappa land``, the jobs live from Kafka, real Spark, a real sqlite Iceberg
catalog, a real Airflow ``dag.test()`` run replaying the live ledger), both example jobs, both
modes: the published window equals the Kafka-live output row for row. (The fallback choice, no
broker: tests/unit/test_demo_kafka.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kappa.demo.comparison import JobOutcome, explained_by, nodata_boundaries, outcome_from_json
from airflow_provider_kappa.demo.incident import incident_window
from airflow_provider_kappa.demo.options import WARMUP, DemoOptions
from airflow_provider_kappa.demo.processes import StoryProcess, copy_sqlite, decode_json, encode_json, run_stories
from airflow_provider_kappa.demo.report import HourCount, SliceStat
from airflow_provider_kappa.demo.run import run_demo
from airflow_provider_kappa.exceptions import KappaConfigError, KappaError

JOBS = ("rmi", "playback_sessions")
MODES = ("sequential", "parallel")
# The module's demo run (13 spark-submits: 1 landing, 2 live runs from Kafka, 3 sequential and 2 parallel slices
# per job, two jobs at once) is shared by its tests; its set-up alone can exceed the suite's default 900 s on a loaded
# 2-core machine.
pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """One reduced demo: 2 hours at 4 impressions/s through Kafka, live reading about one
    micro-batch per 30 minutes of it (fewer than the default 10 minutes), both jobs, both modes,
    both jobs at once (live references and backfill stories, as the default run)."""
    tmp_path = tmp_path_factory.mktemp("demo")
    workdir = tmp_path / "demo"
    kappa = Path(sys.executable).parent / "kappa"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    done = subprocess.run(
        [
            str(kappa),
            "demo",
            "--workdir",
            str(workdir),
            "--hours",
            "2",
            "--rate",
            "4",
            "--landing",
            "30min",
            "--jobs",
            ",".join(JOBS),
            "--modes",
            ",".join(MODES),
            "--concurrency",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=1500,
        env=env,
        cwd=tmp_path,
    )
    return done, workdir


def outcomes(workdir: Path) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["job"], o["mode"]): o for o in json.loads((workdir / "report.json").read_text())}


def test_reduced_demo_prints_the_report(demo: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    done, workdir = demo
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Kappa backfill demo" in done.stdout
    assert "time by stage" in done.stdout
    # the Kafka story ran (this machine's Ivy cache has the broker's jars: make install ran kappa jars)
    assert "      live path: Kafka, broker 127.0.0.1:" in done.stdout, done.stdout[-3000:]
    assert "produced into Kafka and landed by kappa land" in done.stdout
    report = (workdir / "report.txt").read_text()
    assert "live path                     Kafka: the jobs ran live from the broker's topics (impressions " in report
    for job in JOBS:
        assert f"[3/5] {job}: live run from Kafka wrote " in done.stdout
        # the live ledger, put on the lake's time axis: live's micro-batches end off the 30-minute landing grid
        ledger = [p.name for p in (workdir / "lake" / "checkpoints" / job / "ledger").glob("*/*.json")]
        assert len(ledger) >= 4, (job, ledger)
        assert any(int(name[:13]) % (30 * 60 * 1000) for name in ledger), (job, ledger)
    assert f"HTML report: {workdir / 'report.html'}" in done.stdout
    assert (workdir / "report.html").read_text().count("<svg") == 2
    assert sorted(outcomes(workdir)) == sorted((j, m) for j in JOBS for m in MODES)


def test_reduced_demo_runs_the_jobs_stories_at_once_each_in_its_own_airflow_home(
    demo: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    done, workdir = demo
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    o = outcomes(workdir)
    for job in JOBS:
        # each job's modes one after the other (they replace the same window)
        assert o[(job, "sequential")]["ended"] <= o[(job, "parallel")]["started"], o
        # its own Airflow home, with a copy of the migrated DB; its noise in its log
        assert (workdir / "airflow" / job / "airflow.db").stat().st_size > 0
        assert f"Airflow and Spark output in {workdir / f'story-{job}.log'}" in done.stdout
        # the story's stdout goes to its log (a clean run may add nothing after the story's first line)
        assert (workdir / f"story-{job}.log").read_text().startswith(f"kappa demo: {job}'s story (pid "), job
        # the story's progress lines relayed from its process
        assert f"[4/5] {job}: incident: a buggy deploy" in done.stdout
        for mode in MODES:
            assert f"      {job} ({mode}): " in done.stdout
    # the two jobs' stories overlapped in time
    a, b = [(min(o[(j, m)]["started"] for m in MODES), max(o[(j, m)]["ended"] for m in MODES)) for j in JOBS]
    overlap = min(a[1], b[1]) - max(a[0], b[0])
    assert overlap > 0.5 * min(a[1] - a[0], b[1] - b[0]), (a, b)
    assert "backfills (jobs at once: 2)" in done.stdout


@pytest.mark.parametrize("job", JOBS)
@pytest.mark.parametrize("mode", MODES)
def test_published_window_equals_live(demo: tuple[subprocess.CompletedProcess[str], Path], job: str, mode: str) -> None:
    done, workdir = demo
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    o = outcomes(workdir)[(job, mode)]
    assert o["slices"] >= 2, o  # the window is cut into slices in both modes
    assert o["reference_rows"] > 20, o
    # the backfill replays live's micro-batches from the live ledger (cut by Kafka record counts,
    # not on the landing grid), so every row equals the Kafka-live output
    differing = o["only_live"] + o["only_backfill"]
    # no slice ends on a no-data micro-batch live never ran (a continued sequential slice runs
    # without them), so nothing differs, sequential slice boundaries included
    assert o["nodata_boundaries"] == [], o
    assert o["match_rate"] == 100.0, o
    assert differing == [] and o["published_rows"] == o["reference_rows"]
    assert o["unexplained_rows"] == 0, o


def test_incident_window_leaves_a_warmup_and_a_tail_of_lake() -> None:
    t0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
    assert incident_window(t0, t0 + timedelta(hours=2)) == (t0 + WARMUP, t0 + timedelta(hours=1, minutes=45))
    with pytest.raises(KappaConfigError, match="too short"):
        incident_window(t0, t0 + timedelta(minutes=40))


def _progress(rows: int, watermark: str) -> dict[str, Any]:
    return {"sources": [{"numInputRows": rows}], "eventTime": {"watermark": watermark}}


def test_a_no_data_batch_ending_a_sequential_slice_explains_rows_fed_by_events_it_made_late() -> None:
    progress = {
        "s0000": [
            _progress(10, "2026-11-01T00:29:58.000Z"),
            _progress(12, "2026-11-01T00:39:59.000Z"),
            _progress(0, "2026-11-01T00:49:56.000Z"),
        ],
        "s0001": [_progress(11, "2026-11-01T00:49:56.000Z"), _progress(0, "2026-11-01T01:49:58.000Z")],
    }
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


def _story(tmp_path: Path, name: str, code: str) -> StoryProcess:
    return StoryProcess(
        name=name,
        argv=[sys.executable, "-c", code],
        env=dict(os.environ),
        log=tmp_path / f"story-{name}.log",
        result=tmp_path / f"story-{name}.outcomes.json",
    )


def _gone(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status  # a zombie (not reaped by this container's init) runs no more


def test_a_failing_story_fails_the_run_naming_job_and_log_and_stops_the_other(tmp_path: Path) -> None:
    # the other story has started a child of its own (as a story starts spark-submit)
    sleeper = _story(
        tmp_path,
        "playback_sessions",
        "import subprocess, time; p = subprocess.Popen(['sleep', '300']); print('child', p.pid, flush=True); "
        "time.sleep(300)",
    )
    failing = _story(
        tmp_path,
        "rmi",
        "import sys, time; time.sleep(1); print('[4/5] rmi: working', flush=True); "
        "sys.stderr.write('Traceback: the DAG run ended failed\\n'); sys.exit(3)",
    )
    lines: list[str] = []
    began = time.monotonic()
    with pytest.raises(KappaError) as failed:
        run_stories([failing, sleeper], 2, lines.append)
    message = str(failed.value)
    assert message.startswith("rmi: the backfill story failed (exit 3)"), message
    assert str(failing.log) in message and "the DAG run ended failed" in message
    assert "[4/5] rmi: working" in lines
    assert time.monotonic() - began < 60  # the sleeper was not waited for
    pids = [
        int(line.split("(pid ")[1].split(")")[0]) for line in lines if "(pid " in line and "playback_sessions" in line
    ]
    pids += [int(line.split()[1]) for line in lines if line.startswith("child ")]
    assert len(pids) >= 3, lines  # started, stopping, its child
    assert all(_gone(pid) for pid in pids), lines


def test_stories_run_at_most_n_at_once_and_return_their_results(tmp_path: Path) -> None:
    code = (
        "import json, sys, time; t = time.time(); print('{name} started', flush=True); time.sleep(1.5); "
        "open({result!r}, 'w').write(json.dumps({{'name': '{name}', 'started': t, 'ended': time.time()}}))"
    )
    stories = [
        _story(tmp_path, name, code.format(name=name, result=str(tmp_path / f"story-{name}.outcomes.json")))
        for name in ("a", "b", "c")
    ]
    lines: list[str] = []
    results = run_stories(stories, 2, lines.append)
    assert sorted(results) == ["a", "b", "c"] and {"a started", "b started", "c started"} <= set(lines)
    spans = sorted((r["started"], r["ended"]) for r in results.values())
    assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1]  # a and b at once
    assert spans[2][0] >= min(spans[0][1], spans[1][1])  # c only once one of them ended
    with pytest.raises(KappaConfigError, match="--concurrency: 0"):
        run_stories(stories, 0, lines.append)


def test_concurrency_below_one_is_refused_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(KappaConfigError, match="--concurrency: 0 jobs at once; expected at least 1"):
        run_demo(DemoOptions(workdir=tmp_path / "demo", concurrency=0), print)
    assert not (tmp_path / "demo").exists()


def test_an_outcome_survives_its_trip_through_the_story_file() -> None:
    from dataclasses import asdict

    t0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
    o = JobOutcome(
        job="rmi",
        mode="sequential",
        seconds=3.5,
        slices=[SliceStat("rmi/sequential/s0000", 10, 2.0, 3, "2026-11-01T00:49:56.000Z")],
        match_rate=98.7,
        reference_rows=5,
        published_rows=4,
        only_live=[{"window_start": t0, "window_end": t0 + timedelta(minutes=5), "attributed_plays": 415, "_count": 1}],
        hours=[HourCount("2026-11-01 00:00:00+00:00", 5, 4)],
        state_rows=7,
        boundaries=[{"slice": "s0000", "from": "a", "to": "b"}],
        unexplained=0,
        started=1.0,
        ended=2.0,
    )
    back = outcome_from_json(json.loads(json.dumps(asdict(o), default=encode_json), object_hook=decode_json))
    assert back == o


def test_the_migrated_airflow_db_is_copied_with_its_write_ahead_log(tmp_path: Path) -> None:
    import sqlite3

    source = sqlite3.connect(tmp_path / "airflow.db")
    source.execute("pragma journal_mode=wal")
    source.execute("create table dag (dag_id text)")
    source.execute("insert into dag values ('kappa_backfill_rmi')")
    source.commit()  # still open: the row is in airflow.db-wal, not yet in airflow.db
    assert (tmp_path / "airflow.db-wal").stat().st_size > 0
    copy_sqlite(tmp_path / "airflow.db", tmp_path / "copy.db")
    source.close()
    assert sqlite3.connect(tmp_path / "copy.db").execute("select dag_id from dag").fetchall() == [
        ("kappa_backfill_rmi",)
    ]
    with pytest.raises(KappaError, match="missing; expected the DB that airflow db migrate created"):
        copy_sqlite(tmp_path / "nothing.db", tmp_path / "copy2.db")
