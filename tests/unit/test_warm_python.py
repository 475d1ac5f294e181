"""engine/warm_python: when Spark's Python processes fork warm, and the wrapper Spark runs as its Python.
The zygote itself forks for real in the integration tier (test_cli's submit and connect backfills)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from airflow_provider_kappa.engine.warm_python import WARM_DAEMON_ENV, WarmPython, warm_enabled
from airflow_provider_kappa.spark.warm_daemon import SOCKET_ENV


def test_warm_by_default_off_by_the_variable_or_a_python_of_the_users(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(WARM_DAEMON_ENV, raising=False)
    assert warm_enabled({}, {"spark.executor.memory": "1g"})
    # the job's conf or the platform's spark-defaults choose their own Python: kappa keeps out of the way
    assert not warm_enabled({"spark.pyspark.python": "/opt/py/bin/python"}, {})
    assert not warm_enabled({}, {"spark.pyspark.driver.python": "/opt/py/bin/python"})
    monkeypatch.setenv(WARM_DAEMON_ENV, "0")
    assert not warm_enabled({}, {})
    monkeypatch.setenv(WARM_DAEMON_ENV, "1")
    assert warm_enabled({})


def test_the_wrapper_hands_pyspark_modules_to_the_zygote_and_runs_anything_else_as_is() -> None:
    warm = WarmPython()
    try:
        env = warm.env()  # makes the private folder and the wrapper
        assert env["PYSPARK_PYTHON"] == env["PYSPARK_DRIVER_PYTHON"] == str(warm.wrapper)
        assert env[SOCKET_ENV] == str(warm.socket)
        assert len(str(warm.socket)) <= 107  # AF_UNIX
        assert warm.folder.stat().st_mode & 0o777 == 0o700
        script = warm.wrapper.read_text()
        assert '-m airflow_provider_kappa.spark.warm_daemon --run "$@"' in script and "pyspark.*)" in script
        # the job's own driver (python app.py, python -c) runs this interpreter unchanged
        out = subprocess.run(
            [str(warm.wrapper), "-c", "import sys; print(sys.executable)"], capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == sys.executable
        assert warm.forked() == 0  # never started: no zygote log
    finally:
        folder = warm.folder
        warm.stop()
    assert not folder.exists()
    warm.stop()  # idempotent
