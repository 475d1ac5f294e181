"""Harnesses that start and stop real servers for the deployment tests.

Every server runs in its own session (so its own process group, led by the pid we
started); it is stopped by signalling that group, never by a process name. Every
server binds to 127.0.0.1 only. Every wait is bounded and, on timeout, raises
:class:`DeploymentTimeout` carrying the tail of each server's log.

Modules: :mod:`servers.airflow_server` (a real Airflow 3 deployment and a small
REST client), :mod:`servers.spark_cluster` (a Spark standalone master and workers),
:mod:`servers.browser` (headless Chromium over the DevTools protocol),
:mod:`servers.connect_server` (one Spark Connect server per session), :mod:`servers.kafka`
(a KRaft broker), :mod:`servers.rest_catalog` (Apache Iceberg's REST catalog test server),
:mod:`servers.postgres` (a private PostgreSQL cluster), :mod:`servers.processes`,
:mod:`servers.tmp_server` (their
shared fixture helpers).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

#: The interpreter (and bin folder) of the project's venv: servers run its entry points.
VENV_BIN = Path(sys.executable).parent


class DeploymentError(RuntimeError):
    """A server of a deployment test failed to start, died, or answered wrongly."""


class DeploymentTimeout(DeploymentError):
    """A bounded wait for a server ran out of time."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def venv_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment with the venv's bin folder first on ``PATH``.

    :param extra: variables to add or override.
    """
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env.update(extra or {})
    return env


class ServerProcess:
    """One started server: a process leading its own process group, logging to a file.

    :param name: a short name used in errors.
    :param argv: the command line.
    :param log_path: file receiving stdout and stderr.
    :param env: the environment of the process.
    :param cwd: working folder.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str],
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")  # noqa: SIM115 (closed in stop())
        self.popen = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env),
            cwd=str(cwd) if cwd else None,
            start_new_session=True,
        )
        self.pid = self.popen.pid
        self.started_at = time.monotonic()

    def alive(self) -> bool:
        """Whether the process we started is still running."""
        return self.popen.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server's log.

        :param lines: how many lines.
        """
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log yet)"
        return "\n".join(text.splitlines()[-lines:])

    def _signal_group(self, sig: signal.Signals) -> bool:
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def kill(self) -> None:
        """SIGKILL the whole process group (the server and every child it started)."""
        self._signal_group(signal.SIGKILL)
        try:
            self.popen.wait(timeout=30)
        except subprocess.TimeoutExpired as e:
            raise DeploymentError(f"{self.name} (pid {self.pid}) survived SIGKILL for 30s") from e

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM the process group, wait up to ``grace`` seconds, then SIGKILL it.

        :param grace: seconds allowed for a clean shutdown.
        """
        if self._signal_group(signal.SIGTERM):
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and _group_alive(self.pid):
                self.popen.poll()
                time.sleep(0.2)
            self._signal_group(signal.SIGKILL)
        try:
            self.popen.wait(timeout=30)
        finally:
            self._log.close()

    def describe(self) -> str:
        """Name, pid, exit status and log tail, for error messages."""
        rc = self.popen.poll()
        state = "running" if rc is None else f"exited with {rc}"
        return f"--- {self.name} (pid {self.pid}, {state}, log {self.log_path}) ---\n{self.log_tail()}"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A group whose members are all zombies still answers signal 0; reap what we can.
    try:
        while os.waitpid(-pgid, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass
    return _group_has_live_member(pgid)


def _group_has_live_member(pgid: int) -> bool:
    from servers.processes import group_pids

    return bool(group_pids(pgid))


def wait_until(
    check: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    servers: Iterable[ServerProcess] = (),
    interval: float = 0.5,
) -> T:
    """Call ``check`` until it returns something other than None/False; bounded by ``timeout``.

    Fails fast if one of ``servers`` dies while waiting. Errors carry each server's log tail.

    :param check: returns the awaited value, or None/False when not there yet; exceptions
        it raises are remembered and reported on timeout (the server may not be up yet).
    :param timeout: seconds.
    :param what: what is awaited, for the error message.
    :param servers: servers whose death ends the wait early and whose logs are reported.
    :param interval: seconds between checks.
    """
    servers = list(servers)
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = check()
            last_error = None
        except Exception as e:  # the server may simply not answer yet: remembered, reported below
            last_error = e
            value = None
        if value is not None and value is not False:
            return value
        dead = [s for s in servers if not s.alive()]
        if dead:
            logs = "\n".join(s.describe() for s in servers)
            raise DeploymentError(
                f"while waiting for {what}: {', '.join(s.name for s in dead)} died\n{logs}"
            ) from last_error
        if time.monotonic() >= deadline:
            logs = "\n".join(s.describe() for s in servers)
            hint = f" (last error: {last_error!r})" if last_error else ""
            raise DeploymentTimeout(f"timed out after {timeout:.0f}s waiting for {what}{hint}\n{logs}") from last_error
        time.sleep(interval)
