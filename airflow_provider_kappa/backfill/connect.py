"""The Spark Connect engine (``job.engine: connect``): slices as client sessions of one server.

- Where the server is: :func:`configured_url` (``job.connect.url``, or an Airflow ``spark_connect``
  connection through the Spark provider's ``SparkConnectHook``), else a server kappa starts and
  owns, :class:`LocalConnectServer` (a ``SparkConnectServer`` from the pyspark wheel, on a free
  port of 127.0.0.1, in its own process group, stopped by its pid).
- A kappa-owned server is described by a small JSON state file ``{"url", "pid", "start_ticks",
  "log"}`` so another process (an Airflow task) can find it, check it (:func:`read_state`,
  :meth:`ServerState.alive`) and restart it (:func:`ensure_server`).
- :func:`run_application` runs the job's unchanged application once as a session
  (:mod:`airflow_provider_kappa.spark.connect_runner` in a child Python), the session conf in a 0600
  JSON file, and returns the run's ``StreamingQueryProgress`` records.

Only the session keys (``spark.kappa.*`` and runtime ``spark.sql.*``) can change per session
(:func:`split_conf`); the job's other ``spark_conf`` keys go to a local server when it starts, and
a given server keeps its own (a warning says which). Catalog credentials stay in the 0600 catalogs
file whose path the conf carries; a server URL holding a token goes to the runner by environment.
No Airflow import at module level (only :func:`configured_url` imports the hook).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, Mapping

from airflow_provider_kappa.backfill.config import JobConfig
from airflow_provider_kappa.backfill.processes import RUNNING, child_options
from airflow_provider_kappa.backfill.processes import start_ticks as _start_ticks
from airflow_provider_kappa.backfill.submit import spark_env, write_properties_file
from airflow_provider_kappa.exceptions import KappaConfigError, KappaEngineError
from airflow_provider_kappa.spark.conf_keys import PREFIX
from airflow_provider_kappa.spark.warm_daemon import SOCKET_ENV

WARM_DAEMON_MODULE = "airflow_provider_kappa.spark.warm_daemon"
#: Set to ``1`` to start local servers with the warm daemon (opt-in while it gets more mileage:
#: benchmarks/README.md measures ~6 s -> ~2 s of fixed cost per slice); unset or ``0``: Spark's own.
WARM_DAEMON_ENV = "KAPPA_WARM_DAEMON"

log = logging.getLogger(__name__)

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
STARTED_LINE = "Spark Connect server started"
RUNNER_MODULE = "airflow_provider_kappa.spark.connect_runner"
#: Static SQL confs (set only when a Spark application starts), though named ``spark.sql.*``.
STATIC_SQL_PREFIXES = (
    "spark.sql.extensions",
    "spark.sql.warehouse.dir",
    "spark.sql.catalogImplementation",
    "spark.sql.globalTempDatabase",
    "spark.sql.hive.metastore.",
    "spark.sql.queryExecutionListeners",
    "spark.sql.streaming.streamingQueryListeners",
    "spark.sql.ui.",
    "spark.sql.streaming.ui.",
    "spark.sql.event.truncate.length",
    "spark.sql.connect.",
    "spark.sql.legacy.sessionInitWithConfigDefaults",
)


def is_session_key(key: str) -> bool:
    """Whether ``key`` can be set per Spark Connect session: ``spark.kappa.*`` and runtime SQL confs."""
    return key.startswith(PREFIX) or (key.startswith("spark.sql.") and not key.startswith(STATIC_SQL_PREFIXES))


def split_conf(conf: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``(session, server)``: the keys a session sets, and the ones only a server's start can set.

    :param conf: a run's whole Spark conf.
    """
    session = {k: v for k, v in conf.items() if is_session_key(k)}
    return session, {k: v for k, v in conf.items() if k not in session}


def redact_url(url: str) -> str:
    """``url`` without its parameters (``;token=...``), for logs and errors."""
    return url.split(";", 1)[0]


def configured_url(cfg: JobConfig) -> str | None:
    """The server of ``job.connect``: its ``url``, or its Airflow connection's URL through
    ``SparkConnectHook``; ``None`` when absent (kappa starts a local server).

    :raises KappaConfigError: the connection cannot be found or gives no usable URL.
    """
    connect = cfg.job.connect
    if connect is None:
        return None
    if connect.url:
        return connect.url
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

    try:
        return SparkConnectHook(conn_id=str(connect.conn_id)).get_connection_url()
    except Exception as e:  # AirflowNotFoundException, ValueError (a path in the URL), ...
        raise KappaConfigError(
            f"job.connect.conn_id: {connect.conn_id!r} gives no Spark Connect URL ({type(e).__name__}: {e}); "
            "expected an Airflow connection of type spark_connect with host and port"
        ) from e


