"""The Spark Connect engine (``job.engine: connect``): slices as client sessions of one server.

- :class:`ConnectEngine`: the engine (start a kappa-owned server, run a slice as a
  session, release a previous attempt's session, stop). Where the server comes from, and the
  server kappa owns, are :mod:`~airflow_provider_kappa.engine.connect_server`'s.
- :func:`run_application` runs the job's unchanged application once as a session
  (:mod:`airflow_provider_kappa.engine.connect_runner` in a child Python), the session conf in a 0600
  JSON file, and returns the run's ``StreamingQueryProgress`` records.

Only the session keys (``spark.kappa.*`` and runtime ``spark.sql.*``) can change per session
(:func:`split_conf`); the job's other ``spark_conf`` keys go to a local server when it starts, and
a given server keeps its own (a warning says which). Catalog credentials stay in the 0600 catalogs
file whose path the conf carries; a server URL holding a token, and the token of kappa's own server
(from its 0600 state file), go to the runner by environment only (:func:`client_env`).
No Airflow import at module level (only :func:`configured_url` imports the hook).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from airflow_provider_kappa.engine.base import Engine, SliceRunRequest
from airflow_provider_kappa.engine.connect_runner import GAVE_UP_EXIT, RUNNER_MODULE, TOKEN_ENV
from airflow_provider_kappa.engine.connect_server import (
    LocalConnectServer,
    configured_url,
    ensure_server,
    read_state,
    redact_url,
    split_conf,
    with_session_id,
)
from airflow_provider_kappa.engine.processes import RUNNING, child_options
from airflow_provider_kappa.engine.progress import read_progress
from airflow_provider_kappa.engine.shared_server import recycle_every, shared_session
from airflow_provider_kappa.engine.spare_runner import SpareRunner
from airflow_provider_kappa.engine.submit import spark_env
from airflow_provider_kappa.exceptions import KappaConfigError, KappaEngineError
from airflow_provider_kappa.job.checkpoints import CheckpointStore
from airflow_provider_kappa.job.config import JobConfig
from airflow_provider_kappa.spark.storage import first_missing, remove_empty_folders

log = logging.getLogger(__name__)

#: Seconds after a slice's runner starts before :class:`ConnectEngine` starts the next slice's spare
#: runner: past the slice's own start, so the spare's imports do not compete with it for the cores.
SPARE_AFTER_SECONDS = 2.0


# --------------------------------------------------------------------------- one run


def client_env(url: str, token: str | None) -> dict[str, str]:
    """The environment of a runner child, a client of the server at ``url``: ``SPARK_REMOTE`` (a
    token in the URL stays out of the command line) and, for kappa's own server, its token.

    :param url: the server's ``sc://`` URL.
    :param token: the token of a kappa-owned server (``None``: the URL's or the environment's own).
    """
    env = {**os.environ, **spark_env(), "SPARK_REMOTE": url}
    if token is not None:
        env[TOKEN_ENV] = token
    return env


def stop_session(url: str, session_id: str, timeout: float = 60.0, *, token: str | None = None) -> None:
    """Release Spark Connect session ``session_id`` of the server at ``url``: its streaming queries
    are stopped and its running operations interrupted inside the server (a runner that was killed
    leaves them running). A session already closed is fine.

    :param url: the server's ``sc://`` URL (a token in it goes by environment).
    :param session_id: the session to end.
    :param timeout: seconds to wait for the stop.
    :param token: the token of a kappa-owned server (given by environment).
    :raises KappaEngineError: the stop failed or did not end in time.
    """
    cmd = [sys.executable, "-m", RUNNER_MODULE, "--stop-session"]
    env = client_env(with_session_id(url, session_id), token)
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise KappaEngineError(
            f"Spark Connect session {session_id} on {redact_url(url)}: not stopped within {timeout:.0f}s"
        ) from e
    if done.returncode != 0:
        raise KappaEngineError(
            f"Spark Connect session {session_id} on {redact_url(url)} could not be stopped (exit code {done.returncode}): "
            + "\n".join((done.stdout + done.stderr).strip().splitlines()[-10:])
        )
    log.info("Spark Connect session %s on %s released", session_id, redact_url(url))


def stop_run(
    proc: subprocess.Popen[bytes], url: str, session_id: str, grace: float = 20.0, *, token: str | None = None
) -> None:
    """End a runner and its session: SIGTERM (the runner stops its queries and the session), and if
    it is not gone after ``grace`` seconds, SIGKILL it; either way, unless the runner stopped them
    itself, release the session from here (:func:`stop_session`)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            if proc.wait(timeout=grace) != GAVE_UP_EXIT:
                return
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    elif proc.returncode == 0:
        return
    stop_session(url, session_id, token=token)


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
    token: str | None = None,
    spare: SpareRunner | None = None,
    while_running: Callable[[], None] | None = None,
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
    :param token: the token of a kappa-owned server (given to the runner by environment, or on a
        spare runner's stdin).
    :param spare: a runner started ahead (:class:`SpareRunner`) to run this in; a fresh one when
        it is ``None`` or gone.
    :param while_running: called once, from this thread, :data:`SPARE_AFTER_SECONDS` into the run
        (``ConnectEngine`` starts the next slice's spare there).
    :returns: the ``StreamingQueryProgress`` records of the run, in order.
    :raises KappaEngineError: the session fails (the tail of its output in the message) or the server goes away.

    The runner dies with this process (SIGTERM by parent-death signal: it stops its queries and
    session). When this call ends by an exception (a task's timeout, Ctrl-C) or this process's
    :func:`~airflow_provider_kappa.engine.processes.stop_running` (an Airflow task's ``on_kill``),
    the runner is stopped and, if it does not end by itself, the session is released from here:
    its queries stop inside the server.
    """
    if not Path(application).is_file():
        raise KappaConfigError(f"job.application: {str(application)!r} does not exist")
    conf_file = _write_session_conf(conf, work, name, owned)
    progress_file = work / "progress.jsonl"
    cmd = _runner_command(application, conf_file, progress_file)
    session_id = session_id or str(uuid.uuid4())
    remote = with_session_id(url, session_id)
    tail: deque[str] = deque(maxlen=40)
    run = {"remote": remote, "token": token, "conf_file": str(conf_file), "progress_file": str(progress_file)}
    proc = spare.take({**run, "application": str(application), "args": []}) if spare is not None else None
    if proc is not None:
        log.info("%s: Spark Connect session %s on %s: spare runner %d", name, session_id, redact_url(url), proc.pid)
    else:
        log.info("%s: Spark Connect session %s on %s: %s", name, session_id, redact_url(url), " ".join(cmd))
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=client_env(remote, token),
            **child_options(signal.SIGTERM),
        )

    def stop() -> None:
        stop_run(proc, url, session_id, token=token)

    with RUNNING.run(f"Spark Connect session {session_id} ({name})", stop):
        try:
            gone = _follow(proc, tail, name, url, server_alive, while_running)
        except BaseException:
            stop()
            raise
    _check_run_ended(proc.wait(), gone is not None, tail, name=name, url=url, session_id=session_id, token=token)
    return read_progress(progress_file)


#: Session keys set on kappa's own servers (under the job's ``spark_conf``, which wins). A Spark Connect
#: server gives each session a class loader of its own for the artifacts (jars, files) it adds, and Spark
#: caches generated code per class loader: each slice's session compiled again every whole-stage and
#: projection class its previous slices had compiled, and ran them cold (the first micro-batch of a later
#: slice took 1.6-2.8 s against 0.6-1.4 s with these keys, at 2M rows; benchmarks/README.md).
#: kappa adds no artifact to its sessions, and a kappa server runs only kappa's slices.
OWN_SERVER_SESSION_CONF = {
    "spark.sql.artifact.isolation.enabled": "false",
    "spark.sql.artifact.isolation.alwaysApplyClassloader": "false",
}


def _write_session_conf(conf: Mapping[str, str], work: Path, name: str, owned: bool) -> Path:
    """Write the session keys of ``conf`` to the 0600 conf file in ``work``; the server's keys are left
    out, and named in a warning unless the server is kappa's own (started with them; its sessions also
    get :data:`OWN_SERVER_SESSION_CONF`)."""
    if owned:
        conf = {**OWN_SERVER_SESSION_CONF, **conf}
    session, server_only = split_conf(conf)
    if server_only and not owned:
        log.warning(
            "%s: conf key(s) %s cannot be set per Spark Connect session; the server's own values apply",
            name,
            sorted(server_only),
        )
    return write_conf_file(session, work / "session-conf.json")


def _runner_command(application: str | Path, conf_file: Path, progress_file: Path) -> list[str]:
    """The command of the runner child (:mod:`airflow_provider_kappa.engine.connect_runner`)."""
    return [
        sys.executable,
        "-m",
        RUNNER_MODULE,
        "--conf-file",
        str(conf_file),
        "--progress-file",
        str(progress_file),
        str(application),
    ]


def _check_run_ended(
    code: int, gone: bool, tail: deque[str], *, name: str, url: str, session_id: str, token: str | None
) -> None:
    """Raise unless the runner ended well; a runner killed by a signal has its session released from here.

    :param code: the runner's exit code (negative: killed by that signal).
    :param gone: the server went away during the run.
    :param tail: the runner's last output lines.
    :param token: the token of a kappa-owned server.
    :raises KappaEngineError: the server went away, the session failed or could not be released.
    """
    if gone:
        raise KappaEngineError(f"{name}: the Spark Connect server at {redact_url(url)} went away during the run")
    if code < 0 or code == GAVE_UP_EXIT:  # killed, or gave up its stop: its queries may still run in the server
        try:
            stop_session(url, session_id, token=token)
        except KappaEngineError as e:
            how = f"was killed by signal {-code}" if code < 0 else "gave up stopping its queries"
            raise KappaEngineError(
                f"{name}: the Spark Connect runner {how} and its session {session_id} could not "
                f"be released (its query may still run in the server; the next attempt's epoch refuses its commits): {e}"
            ) from e
    if code != 0:
        last = "\n".join(list(tail)[-15:])
        raise KappaEngineError(
            f"{name}: the Spark Connect session on {redact_url(url)} failed (exit code {code}); last lines:\n{last}"
        )


def _follow(
    proc: subprocess.Popen[bytes],
    tail: deque[str],
    name: str,
    url: str,
    server_alive: Callable[[], bool] | None,
    while_running: Callable[[], None] | None = None,
) -> float | None:
    """Log the runner's output until it ends (calling ``while_running`` once, :data:`SPARE_AFTER_SECONDS`
    in); return when the server was found gone (``None``: it was not)."""
    gone: float | None = None
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    pending = b""
    last_check = started = time.monotonic()
    while True:
        if while_running is not None and time.monotonic() - started >= SPARE_AFTER_SECONDS:
            while_running, call = None, while_running
            call()
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


class ConnectEngine(Engine):
    """Engine ``connect``: every slice is one session of a Spark Connect server.

    The server: ``url`` when given, else ``job.connect``'s (:func:`configured_url`), else the
    kappa-owned server recorded in ``state_file`` (restarted there if it is gone). :meth:`start`
    starts that owned server (``kappa backfill`` calls it while the snapshot and the plan run);
    without it (an Airflow slice task whose setup task started the server) a slice finding no server
    at all starts one for itself alone, a Spark start per slice. The server is not warmed with a
    query before the first slice: measured, a warm-up query from a client process cost more wall
    time than it took off the first slice (benchmarks/README.md).

    The server :meth:`start` started is recycled (stopped and started again, between two slices)
    after every :func:`recycle_every` sessions: Spark keeps the Python planner daemons of each
    session (about five per slice) for the server's life, so a long backfill would otherwise grow
    its process count with every slice. ``kappa backfill`` runs its slices one after the other. The
    slice tasks of an Airflow backfill, on the server its setup task started, count and recycle it
    together (:func:`~airflow_provider_kappa.engine.shared_server.shared_session`).

    After :meth:`start` (``kappa backfill``: many slices in this process, one after the other), each
    slice runs in a :class:`SpareRunner` started while the slice before it ran, its imports done and
    its session opened there (the first one only imports, while the snapshot and plan run), so neither
    is on the slices' path; none is started while the last slice runs (:meth:`last_slice`), and
    :meth:`stop` ends one left over (a failed slice's successor). An Airflow slice task runs one slice
    and starts its runner then.

    :param cfg: the job config.
    :param state_file: the state file of the server kappa owns for this backfill
        (:func:`~airflow_provider_kappa.job.checkpoints.connect_state_path`).
    :param store: the backfill's checkpoint folders: each attempt's session is recorded there, so
        the next attempt of the slice can release it (:meth:`before_attempt`).
    :param url: the server to use (default: as above).
    """

    name = "connect"

    def __init__(self, cfg: JobConfig, *, state_file: Path, store: CheckpointStore, url: str | None = None) -> None:
        self.cfg = cfg
        self.state_file = state_file
        self.store = store
        self.url = url
        self._owned: LocalConnectServer | None = None
        self._sessions = 0  # sessions run on the owned server since it started
        self._spare: SpareRunner | None = None
        self._spares = False  # start() was called: more slices follow in this process
        self._last = False  # last_slice() was called: no slice follows the next one
        self._created: Path | None = None  # the topmost folder start() created for the owned server
        self._stopped = False  # stop() was called: a start() under way in another thread starts no server

    def owned_token(self, url: str) -> str | None:
        """The token of the kappa-owned server at ``url`` (from its state file); ``None`` for another server."""
        state = read_state(self.state_file)
        return state.token if state is not None and state.url == url else None

    def server_url(self) -> str | None:
        """The server the slices run on now, ``None`` when there is none yet."""
        url = self.url or configured_url(self.cfg)
        if url is None:
            state = read_state(self.state_file)
            url = state.url if state is not None and state.alive() else None
        return url

    def start(self) -> None:
        """Start the kappa-owned local server unless a server is given (``url``, ``job.connect``)
        or already running, and the first slice's spare runner; idempotent."""
        if self._stopped:
            return
        self._spares = True
        self._next_spare()
        if self.url or configured_url(self.cfg) or self._owned is not None:
            return
        state = read_state(self.state_file)
        if state is not None and state.alive():
            return
        if self._created is None:
            from pyarrow.fs import LocalFileSystem

            missing = first_missing(LocalFileSystem(), str(self.state_file.parent))
            self._created = None if missing is None else Path(missing)
        server = self._owned = LocalConnectServer(
            self.cfg, self.state_file.parent, state_file=self.state_file, die_with_parent=True
        )
        # stop() sets _stopped, then stops the _owned it sees: one of the two sees the other's write
        if self._stopped:
            return
        server.start()

    @property
    def owned_server(self) -> LocalConnectServer | None:
        """The server :meth:`start` started, if it did."""
        return self._owned

    def stop(self) -> None:
        """Stop the spare runner and the server :meth:`start` started (a given or configured server is
        never stopped); a :meth:`start` still under way in another thread, or called later, starts
        nothing more."""
        self._stopped = True
        self._spares = False
        if self._spare is not None:
            self._spare.close()
            self._spare = None
        if self._owned is not None:
            self._owned.stop()  # one still starting in another thread ends too (its start raises)
            self._owned = None

    def discard(self) -> None:
        """Stop, then remove the owned server's folder and the empty folders above it that
        :meth:`start` created (a backfill refused while its server started writes nothing)."""
        self.stop()
        created, self._created = self._created, None
        if created is None or not self.state_file.parent.exists():  # stopped before the server made it
            return
        try:
            shutil.rmtree(self.state_file.parent)
        except OSError as e:  # said, not raised: the refusal being reported is the error that matters
            log.warning("the local Spark Connect server's folder %s was not removed: %s", self.state_file.parent, e)
            return
        from pyarrow.fs import LocalFileSystem

        try:  # only while empty: anything another process wrote there stays
            remove_empty_folders(LocalFileSystem(), str(self.state_file.parent.parent), str(created))
        except OSError as e:  # said, not raised, as above
            log.warning("the empty folders above %s were not removed: %s", self.state_file.parent, e)

    def before_attempt(self, slice_id: str) -> None:
        """Release the Spark Connect session of ``slice_id``'s previous attempt if it ran on the same
        server (its runner may have been killed, leaving its query running inside the server). The
        epoch taken next fences that query's commits out anyway; this stops it spending the server's
        cores."""
        previous = self.store.session(slice_id)
        if not previous:
            return
        url = self.server_url()
        if url is None or redact_url(url) != previous.get("server"):
            return
        try:
            stop_session(url, str(previous["session_id"]), token=self.owned_token(url))
        except KappaEngineError as e:
            # Not fatal on purpose: the epoch taken next fences that session's query out whatever it
            # does; the retry must not fail because an old session could not be reached.
            log.warning("slice %s: the previous attempt's Spark Connect session was not stopped: %s", slice_id, e)

    def last_slice(self) -> None:
        """No spare runner after the next slice: one would start, import and open a session only to be
        stopped (:meth:`stop`)."""
        self._last = True

    def _next_spare(self) -> None:
        """Start the next slice's spare runner, once :meth:`start` was called, unless none is waiting or
        the slice running is the last."""
        if not self._spares or self._last or self._spare is not None:
            return
        url = self.server_url()
        try:
            self._spare = SpareRunner(url, self.owned_token(url) if url is not None else None)
        except OSError as e:  # the slice starts a runner of its own instead; not a reason to fail
            log.warning("no spare Spark Connect runner (%s: %s); the next slice starts its own", type(e).__name__, e)

    def _recycle(self) -> None:
        """Restart the owned server once it ran :func:`recycle_every` sessions (see the class docstring)."""
        every = recycle_every()
        if self._owned is None or not every or self._sessions < every:
            return
        log.info(
            "recycling the local Spark Connect server after %d sessions (Spark keeps each session's Python "
            "daemons for the server's life)",
            self._sessions,
        )
        if self._spare is not None:  # its session, opened ahead on this server, released while it runs
            self._spare.close()
            self._spare = None
        self._owned.stop()
        self._owned, self._sessions = None, 0
        self.start()

    def run(self, request: SliceRunRequest) -> list[dict[str, Any]]:
        """One session of the slice; see :meth:`Engine.run`."""
        self._recycle()
        url = self.url or configured_url(self.cfg)
        session_id = str(uuid.uuid4())
        if url is None and not self.state_file.is_file():
            log.warning(
                "slice %s: no Spark Connect server (no job.connect, no server state file %s): starting one for this "
                "slice alone, a Spark start per slice; kappa backfill and the DAG's setup task start one per backfill",
                request.slice_id,
                self.state_file,
            )
            with LocalConnectServer(self.cfg, request.private / "server", die_with_parent=True) as server:
                return run_application(
                    request.application,
                    request.conf,
                    url=server.url,
                    work=request.private,
                    name=request.name,
                    server_alive=server.alive,
                    owned=True,
                    session_id=session_id,
                    token=server.token,
                )
        if url is None and self._owned is None:
            # the server of the DAG's setup task, shared by the slice tasks: counted and recycled
            # through its sessions book (engine/shared_server.py)
            with shared_session(self.cfg, self.state_file, session_id) as shared:
                return self._run_session(request, shared.url, session_id)
        if url is None:
            url = ensure_server(self.cfg, self.state_file).url
            self._sessions += 1
        return self._run_session(request, url, session_id)

    def _run_session(self, request: SliceRunRequest, url: str, session_id: str) -> list[dict[str, Any]]:
        """Run the slice's application as session ``session_id`` of the server at ``url``, recorded
        for the next attempt while it runs (a spare runner's session, opened ahead on that server, is
        that session)."""
        spare, self._spare = self._spare, None
        if spare is not None and spare.url not in (None, url):
            spare.discard()  # opened ahead on a server since restarted: the slice starts its own runner
            spare = None
        elif spare is not None and spare.url == url:
            session_id = spare.session_id  # the session it opened ahead
        self.store.record_session(
            request.slice_id, request.epoch, {"server": redact_url(url), "session_id": session_id}
        )
        state = read_state(self.state_file)
        owned = state is not None and state.url == url
        try:
            progress = run_application(
                request.application,
                request.conf,
                url=url,
                work=request.private,
                name=request.name,
                server_alive=state.alive if owned and state else None,
                owned=owned,
                session_id=session_id,
                token=state.token if owned and state else None,
                spare=spare,
                while_running=self._next_spare,
            )
        finally:
            if spare is not None:
                spare.close()  # not taken: the run failed before it started
        self._next_spare()
        self.store.record_session(
            request.slice_id, request.epoch, None
        )  # released: nothing for the next attempt to stop
        return progress
