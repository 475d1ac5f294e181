"""Run the job's unchanged application as a Spark Connect client session.

``python -m airflow_provider_kappa.engine.connect_runner [--remote URL] --conf-file F --progress-file P APP [ARGS...]``

``python -m airflow_provider_kappa.engine.connect_runner --wait``: a spare runner. It imports what a
run needs (:data:`PRELOAD`); given a first line ``{"open": URL, "token"}`` it opens that session and runs
a trivial query in it; then it reads its run from stdin, one JSON line
``{"remote", "token", "conf_file", "progress_file", "application", "args"}``, and runs it as below (in
the session opened ahead when ``remote`` is its URL); at end of input without a run it releases that
session and exits 0. The launcher starts it while the slice before runs, so this is off the next
slice's critical path (:class:`~airflow_provider_kappa.engine.spare_runner.SpareRunner`).

``python -m airflow_provider_kappa.engine.connect_runner [--remote URL] --stop-session``: reattach to the
session named by the URL's ``session_id`` parameter, stop its streaming queries, interrupt its
operations and release it (a killed runner left them running in the server); exit 0, also when
the session is already closed.

1. opens a session on the Spark Connect server ``URL`` (default: ``$SPARK_REMOTE``, so a URL
   holding a token need not be on the command line; the token of kappa's own server comes in
   ``$SPARK_CONNECT_AUTHENTICATE_TOKEN``, which pyspark's client sends, and the job's own
   ``getOrCreate()`` with it);
2. sets the run's session conf from ``F``, a JSON object ``{key: value}`` (the launcher writes it
   with mode 0600): ``spark.kappa.*`` keys and runtime SQL keys (a catalog's ``spark.sql.catalog.<name>.*``
   included, which Spark does not register). A key the server does not let a session change (a static
   or core conf) is refused with its name and Spark's reason, unless the server already has the wanted value;
3. registers a client-side ``StreamingQueryListener`` that appends each micro-batch's progress
   JSON (``StreamingQueryProgress.json``) as one line to ``P``;
4. sets ``SPARK_REMOTE`` and runs ``APP`` with :func:`runpy.run_path` as ``__main__``: the job's
   ``SparkSession.builder.getOrCreate()`` returns the session opened here;
5. waits for the listener to see every query end, stops the queries left and the session (never
   the server), and exits 0, or 1 with the job's traceback on failure (2 on bad arguments); a job's
   ``sys.exit(code)`` is its exit code, and ``sys.exit("message")`` prints the message and exits 1,
   as Python does (the launcher's error quotes the runner's last lines).

A Spark Connect client: imports pyspark, never Airflow.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import runpy
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from airflow_provider_kappa.engine.processes import UNFINALIZED_EXIT
from airflow_provider_kappa.spark.conf_keys import PREFIX

#: This module, run as ``python -m`` by the launcher.
RUNNER_MODULE = "airflow_provider_kappa.engine.connect_runner"
#: The pre-shared token of a Spark Connect server (read by the server and by pyspark's client).
TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"
#: What a spare runner (``--wait``) imports before its run comes: pyspark's Spark Connect client and
#: the modules the job's ``read_source`` / ``write_sink`` load in it.
PRELOAD = (
    "pyspark.sql.connect.session",
    "pyspark.sql.connect.functions",
    "pyspark.sql.connect.streaming.query",
    "pyspark.sql.streaming.listener",
    "airflow_provider_kappa.spark.resolve",
)

#: How long to wait, after the job returns, for the listener to receive the last events.
DRAIN_SECONDS = 30.0
#: After SIGTERM (a killed task, or the launcher's death: the parent-death signal), how long the
#: runner may take to stop its queries and its session before it exits anyway: a server that is gone
#: would otherwise keep the client retrying for minutes. Below the launcher's own grace (20 s).
STOP_SECONDS = 15.0
#: The same when the launcher is gone (the parent-death signal): ``kappa backfill`` killed takes its
#: local server with it, and a launcher that died cannot release the session anyway; the epoch fence
#: refuses whatever the query would still commit. So a runner ends within seconds of its launcher.
ORPHAN_STOP_SECONDS = 3.0
#: The launcher's pid, read when the runner starts (a parent-death signal arrives once it changed).
_PARENT = os.getppid()
#: The exit code of a runner that gave up stopping its queries and session (the deadline, or a second
#: SIGTERM): its launcher then releases the session itself.
GAVE_UP_EXIT = 124
#: How often the stop's watch (:func:`watch_stop`) looks at the clock and at the launcher.
WATCH_SECONDS = 0.1
#: When the first SIGTERM came (``time.monotonic()``), set by :func:`_interrupt`; read by :func:`watch_stop`.
_stop_since: float | None = None


class ProgressFile:
    """A ``StreamingQueryListener`` writing each progress record as a JSON line (built lazily
    so that importing this module needs no pyspark)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.started: set[str] = set()
        self.ended: set[str] = set()
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)

    def listener(self) -> Any:
        """The listener object to register with ``spark.streams.addListener``."""
        from pyspark.sql.streaming.listener import StreamingQueryListener

        outer = self

        class _Listener(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - pyspark's API
                with outer.changed:
                    outer.started.add(str(event.id))
                    outer.changed.notify_all()

            def onQueryProgress(self, event: Any) -> None:  # noqa: N802
                line = event.progress.json
                with outer.changed, outer.path.open("a", encoding="utf-8") as fh:
                    fh.write(line.replace("\n", " ") + "\n")

            def onQueryIdle(self, event: Any) -> None:  # noqa: N802
                pass

            def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
                with outer.changed:
                    outer.ended.add(str(event.id))
                    outer.changed.notify_all()

        return _Listener()

    def drain(self, query_ids: set[str], timeout: float) -> bool:
        """Wait until the listener saw ``query_ids`` end (their last progress comes before that)."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while not query_ids <= self.ended:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(left)
        return True


def read_conf_file(path: Path) -> dict[str, str]:
    """The session conf the launcher wrote: a JSON object of string keys and values."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"connect_runner: conf file {str(path)!r} cannot be read as JSON: {e}") from e
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise SystemExit(f"connect_runner: conf file {str(path)!r} must hold a JSON object of strings")
    return data


def set_session_conf(spark: Any, conf: Mapping[str, str]) -> None:
    """Set ``conf`` on the session: ``spark.kappa.*`` always; any other key if the server lets a
    session set it (Spark's own rule: a key it registers as modifiable, or one it does not register,
    such as a catalog's ``spark.sql.catalog.<name>.*``, which the session's catalogs read when first
    used), or already has the wanted value.

    Two requests in all when every key takes (the usual case): the whole conf in one, through Spark
    Connect's public ``SparkSession.builder.config(map=...).getOrCreate()``, which on the active session
    applies the options in one config request that skips a key the session may not change; then one
    ``getAll``. A request or two per key took 49-83 ms of a later slice's start at 28 keys
    (benchmarks/README.md). Only the keys ``getAll`` does not show at their value take the per-key path
    (:func:`_set_each`), which names a refused key with Spark's reason.

    :raises ValueError: naming every key that only the server's start can set, with Spark's reason.
    """
    pending = dict(conf)
    session_class = type(spark)  # pyspark.sql.connect's SparkSession: its builder is Spark Connect's
    if pending and session_class.getActiveSession() is spark:
        with warnings.catch_warnings(record=True) as said:  # the skipped keys' notes: _set_each says it
            warnings.simplefilter("always")
            session_class.builder.config(map=pending).getOrCreate()
        have = spark.conf.getAll
        pending = {k: v for k, v in pending.items() if have.get(k) != v}
        for note in said:
            if not any(key in str(note.message) for key in pending):
                warnings.warn_explicit(note.message, note.category, note.filename, note.lineno)
    _set_each(spark, pending)


def _set_each(spark: Any, conf: Mapping[str, str]) -> None:
    """:func:`set_session_conf`, one key at a time (two requests a key): ``isModifiable``, then ``set``."""
    from pyspark.errors import PySparkException

    refused = []
    for key, value in sorted(conf.items()):
        if key.startswith(PREFIX) or spark.conf.isModifiable(key):
            spark.conf.set(key, value)
        elif spark.conf.get(key, None) != value:
            try:
                spark.conf.set(key, value)
            except PySparkException as e:  # CANNOT_MODIFY_CONFIG (a static or core conf): named below
                refused.append((key, str(e).splitlines()[0] if str(e) else type(e).__name__))
    if refused:
        raise ValueError(
            f"conf key(s) {[k for k, _ in refused]} cannot be set in a Spark Connect session (static or core "
            "Spark conf); give them to the Spark Connect server when it starts, or use job.engine: submit "
            f"(Spark said: {refused[0][1]})"
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; see the module docstring."""
    parser = argparse.ArgumentParser(prog="python -m airflow_provider_kappa.engine.connect_runner")
    parser.add_argument(
        "--remote", default=os.environ.get("SPARK_REMOTE"), help="sc://host:port (default $SPARK_REMOTE)"
    )
    parser.add_argument("--stop-session", action="store_true", help="end the URL's session_id session and exit")
    parser.add_argument("--wait", action="store_true", help="import first, then read the run from stdin (JSON)")
    parser.add_argument("--conf-file", type=Path)
    parser.add_argument("--progress-file", type=Path)
    parser.add_argument("application", type=Path, nargs="?")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.wait and not take_run(args):
        return 0
    if not args.remote:
        parser.error("no Spark Connect URL: give --remote or set SPARK_REMOTE")
    if args.stop_session:
        if ";session_id=" not in args.remote:
            parser.error("--stop-session: the URL has no session_id parameter")
        return stop_session(args.remote)
    if args.conf_file is None or args.progress_file is None or args.application is None:
        parser.error("--conf-file, --progress-file and the application are required")
    if not args.application.is_file():
        parser.error(f"application {str(args.application)!r} does not exist")
    conf = read_conf_file(args.conf_file)
    # SIGTERM (a killed task) ends like Ctrl-C: the queries and the session are stopped below,
    # within STOP_SECONDS (ORPHAN_STOP_SECONDS once the launcher is gone), kept by a thread of its own
    threading.Thread(target=watch_stop, name="kappa-stop-watch", daemon=True).start()
    signal.signal(signal.SIGTERM, _interrupt)

    from pyspark.sql import SparkSession

    spark = getattr(args, "session", None) or SparkSession.builder.remote(args.remote).create()
    progress = ProgressFile(args.progress_file)
    args.progress_file.touch()
    code = 0
    listener = progress.listener()
    try:
        set_session_conf(spark, conf)
        spark.streams.addListener(listener)
        os.environ["SPARK_REMOTE"] = args.remote
        sys.argv = [str(args.application), *args.args]
        runpy.run_path(str(args.application), run_name="__main__")
        if not progress.drain(set(progress.started), DRAIN_SECONDS):
            print(
                f"connect_runner: the last progress events did not arrive within {DRAIN_SECONDS:.0f}s", file=sys.stderr
            )
    except SystemExit as e:  # the job called sys.exit: a message is printed, as Python prints it, and exits 1
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - reported on stderr and as the exit code; the launcher raises
        traceback.print_exc()
        code = 1
    finally:
        _stop(spark, listener)
    return code


def take_run(args: argparse.Namespace) -> bool:
    """A spare runner's wait (``--wait``): import :data:`PRELOAD`; open the session of an ``open``
    line ahead (:func:`open_ahead`); then read the run into ``args`` (its token into the environment,
    where pyspark's client reads it; ``args.session``: the session opened ahead, when the run's URL is
    its URL). ``False`` at end of input without a run: the launcher no longer needs this runner (a
    session opened ahead is released)."""
    for module in PRELOAD:
        try:
            importlib.import_module(module)
        except ImportError as e:  # another pyspark release's layout: the run imports what it needs itself
            print(f"connect_runner: {module} not imported ahead ({e}); the run imports what it uses", file=sys.stderr)
    run = _read_line()
    opened = None
    if run is not None and "open" in run:
        opened = open_ahead(str(run["open"]), run.get("token"))
        run = _read_line()
    if opened is not None and run is not None and run.get("remote") == opened[0]:
        args.session = opened[1]
    elif opened is not None:
        # no run came, or it is for another session: the one opened ahead is released (also the
        # default session pyspark would otherwise hand the job)
        if run is not None:
            print("connect_runner: the run is on another server than the session opened ahead", file=sys.stderr)
        opened[1].stop()
    if run is None:
        return False
    try:
        args.remote = str(run["remote"])
        args.conf_file, args.progress_file = Path(run["conf_file"]), Path(run["progress_file"])
        args.application, args.args = Path(run["application"]), [str(a) for a in run.get("args", [])]
        token = run.get("token")
    except (KeyError, TypeError) as e:
        raise SystemExit(f"connect_runner: the run read from stdin is not valid: {type(e).__name__}: {e}") from e
    if token is not None:
        os.environ[TOKEN_ENV] = str(token)
    return True


def open_ahead(remote: str, token: object) -> tuple[str, Any] | None:
    """Open the session of ``remote`` (its ``session_id``) before the run comes and run a trivial
    query in it: a session's first query pays the server's per-session set-up (~0.5 s measured on a
    warm local server), now off the slice's path. Returns ``(remote, session)``; ``None`` when it
    failed (said on stderr: the run then opens its session itself)."""
    from pyspark.sql import SparkSession

    if token is not None:
        os.environ[TOKEN_ENV] = str(token)
    spark = SparkSession.builder.remote(remote).create()
    try:
        spark.range(1).count()
    except Exception as e:  # noqa: BLE001 - reported; the run connects on its own and reports its own errors
        print(f"connect_runner: session not opened ahead ({type(e).__name__}: {e})", file=sys.stderr)
        spark.stop()  # no longer pyspark's default session: the run's own is
        return None
    return remote, spark


def _read_line() -> dict[str, Any] | None:
    """The next JSON object on stdin; ``None`` at end of input."""
    line = sys.stdin.readline()
    if not line.strip():
        return None
    try:
        data = json.loads(line)
    except ValueError as e:
        raise SystemExit(f"connect_runner: the run read from stdin is not valid: {type(e).__name__}: {e}") from e
    if not isinstance(data, dict):
        raise SystemExit("connect_runner: the run read from stdin is not valid: not a JSON object")
    return data


def stop_session(remote: str) -> int:
    """Reattach to the session of ``remote`` (its ``session_id``), stop its streaming queries,
    interrupt its operations and release it. 0 when done or when the session is already closed."""
    from pyspark.sql import SparkSession

    try:
        spark = SparkSession.builder.remote(remote).create()
        queries = list(spark.streams.active)
    except Exception as e:  # noqa: BLE001 - a closed session is what we want; anything else is reported
        if "SESSION_CLOSED" in str(e) or "SESSION_NOT_FOUND" in str(e):
            print(f"connect_runner: session already closed ({type(e).__name__})")
            return 0
        raise
    try:
        for query in queries:
            print(f"connect_runner: stopping streaming query {query.id} ({query.name})")
            query.stop()
        spark.interruptAll()
    finally:
        spark.stop()  # releases the session on the server
    return 0


def _interrupt(signum: int, frame: object) -> None:
    """The first SIGTERM ends the run like Ctrl-C (:func:`watch_stop` keeps its deadline); a second one
    ends the process at once. No thread is started here: a handler runs between two bytecodes of the
    main thread, which may hold ``threading``'s own locks (starting a thread takes one)."""
    global _stop_since
    if _stop_since is not None:
        os._exit(GAVE_UP_EXIT)
    _stop_since = time.monotonic()
    raise KeyboardInterrupt(f"signal {signum}")


def watch_stop() -> None:
    """Ends the process (:data:`GAVE_UP_EXIT`) when a stop runs out of time: :data:`STOP_SECONDS` after
    the first SIGTERM, or :data:`ORPHAN_STOP_SECONDS` after the launcher is gone, whether or not the
    parent-death signal's handler got to run (the main thread may be stuck where no handler runs).
    Runs as a daemon thread of the runner, started before the run."""
    orphaned = None
    while True:
        now = time.monotonic()
        if orphaned is None and os.getppid() != _PARENT:
            orphaned = now
        since = _stop_since
        if (orphaned is not None and now - orphaned >= ORPHAN_STOP_SECONDS) or (
            since is not None and now - since >= STOP_SECONDS
        ):
            os._exit(GAVE_UP_EXIT)
        time.sleep(WATCH_SECONDS)


def _stop(spark: Any, listener: Any) -> None:
    """Stop the session's queries still running and its listener, then the session (the server
    keeps running)."""
    try:
        for query in spark.streams.active:
            query.stop()
        spark.streams.removeListener(listener)
    finally:
        spark.stop()


# the process's last exit hook, registered at import (before pyspark's): once main() returned, the runner
# ends without the interpreter's finalization (0.3-0.6 s of every slice's fixed cost). The run is over then
# (its queries stopped, its session released, its progress file written line by line), and the launcher
# waits for this exit before the next slice starts.
UNFINALIZED_EXIT.register()

if __name__ == "__main__":
    UNFINALIZED_EXIT.code = main()
    sys.exit(UNFINALIZED_EXIT.code)