# --------------------------------------------------------------------------- server state


def port_open(url: str, timeout: float = 1.0) -> bool:
    """Whether the host:port of ``sc://host:port`` accepts a TCP connection."""
    netloc = redact_url(url).removeprefix("sc://").rstrip("/")
    host, _, port = netloc.partition(":")
    try:
        with socket.create_connection((host, int(port or 15002)), timeout=timeout):
            return True
    except OSError:
        return False


@dataclass(frozen=True)
class ServerState:
    """A kappa-owned local server, as its state file records it."""

    url: str
    pid: int
    start_ticks: int | None
    log: str

    def running(self) -> bool:
        """Its process (the same one, not a reused pid) is alive."""
        return self.start_ticks is not None and _start_ticks(self.pid) == self.start_ticks

    def alive(self) -> bool:
        """Running and accepting connections."""
        return self.running() and port_open(self.url)

    def write(self, path: Path) -> Path:
        """Write this state as JSON to ``path`` (atomically)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        tmp.replace(path)
        return path


def read_state(path: Path) -> ServerState | None:
    """The server recorded in ``path``, ``None`` if there is no (readable) state file."""
    try:
        data = json.loads(path.read_text())
        return ServerState(str(data["url"]), int(data["pid"]), data.get("start_ticks"), str(data.get("log", "")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def stop_group(pid: int, start_ticks: int | None, timeout: float = 30.0) -> None:
    """Stop process group ``pid`` (SIGTERM, then SIGKILL after ``timeout``) if it is still the
    process that started at ``start_ticks``."""
    if start_ticks is None or _start_ticks(pid) != start_ticks:
        return
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if _start_ticks(pid) != start_ticks:
                return
            time.sleep(0.2)


def stop_owned(path: Path) -> None:
    """Stop the kappa-owned server recorded in state file ``path`` and remove the file."""
    state = read_state(path)
    if state is not None:
        stop_group(state.pid, state.start_ticks)
    path.unlink(missing_ok=True)


# --------------------------------------------------------------------------- local server


def free_port() -> int:
    """A TCP port of 127.0.0.1 free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalConnectServer:
    """A Spark Connect server on 127.0.0.1 for one backfill, started from this venv's pyspark.

    Master ``job.master``; the job's ``spark_conf`` keys a session cannot set go to it at start
    (in a 0600 properties file). It leads its own process group and is stopped by its pid. Its Python
    processes fork from a warm zygote (:meth:`warm_python`, :mod:`airflow_provider_kappa.spark.warm_daemon`)
    unless ``KAPPA_WARM_DAEMON=0``. Use it as a context manager, or :meth:`start` / :meth:`stop`.

    :param cfg: the job config (``job.master``, ``job.spark_conf``, ``job.name``).
    :param work: a folder for its log, properties and state files (``server.json``).
    :param start_timeout: seconds to wait for it to accept connections.
    :param master: overrides ``job.master``; with ``cfg`` ``None``, the master (default ``local[*]``).
    :param conf: with ``cfg`` ``None``, the server's Spark conf.
    :param state_file: where to record its state (default ``<work>/server.json``).
    :param die_with_parent: the server ends when this process dies, SIGKILL included (a parent-death
        signal: ``kappa backfill``'s own server); leave False for a server other processes keep using.
    """

    def __init__(
        self,
        cfg: JobConfig | None,
        work: Path,
        start_timeout: float = 240.0,
        *,
        master: str | None = None,
        conf: Mapping[str, str] | None = None,
        state_file: Path | None = None,
        die_with_parent: bool = False,
    ) -> None:
        self.die_with_parent = die_with_parent
        self.master = master or (cfg.job.master if cfg else "local[*]")
        self.conf = split_conf(cfg.job.spark_conf)[1] if cfg else dict(conf or {})
        self.name = f"kappa-connect-{cfg.job.name}" if cfg else "kappa-connect"
        self.work = Path(work)
        self._state_file = state_file or self.work / "server.json"
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.state: ServerState | None = None
        self.seconds = 0.0
        self.zygote: subprocess.Popen[bytes] | None = None
        self._socket_dir: Path | None = None

    @property
    def state_file(self) -> Path:
        """Where the server's state is recorded (default ``<work>/server.json``)."""
        return self._state_file

    @property
    def log_file(self) -> Path:
        """The server's stdout and stderr."""
        return self.work / "server.log"

    @property
    def url(self) -> str:
        """``sc://127.0.0.1:<port>``."""
        if self.state is None:
            raise KappaEngineError("the local Spark Connect server is not started")
        return self.state.url

    def alive(self) -> bool:
        """Whether the server runs and accepts connections."""
        return self.state is not None and self.state.alive()

    def command(self, port: int) -> list[str]:
        """The spark-submit command line (the conf is in the properties file, not here)."""
        spark_submit = str(Path(sys.executable).parent / "spark-submit")
        conf = {
            **self.conf,
            "spark.connect.grpc.binding.port": str(port),
            "spark.connect.grpc.binding.address": "127.0.0.1",
        }
        props = write_properties_file(conf, self.work / "server.properties")
        return [
            spark_submit, "--master", self.master, "--name", self.name,
            "--properties-file", str(props), "--class", SERVER_CLASS, "spark-internal",
        ]  # fmt: skip

    def warm_python(self) -> dict[str, str]:
        """Environment of a server whose Python processes are forked warm
        (:mod:`airflow_provider_kappa.spark.warm_daemon`): ``PYSPARK_PYTHON`` is a small wrapper that
        hands ``python -m pyspark.*`` to the zygote; empty when ``KAPPA_WARM_DAEMON=0`` (Spark's own
        daemon, cold) or when the job sets ``spark.pyspark.python``."""
        if os.environ.get(WARM_DAEMON_ENV, "1") == "0" or "spark.pyspark.python" in self.conf:
            return {}
        self._socket_dir = Path(tempfile.mkdtemp(prefix="kappa-wd-"))  # short: AF_UNIX paths are <= 107 bytes
        wrapper = self.work / "python"
        wrapper.write_text(
            "#!/bin/sh\n"
            "# PYSPARK_PYTHON of a kappa-owned Spark Connect server: pyspark's own processes forked warm\n"
            f'if [ "$1" = "-m" ]; then case "$2" in pyspark.*) exec "{sys.executable}" -m {WARM_DAEMON_MODULE} --run "$@";; esac; fi\n'
            f'exec "{sys.executable}" "$@"\n'
        )
        wrapper.chmod(0o700)
        return {"PYSPARK_PYTHON": str(wrapper), SOCKET_ENV: str(self._socket_dir / "zygote.sock")}

    def _start_zygote(self, env: Mapping[str, str], out: Any) -> None:
        """The warm daemon's zygote, in its own process group; it ends within a second of the server."""
        assert self.proc is not None
        self.zygote = subprocess.Popen(
            [sys.executable, "-m", WARM_DAEMON_MODULE, "--serve", env[SOCKET_ENV], "--watch-pid", str(self.proc.pid)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env),
            start_new_session=True,
        )

    def start(self) -> LocalConnectServer:
        """Start the server and wait until it accepts connections; record its state file.

        :raises KappaEngineError: it exits or does not listen within ``start_timeout``; the message
            holds the tail of its log.
        """
        self.work.mkdir(parents=True, exist_ok=True)
        port = free_port()
        began = time.monotonic()
        env = {**os.environ, **spark_env(), **self.warm_python()}
        with self.log_file.open("wb") as out:
            self.proc = subprocess.Popen(
                self.command(port),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                **(child_options() if self.die_with_parent else {"start_new_session": True}),
            )
            if SOCKET_ENV in env:
                try:
                    self._start_zygote(env, out)
                except OSError as e:  # the server still runs, its Python processes start cold
                    log.warning("warm daemon not started (%s: %s); Spark's Python processes start cold", type(e).__name__, e)
        url = f"sc://127.0.0.1:{port}"
        self.state = ServerState(url, self.proc.pid, _start_ticks(self.proc.pid), str(self.log_file))
        self.state.write(self.state_file)
        while not port_open(url, timeout=0.5):
            if self.proc.poll() is not None or time.monotonic() - began > self.start_timeout:
                code = self.proc.poll()
                self.stop()
                why = f"exited with code {code}" if code is not None else f"did not listen within {self.start_timeout:.0f}s"
                raise KappaEngineError(
                    f"local Spark Connect server on {url} {why}; log {self.log_file}, last lines:\n{log_tail(self.log_file)}"
                )
            time.sleep(0.25)
        self.seconds = time.monotonic() - began
        log.info("Spark Connect server %s (pid %d) ready in %.1fs, log %s", url, self.proc.pid, self.seconds, self.log_file)
        return self

    def stop(self) -> None:
        """Stop the server's process group (and a restart recorded in the state file); remove the state file."""
        if self.proc is not None and self.proc.poll() is None:
            stop_group(self.proc.pid, self.state.start_ticks if self.state else None)
        if self.zygote is not None and self.zygote.poll() is None:
            self.zygote.terminate()
        for proc in (self.proc, self.zygote):
            if proc is not None:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
        stop_owned(self.state_file)
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)

    def __enter__(self) -> LocalConnectServer:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def log_tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file."""
    try:
        with path.open(encoding="utf-8", errors="replace") as fh:
            return "".join(deque(fh, maxlen=lines))
    except OSError:
        return "(no log)"


def ensure_server(cfg: JobConfig, state_file: Path) -> ServerState:
    """The kappa-owned server recorded in ``state_file`` if it is alive; else start a new one
    there (a server killed mid-backfill is restarted for the retry). The caller that owns the
    backfill stops it with :func:`stop_owned`.

    :param cfg: the job config.
    :param state_file: the server's state file (its folder holds its log).
    """
    state = read_state(state_file)
    if state is not None and state.alive():
        return state
    if state is not None:
        log.warning("Spark Connect server %s (pid %d) is gone; starting a new one", state.url, state.pid)
        stop_group(state.pid, state.start_ticks)
    server = LocalConnectServer(cfg, state_file.parent, state_file=state_file)
    server.start()
    assert server.state is not None
    return server.state


# --------------------------------------------------------------------------- one run


def with_session_id(url: str, session_id: str) -> str:
    """``url`` (``sc://host:port[/;params]``) with its ``session_id`` parameter set to ``session_id``."""
    base, _, params = url.partition(";")
    kept = [p for p in params.split(";") if p and not p.startswith("session_id=")]
    return base.rstrip("/") + "/;" + ";".join([*kept, f"session_id={session_id}"])


def stop_session(url: str, session_id: str, timeout: float = 60.0) -> None:
    """Release Spark Connect session ``session_id`` of the server at ``url``: its streaming queries
    are stopped and its running operations interrupted inside the server (a runner that was killed
    leaves them running). A session already closed is fine.

    :param url: the server's ``sc://`` URL (a token in it goes by environment).
    :param session_id: the session to end.
    :param timeout: seconds to wait for the stop.
    :raises KappaEngineError: the stop failed or did not end in time.
    """
    cmd = [sys.executable, "-m", RUNNER_MODULE, "--stop-session"]
    env = {**os.environ, **spark_env(), "SPARK_REMOTE": with_session_id(url, session_id)}
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise KappaEngineError(f"Spark Connect session {session_id} on {redact_url(url)}: not stopped within {timeout:.0f}s") from e
    if done.returncode != 0:
        raise KappaEngineError(
            f"Spark Connect session {session_id} on {redact_url(url)} could not be stopped (exit code {done.returncode}): "
            + "\n".join((done.stdout + done.stderr).strip().splitlines()[-10:])
        )
    log.info("Spark Connect session %s on %s released", session_id, redact_url(url))


def stop_run(proc: subprocess.Popen[bytes], url: str, session_id: str, grace: float = 20.0) -> None:
    """End a runner and its session: SIGTERM (the runner stops its queries and the session), and if
    it is not gone after ``grace`` seconds, SIGKILL it and release the session from here
    (:func:`stop_session`)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    elif proc.returncode == 0:
        return
    stop_session(url, session_id)


def write_conf_file(conf: Mapping[str, str], path: Path) -> Path:
    """Write a session's conf as JSON with mode 0600."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(dict(conf), fh)
    return path


def run_application(
    application: str | Path,
    conf: Mapping[str, str],
    *,
    url: str,
    work: Path,
    name: str,
    server_alive: Callable[[], bool] | None = None,
    owned: bool = False,
    session_id: str | None = None,
) -> list[dict[str, Any]]:
    """Run ``application`` once as a Spark Connect session of the server at ``url``.

    :param application: the job's Python file.
    :param conf: the run's whole conf; its session keys are set (:func:`split_conf`), the others are
        the server's and only logged by name when they are left out.
    :param url: the server's ``sc://`` URL (given to the runner by environment).
    :param work: a private folder (the 0600 conf file and the progress file go there).
    :param name: the run's name, for logs.
    :param server_alive: checked every second when given: a server that goes away ends the run
        at once instead of after the client's retries.
    :param owned: the server is kappa's own (:class:`LocalConnectServer`), started with the job's
        server keys: they are not reported as left out.
    :param session_id: the session's id (a UUID; default a new one): the session the runner opens,
        and the one :func:`stop_session` ends if the runner cannot.
    :returns: the ``StreamingQueryProgress`` records of the run, in order.
    :raises KappaEngineError: the session fails (the tail of its output in the message) or the server goes away.

    The runner dies with this process (SIGTERM by parent-death signal: it stops its queries and
    session). When this call ends by an exception (a task's timeout, Ctrl-C) or this process's
    :func:`~airflow_provider_kappa.backfill.processes.stop_running` (an Airflow task's ``on_kill``),
    the runner is stopped and, if it does not end by itself, the session is released from here:
    its queries stop inside the server.
    """
    if not Path(application).is_file():
        raise KappaConfigError(f"job.application: {str(application)!r} does not exist")
    session, server_only = split_conf(conf)
    if server_only and not owned:
        log.warning(
            "%s: conf key(s) %s cannot be set per Spark Connect session; the server's own values apply",
            name, sorted(server_only),
        )  # fmt: skip
    conf_file = write_conf_file(session, work / "session-conf.json")
    progress_file = work / "progress.jsonl"
    cmd = [sys.executable, "-m", RUNNER_MODULE, "--conf-file", str(conf_file), "--progress-file", str(progress_file), str(application)]
    session_id = session_id or str(uuid.uuid4())
    env = {**os.environ, **spark_env(), "SPARK_REMOTE": with_session_id(url, session_id)}
    log.info("%s: Spark Connect session %s on %s: %s", name, session_id, redact_url(url), " ".join(cmd))
    tail: deque[str] = deque(maxlen=40)
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, **child_options(signal.SIGTERM)
    )

    def stop() -> None:
        stop_run(proc, url, session_id)

    with RUNNING.run(f"Spark Connect session {session_id} ({name})", stop):
        try:
            gone = _follow(proc, tail, name, url, server_alive)
        except BaseException:
            stop()
            raise
    code = proc.wait()
    if gone is not None:
        raise KappaEngineError(f"{name}: the Spark Connect server at {redact_url(url)} went away during the run")
    if code < 0:  # the runner was killed by a signal: its queries may still run inside the server
        try:
            stop_session(url, session_id)
        except KappaEngineError as e:
            raise KappaEngineError(
                f"{name}: the Spark Connect runner was killed by signal {-code} and its session {session_id} could not "
                f"be released (its query may still run in the server; the next attempt's epoch refuses its commits): {e}"
            ) from e
    if code != 0:
        last = "\n".join(list(tail)[-15:])
        raise KappaEngineError(
            f"{name}: the Spark Connect session on {redact_url(url)} failed (exit code {code}); last lines:\n{last}"
        )
    from airflow_provider_kappa.backfill.progress import read_progress

    return read_progress(progress_file)


def _follow(
    proc: subprocess.Popen[bytes], tail: deque[str], name: str, url: str, server_alive: Callable[[], bool] | None
) -> float | None:
    """Log the runner's output until it ends; return when the server was found gone (``None``: it was not)."""
    gone: float | None = None
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    pending = b""
    last_check = time.monotonic()
    while True:
        chunk = proc.stdout.read()
        if chunk:
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                line = raw.decode("utf-8", "replace").rstrip()
                tail.append(line)
                log.info("%s", line)
        elif proc.poll() is not None:
            break
        else:
            time.sleep(0.05)
        if gone is not None and time.monotonic() - gone > 15:
            proc.kill()  # its client retrying the dead server
        elif gone is None and server_alive is not None and time.monotonic() - last_check > 1.0:
            last_check = time.monotonic()
            if not server_alive():
                gone = time.monotonic()
                log.warning("%s: the Spark Connect server at %s is gone; ending the session", name, redact_url(url))
                proc.terminate()
    if pending:
        tail.append(pending.decode("utf-8", "replace"))
        log.info("%s", tail[-1])
    return gone
