"""The spare Connect runner (:class:`SpareRunner`): a slice's runner child, started while the slice
before it runs, so that its imports and its session's opening are off the backfill's critical path
(:class:`~airflow_provider_kappa.engine.connect.ConnectEngine` keeps one ahead under ``kappa
backfill``; the child's side is :func:`airflow_provider_kappa.engine.connect_runner.take_run`).
No pyspark or Airflow import: the child imports pyspark, this launcher side never does.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Mapping
from typing import Any

from airflow_provider_kappa.engine.connect_runner import RUNNER_MODULE
from airflow_provider_kappa.engine.connect_server import with_session_id
from airflow_provider_kappa.engine.processes import child_options
from airflow_provider_kappa.engine.submit import spark_env

log = logging.getLogger(__name__)


class SpareRunner:
    """A runner child started before its run (``connect_runner --wait``): it imports pyspark's Spark
    Connect client and the job's kappa modules (~0.7 s of CPU) while the slice before it runs, and,
    given the server (``url``), opens the run's session there ahead and runs a trivial query in it
    (a new session's first query costs ~0.5 s on a warm server); then it takes its run from stdin
    (:meth:`take`). Each slice still runs in a process and a session of its own; only their start
    moves off the critical path. It dies with the thread that started it (SIGTERM).

    :param url: the server the run will most likely use (``None``: nothing opened ahead). The engine
        ends a spare whose server was restarted since (:meth:`discard`); a runner given a run on
        another URL all the same releases the session opened ahead and opens its own.
    :param token: the token of a kappa-owned server at ``url``.
    """

    def __init__(self, url: str | None = None, token: str | None = None) -> None:
        self.url = url
        self.session_id = str(uuid.uuid4())
        self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            [sys.executable, "-m", RUNNER_MODULE, "--wait"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, **spark_env()},
            **child_options(signal.SIGTERM),
        )
        if url is not None:
            self._send({"open": with_session_id(url, self.session_id), "token": token})

    def _send(self, line: Mapping[str, Any]) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(dict(line)).encode() + b"\n")
        self.proc.stdin.flush()

    def take(self, run: Mapping[str, Any]) -> subprocess.Popen[bytes] | None:
        """Give the runner ``run`` (the JSON line :func:`connect_runner.take_run
        <airflow_provider_kappa.engine.connect_runner.take_run>` reads) and hand over its process;
        ``None`` when it is gone (the caller starts a runner of its own)."""
        proc = self.proc
        if proc is None:
            return None
        assert proc.stdin is not None
        try:
            if proc.poll() is not None:
                raise BrokenPipeError(f"exit code {proc.returncode}")
            self._send(run)
            proc.stdin.close()
        except OSError as e:
            log.warning("the spare Spark Connect runner (pid %d) is gone (%s); starting a new one", proc.pid, e)
            self.close()
            return None
        self.proc = None
        return proc

    def discard(self) -> None:
        """End the runner now (SIGTERM), without releasing a session it opened ahead (its server is gone)."""
        proc, self.proc = self.proc, None
        if proc is not None:
            end_idle(proc)

    def close(self, grace: float = 5.0) -> None:
        """End the runner if it was not taken: end of input (it releases a session it opened ahead and
        exits 0), then SIGTERM after ``grace`` seconds, SIGKILL after as many more; SIGTERM at once
        when it opened no session."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if self.url is None:  # no session opened ahead to release: nothing to wait for
            end_idle(proc, grace)
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            log.info("the spare Spark Connect runner (pid %d) did not end within %.0fs; stopping it", proc.pid, grace)
        except OSError as e:  # its stdin already broken: it is gone or going
            log.info("the spare Spark Connect runner (pid %d): %s", proc.pid, e)
        end_idle(proc, grace)


def end_idle(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """End an idle runner: SIGTERM, then SIGKILL after ``grace`` seconds; its output is dropped."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()
