"""The Spark Connect server kappa starts takes clients with its token only (issue #25): another
local process cannot open a session on it (and run a Python UDF as the server's user). One real
server from the pyspark wheel, on 127.0.0.1, started by :class:`LocalConnectServer`."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_kappa.engine.connect import run_application
from airflow_provider_kappa.engine.connect_server import TOKEN_ENV, LocalConnectServer, read_state

#: What another local process would run: a plain pyspark Connect client with a Python UDF.
CLIENT = """
from pyspark.sql import SparkSession, functions as F
spark = SparkSession.builder.create()
plus_one = F.udf(lambda v: v + 1, "long")
print("sum", spark.range(0, 10).select(plus_one("id").alias("v")).groupBy().sum("v").collect()[0][0])
spark.stop()
"""

APP = """
from pyspark.sql import SparkSession
spark = SparkSession.builder.getOrCreate()
print("rows", spark.range(3).count(), spark.conf.get("spark.kappa.job"))
"""


def client(url: str, token: str | None) -> subprocess.CompletedProcess[str]:
    """A session and a Python UDF on the server at ``url``, from another local process."""
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    env["SPARK_REMOTE"] = url
    if token is not None:
        env[TOKEN_ENV] = token
    cmd = [sys.executable, "-c", CLIENT]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)


def test_the_owned_server_refuses_a_client_without_its_token(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="airflow_provider_kappa")  # an earlier CLI test may leave it at WARNING
    server = LocalConnectServer(None, tmp_path / "server", master="local[1]", conf={"spark.ui.enabled": "false"})
    with server:
        token = server.token
        assert server.url.startswith("sc://localhost:") and token not in server.url
        # the token is only in the 0600 state file
        assert stat.S_IMODE(server.state_file.stat().st_mode) == 0o600
        state = read_state(server.state_file)
        assert state is not None and state.token == token and token not in repr(state)
        cmdline = Path(f"/proc/{server.proc.pid}/cmdline").read_bytes().decode(errors="replace")  # type: ignore[union-attr]
        assert token not in cmdline
        # another local process: without the token, or with a wrong one, refused
        for wrong in (None, "not-the-token"):
            refused = client(server.url, wrong)
            assert refused.returncode != 0, refused.stdout + refused.stderr
            assert "UNAUTHENTICATED" in refused.stderr or "Invalid authentication" in refused.stderr, refused.stderr[
                -2000:
            ]
        # a client given the token by environment works (sum of 1..10)
        done = client(server.url, token)
        assert done.returncode == 0 and "sum 55" in done.stdout, done.stdout + done.stderr
        # kappa's own client: the runner, given the token by environment
        (tmp_path / "app.py").write_text(APP)
        work = tmp_path / "run"
        run_application(
            tmp_path / "app.py",
            {"spark.kappa.job": "t"},
            url=server.url,
            work=work,
            name="token",
            owned=True,
            token=token,
        )
        logged = "\n".join(r.getMessage() for r in caplog.records)
        assert "rows 3 t" in logged and token not in logged
        assert token not in server.log_file.read_text(errors="replace")
        assert not [p for p in work.rglob("*") if p.is_file() and token in p.read_text(errors="replace")]
    assert not server.state_file.exists()
