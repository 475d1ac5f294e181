"""Launch one run of the job's unchanged application with spark-submit (SparkSubmitHook).

The whole ``spark.*`` conf, the platform's ``spark-defaults.conf`` merged in, goes to a properties
file readable by its owner only, so the command line shows only the master, the deploy mode, the
application and that path. What goes where per master and deploy mode (Python, environment, the
shipped catalogs file, event logs) is decided by the pure
:func:`~airflow_provider_kappa.engine.submit_args.submit_args`. Outside an Airflow deployment
(the CLI) the Spark connection is an in-process one whose host is the job's master.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_provider_kappa.compat.spark_provider import cluster_application, resolved_connection, submit_process
from airflow_provider_kappa.engine.base import Engine, SliceRunRequest
from airflow_provider_kappa.engine.class_data_sharing import ClassDataSharing
from airflow_provider_kappa.engine.class_data_sharing import plan as plan_class_data_sharing
from airflow_provider_kappa.engine.processes import RUNNING, child_options, stop_process_group
from airflow_provider_kappa.engine.progress import PROGRESS_DIR, RUN_ID, collect_progress, event_log_conf, read_progress
from airflow_provider_kappa.engine.submit_args import (
    DRIVER_PYTHON,
    PYTHON,
    SUBMIT_PREFIX,
    SubmitArgs,
    check_kubernetes_provider,
    is_local,
    kubernetes_provider_missing,
    read_spark_defaults,
    spark_defaults_path,
    submit_args,
)
from airflow_provider_kappa.engine.warm_python import WarmPython, warm_enabled
from airflow_provider_kappa.exceptions import KappaConfigError

log = logging.getLogger(__name__)

LOCAL_CONN_ID = "kappa_local_spark"

if TYPE_CHECKING:
    from airflow_provider_kappa.job.config import JobConfig


def write_properties_file(conf: Mapping[str, str], path: str | Path) -> Path:
    """Write ``conf`` as a Spark properties file with mode 0600.

    :param conf: Spark conf entries.
    :param path: the file to write.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"{k} {_escape(v)}" for k, v in sorted(conf.items())]
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    return target


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def spark_env() -> dict[str, str]:
    """Environment of a Spark process kappa runs on this machine with a local master (a local Spark
    Connect server): this interpreter for Python workers, loopback for Spark's own addresses, and
    this venv's ``bin`` (spark-submit) first. spark-submit's own comes from
    :func:`~airflow_provider_kappa.engine.submit_args.submit_args`."""
    venv_bin = str(Path(sys.executable).parent)
    return {
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
        "PATH": venv_bin + os.pathsep + os.environ.get("PATH", ""),
    }


