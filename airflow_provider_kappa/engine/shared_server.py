"""The kappa-owned local Spark Connect server shared by a backfill's slice tasks, and its recycling.

Spark keeps the Python planner daemons of each Spark Connect session (about five per slice) for the
server's life, so a long backfill on one server grows its process count with every slice. A server
kappa owns is therefore recycled (stopped and started again, between two sessions) after
:func:`recycle_every` sessions:

- ``kappa backfill`` runs its slices one after the other in one process and counts them itself
  (:class:`~airflow_provider_kappa.engine.connect.ConnectEngine`);
- an Airflow backfill's slice tasks are processes of their own, on a server the DAG's setup task
  started (:class:`~airflow_provider_kappa.operators.connect_server.KappaConnectServerOperator`). They
  share the count through ``connect/sessions.json`` beside the server's state file, under the lock
  ``connect/server.lock`` (:func:`shared_session`): ``{"pid": <server pid>, "sessions": <run on it>,
  "recycled": <servers stopped so far>, "active": {<session id>: <task pid>}}``. A task recycles the
  server only when no other task's session is running on it (a session whose task process is gone
  does not count); otherwise the next task to find it idle does. The lock also keeps two tasks that
  find the server gone from starting two.

No Airflow import.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from airflow_provider_kappa.engine.connect_server import ServerState, ensure_server, read_state, stop_group
from airflow_provider_kappa.exceptions import KappaConfigError
from airflow_provider_kappa.job.checkpoints import connect_lock_path, connect_sessions_path
from airflow_provider_kappa.job.config import JobConfig
from airflow_provider_kappa.spark.warm_daemon import pid_alive

log = logging.getLogger(__name__)

#: Environment variable: sessions a kappa-owned local server runs before it is recycled (``0``: never).
RECYCLE_ENV = "KAPPA_CONNECT_RECYCLE_EVERY"
#: Sessions a kappa-owned local server runs before it is recycled, by default: about 250 idle Python
#: daemons at most, and one server start (a few seconds) per 50 slices.
RECYCLE_EVERY = 50


def recycle_every() -> int:
    """:data:`RECYCLE_EVERY`, or ``$KAPPA_CONNECT_RECYCLE_EVERY`` (``0``: never recycle).

    :raises KappaConfigError: the variable is not a whole number >= 0 (naming it and its value).
    """
    raw = os.environ.get(RECYCLE_ENV, "").strip()
    if not raw:
        return RECYCLE_EVERY
    if not raw.isdigit():
        raise KappaConfigError(f"{RECYCLE_ENV}: {raw!r} is not a whole number of sessions; expected 0 (never) or more")
    return int(raw)


@contextmanager
def _locked(state_file: Path) -> Iterator[None]:
    lock = connect_lock_path(state_file)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        yield


def read_sessions(state_file: Path) -> dict[str, Any]:
    """The sessions book of the server of ``state_file`` (empty when there is none yet)."""
    try:
        book = json.loads(connect_sessions_path(state_file).read_text())
    except FileNotFoundError:
        return {"pid": None, "sessions": 0, "recycled": 0, "active": {}}
    return {
        "pid": book.get("pid"),
        "sessions": int(book.get("sessions", 0)),
        "recycled": int(book.get("recycled", 0)),
        "active": dict(book.get("active", {})),
    }


def _write_sessions(state_file: Path, book: dict[str, Any]) -> None:
    path = connect_sessions_path(state_file)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(book))
    tmp.replace(path)


def _take(cfg: JobConfig, state_file: Path, session_id: str) -> ServerState:
    """Under the lock: recycle the server if it is due and idle, make sure one runs, count the session."""
    book = read_sessions(state_file)
    state = read_state(state_file)
    active = {sid: pid for sid, pid in book["active"].items() if pid_alive(int(pid))}
    every = recycle_every()
    if state is not None and book["pid"] == state.pid and every and book["sessions"] >= every and not active:
        log.info(
            "recycling the local Spark Connect server (pid %d) after %d sessions (Spark keeps each session's "
            "Python daemons for the server's life)",
            state.pid,
            book["sessions"],
        )
        stop_group(state.pid, state.start_ticks)
        state_file.unlink(missing_ok=True)
        book["recycled"] += 1
    state = ensure_server(cfg, state_file)
    if book["pid"] != state.pid:
        book["pid"], book["sessions"] = state.pid, 0
    book["sessions"] += 1
    book["active"] = {**active, session_id: os.getpid()}
    _write_sessions(state_file, book)
    return state


@contextmanager
def shared_session(cfg: JobConfig, state_file: Path, session_id: str) -> Iterator[ServerState]:
    """The kappa-owned server of ``state_file`` for one session ``session_id`` of this process:
    started if it is gone, recycled first if it ran :func:`recycle_every` sessions and none runs now.

    :param cfg: the job config (to start a server).
    :param state_file: the server's state file.
    :param session_id: the Spark Connect session the caller opens on it.
    """
    with _locked(state_file):
        state = _take(cfg, state_file, session_id)
    try:
        yield state
    finally:
        with _locked(state_file):
            book = read_sessions(state_file)
            book["active"].pop(session_id, None)
            _write_sessions(state_file, book)


def remove_sessions(state_file: Path) -> None:
    """Remove the sessions book and lock of the server of ``state_file`` (the server was stopped)."""
    connect_sessions_path(state_file).unlink(missing_ok=True)
    connect_lock_path(state_file).unlink(missing_ok=True)
