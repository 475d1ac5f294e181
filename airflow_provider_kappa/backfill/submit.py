"""Launch one run of the job's unchanged application with spark-submit (SparkSubmitHook).

The whole ``spark.*`` conf goes to a properties file readable by its owner only, so the
command line shows only the application and that path. Outside an Airflow deployment
(the CLI) the Spark connection is an in-process one whose host is the job's master.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping

LOCAL_CONN_ID = "kappa_local_spark"


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
    """Environment every Spark process needs here: this interpreter for Python workers,
    loopback for Spark's own addresses, and this venv's ``bin`` (spark-submit) first."""
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
) -> None:
    """Run ``application`` once with spark-submit and wait for it; raise if it fails.

    :param application: the job's Python file.
    :param conf: the full Spark conf (``spark.kappa.*`` included).
    :param properties_file: where to write the conf (0600).
    :param name: Spark application name.
    :param master: Spark master when no ``conn_id`` is given (e.g. ``local[*]``).
    :param conn_id: an Airflow Spark connection; its master wins over ``master``.
    :param class_data_sharing: map (or, on a machine's first run, write) the driver JVM's
        class archive (:mod:`airflow_provider_kappa.backfill.class_data_sharing`; ``job.class_data_sharing``).
    """
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    if not Path(application).is_file():
        from airflow_provider_kappa.exceptions import KappaConfigError

        raise KappaConfigError(f"job.application: {str(application)!r} does not exist")
    env = spark_env()
    if conn_id is None:
        conn_id = LOCAL_CONN_ID
        os.environ[f"AIRFLOW_CONN_{LOCAL_CONN_ID.upper()}"] = json.dumps(
            {"conn_type": "spark", "host": master or "local[*]"}
        )
    os.environ["PATH"] = env["PATH"]
    hook = SparkSubmitHook(conn_id=conn_id, name=name, properties_file=str(properties_file), env_vars=env)
    sharing = None
    if class_data_sharing:
        from airflow_provider_kappa.backfill.class_data_sharing import plan

        connection = hook._connection  # the resolved connection: deploy mode and Spark home
        sharing = plan(
            conf,
            driver_on_cluster=connection.get("deploy_mode") == "cluster",
            home=Path(connection["spark_home"]) if connection.get("spark_home") else None,
        )
    write_properties_file(sharing.conf if sharing else conf, properties_file)
    try:
        hook.submit(application=str(application))
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt):  # Ctrl-C, or SIGTERM turned into it (kappa land)
            stop_submit(hook)
        if sharing:
            sharing.abandon()
        raise
    if sharing:
        sharing.keep()


def stop_submit(hook: Any, timeout: float = 60.0) -> None:
    """Stop a running spark-submit of ``hook`` cleanly: SIGTERM (its JVM runs Spark's shutdown hooks),
    SIGKILL after ``timeout`` seconds. A stop between an Iceberg commit and Spark's checkpoint commit
    loses nothing: the sink skips the replayed micro-batch on restart.

    :param hook: the ``SparkSubmitHook`` whose process to stop.
    """
    # SparkSubmitHook's public on_kill() SIGKILLs the spark-submit at once; a graceful stop needs
    # SIGTERM first, so this reads the hook's process handle (private, no public accessor).
    proc = getattr(hook, "_submit_sp", None)
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