def submit(
    application: str | Path,
    conf: Mapping[str, str],
    *,
    properties_file: str | Path,
    name: str,
    master: str | None = None,
    conn_id: str | None = None,
    class_data_sharing: bool = True,
    application_args: Sequence[str] = (),
    warm: WarmPython | None = None,
) -> None:
    """Run ``application`` once with spark-submit and wait for it; raise if it fails.

    :param application: the job's Python file.
    :param conf: the full Spark conf (``spark.kappa.*`` included).
    :param properties_file: where to write the conf (0600).
    :param name: Spark application name.
    :param master: Spark master when no ``conn_id`` is given (e.g. ``local[*]``).
    :param conn_id: an Airflow Spark connection; its master wins over ``master``.
    :param class_data_sharing: map (or, on a machine's first run, write) the driver JVM's
        class archive (:mod:`airflow_provider_kappa.engine.class_data_sharing`; ``job.class_data_sharing``).
    :param application_args: arguments of the application.
    :param warm: with a local master, Spark's Python processes fork from this zygote, started here
        if it does not run yet (:mod:`~airflow_provider_kappa.engine.warm_python`); default: one of this
        call's own, stopped when it returns. Not when the job or the platform's defaults set
        ``spark.pyspark.python``, nor with ``KAPPA_WARM_DAEMON=0``.
    """
    application, properties_file = Path(application).resolve(), Path(properties_file).resolve()
    if not application.is_file():
        raise KappaConfigError(f"job.application: {str(application)!r} does not exist")
    hook = _submit_hook(
        conn_id,
        master=master,
        name=name,
        properties_file=properties_file,
        deploy_mode=conf.get(SUBMIT_PREFIX + "deploy_mode"),
        application_args=application_args,
    )
    connection = resolved_connection(hook)  # master and deploy mode
    run_id = uuid.uuid4().hex
    defaults = read_spark_defaults(spark_defaults_path())
    with ExitStack() as stack:
        python, warm_env = sys.executable, {}
        if is_local(connection["master"]) and warm_enabled(conf, defaults):
            if warm is None:  # this call's own zygote
                warm = WarmPython()
                stack.callback(warm.stop)
            warm.start({**os.environ, **spark_env()}, os.getpid())
            python, warm_env = str(warm.wrapper), warm.env()
        args = submit_args(
            {**conf, RUN_ID: run_id},
            master=connection["master"],
            python=python,
            deploy_mode=connection.get("deploy_mode"),
            defaults=defaults,
            venv_bin=str(Path(sys.executable).parent),
        )
        _log_submit(name, args)
        sharing = None
        if class_data_sharing:
            sharing = plan_class_data_sharing(args.conf, driver_on_cluster=args.deploy_mode == "cluster")
        write_properties_file(sharing.conf if sharing else args.conf, properties_file)
        popen: dict[str, Any] = {"env": {**os.environ, **warm_env, **args.local_env}}
        if args.driver_links:
            popen["cwd"] = str(_driver_folder(properties_file, args.driver_links))
        began = time.time()
        _run_hook(hook, name, application, popen, sharing)
    if args.user_event_log and args.event_log_dir and PROGRESS_DIR in conf:
        _collect(args.event_log_dir, run_id, conf[PROGRESS_DIR], began)


def _submit_hook(
    conn_id: str | None,
    *,
    master: str | None,
    name: str,
    properties_file: Path,
    deploy_mode: str | None,
    application_args: Sequence[str],
) -> Any:
    """The ``SparkSubmitHook`` of one submit: through ``conn_id``, else an in-process connection whose host
    is ``master``. The job's deploy mode (``job.deploy_mode``) wins over the connection's deploy-mode extra.

    :raises KappaConfigError: a Kubernetes master without Airflow's Kubernetes provider.
    """
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    if conn_id is None:
        check_kubernetes_provider(master or "local[*]", f"job.master {master!r}")
        conn_id = LOCAL_CONN_ID
        os.environ[f"AIRFLOW_CONN_{LOCAL_CONN_ID.upper()}"] = json.dumps(
            {"conn_type": "spark", "host": master or "local[*]"}
        )
    try:
        return SparkSubmitHook(
            conn_id=conn_id,
            name=name,
            properties_file=str(properties_file),
            deploy_mode=deploy_mode,
            application_args=list(application_args) or None,
        )
    except NameError as e:  # the connection's master is Kubernetes: see submit_args.check_kubernetes_provider
        if "kube_client" not in str(e):
            raise
        raise kubernetes_provider_missing(f"the master of Spark connection {conn_id!r}") from e


def _log_submit(name: str, args: SubmitArgs) -> None:
    log.info(
        "spark-submit %s: master %s, deploy mode %s, driver Python %s, executor Python %s, shipped %s, event log %s",
        name,
        args.master,
        args.deploy_mode,
        args.conf.get(DRIVER_PYTHON, "(platform's)"),
        args.conf.get(PYTHON, "(platform's)"),
        args.shipped or "nothing",
        args.event_log_dir or "off",
    )


def _driver_folder(properties_file: Path, links: Mapping[str, str]) -> Path:
    """The driver's working directory: a private folder beside the properties file holding the links it needs."""
    cwd = Path(properties_file).resolve().parent / "driver"
    cwd.mkdir(mode=0o700, exist_ok=True)
    for link, target in links.items():
        (cwd / link).unlink(missing_ok=True)
        (cwd / link).symlink_to(target, target_is_directory=True)
    return cwd


def _run_hook(
    hook: Any, name: str, application: Path, popen: Mapping[str, Any], sharing: ClassDataSharing | None
) -> None:
    """Run the spark-submit and wait for it; whatever ends this early stops it (no orphan left) and
    abandons the class-data-sharing archive being written, a success keeps it."""
    try:
        # own process group, SIGKILLed by the kernel if this process dies (engine/processes.py)
        with RUNNING.run(f"spark-submit {name}", lambda: stop_submit(hook)):
            hook.submit(application=str(application), **popen, **child_options())
    except BaseException:
        stop_submit(hook)  # Ctrl-C, SIGTERM turned into it (kappa land), a task timeout: no orphan left
        if sharing:
            sharing.abandon()
        raise
    if sharing:
        sharing.keep()


