"""A slice's progress read back from the user's spark.eventLog.dir (engine/progress.py collect_progress):
the run's own log found by its run id among other applications' logs, plain, zstd-compressed (Spark 4's
default codec) or rolling (Spark 4's default layout), then summed by read_progress like kappa's own folder."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import zstandard

from airflow_provider_kappa.engine.progress import PROGRESS_EVENT, RUN_ID, collect_progress, read_progress, summarize


def log_lines(run_id: str, rows: list[int]) -> list[str]:
    """An event log as Spark writes it: start, environment (with the run id), one progress per batch."""
    lines = [
        json.dumps({"Event": "SparkListenerLogStart", "Spark Version": "4.2.0"}),
        json.dumps(
            {"Event": "SparkListenerEnvironmentUpdate", "Spark Properties": {RUN_ID: run_id, "spark.app.name": "x"}},
            separators=(",", ":"),
        ),
    ]
    for batch, n in enumerate(rows):
        progress = {
            "name": "q",
            "batchId": batch,
            "batchDuration": 100,
            "sources": [{"numInputRows": n}],
            "sink": {"numOutputRows": n},
        }
        lines.append(json.dumps({"Event": PROGRESS_EVENT, "progress": progress}))
    return lines


@pytest.mark.parametrize("layout", ["plain", "zstd", "rolling"])
def test_the_runs_progress_is_found_by_run_id_among_other_logs(tmp_path: Path, layout: str) -> None:
    history = tmp_path / "history"
    history.mkdir()
    ours, other = log_lines("run-ours", [3, 4, 5]), log_lines("run-other", [100])
    (history / "app-1-0000").write_text("\n".join(other) + "\n")  # another application, same folder
    if layout == "plain":
        (history / "app-1-0001").write_text("\n".join(ours) + "\n")
    elif layout == "zstd":
        (history / "app-1-0001.zstd").write_bytes(
            zstandard.ZstdCompressor().compress(("\n".join(ours) + "\n").encode())
        )
    else:  # Spark rolls: the environment is in the first file only; events_10 sorts before events_2 by name
        folder = history / "eventlog_v2_app-1-0001"
        folder.mkdir()
        (folder / "events_1_app-1-0001").write_text("\n".join(ours[:3]) + "\n")
        (folder / "events_2_app-1-0001").write_text(ours[3] + "\n")
        (folder / "events_10_app-1-0001").write_text(ours[4] + "\n")
        (folder / "appstatus_app-1-0001").write_text("")
    into = tmp_path / "private" / "events"
    assert collect_progress(history.as_uri(), "run-ours", into.as_uri(), since=time.time() - 60) == 3
    metrics = summarize(read_progress(into), 1.0)
    assert (metrics.rows_read, metrics.batches) == (12, 3)
    assert [p["batchId"] for p in read_progress(into)] == [0, 1, 2]  # in order across rolled files


def test_older_logs_and_other_codecs(tmp_path: Path) -> None:
    history = tmp_path / "history"
    history.mkdir()
    (history / "app-1-0001").write_text("\n".join(log_lines("run-ours", [1])) + "\n")
    assert (
        collect_progress(str(history), "run-ours", tmp_path / "a", since=time.time() + 3600) == 0
    )  # older than the run
    (history / "app-1-0002.lz4").write_bytes(b"\x04\x22\x4d\x18")  # another codec: ours may be that one
    with pytest.raises(
        ValueError,
        match=r"run run-lz4 not found in .*app-1-0002.lz4: event log compressed with lz4; readable: plain or zstd",
    ):
        collect_progress(str(history), "run-lz4", tmp_path / "b", since=time.time() - 60)
    # found among logs it cannot read: those are other applications'
    assert collect_progress(str(history), "run-ours", tmp_path / "c", since=time.time() - 60) == 1
