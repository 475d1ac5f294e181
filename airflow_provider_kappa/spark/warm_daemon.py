"""Spark's Python daemon, forked warm: ``spark.python.daemon.module=airflow_provider_kappa.spark.warm_daemon``.

Why: a Spark Connect server starts a new ``pyspark.daemon`` for every Python planning call of a
query (``create_data_source``, ``plan_data_source_read``, ``write_into_data_source``,
``python_streaming_sink_runner``: their worker environment differs per session and call), so every
slice run as a session pays, on its first micro-batch's critical path, about six fresh Python
interpreters importing pyspark (~0.5 s CPU each) and then, in their forked workers, pyiceberg and
pyarrow (~1.2 s CPU for the writer and for the commit). Measured in benchmarks/README.md.

How: a *zygote* (``python -m airflow_provider_kappa.spark.warm_daemon --serve SOCKET``), started once
with the server (:class:`~airflow_provider_kappa.engine.connect_server.LocalConnectServer`), imports
pyspark's worker modules, pyarrow, pyiceberg and this package's source and sink once, then
listens on a Unix socket. Spark starts this module as its daemon (``python -m ... <worker module>``):
it imports nothing heavy, hands its stdin, stdout, stderr, environment, ``sys.path`` and working
folder to the zygote (``SCM_RIGHTS``), which forks a child that runs ``pyspark.daemon``'s manager
with them: the daemon and every worker it forks start with everything imported. This process stays
as the daemon Spark knows: it forwards SIGTERM/SIGINT/SIGHUP to the manager and exits with its code.
Without a zygote (``KAPPA_WARM_DAEMON_SOCKET`` unset or not answering, e.g. a remote server) it
runs ``pyspark.daemon``'s manager itself, exactly as Spark's default daemon.

The zygote stays single-threaded (``OPENBLAS_NUM_THREADS=1`` before numpy is imported) so that
forking it is safe, and exits when the process it watches (the server) is gone.

Runs inside Spark's room: imports pyspark, never Airflow.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import select
import shutil
import signal
import socket
import struct
import sys
import time
import traceback
import warnings
from collections.abc import Sequence
from typing import Any

from airflow_provider_kappa.compat.pyspark import WORKER_MODULES

#: Environment variable naming the zygote's Unix socket (set on the server's environment).
SOCKET_ENV = "KAPPA_WARM_DAEMON_SOCKET"
#: The start of the zygote's line on its stderr for each process it forks (counted by
#: :attr:`~airflow_provider_kappa.engine.warm_python.WarmPython.forked`).
FORKED_LINE = "warm daemon zygote: forked "
#: Imported once by the zygote: pyspark's daemon and worker modules (their names are pyspark's
#: internals: :mod:`airflow_provider_kappa.compat.pyspark`), Arrow, pyiceberg, the kappa_iceberg
#: source and sink (what a slice's Python processes import).
PRELOAD = (
    *WORKER_MODULES,
    "pyarrow",
    "pyarrow.compute",
    "pyarrow.fs",
    "pyarrow.parquet",
    "pyiceberg.catalog.sql",
    "pyiceberg.io.pyarrow",
    "pyiceberg.table",
    "airflow_provider_kappa.spark.datasource",
    "airflow_provider_kappa.spark.catalog",
    "airflow_provider_kappa.spark.sink",
    "airflow_provider_kappa.spark.source.reader",
    "airflow_provider_kappa.spark.source.read",
)
_HEADER = struct.Struct("!I")
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


# --------------------------------------------------------------------------- the process Spark starts


def run(args: Sequence[str]) -> int:
    """Spark's Python process ``python ARGS`` (``-m pyspark.daemon WORKER`` or ``-m pyspark.MODULE``):
    forked by the zygote when one answers, else this interpreter replaced by ``python ARGS``."""
    path = os.environ.get(SOCKET_ENV)
    if path and len(args) >= 2 and args[0] == "-m" and args[1].startswith("pyspark."):
        try:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(path)
        except OSError:
            pass  # no zygote: a cold start, as without this module
        else:
            code = _through_zygote(conn, args)
            if code is not None:
                return code
    os.execv(sys.executable, [sys.executable, *args])


def _through_zygote(conn: socket.socket, args: Sequence[str]) -> int | None:
    """Have the zygote fork ``python ARGS`` with this process's stdio, environment and folder; its
    exit code, or ``None`` when the zygote started nothing."""
    request = json.dumps({"args": list(args), "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    try:
        socket.send_fds(conn, [_HEADER.pack(len(request)) + request], [0, 1, 2])
        answer = _recv_exactly(conn, _HEADER.size)
    except OSError:
        return None
    if len(answer) < _HEADER.size:
        return None
    pid = _HEADER.unpack(answer)[0]
    # Spark reads from and writes to the child's copies of these pipes; ours would keep them open
    # after the child ends.
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(devnull, fd)
    for sig in _FORWARDED:
        signal.signal(sig, lambda signum, _frame: _kill(pid, signum))
    status = _recv_exactly(conn, _HEADER.size)
    return _HEADER.unpack(status)[0] if status else 1


def _kill(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _recv_exactly(conn: socket.socket, size: int) -> bytes:
    """``size`` bytes, or fewer if the other end closes."""
    data = b""
    while len(data) < size:
        try:
            chunk = conn.recv(size - len(data))
        except InterruptedError:
            continue
        if not chunk:
            break
        data += chunk
    return data


# --------------------------------------------------------------------------- the zygote


def preload() -> list[str]:
    """Import :data:`PRELOAD` (single-threaded BLAS first); the modules that failed to import."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

    failed = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - an optional module missing only makes its forks colder
            failed.append(name)
    return failed


