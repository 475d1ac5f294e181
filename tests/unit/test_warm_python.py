"""engine/warm_python: when Spark's Python processes fork warm, and the wrapper Spark runs as its Python.
The zygote itself forks for real in the integration tier (test_cli's submit and connect backfills)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airflow_provider_kappa.engine.warm_python import WARM_DAEMON_ENV, WarmPython, warm_enabled
from airflow_provider_kappa.spark.warm_daemon import SOCKET_ENV, preloaded


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
        assert "*.py) exec" in script  # the job's driver too (forked for real below)
        # anything else (python -c, no zygote needed) runs this interpreter unchanged
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


def test_the_zygote_forks_a_jobs_driver_as_python_runs_the_script(tmp_path: Path) -> None:
    """``wrapper APP.py ARGS`` (spark-submit's driver) is forked from a real zygote: ``__main__``, ``sys.argv``,
    the script's folder first on ``sys.path``, ``PYTHONUNBUFFERED`` honoured, its exit code and an uncaught
    exception's traceback as a cold ``python`` gives them; the zygote's objects frozen for the collector; the
    zygote serves the next request after a driver ended through its frames."""
    app = tmp_path / "jobs" / "app.py"
    app.parent.mkdir()
    app.write_text(
        "import gc, os, sys\n"
        "print('name', __name__, 'argv', sys.argv[1:], 'path0', sys.path[0], 'frozen', gc.get_freeze_count() > 0)\n"
        "print('unbuffered', sys.stdout.write_through)\n"
        "if sys.argv[1] == 'boom':\n"
        "    raise RuntimeError('the job failed')\n"
        "sys.exit(int(sys.argv[1]))\n"
    )
    warm = WarmPython()
    env = {**os.environ, **warm.env(), "PYTHONUNBUFFERED": "YES"}
    warm.start(env, os.getpid())
    try:
        assert warm.zygote is not None
        deadline = time.monotonic() + 60
        while not warm.socket.exists():  # the zygote imports pyspark, pyarrow, pyiceberg first
            assert warm.zygote.poll() is None and time.monotonic() < deadline, warm.log_file.read_text()
            time.sleep(0.1)
        first = subprocess.run([str(warm.wrapper), str(app), "3", "x"], env=env, capture_output=True, text=True)
        assert first.returncode == 3, first.stderr
        assert first.stdout.splitlines() == [
            f"name __main__ argv ['3', 'x'] path0 {app.parent} frozen True",
            "unbuffered True",
        ]
        failed = subprocess.run([str(warm.wrapper), str(app), "boom"], env=env, capture_output=True, text=True)
        assert failed.returncode == 1
        assert failed.stderr.rstrip().endswith("RuntimeError: the job failed"), failed.stderr
        assert warm.socket.exists() and warm.zygote.poll() is None  # the drivers' ends left the zygote serving
        log = warm.log_file.read_text()
        assert f"warm daemon zygote: {len(preloaded())} modules in " in log, log  # every one imported
        assert log.count(f"forked driver {app}") == 2, log
        assert warm.forked() == 2
    finally:
        warm.stop()


def test_the_stub_spark_starts_for_each_python_process_imports_nothing_heavy() -> None:
    """The stub (``warm_daemon --run``) runs once per Python process Spark starts: it leaves pyspark's module
    list, runpy, inspect and the rest to the zygote (socket brings select)."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, airflow_provider_kappa.spark.warm_daemon\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('pyspark', 'pyarrow', 'pyiceberg', 'inspect', 'runpy', 'shutil', 'traceback', 'dataclasses')))",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONSTARTUP"},
    )
    assert out.stdout.strip() == "[]", out.stdout
