"""Spark's Python processes forked warm on this machine, for a Spark that kappa starts here (a local
Spark Connect server, a spark-submit with a local master).

A :class:`WarmPython` owns the zygote of :mod:`airflow_provider_kappa.spark.warm_daemon` (one
interpreter that imported pyspark's worker modules, pyarrow, pyiceberg and kappa's source and sink
once) and a small wrapper script Spark runs as its Python (``PYSPARK_PYTHON`` and
``PYSPARK_DRIVER_PYTHON``): ``python -m pyspark.*`` and the job's own driver (``python app.py``, as
spark-submit starts it) go to the zygote, which forks them with everything imported; anything else
(``python -c``) runs this interpreter as before. Both live in a private temporary folder with a
short path (``AF_UNIX`` paths are at most 107 bytes). The zygote ends within a second of the process it
watches and by :meth:`WarmPython.stop`.

Off with ``KAPPA_WARM_DAEMON=0`` (Spark's own daemon, cold) and when the job sets its own
``spark.pyspark.python`` (:func:`warm_enabled`). No Airflow, pyspark or pyiceberg import here.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from airflow_provider_kappa.spark.warm_daemon import FORKED_LINE, SOCKET_ENV

log = logging.getLogger(__name__)

WARM_DAEMON_MODULE = "airflow_provider_kappa.spark.warm_daemon"
#: Set to ``0`` to start kappa's local Sparks with Spark's own (cold) Python daemon; unset or anything else:
#: the warm daemon (benchmarks/README.md measured ~6 s -> ~2 s of fixed cost per Connect slice with it).
WARM_DAEMON_ENV = "KAPPA_WARM_DAEMON"
USER_PYTHON_KEYS = ("spark.pyspark.python", "spark.pyspark.driver.python")


def warm_enabled(*confs: Mapping[str, str]) -> bool:
    """Whether Spark's Python processes fork warm: not with ``KAPPA_WARM_DAEMON=0``, nor when one of
    ``confs`` (the job's Spark conf, the platform's defaults) sets the Python itself."""
    if os.environ.get(WARM_DAEMON_ENV, "1") == "0":
        return False
    return not any(key in conf for conf in confs for key in USER_PYTHON_KEYS)


class WarmPython:
    """The zygote and the wrapper of one local Spark (see the module doc). Nothing is on disk until
    :meth:`env` or :meth:`start` makes its private folder; :meth:`stop` (or the zygote as it ends)
    removes it."""

    def __init__(self) -> None:
        self._folder: Path | None = None
        self.zygote: subprocess.Popen[bytes] | None = None
        self._own_log: IO[bytes] | None = None

    @property
    def folder(self) -> Path:
        """The private folder (0700; a short path: ``AF_UNIX`` paths are <= 107 bytes), made with the wrapper
        at first use."""
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix="kappa-wd-"))
            self.wrapper.write_text(
                "#!/bin/sh\n"
                "# PYSPARK_PYTHON of a Spark kappa started on this machine: pyspark's own processes and the job's\n"
                "# driver (python APP.py, as spark-submit starts it) forked warm; anything else as it is\n"
                f'if [ "$1" = "-m" ]; then case "$2" in pyspark.*) exec "{sys.executable}" -m {WARM_DAEMON_MODULE} --run "$@";; esac; fi\n'
                f'case "$1" in -*) ;; *.py) exec "{sys.executable}" -m {WARM_DAEMON_MODULE} --run "$@";; esac\n'
                f'exec "{sys.executable}" "$@"\n'
            )
            self.wrapper.chmod(0o700)
        return self._folder

    @property
    def wrapper(self) -> Path:
        """The script Spark runs as its Python."""
        return self.folder / "python"

    @property
    def socket(self) -> Path:
        """The zygote's Unix socket."""
        return self.folder / "zygote.sock"

    def env(self) -> dict[str, str]:
        """The variables of the Spark process whose Python processes fork warm."""
        return {
            "PYSPARK_PYTHON": str(self.wrapper),
            "PYSPARK_DRIVER_PYTHON": str(self.wrapper),
            SOCKET_ENV: str(self.socket),
        }

    @property
    def log_file(self) -> Path:
        """The zygote's log when :meth:`start` was given no ``out``."""
        return self.folder / "zygote.log"

    def start(self, env: Mapping[str, str], watch_pid: int, out: Any = None) -> None:
        """Start the zygote in its own process group (idempotent); it ends within a second of ``watch_pid``.
        A zygote that cannot start leaves Spark's Python processes cold (said in the log).

        :param env: its environment (the Spark process's, without secrets).
        :param watch_pid: the process whose end ends it.
        :param out: where it writes (default :attr:`log_file`).
        """
        if self.zygote is not None and self.zygote.poll() is None:
            return
        if out is None:
            self._own_log = out = self.log_file.open("wb")
        try:
            self.zygote = subprocess.Popen(
                [sys.executable, "-m", WARM_DAEMON_MODULE, "--serve", str(self.socket), "--watch-pid", str(watch_pid)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**env, **self.env()},
                start_new_session=True,
            )
        except OSError as e:  # Spark still runs, its Python processes start cold
            log.warning("warm daemon not started (%s: %s); Spark's Python processes start cold", type(e).__name__, e)

    def forked(self) -> int:
        """How many of Spark's Python processes the zygote forked (from :attr:`log_file`; 0 without it)."""
        try:
            return self.log_file.read_text(errors="replace").count(FORKED_LINE)
        except OSError:
            return 0

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the zygote (SIGTERM, waited for up to ``timeout`` s) and remove the folder (idempotent).
        The processes it forked end with the Spark that runs them."""
        if self.zygote is not None and self._own_log is not None:
            log.info("warm daemon: %d of Spark's Python processes forked warm", self.forked())
        if self.zygote is not None and self.zygote.poll() is None:
            self.zygote.terminate()
        if self.zygote is not None:
            try:
                self.zygote.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.zygote.kill()
                self.zygote.wait()
        if self._own_log is not None:
            self._own_log.close()
            self._own_log = None
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
