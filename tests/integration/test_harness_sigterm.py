"""The test harness itself: a test run stopped by SIGTERM stops the servers its fixtures started
(tests/stop_on_sigterm.py). Before it, a SIGTERM to pytest left the deploy tests' Airflow and
PostgreSQL running, orphaned in their own process groups.

A real pytest run in its own process, on a throwaway test module whose session fixture starts a
server the way tests/servers does (:class:`servers.ServerProcess`, its own process group); once the
test holds it, the run gets SIGTERM."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from paths import REPO
from servers import wait_until

from airflow_provider_kappa.spark.warm_daemon import pid_alive

MODULE = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path

    import pytest
    from servers import ServerProcess

    HERE = Path(__file__).parent


    @pytest.fixture(scope="session")
    def server():
        proc = ServerProcess("sleeper", [sys.executable, "-c", "import time; time.sleep(600)"], HERE / "server.log", {})
        (HERE / "server.pid").write_text(str(proc.pid))
        try:
            yield proc
        finally:
            proc.stop(grace=5)
            (HERE / "stopped").write_text("yes")


    def test_holds_the_server(server):
        (HERE / "holding").write_text("yes")
        time.sleep(600)
    """
)


def run_and_terminate(tmp_path: Path, *plugin: str) -> tuple[int, int, str]:
    """Run the throwaway module with ``plugin`` arguments, SIGTERM it once its test holds the server;
    return the server's pid, pytest's exit code and its output."""
    (tmp_path / "test_throwaway.py").write_text(MODULE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path)]
    argv += ["-c", os.devnull, *plugin, str(tmp_path / "test_throwaway.py")]
    run = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: (tmp_path / "holding").exists() or None, timeout=120, what="the test to hold its server")
        pid = int((tmp_path / "server.pid").read_text())
        assert pid_alive(pid)
        run.send_signal(signal.SIGTERM)
        out, _ = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    return pid, run.returncode, out


def test_a_run_stopped_by_sigterm_tears_down_its_fixtures_and_stops_their_servers(tmp_path: Path) -> None:
    pid, code, out = run_and_terminate(tmp_path, "-p", "stop_on_sigterm")
    deadline = time.monotonic() + 10
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pid_alive(pid), f"the server (pid {pid}) outlived the run:\n{out}"
    assert (tmp_path / "stopped").exists(), out
    assert code == 2 and "stopped by signal SIGTERM" in out, out  # pytest's "interrupted"


def test_without_the_plugin_sigterm_orphans_the_server(tmp_path: Path) -> None:
    """What the plugin is for: pytest's default (the process ends at once; the server runs on)."""
    pid, code, out = run_and_terminate(tmp_path)
    try:
        assert code == -signal.SIGTERM, out
        assert pid_alive(pid) and not (tmp_path / "stopped").exists(), out
    finally:
        with contextlib.suppress(ProcessLookupError):  # gone already: the assertion above says why
            os.killpg(pid, signal.SIGKILL)
