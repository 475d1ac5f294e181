"""The Spark Connect server of engine ``connect``: where it is and the one kappa starts and owns.

- Where the server is: :func:`configured_url` (``job.connect.url``, or an Airflow ``spark_connect``
  connection through the Spark provider's ``SparkConnectHook``), else a server kappa starts and
  owns, :class:`LocalConnectServer` (a ``SparkConnectServer`` from the pyspark wheel, on a free
  port of 127.0.0.1, in its own process group, stopped by its pid). It takes only clients that
  send its random token (``SPARK_CONNECT_AUTHENTICATE_TOKEN``): another local process cannot open a
  session on it and run a Python UDF as its user.
- A kappa-owned server is described by a small 0600 JSON state file ``{"url", "pid", "start_ticks",
  "log", "token"}`` so another process (an Airflow task) can find it, check it (:func:`read_state`,
  :meth:`ServerState.alive`) and restart it (:func:`ensure_server`). The token is kept there and given
  to kappa's clients by environment only: never in a URL, a command line, a log, an error or XCom.

No Airflow import at module level (only :func:`configured_url` imports the hook).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType

from airflow_provider_kappa.engine.class_data_sharing import ClassDataSharing
from airflow_provider_kappa.engine.class_data_sharing import plan as plan_class_data_sharing
from airflow_provider_kappa.engine.connect_runner import TOKEN_ENV
from airflow_provider_kappa.engine.iceberg_spark import iceberg_spark_conf
from airflow_provider_kappa.engine.processes import child_options, holds_listener
from airflow_provider_kappa.engine.processes import start_ticks as _start_ticks
from airflow_provider_kappa.engine.submit import spark_env, write_properties_file
from airflow_provider_kappa.engine.warm_python import WarmPython, warm_enabled
from airflow_provider_kappa.exceptions import KappaConfigError, KappaEngineError
from airflow_provider_kappa.job.config import JobConfig
from airflow_provider_kappa.spark.conf_keys import PREFIX

log = logging.getLogger(__name__)

#: How often a server's start looks for its port, and its stop for its end: both are on a backfill's
#: critical path (a check is a local connect or a read of /proc: microseconds).
POLL_SECONDS = 0.05
#: Starts of a local server whose free port another process took before it bound it.
PORT_ATTEMPTS = 3
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
#: How long a server whose JVM writes the class archive at exit may take to stop before SIGKILL (which
#: loses the archive): the stop took ~15 s longer for a 191 MB archive on a 2-core machine (2M-row backfill).
ARCHIVE_STOP_SECONDS = 180.0
STARTED_LINE = "Spark Connect server started"
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


def with_session_id(url: str, session_id: str) -> str:
    """``url`` (``sc://host:port[/;params]``) with its ``session_id`` parameter set to ``session_id``."""
    base, _, params = url.partition(";")
    kept = [p for p in params.split(";") if p and not p.startswith("session_id=")]
    return base.rstrip("/") + "/;" + ";".join([*kept, f"session_id={session_id}"])


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
    """A kappa-owned local server, as its state file records it; ``token``: the token its clients
    send (``None``: a server that takes any client), never in ``repr``."""

    url: str
    pid: int
    start_ticks: int | None
    log: str
    token: str | None = field(default=None, repr=False)

    def running(self) -> bool:
        """Its process (the same one, not a reused pid) is alive."""
        return self.start_ticks is not None and _start_ticks(self.pid) == self.start_ticks

    def alive(self) -> bool:
        """Running and accepting connections."""
        return self.running() and port_open(self.url)

    def write(self, path: Path) -> Path:
        """Write this state as JSON to ``path`` (atomically), mode 0600: it holds the token."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)  # a left-over file would keep its own mode
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(asdict(self), fh)
        tmp.replace(path)
        return path


def read_state(path: Path) -> ServerState | None:
    """The server recorded in ``path``, ``None`` if there is no (readable) state file."""
    try:
        data = json.loads(path.read_text())
        token = data.get("token")
        return ServerState(
            str(data["url"]), int(data["pid"]), data.get("start_ticks"), str(data.get("log", "")), token and str(token)
        )
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
            time.sleep(POLL_SECONDS)


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

    It takes only clients that send :attr:`token`, a random token made at each start (given to the
    server and to kappa's clients by environment, kept in the 0600 state file); its URL names host
    ``localhost`` (pyspark's client sends a token without TLS only to ``localhost``). Master ``job.master``; the job's ``spark_conf`` keys a session cannot set go to it at start
    (in a 0600 properties file). It leads its own process group and is stopped by its pid. Its Python
    processes fork from a warm zygote (:meth:`warm_python`, :mod:`airflow_provider_kappa.engine.warm_python`)
    unless ``KAPPA_WARM_DAEMON=0``. Use it as a context manager, or :meth:`start` / :meth:`stop`.

    :param cfg: the job config (``job.master``, ``job.spark_conf``, ``job.name``).
    :param work: a folder for its log, properties and state files (``server.json``).
    :param start_timeout: seconds to wait for it to accept connections.
    :param master: overrides ``job.master``; with ``cfg`` ``None``, the master (default ``local[*]``).
    :param conf: with ``cfg`` ``None``, the server's Spark conf.
    :param state_file: where to record its state (default ``<work>/server.json``).
    :param die_with_parent: the server ends when this process dies, SIGKILL included (a parent-death
        signal: ``kappa backfill``'s own server); leave False for a server other processes keep using.
    :param write_archive: its JVM maps the machine's class archive for Connect servers
        (:mod:`~airflow_provider_kappa.engine.class_data_sharing`, unless ``job.class_data_sharing``
        is false) and, when there is none yet, writes it at exit, kept once :meth:`stop` saw it end
        cleanly; False: map only (a server another process stops).
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
        write_archive: bool = True,
    ) -> None:
        self.die_with_parent = die_with_parent
        self.class_data_sharing = cfg.job.class_data_sharing if cfg else True
        self.write_archive = write_archive
        self.sharing: ClassDataSharing | None = None
        self.master = master or (cfg.job.master if cfg else "local[*]")
        # kappa's own server: with Iceberg's Spark runtime where the job declares an Iceberg catalog
        self.conf = split_conf(iceberg_spark_conf(cfg.job.spark_conf))[1] if cfg else dict(conf or {})
        self.name = f"kappa-connect-{cfg.job.name}" if cfg else "kappa-connect"
        self.work = Path(work)
        self._state_file = state_file or self.work / "server.json"
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.state: ServerState | None = None
        self.seconds = 0.0
        self.warm: WarmPython | None = None
        self._token: str | None = None
        self._halted = False  # stop() was called: a start() under way in another thread ends, stopped

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
        """``sc://localhost:<port>`` (no token in it)."""
        if self.state is None:
            raise KappaEngineError("the local Spark Connect server is not started")
        return self.state.url

    @property
    def token(self) -> str:
        """The token its clients send (``SPARK_CONNECT_AUTHENTICATE_TOKEN``); never log it."""
        if self._token is None:
            raise KappaEngineError("the local Spark Connect server is not started")
        return self._token

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
        if self.class_data_sharing and self.sharing is None:
            self.sharing = plan_class_data_sharing(conf, main_class=SERVER_CLASS, write=self.write_archive)
        props = write_properties_file(self.sharing.conf if self.sharing else conf, self.work / "server.properties")
        return [
            spark_submit,
            "--master",
            self.master,
            "--name",
            self.name,
            "--properties-file",
            str(props),
            "--class",
            SERVER_CLASS,
            "spark-internal",
        ]

    def warm_python(self) -> dict[str, str]:
        """Environment of a server whose Python processes are forked warm
        (:class:`~airflow_provider_kappa.engine.warm_python.WarmPython`): ``PYSPARK_PYTHON`` and
        ``PYSPARK_DRIVER_PYTHON`` are a small wrapper that hands ``python -m pyspark.*`` to the zygote; empty
        when ``KAPPA_WARM_DAEMON=0`` (Spark's own daemon, cold) or when the job sets ``spark.pyspark.python``.

        The driver's one matters too: the server looks up the installed Python data sources
        (``pyspark.sql.worker.lookup_data_sources``, once per server, at the first ``spark.dataSource``
        call: the first slice's ``read_source``) with the driver's Python. Started cold, that lookup took
        1.1 s of the first slice's start (benchmarks/README.md)."""
        if not warm_enabled(self.conf):
            return {}
        self.warm = WarmPython()
        return self.warm.env()

    def start(self) -> LocalConnectServer:
        """Start the server and wait until it accepts connections; record its state file. A server whose
        port another process took before it bound it (the port is chosen free, then given to it) is
        started again on another port, up to :data:`PORT_ATTEMPTS` times.

        :raises KappaEngineError: it exits or does not listen within ``start_timeout``; the message
            holds the tail of its log.
        """
        self.work.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        self._token = secrets.token_urlsafe(32)
        for attempt in range(1, PORT_ATTEMPTS + 1):
            if self._wait_ready(self._launch(free_port()), began, retry=attempt < PORT_ATTEMPTS):
                break
        assert self.proc is not None
        self.seconds = time.monotonic() - began
        log.info(
            "Spark Connect server %s (pid %d) ready in %.1fs, log %s",
            self.url,
            self.proc.pid,
            self.seconds,
            self.log_file,
        )
        return self

    def _launch(self, port: int) -> str:
        """Start the server's process on ``port`` (and its warm zygote) and record its state file; its URL."""
        assert self._token is not None
        env = {**os.environ, **spark_env(), **self.warm_python(), TOKEN_ENV: self._token}
        with self.log_file.open("wb") as out:
            self.proc = subprocess.Popen(
                self.command(port),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                **(child_options() if self.die_with_parent else {"start_new_session": True}),
            )
            if self.warm is not None:
                self.warm.start({k: v for k, v in env.items() if k != TOKEN_ENV}, self.proc.pid, out)
        url = f"sc://localhost:{port}"  # bound to 127.0.0.1; localhost: the client's token without TLS
        self.state = ServerState(url, self.proc.pid, _start_ticks(self.proc.pid), str(self.log_file), self._token)
        self.state.write(self.state_file)
        return url

    def _wait_ready(self, url: str, began: float, *, retry: bool) -> bool:
        """Wait until the server listens on ``url``'s port itself: ``True``. ``False`` when it exited after
        another process took that port (``retry``: the caller starts it again on another one).

        :raises KappaEngineError: it exited, was stopped, or did not listen within ``start_timeout``.
        """
        assert self.proc is not None
        port = int(url.rsplit(":", 1)[1])
        taken = False  # the port answered, but not from the server
        while True:
            if not self._halted and port_open(url, timeout=0.5):
                if holds_listener(self.proc.pid, port) is not False:
                    return True
                taken = True
            code = self.proc.poll()
            if self._halted or code is not None or time.monotonic() - began > self.start_timeout:
                if retry and taken and code is not None and not self._halted:
                    log.warning(
                        "local Spark Connect server: another process took port %d before it bound it (it exited "
                        "with code %d); starting it on another port",
                        port,
                        code,
                    )
                    self._discard_attempt()
                    return False
                self.stop()
                why = (
                    "was stopped while it started"
                    if self._halted and code is None
                    else f"exited with code {code}"
                    if code is not None
                    else f"did not listen within {self.start_timeout:.0f}s"
                )
                raise KappaEngineError(
                    f"local Spark Connect server on {url} {why}; log {self.log_file}, last lines:\n{log_tail(self.log_file)}"
                )
            time.sleep(POLL_SECONDS)

    def _discard_attempt(self) -> None:
        """Forget an attempt whose process exited: its warm zygote and its class archive plan."""
        if self.warm is not None:
            self.warm.stop()
            self.warm = None
        if self.sharing is not None:
            self.sharing.abandon()
            self.sharing = None

    def stop(self) -> None:
        """Stop the server's process group (and a restart recorded in the state file); remove the state file.
        Called from another thread while :meth:`start` runs, that start ends too (it raises)."""
        self._halted = True
        if self.proc is not None and self.proc.poll() is None:
            writing = self.sharing is not None and self.sharing.writing is not None
            if writing:
                log.info("the local Spark Connect server writes its class archive as it stops (once per machine)")
            stop_group(
                self.proc.pid, self.state.start_ticks if self.state else None, ARCHIVE_STOP_SECONDS if writing else 30.0
            )
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if self.warm is not None:
            self.warm.stop()
        if self.sharing is not None:
            # the archive its JVM wrote at exit: kept when it ended on the SIGTERM (143) or by itself
            code = self.proc.returncode if self.proc is not None else None
            if code in (0, 128 + signal.SIGTERM):
                self.sharing.keep()
            else:
                self.sharing.abandon()
            self.sharing = None
        stop_owned(self.state_file)

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
    server = LocalConnectServer(cfg, state_file.parent, state_file=state_file, write_archive=False)
    server.start()
    assert server.state is not None
    return server.state
