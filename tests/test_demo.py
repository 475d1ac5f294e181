"""A reduced ``kappa demo`` end to end, as a user runs it: the real CLI in its own process
(real Spark, a real sqlite Iceberg catalog, a real Airflow ``dag.test()`` run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def test_reduced_demo_prints_the_report_and_matches_live(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    kappa = Path(sys.executable).parent / "kappa"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    done = subprocess.run(
        [str(kappa), "demo", "--workdir", str(workdir), "--hours", "2", "--rate", "4",
         "--jobs", "playback_sessions", "--modes", "sequential"],
        capture_output=True, text=True, timeout=1500, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Kappa backfill demo" in done.stdout
    assert f"HTML report: {workdir / 'report.html'}" in done.stdout
    page = (workdir / "report.html").read_text()
    assert page.count("<svg") == 2
    [outcome] = json.loads((workdir / "report.json").read_text())
    assert outcome["job"] == "playback_sessions" and outcome["mode"] == "sequential"
    assert outcome["reference_rows"] > 20, outcome
    # threshold = landing interval: the backfill cuts micro-batches where live did
    assert outcome["match_rate"] == 100.0, outcome
    assert outcome["published_rows"] == outcome["reference_rows"]
