"""The processes a slice run starts, and how they end with the run that owns them.

- :func:`child_options`: ``Popen`` options of every Spark child of a launcher (a spark-submit, a
  Spark Connect runner, a kappa-owned Connect server): its own process group (so the whole tree
  can be stopped with one ``killpg``), and on Linux a parent-death signal
  (``prctl(PR_SET_PDEATHSIG)``): when the launcher dies, SIGKILL included (``kappa backfill``
  killed, an Airflow task's process killed), the kernel signals the child at once.
- :data:`RUNNING` / :func:`stop_running`: the stops of the runs in progress in this process, so
  an Airflow task's ``on_kill`` ends its Spark application (the slice operator calls it).
- :func:`sigterm_raises`: SIGTERM turned into an exception in the main thread, so a CLI verb
  unwinds (stopping its children cleanly) as on Ctrl-C.
- :func:`private_folder`: the run's private temporary folder (the 0600 catalogs file), removed
  at the end, and, when its creator died without removing it (SIGKILL), by the next run on the
  machine: its name holds the creator's pid and start time.
- :data:`UNFINALIZED_EXIT`: the end of a kappa process (the ``kappa`` command, a Spark Connect
  runner) without the interpreter's finalization, once its entry point returned.

No pyspark, pyiceberg or Airflow import.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_PRIVATE = re.compile(r"kappa-run-(\d+)-(\d+)-")


def start_ticks(pid: int) -> int | None:
    """The process's start time (``/proc/<pid>/stat`` field 22), telling a reused pid apart;
    ``None`` when it is gone (or a zombie) or there is no ``/proc``."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else int(fields[19])


def holds_listener(pid: int, port: int) -> bool | None:
    """Whether process ``pid`` holds the listening TCP socket of ``port`` on this host (Linux's
    ``/proc/net/tcp*`` and ``/proc/<pid>/fd``); ``None`` where this cannot be told (no ``/proc``).
    A port chosen free can be taken by another process before the child binds it: the port then
    answers, but not from the child."""
    sockets = set()
    tables = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                rows = fh.read().splitlines()[1:]
        except OSError:
            continue
        tables += 1
        for row in rows:
            fields = row.split()  # sl local_address rem_address st ... inode
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                sockets.add(f"socket:[{fields[9]}]")
    if not tables:
        return None
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:  # gone
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in sockets:
                return True
        except OSError:  # closed meanwhile
            continue
    return False


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    fn: Callable[..., int] = libc.prctl
    return fn


def child_options(death_signal: int = signal.SIGKILL) -> dict[str, Any]:
    """``Popen`` keyword arguments of a child that must not outlive this process.

    :param death_signal: what the child gets when this process (the thread that started it) dies:
        SIGKILL for a Spark application (an attempt that lost its launcher is superseded anyway, and
        the epoch fence refuses its commits), SIGTERM for a child that should clean up first (a
        Connect runner stops its queries and session).
    :returns: ``start_new_session`` (own process group) and, on Linux, a ``preexec_fn`` setting the
        parent-death signal (resolved here, before the fork).
    """
    prctl = _prctl()
    if prctl is None:
        return {"start_new_session": True}
    parent = os.getpid()

    def die_with_parent() -> None:
        prctl(_PR_SET_PDEATHSIG, int(death_signal), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl: nobody would signal us
            os.kill(os.getpid(), death_signal)

    return {"start_new_session": True, "preexec_fn": die_with_parent}


def stop_process_group(pid: int, timeout: float = 30.0) -> None:
    """Stop a child started with :func:`child_options` and everything under it: SIGTERM to the child
    (a spark-submit's JVM runs Spark's shutdown hooks, which end its Python processes), then, once it
    is gone or after ``timeout`` seconds, SIGKILL to its whole process group (the leader if it is
    still there, and whatever it left behind)."""
    ticks = start_ticks(pid)
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and ticks is not None and start_ticks(pid) == ticks:
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)  # the leader if it is still there, and whatever it left in the group
    except ProcessLookupError:
        pass


