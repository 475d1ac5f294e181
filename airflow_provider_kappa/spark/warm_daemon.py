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

A spark-submit with a local master that kappa starts hands its job's driver (``python APP.py``) to the
zygote as well: the driver forks with pyspark imported and runs the script as ``python`` would
(``__main__``, ``sys.argv``, the script's folder first on ``sys.path``), and ends as a cold interpreter
does (``benchmarks/bench_warm_driver.py``: the driver's CPU 1.37 s -> 0.11 s).

The zygote stays single-threaded (``OPENBLAS_NUM_THREADS=1`` before numpy is imported) so that
forking it is safe, freezes what it imported for the garbage collector (``gc.freeze``: a child's full
collection and its exit do not walk, and copy, the zygote's pages), and exits when the process it
watches (the server) is gone.

Runs inside Spark's room: imports pyspark, never Airflow.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

# The stub (``--run``), started by Spark for each of its Python processes, imports only the modules above
# (Python's own, small): the zygote's imports (pyspark's module list, runpy, select, ...) are made in the
# functions that need them.

#: Environment variable naming the zygote's Unix socket (set on the server's environment).
SOCKET_ENV = "KAPPA_WARM_DAEMON_SOCKET"
#: The start of the zygote's line on its stderr for each process it forks (counted by
#: :attr:`~airflow_provider_kappa.engine.warm_python.WarmPython.forked`).
FORKED_LINE = "warm daemon zygote: forked "
#: Imported once by the zygote, besides pyspark's daemon and worker modules (their names are pyspark's
#: internals: :data:`airflow_provider_kappa.compat.pyspark.WORKER_MODULES`): Arrow, pyiceberg (with the
#: sqlite driver its SqlCatalog loads at connect and the Rust transforms its partitioned writes call),
#: the kappa_iceberg source and sink (what a slice's Python processes import), and what a job's driver
#: imports (pyspark's SparkSession, py4j).
PRELOAD = (
    "pyarrow",
    "pyarrow.compute",
    "pyarrow.fs",
    "pyarrow.parquet",
    "pyiceberg.catalog.sql",
    "pyiceberg.io.pyarrow",
    "pyiceberg.table",
    "pyiceberg_core",
    "sqlite3",
    "sqlalchemy.dialects.sqlite.pysqlite",
    "pyspark.sql.session",
    "pyspark.sql.streaming",
    "py4j.java_gateway",
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
    """Spark's Python process ``python ARGS`` (``-m pyspark.daemon WORKER``, ``-m pyspark.MODULE``, or a
    job's driver ``APP.py ARGS...``): forked by the zygote when one answers, else this interpreter replaced
    by ``python ARGS``."""
    path = os.environ.get(SOCKET_ENV)
    if path and (is_pyspark_module(args) or is_script(args)):
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


def is_pyspark_module(args: Sequence[str]) -> bool:
    """``-m pyspark.MODULE ...``: one of pyspark's own processes."""
    return len(args) >= 2 and args[0] == "-m" and args[1].startswith("pyspark.")


def is_script(args: Sequence[str]) -> bool:
    """``APP.py ARGS...``: a job's driver, as spark-submit starts it (an existing ``.py`` file first)."""
    return bool(args) and args[0].endswith(".py") and not args[0].startswith("-") and os.path.isfile(args[0])


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


def preloaded() -> tuple[str, ...]:
    """What the zygote imports: pyspark's worker modules, then :data:`PRELOAD`."""
    from airflow_provider_kappa.compat.pyspark import WORKER_MODULES

    return (*WORKER_MODULES, *PRELOAD)


def preload() -> list[str]:
    """Import :func:`preloaded` (single-threaded BLAS first); the modules that failed to import."""
    import importlib

    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

    failed = []
    for name in preloaded():
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - an optional module missing only makes its forks colder
            failed.append(name)
    return failed


def serve(path: str, watch_pid: int | None) -> None:
    """Listen on ``path``; fork a ``pyspark.daemon`` manager or a job's driver per request; end when
    ``watch_pid`` is gone."""
    import gc
    import select
    import shutil
    import time

    began = time.monotonic()
    failed = preload()
    # Everything imported so far goes to the collector's permanent generation: a child's full collection
    # and its interpreter's end then skip those objects instead of walking them, which wrote to (copied) every
    # page of the zygote they are on. Measured: a child's gc.collect() 105 ms -> 7 ms of CPU, a driver's
    # exit 372 ms -> 95 ms; test_cli's and test_dag's backfills 208-221 -> 182-188 CPU-s (docs/testing.md).
    gc.freeze()
    print(
        f"warm daemon zygote: {len(preloaded()) - len(failed)} modules in {time.monotonic() - began:.1f}s"
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
    zygote = os.getpid()
    # a child's end wakes the loop at once (its stub, which Spark waits for, is told its exit code then, not
    # up to a second later): SIGCHLD writes a byte to this pipe (closed in the children)
    woken, wake = os.pipe()
    os.set_blocking(wake, False)
    signal.set_wakeup_fd(wake)
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
    try:
        while watch_pid is None or pid_alive(watch_pid):
            ready, _, _ = select.select([listener, woken], [], [], 1.0)
            if woken in ready:
                os.read(woken, 4096)
            if listener in ready:
                conn, _ = listener.accept()
                pid = _fork_manager(conn, [listener, *children.values()], (woken, wake))
                if pid is None:
                    conn.close()
                else:
                    children[pid] = conn
            _reap(children)
    finally:
        # a job's driver forked from here ends as a cold interpreter does, by SystemExit through this frame:
        # the socket and the folder are the zygote's alone
        if os.getpid() == zygote:
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


def _fork_manager(conn: socket.socket, others: list[socket.socket], pipe: tuple[int, int]) -> int | None:
    """Receive a stub's request and fork its process (a ``pyspark.daemon`` manager, a pyspark module, or a
    job's driver); the child's pid (``None`` on a bad request). ``others``: the zygote's sockets, and
    ``pipe`` its SIGCHLD wake-up pipe, closed in the child."""
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
    args = request["args"]
    pid = os.fork()
    if pid == 0:  # the manager, or the job's driver
        code: int | None = 1
        try:
            for sock in (*others, conn):
                sock.close()
            signal.set_wakeup_fd(-1)
            for fd in pipe:
                os.close(fd)
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            os.environ.clear()
            os.environ.update(request["env"])
            os.chdir(request["cwd"])
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)
            if is_pyspark_module(args):
                _run_module(args[1], args[2:])
                code = 0
            else:
                code = None  # the driver exits as `python APP.py` does (below)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:  # noqa: BLE001 - printed to the stub's stderr, then the exit code
            import traceback

            traceback.print_exc()
        if code is not None:
            os._exit(code)
        _run_script(args)
    for fd in fds:
        os.close(fd)
    # the module and its first argument (the daemon's worker module, e.g. pyspark.sql.worker.lookup_data_sources),
    # or the driver's script
    what = " ".join(args[1:3]) if is_pyspark_module(args) else f"driver {args[0]}"
    print(f"{FORKED_LINE}{what} as pid {pid}", file=sys.stderr, flush=True)
    conn.sendall(_HEADER.pack(pid))
    conn.settimeout(None)
    return pid


def _python_path(first: str) -> list[str]:
    """``sys.path`` as a cold ``python`` builds it: ``first`` (the working folder for ``-m``, the script's
    folder for a script), then ``$PYTHONPATH``, then the interpreter's own."""
    pythonpath = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return [first, *pythonpath, *(p for p in sys.path if p not in pythonpath and p not in ("", os.getcwd(), first))]


def _run_module(module: str, argv: Sequence[str]) -> None:
    """What ``python -m module argv...`` does, in this (already warm) interpreter."""
    import runpy
    import warnings

    sys.path[:] = _python_path(os.getcwd())
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


def _run_script(args: Sequence[str]) -> NoReturn:
    """What ``python APP.py ARGS...`` does (a job's driver under spark-submit), in this (already warm)
    forked interpreter. It ends as a cold interpreter does, by ``SystemExit`` up through the zygote's frames
    (which leave the zygote's socket alone in a child): non-daemon threads are joined, ``atexit`` handlers
    run and stdio is flushed. Its own stdio replaces the zygote's; ``PYTHONUNBUFFERED``, which spark-submit
    sets for its driver, is honoured."""
    import runpy
    import traceback

    _driver_stdio(bool(os.environ.get("PYTHONUNBUFFERED")))
    signal.signal(signal.SIGINT, signal.default_int_handler)  # KeyboardInterrupt, as in a cold start
    script = args[0]
    sys.path[:] = _python_path(os.path.dirname(os.path.abspath(script)))
    sys.argv = list(args)
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001 - what a cold interpreter prints for an uncaught exception
        traceback.print_exc()
        raise SystemExit(1) from None
    raise SystemExit(0)


def _driver_stdio(unbuffered: bool) -> None:
    """``sys.stdin``, ``sys.stdout``, ``sys.stderr`` over descriptors 0-2 as a cold ``python`` makes them
    (``unbuffered``: ``python -u``); the zygote's own wrap its log."""
    import io

    encoding = sys.stdout.encoding if sys.stdout is not None else "utf-8"

    def writer(fd: int, errors: str, line_buffering: bool) -> io.TextIOWrapper:
        raw = io.FileIO(fd, "w", closefd=False)
        return io.TextIOWrapper(
            raw if unbuffered else io.BufferedWriter(raw),
            encoding=encoding,
            errors=errors,
            line_buffering=line_buffering,
            write_through=unbuffered,
        )

    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding=encoding)
    sys.stdout = writer(1, "strict", os.isatty(1))
    sys.stderr = writer(2, "backslashreplace", True)


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
