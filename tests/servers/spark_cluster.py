"""A Spark standalone cluster on 127.0.0.1 from the pyspark distribution in the venv.

One master and ``workers`` workers, each started with ``$SPARK_HOME/bin/spark-class`` as its
own process group (a worker's executors and their Python workers are its children, so
:meth:`SparkCluster.kill_worker` takes the whole "machine" down at once). SPARK_HOME is the
pyspark package folder. Executors run the venv's interpreter (``PYSPARK_PYTHON``), where
``airflow_provider_kappa`` is installed in editable mode.

:func:`packed_venv` builds the small packed virtualenv executors run through ``spark.archives``.

Typical use::

    with spark_cluster(tmp / "spark", workers=2) as cluster:
        proc = cluster.submit(app_path, args=[...], log_path=tmp / "driver.log")
        ...
        cluster.kill_worker(0)
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from servers import DeploymentError, ServerProcess, free_port, venv_env, wait_until


def spark_home() -> Path:
    """The pyspark package folder of the venv (it holds ``bin/spark-class`` and ``jars/``)."""
    import pyspark

    home = Path(pyspark.__file__).parent
    if not (home / "bin" / "spark-class").exists():
        raise DeploymentError(f"pyspark at {home} has no bin/spark-class: not a full pyspark distribution")
    return home


@dataclass
class SparkCluster:
    """A standalone master and its workers, all bound to 127.0.0.1.

    :param root: folder for logs, worker work dirs and local dirs.
    :param workers: number of workers.
    :param worker_cores: cores each worker offers.
    :param worker_memory: memory each worker offers (Spark size string).
    :param daemon_memory: heap of the master and worker JVMs themselves.
    """

    root: Path
    workers: int = 2
    worker_cores: int = 1
    worker_memory: str = "1g"
    daemon_memory: str = "256m"
    master_port: int = 0
    webui_port: int = 0
    master: ServerProcess | None = None
    worker_procs: list[ServerProcess] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self.master_port = self.master_port or free_port()
        self.webui_port = self.webui_port or free_port()
        self.home = spark_home()

    @property
    def master_url(self) -> str:
        """``spark://127.0.0.1:<port>``: what ``--master`` takes."""
        return f"spark://127.0.0.1:{self.master_port}"

    @property
    def webui_url(self) -> str:
        """The master's web UI (``/json`` is its state as JSON)."""
        return f"http://127.0.0.1:{self.webui_port}"

    @property
    def worker_pids(self) -> list[int]:
        """Pids (= process group ids) of the workers, in start order."""
        return [w.pid for w in self.worker_procs]

    def worker_dir(self, index: int) -> Path:
        """Work dir of worker ``index`` (its executors run in ``<it>/<app-id>/<executor-id>``).

        :param index: worker index.
        """
        return self.root / f"worker-{index}"

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment of the daemons and of spark-submit.

        :param extra: more variables.
        """
        settings = {
            "SPARK_HOME": str(self.home),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_MASTER_HOST": "127.0.0.1",
            "SPARK_DAEMON_MEMORY": self.daemon_memory,
            # No REST submission server: it would bind the fixed port 6066.
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
            "SPARK_LOG_DIR": str(self.root / "logs"),
            "SPARK_LOCAL_DIRS": str(self.root / "local"),
            "SPARK_CONF_DIR": str(self.root / "conf"),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        }
        settings.update(extra or {})
        return venv_env(settings)

    def start(self, timeout: float = 120.0) -> SparkCluster:
        """Start the master, then the workers; wait until every worker is registered ALIVE.

        :param timeout: seconds allowed for the whole start.
        """
        (self.root / "conf").mkdir(parents=True, exist_ok=True)
        (self.root / "local").mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        spark_class = str(self.home / "bin" / "spark-class")
        env = self.env()
        self.master = ServerProcess(
            "spark master",
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.master_port),
                "--webui-port",
                str(self.webui_port),
            ],
            self.root / "logs" / "master.log",
            env,
            cwd=self.root,
        )
        wait_until(
            lambda: self.state() is not None,
            timeout=timeout,
            what=f"the Spark master web UI at {self.webui_url}/json",
            servers=[self.master],
        )
        self.timings["master_s"] = time.monotonic() - t0
        for i in range(self.workers):
            self.worker_procs.append(self._launch_worker(i))
        remaining = max(10.0, timeout - (time.monotonic() - t0))
        wait_until(
            lambda: self.alive_workers() >= self.workers,
            timeout=remaining,
            what=f"{self.workers} workers registered ALIVE at {self.master_url}",
            servers=[self.master, *self.worker_procs],
        )
        self.timings["start_total_s"] = time.monotonic() - t0
        return self

    def _launch_worker(self, index: int) -> ServerProcess:
        self.worker_dir(index).mkdir(parents=True, exist_ok=True)
        return ServerProcess(
            f"spark worker {index}",
            [
                str(self.home / "bin" / "spark-class"),
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                "127.0.0.1",
                "--cores",
                str(self.worker_cores),
                "--memory",
                self.worker_memory,
                "--webui-port",
                str(free_port()),
                "--work-dir",
                str(self.worker_dir(index)),
                self.master_url,
            ],
            self.root / "logs" / f"worker-{index}.log",
            self.env(),
            cwd=self.root,
        )

    def restart_worker(self, index: int, timeout: float = 120.0) -> None:
        """Start worker ``index`` again after :meth:`kill_worker`; wait until every worker is ALIVE.

        :param index: worker index.
        :param timeout: seconds.
        """
        if self.worker_procs[index].alive():
            raise DeploymentError(f"spark worker {index} (pid {self.worker_procs[index].pid}) is still running")
        self.worker_procs[index] = self._launch_worker(index)
        servers = [s for s in [self.master, *self.worker_procs] if s is not None]
        wait_until(
            lambda: self.alive_workers() >= self.workers,
            timeout=timeout,
            what=f"worker {index} registered again",
            servers=servers,
        )

    def state(self) -> dict[str, Any] | None:
        """The master's ``/json`` state, or None while it does not answer."""
        resp = httpx.get(f"{self.webui_url}/json/", timeout=5, follow_redirects=True)
        return dict(resp.json()) if resp.status_code == 200 else None

    def alive_workers(self) -> int:
        """How many workers the master lists as ALIVE."""
        state = self.state() or {}
        return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def kill_worker(self, index: int) -> None:
        """SIGKILL worker ``index``'s process group: the worker JVM, its executors and their Python workers.

        :param index: worker index.
        """
        self.worker_procs[index].kill()

    def submit(
        self,
        application: Path,
        *,
        args: Sequence[str] = (),
        conf: Mapping[str, str] | None = None,
        log_path: Path,
        name: str = "spark-submit",
    ) -> ServerProcess:
        """Start ``spark-submit --master <this cluster>`` of a Python application (client deploy mode).

        The driver runs in its own process group; call ``.popen.wait()`` for its end.

        :param application: the ``.py`` file.
        :param args: application arguments.
        :param conf: more ``--conf`` entries (over :func:`client_conf`).
        :param log_path: driver stdout and stderr.
        :param name: name for error messages.
        """
        settings = {**client_conf(), **(conf or {})}
        argv = [str(self.home / "bin" / "spark-submit"), "--master", self.master_url]
        for key, value in settings.items():
            argv += ["--conf", f"{key}={value}"]
        argv += [str(application), *args]
        return ServerProcess(name, argv, log_path, self.env(), cwd=self.root)

    def stop(self) -> None:
        """Stop the workers, then the master (SIGTERM to each process group, then SIGKILL)."""
        errors: list[str] = []
        for server in [*reversed(self.worker_procs), *([self.master] if self.master else [])]:
            try:
                server.stop(grace=10)
            except Exception as e:  # keep stopping the others; reported below
                errors.append(f"{server.name}: {e!r}")
        self.worker_procs.clear()
        self.master = None
        if errors:
            raise DeploymentError("could not stop the Spark cluster: " + "; ".join(errors))

    def describe(self) -> str:
        """Log tails of the master and workers (for assertion messages)."""
        return "\n".join(s.describe() for s in [*([self.master] if self.master else []), *self.worker_procs])