class _Running:
    """Stops of the Spark runs in progress in this process (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stops: dict[int, tuple[str, Callable[[], None]]] = {}
        self._next = 0

    @contextmanager
    def run(self, what: str, stop: Callable[[], None]) -> Iterator[None]:
        """Register ``stop`` (ends the run ``what``) while the block runs."""
        with self._lock:
            key = self._next
            self._next += 1
            self._stops[key] = (what, stop)
        try:
            yield
        finally:
            with self._lock:
                self._stops.pop(key, None)

    def stop_all(self) -> list[str]:
        """Call every registered stop; return what was stopped. A failing stop is logged and
        re-raised after the others ran."""
        with self._lock:
            stops = list(self._stops.values())
        error: BaseException | None = None
        for what, stop in stops:
            log.warning("stopping %s", what)
            try:
                stop()
            except Exception as e:  # noqa: BLE001 - the other runs are still stopped; re-raised below
                log.error("stopping %s failed: %s: %s", what, type(e).__name__, e)
                error = error or e
        if error is not None:
            raise error
        return [what for what, _ in stops]


#: The Spark runs of this process (spark-submit children, Connect sessions).
RUNNING = _Running()


def stop_running() -> list[str]:
    """Stop every Spark run this process has in progress (an Airflow task's ``on_kill``); return their names."""
    return RUNNING.stop_all()


def _owner_alive(name: str) -> bool:
    m = _PRIVATE.match(name)
    if m is None:
        return True
    pid, ticks = int(m.group(1)), int(m.group(2))
    return start_ticks(pid) == ticks


def sweep_private_folders(base: Path | None = None) -> list[Path]:
    """Remove the private folders (:func:`private_folder`) whose creator is gone; return them."""
    base = Path(base or tempfile.gettempdir())
    removed = []
    try:
        entries = list(base.iterdir())
    except OSError:
        return []
    for entry in entries:
        if entry.is_dir() and _PRIVATE.match(entry.name) and not _owner_alive(entry.name):
            try:
                if entry.stat().st_uid != os.getuid():
                    continue
            except OSError:
                continue
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


@contextmanager
def private_folder(label: str, base: Path | None = None) -> Iterator[Path]:
    """A private (0700) temporary folder for one run, removed when the block ends; folders of
    earlier runs on this machine whose process died (SIGKILL) are removed first.

    :param label: part of the name (e.g. the slice id).
    :param base: where (default: the system's temporary folder).
    """
    for gone in sweep_private_folders(base):
        log.info("removed %s, left by a run whose process is gone", gone)
    pid = os.getpid()
    folder = Path(tempfile.mkdtemp(prefix=f"kappa-run-{pid}-{start_ticks(pid) or 0}-{label}-", dir=base))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def sigterm_raises(exception: Callable[[int], BaseException]) -> Iterator[None]:
    """While the block runs, SIGTERM raises ``exception(signum)`` in the main thread (a service
    manager's or a scheduler's stop): the block unwinds as on Ctrl-C, its ``finally`` and ``except``
    clauses stop the Spark children cleanly. Off the main thread (no signal handler can be set
    there) the block runs unchanged. SIGKILL cannot be caught: the children get the parent-death
    signal (:func:`child_options`).

    :param exception: signal number -> the exception to raise (``SystemExit(143)`` for a command
        that fails when stopped, ``KeyboardInterrupt`` for one whose stop is its normal end).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise exception(signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class _UnfinalizedExit:
    """The end of a process whose entry point returned, without the interpreter's finalization.

    :meth:`register` makes it the process's last exit hook (call it before anything else registers one:
    hooks run last registered first; a second call does nothing). Once the entry point sets :attr:`code`
    and every other hook has run (pyspark's client, a live run's ledger flush), the hook flushes logging,
    stdout and stderr and ends the process with that code: the finalization that follows (the modules of
    pyspark, pyarrow, gRPC and pyiceberg torn down) took 0.3-0.6 s of every Connect slice's fixed cost and
    0.9 s at the end of ``kappa backfill`` (benchmarks/README.md), with nothing left to do by then (every
    child stopped and waited for, non-daemon threads joined before exit hooks run). Open files left unclosed
    are not flushed by it. While :attr:`code` is ``None`` (the entry point did not return: an uncaught
    exception) the process exits as Python does.
    """

    def __init__(self) -> None:
        self.code: int | None = None
        self._registered = False

    def register(self) -> None:
        """Register the hook, once per process."""
        if not self._registered:
            self._registered = True
            atexit.register(self._end)

    def _end(self) -> None:
        if self.code is None:
            return
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(self.code)


#: The one hook of this process (:class:`_UnfinalizedExit`).
UNFINALIZED_EXIT = _UnfinalizedExit()