def _collect(event_log_dir: str, run_id: str, into: str, began: float) -> None:
    """Copy the run's progress from the user's event-log folder into kappa's progress folder; a folder
    this machine cannot read leaves the slice's metrics empty (the run itself succeeded), said in the log."""
    try:
        count = collect_progress(event_log_dir, run_id, into, began)
    except (OSError, ValueError, ImportError) as e:
        log.warning(
            "the run's progress is in %s (spark.eventLog.dir), which cannot be read from here (%s: %s): "
            "its metrics show no rows; see it in your Spark History Server",
            event_log_dir,
            type(e).__name__,
            e,
        )
        return
    if count == 0:
        log.warning(
            "run %s recorded no streaming progress in %s (spark.eventLog.dir): its metrics show no rows",
            run_id,
            event_log_dir,
        )


def stop_submit(hook: Any, timeout: float = 60.0) -> None:
    """Stop a running spark-submit of ``hook`` cleanly: SIGTERM (its JVM runs Spark's shutdown hooks),
    then, once it ended or after ``timeout`` seconds, SIGKILL to its whole process group (the JVM if
    still there, and the job's Python driver and workers left). A stop between an Iceberg commit and Spark's
    checkpoint commit loses nothing: the sink skips the replayed micro-batch on restart.

    :param hook: the ``SparkSubmitHook`` whose process to stop.
    """
    # SparkSubmitHook's public on_kill() SIGKILLs the spark-submit alone at once; a graceful stop of
    # the whole tree needs SIGTERM first and its process group after, so this needs the hook's process
    proc = submit_process(hook)
    if proc is None or proc.poll() is not None:
        return
    if cluster_application(hook):
        # the driver runs on the cluster, so stopping the local spark-submit (a client) leaves it running:
        # the hook's own on_kill kills it there (yarn application -kill, the Kubernetes driver pod deleted,
        # a standalone driver killed), and SIGKILLs the client, which holds no state of the run
        hook.on_kill()
    stop_process_group(proc.pid, timeout)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class SubmitEngine(Engine):
    """Engine ``submit``: every slice is one spark-submit through SparkSubmitHook, its progress
    read back from the run's own event log. With a local master, Spark's Python processes fork from a
    warm zygote (:mod:`~airflow_provider_kappa.engine.warm_python`): one for all the slices between
    :meth:`start` and :meth:`stop` (``kappa backfill``), else one per slice (an Airflow slice task).

    :param cfg: the job config (``job.master``, ``job.class_data_sharing``).
    :param conn_id: an Airflow Spark connection to submit through (default: ``job.master``).
    :param submit_fn: replaces :func:`submit` (tests).
    """

    name = "submit"

    def __init__(
        self, cfg: JobConfig, *, conn_id: str | None = None, submit_fn: Callable[..., None] | None = None
    ) -> None:
        self.cfg = cfg
        self.conn_id = conn_id
        self.submit_fn = submit_fn or submit
        self._warm: WarmPython | None = None

    def start(self) -> None:
        """One warm zygote for the slices up to :meth:`stop`: the first slice with a local master starts it."""
        if self._warm is None:
            self._warm = WarmPython()  # nothing on disk until submit() starts it

    def run(self, request: SliceRunRequest) -> list[dict[str, Any]]:
        """One spark-submit of the slice; see :meth:`Engine.run`."""
        events = request.private / "eventlog"
        events.mkdir()
        self.submit_fn(
            request.application,
            {**request.conf, **event_log_conf(events)},
            properties_file=request.private / "spark.properties",
            name=request.name,
            master=self.cfg.job.master,
            conn_id=self.conn_id,
            class_data_sharing=self.cfg.job.class_data_sharing,
            warm=self._warm,
        )
        return read_progress(events)

    def stop(self) -> None:
        """Stop the warm zygote (idempotent)."""
        warm, self._warm = self._warm, None
        if warm is not None:
            warm.stop()