def client_conf() -> dict[str, str]:
    """Spark conf of a client (driver) of the cluster: the driver on 127.0.0.1, driver and
    executors at 512m and 1 core, every Python process on the venv's interpreter, no UI, two
    shuffle partitions. :meth:`SparkCluster.submit` uses it; a job's ``spark_conf`` can too.

    (A module-level function placed after the ``@dataclass`` class, not between the decorator
    and ``class``: there the decorator would wrap the function and fail at import with
    ``'function' object has no attribute '__mro__'``.)
    """
    return {
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.memory": "512m",
        "spark.executor.memory": "512m",
        "spark.executor.cores": "1",
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
    }


def packed_venv(folder: Path) -> Path:
    """A small virtualenv packed with venv-pack, holding only what executors need here: a Python and
    ``airflow_provider_kappa`` (pyspark's Python code comes from the cluster's ``SPARK_HOME``). Not
    the project venv (1.5 GB): its ``bin/python`` links to the same base interpreter, its
    ``site-packages`` holds a copy of the package's source tree (pure Python; a wheel build would
    need setuptools>=68 from the network).

    :param folder: where to build ``venv/`` and write ``kappa-env.tar.gz``.
    :returns: the archive, for ``job.python_archive`` / ``spark.archives``.
    """
    import shutil
    import subprocess

    import venv_pack

    import airflow_provider_kappa

    prefix = folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], check=True, capture_output=True)
    site = prefix / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    shutil.copytree(
        Path(airflow_provider_kappa.__file__).parent,
        site / "airflow_provider_kappa",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    archive = folder / "kappa-env.tar.gz"
    venv_pack.pack(prefix=str(prefix), output=str(archive), verbose=False)
    return archive


@contextmanager
def spark_cluster(
    root: Path, *, workers: int = 2, worker_cores: int = 1, timeout: float = 120.0
) -> Iterator[SparkCluster]:
    """Start a :class:`SparkCluster`, yield it, and always stop it.

    :param root: folder for logs and work dirs.
    :param workers: number of workers.
    :param worker_cores: cores per worker.
    :param timeout: seconds allowed for the start.
    """
    cluster = SparkCluster(root, workers=workers, worker_cores=worker_cores)
    try:
        cluster.start(timeout=timeout)
        yield cluster
    finally:
        cluster.stop()