def serve(path: str, watch_pid: int | None) -> None:
    """Listen on ``path``; fork a ``pyspark.daemon`` manager per request; end when ``watch_pid`` is gone."""
    began = time.monotonic()
    failed = preload()
    print(
        f"warm daemon zygote: {len(PRELOAD) - len(failed)} modules in {time.monotonic() - began:.1f}s"
        + (f", not imported: {failed}" if failed else ""),
        file=sys.stderr,
        flush=True,
    )
    if os.path.exists(path):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(64)
    children: dict[int, socket.socket] = {}
    signal.signal(signal.SIGTERM, _exit_on_signal)  # stopped with the server: remove the socket
    try:
        while watch_pid is None or pid_alive(watch_pid):
            ready, _, _ = select.select([listener], [], [], 1.0)
            if ready:
                conn, _ = listener.accept()
                pid = _fork_manager(conn, [listener, *children.values()])
                if pid is None:
                    conn.close()
                else:
                    children[pid] = conn
            _reap(children)
    finally:
        listener.close()
        if os.path.exists(path):
            os.unlink(path)
        folder = os.path.dirname(path)
        if os.path.basename(folder).startswith("kappa-wd-"):  # kappa's private folder (engine/warm_python.py)
            shutil.rmtree(folder, ignore_errors=True)


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _reap(children: dict[int, socket.socket]) -> None:
    """Tell each stub whose manager ended its exit code."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            try:
                conn.sendall(_HEADER.pack(os.waitstatus_to_exitcode(status) & 0xFF))
            except OSError:
                pass
            conn.close()


def _fork_manager(conn: socket.socket, others: list[socket.socket]) -> int | None:
    """Receive a stub's request and fork its manager; the child's pid (``None`` on a bad request).
    ``others``: the zygote's sockets, closed in the child."""
    conn.settimeout(30)
    try:
        head, fds, _flags, _addr = socket.recv_fds(conn, _HEADER.size, 3)
        if len(head) < _HEADER.size or len(fds) != 3:
            head += _recv_exactly(conn, _HEADER.size - len(head))
        request: dict[str, Any] = json.loads(_recv_exactly(conn, _HEADER.unpack(head)[0]))
    except (OSError, ValueError, struct.error):
        return None
    if len(fds) != 3:
        for fd in fds:
            os.close(fd)
        return None
    pid = os.fork()
    if pid == 0:  # the manager
        code = 1
        try:
            for sock in (*others, conn):
                sock.close()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            os.environ.clear()
            os.environ.update(request["env"])
            os.chdir(request["cwd"])
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)
            _run_module(request["args"][1], request["args"][2:])
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:  # noqa: BLE001 - printed to the stub's stderr, then the exit code
            traceback.print_exc()
        finally:
            os._exit(code)
    for fd in fds:
        os.close(fd)
    # the module and its first argument (the daemon's worker module, e.g. pyspark.sql.worker.lookup_data_sources)
    print(f"{FORKED_LINE}{' '.join(request['args'][1:3])} as pid {pid}", file=sys.stderr, flush=True)
    conn.sendall(_HEADER.pack(pid))
    conn.settimeout(None)
    return pid


def _run_module(module: str, argv: Sequence[str]) -> None:
    """What ``python -m module argv...`` does, in this (already warm) interpreter."""

    # sys.path as `python -m` would build it: the working folder, then PYTHONPATH, then the rest
    pythonpath = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [
        os.getcwd(),
        *pythonpath,
        *(p for p in sys.path if p not in pythonpath and p not in ("", os.getcwd())),
    ]
    sys.argv = [module, *argv]
    # `python -m pyspark.daemon` is the daemon's public entry (spark.python.daemon.module): run as
    # __main__ like the others, its body only defines functions over the modules preloaded
    with warnings.catch_warnings():
        # "'M' found in sys.modules after import of package 'P', but prior to execution of 'M'":
        # preloaded on purpose; every other warning shows as in a cold start
        warnings.filterwarnings(
            "ignore", message=".* found in sys.modules after import of package", category=RuntimeWarning
        )
        runpy.run_module(module, run_name="__main__", alter_sys=True)


def main(argv: Sequence[str] | None = None) -> int:
    """``--serve SOCKET [--watch-pid PID]``: the zygote; ``--run ARGS...``: Spark's ``python ARGS``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--serve"]:
        watch = int(args[3]) if len(args) > 3 and args[2] == "--watch-pid" else None
        serve(args[1], watch)
        return 0
    if args[:1] == ["--run"]:
        return run(args[1:])
    print(
        "usage: python -m airflow_provider_kappa.spark.warm_daemon --serve SOCKET [--watch-pid PID] | --run ARGS...",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
