"""A Spark Connect runner ends on SIGTERM even when its server is gone (issue #25): it was seen
retrying a dead server for over 150 s after ``kappa backfill`` was killed, SIGTERM ignored. The
runner is a real child process with pyspark's client; no server listens on its port."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from airflow_provider_kappa.engine.connect_runner import STOP_SECONDS

APP = """
from pyspark.sql import SparkSession
SparkSession.builder.getOrCreate().range(1).count()
"""


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the block ends: nothing listens there


def test_a_runner_whose_server_is_gone_ends_on_sigterm(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(APP)
    (tmp_path / "conf.json").write_text(json.dumps({"spark.kappa.job": "t"}))
    env = {**os.environ, "SPARK_REMOTE": f"sc://localhost:{_closed_port()}"}
    cmd = [
        sys.executable,
        "-m",
        "airflow_provider_kappa.engine.connect_runner",
        "--conf-file",
        str(tmp_path / "conf.json"),
    ]
    cmd += ["--progress-file", str(tmp_path / "progress.jsonl"), str(tmp_path / "app.py")]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        time.sleep(8)  # pyspark imported, the client retrying the missing server
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=STOP_SECONDS + 10)
        assert time.monotonic() - sent <= STOP_SECONDS + 10
        assert proc.returncode != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
