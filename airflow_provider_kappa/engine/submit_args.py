"""What one spark-submit of a kappa run gets, per master and deploy mode: a pure function.

:func:`submit_args` turns (the run's Spark conf, the platform's ``spark-defaults.conf``, the master,
the deploy mode, the job's Python and environment choices) into the properties file's content and
the environment of the local ``spark-submit`` process. :mod:`~airflow_provider_kappa.engine.submit`
writes and runs it. Nothing here touches a file or a process (tested per mode in
``tests/unit/test_submit_args.py``).

- **spark-defaults kept.** ``--properties-file`` makes spark-submit skip ``spark-defaults.conf``, so
  its entries are merged into the file here: defaults < the job's conf < kappa's keys; the list keys
  (``spark.files``, ``spark.archives``, ``spark.jars``, ``spark.submit.pyFiles``) are joined, not replaced.
- **Python.** The user's ``spark.pyspark.python`` / ``spark.pyspark.driver.python`` win. Otherwise:
  a local master runs this interpreter everywhere; a driver on this machine (client mode) runs this
  interpreter; executors of a cluster run the packed virtualenv of ``job.python_archive``
  (``spark.archives`` ``<archive>#kappa_env``, ``./kappa_env/bin/python``) when one is given, else
  what the platform sets.
- **Environment** (``job.env``), the way each mode expects it (the mechanism of the Spark provider's
  ``SparkSubmitHook``, kept off the command line here): executors ``spark.executorEnv.*``; a driver on
  this machine the spark-submit process's environment; a YARN cluster-mode driver
  ``spark.yarn.appMasterEnv.*``; a Kubernetes cluster-mode driver ``spark.kubernetes.driverEnv.*``.
- **Catalogs file.** On a cluster master the 0600 catalogs file goes with the application in
  ``spark.files``; the driver and executors read it through ``SparkFiles`` when its path is not
  theirs (:func:`airflow_provider_kappa.spark.settings.read_catalogs_file`). A catalogs file the
  user configures (``job.catalogs_file``, ``spark.kappa.catalogs.ship=false``) is read where it is.
- **Event logs.** The user's ``spark.eventLog.dir`` (job conf or spark-defaults) is kept; kappa's
  own folder (``spark.kappa.progress.dir``, :func:`~airflow_provider_kappa.engine.progress.event_log_conf`)
  is used only when the user sets none.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from airflow_provider_kappa.engine.class_data_sharing import spark_home
from airflow_provider_kappa.engine.progress import PROGRESS_DIR
from airflow_provider_kappa.exceptions import KappaConfigError
from airflow_provider_kappa.spark.settings import PREFIX

CLIENT = "client"
CLUSTER = "cluster"
DEPLOY_MODES = (CLIENT, CLUSTER)

LIST_KEYS = ("spark.files", "spark.archives", "spark.jars", "spark.submit.pyFiles")
"""Comma-separated list keys: spark-defaults, the job's conf and kappa's entries are joined."""

ENV_ALIAS = "kappa_env"
"""The folder a ``job.python_archive`` is unpacked to in each driver/executor working directory."""

PYTHON = "spark.pyspark.python"
DRIVER_PYTHON = "spark.pyspark.driver.python"
EVENT_LOG_DIR = "spark.eventLog.dir"
EVENT_LOG_ENABLED = "spark.eventLog.enabled"
EVENT_LOG_COMPRESS = "spark.eventLog.compress"
EVENT_LOG_ROLLING = "spark.eventLog.rolling.enabled"

CATALOGS_FILE = PREFIX + "catalogs.file"
CATALOGS_SHIP = PREFIX + "catalogs.ship"
"""``false``: the catalogs file is a path the cluster reads itself (``job.catalogs_file``): not shipped."""

SUBMIT_PREFIX = PREFIX + "submit."
"""The job's launch choices carried in the run's conf (``job.deploy_mode``, ``job.python_archive``,
``job.env``; :func:`airflow_provider_kappa.engine.launch.submit_keys`): read here, never written out."""

_INTERNAL = (PROGRESS_DIR, CATALOGS_SHIP)


def private_event_log(folder: str) -> dict[str, str]:
    """The Spark conf of kappa's own event log in ``folder`` (a run's progress folder): one plain
    JSON-lines file, neither compressed nor rolled, so that the run's progress is read from it."""
    return {EVENT_LOG_ENABLED: "true", EVENT_LOG_DIR: folder, EVENT_LOG_COMPRESS: "false", EVENT_LOG_ROLLING: "false"}


def _internal(key: str) -> bool:
    return key in _INTERNAL or key.startswith(SUBMIT_PREFIX)


@dataclass(frozen=True)
class SubmitArgs:
    """One spark-submit, ready to write and run.

    :param conf: the properties file's entries (spark-defaults merged in).
    :param local_env: variables set on the local spark-submit process (over the current environment).
    :param deploy_mode: ``client`` or ``cluster``.
    :param master: the Spark master.
    :param event_log_dir: where this run's event log is written (the user's or kappa's), if anywhere.
    :param user_event_log: whether ``event_log_dir`` is the user's (progress is then found by run id).
    :param shipped: local files added to ``spark.files``.
    :param driver_links: links to make in the working directory of a driver on this machine (name ->
        target): ``kappa_env`` -> this interpreter's environment, so that the relative
        ``./kappa_env/bin/python`` Spark also uses for the driver's own Python workers (a Python data
        source is planned there) runs this machine's environment, as the unpacked archive does on executors.
    """

    conf: dict[str, str]
    local_env: dict[str, str]
    deploy_mode: str
    master: str
    event_log_dir: str | None = None
    user_event_log: bool = False
    shipped: list[str] = field(default_factory=list)
    driver_links: dict[str, str] = field(default_factory=dict)


def is_local(master: str) -> bool:
    """Whether ``master`` runs everything in the spark-submit's own JVM (``local``, ``local[N]``, ``local[*, F]``)."""
    return master == "local" or master.startswith("local[")


def cluster_kind(master: str) -> str:
    """``local``, ``standalone`` (``spark://``), ``yarn``, ``kubernetes`` (``k8s://``) or ``other``."""
    if is_local(master):
        return "local"
    if master.startswith("spark://"):
        return "standalone"
    if master == "yarn" or master.startswith("yarn"):
        return "yarn"
    if master.startswith("k8s://"):
        return "kubernetes"
    return "other"


def kubernetes_provider_missing(where: str) -> KappaConfigError:
    """The error for a Kubernetes master without Airflow's Kubernetes provider.

    :param where: the setting that gave the master, with its value (``job.master 'k8s://...'``).
    """
    return KappaConfigError(
        f"{where} is a Kubernetes master (k8s://), and Airflow's Kubernetes provider, which SparkSubmitHook "
        "needs for it, is not installed here; install it with: pip install 'airflow-provider-kappa[kubernetes]' "
        "(apache-airflow-providers-cncf-kubernetes)"
    )


def check_kubernetes_provider(master: str, where: str) -> None:
    """Refuse a Kubernetes ``master`` when SparkSubmitHook could not submit to it here.

    The Spark provider imports the Kubernetes provider's ``kube_client`` when its hook module loads,
    under ``contextlib.suppress(ImportError, NameError)``; without it, its hook fails with ``NameError:
    name 'kube_client' is not defined``, which names neither the setting nor the fix. The same import
    is tried here (:func:`kubernetes_provider_installed`): the hook's condition, through the Kubernetes
    provider's public module rather than the Spark provider's module global.

    :param master: a Spark master URL.
    :param where: the setting that gave it, with its value (for the message).
    :raises KappaConfigError: :func:`kubernetes_provider_missing`.
    """
    if cluster_kind(master) != "kubernetes":
        return
    if not kubernetes_provider_installed():
        raise kubernetes_provider_missing(where)


def kubernetes_provider_installed() -> bool:
    """Whether the client SparkSubmitHook needs for a Kubernetes master, Airflow's Kubernetes provider's
    ``kube_client`` module, imports here (the Spark provider's own condition, :func:`check_kubernetes_provider`)."""
    try:
        import airflow.providers.cncf.kubernetes.kube_client  # noqa: F401
    except (ImportError, NameError):
        return False
    return True


def _join(*values: str | None) -> str:
    out: list[str] = []
    for value in values:
        for item in (value or "").split(","):
            if item.strip() and item.strip() not in out:
                out.append(item.strip())
    return ",".join(out)


def submit_args(
    conf: Mapping[str, str],
    *,
    master: str,
    python: str,
    deploy_mode: str | None = None,
    defaults: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    python_archive: str | None = None,
    environ: Mapping[str, str] | None = None,
    venv_bin: str | None = None,
) -> SubmitArgs:
    """The properties and environment of one spark-submit (see the module doc for the rules).

    :param conf: the run's conf: the job's ``spark_conf`` and kappa's keys (``spark.kappa.*``,
        ``spark.kappa.progress.dir``).
    :param master: the Spark master (``local[*]``, ``spark://h:p``, ``yarn``, ``k8s://https://h:p``).
    :param python: this machine's interpreter (where the package is installed).
    :param deploy_mode: ``client`` or ``cluster`` (the Spark connection's); None: ``job.deploy_mode``
        (``spark.kappa.submit.deploy_mode``), else ``spark.submit.deployMode`` of the conf or the
        defaults, else ``client``.
    :param defaults: entries of the platform's ``spark-defaults.conf`` (:func:`read_spark_defaults`).
    :param env: environment for the driver and executors, over ``job.env`` (``spark.kappa.submit.env.*``).
    :param python_archive: a packed virtualenv, a path or URL spark-submit can read (default
        ``job.python_archive``, ``spark.kappa.submit.python_archive``).
    :param environ: the current environment (default: ``os.environ``).
    :param venv_bin: folder put first on the spark-submit process's ``PATH`` (this venv's ``bin``).
    :raises KappaConfigError: a deploy mode Spark refuses for this master, naming both.
    """
    environ = os.environ if environ is None else environ
    defaults = dict(defaults or {})
    python_archive = python_archive or conf.get(SUBMIT_PREFIX + "python_archive")
    env = {**_job_env(conf), **(env or {})}
    mode = _deploy_mode(conf, defaults, master, deploy_mode or conf.get(SUBMIT_PREFIX + "deploy_mode"))
    kind = cluster_kind(master)
    user = _user_conf(conf, defaults)
    out = dict(user)
    out["spark.submit.deployMode"] = mode
    driver_here = mode == CLIENT
    local_env: dict[str, str] = {}
    if venv_bin:
        local_env["PATH"] = venv_bin + os.pathsep + environ.get("PATH", "")
    links = _set_python(out, local_env, kind=kind, driver_here=driver_here, python=python, archive=python_archive)
    if kind == "local" and "SPARK_LOCAL_IP" not in environ:
        local_env["SPARK_LOCAL_IP"] = "127.0.0.1"
    _set_env(out, local_env, env, kind=kind, driver_here=driver_here, master=master)
    shipped = _ship_catalogs(out, conf, kind)
    event_dir, user_log = _event_log(out, user, conf)
    return SubmitArgs(
        conf=out,
        local_env=local_env,
        deploy_mode=mode,
        master=master,
        event_log_dir=event_dir,
        user_event_log=user_log and event_dir is not None,
        shipped=shipped,
        driver_links=links,
    )


def _job_env(conf: Mapping[str, str]) -> dict[str, str]:
    """``job.env`` as carried in the run's conf (``spark.kappa.submit.env.<NAME>``)."""
    prefix = SUBMIT_PREFIX + "env."
    return {k[len(prefix) :]: v for k, v in conf.items() if k.startswith(prefix)}


def _deploy_mode(conf: Mapping[str, str], defaults: Mapping[str, str], master: str, chosen: str | None) -> str:
    """The deploy mode: ``chosen``, else the conf's or the defaults' ``spark.submit.deployMode``, else client.

    :raises KappaConfigError: not a deploy mode, or one Spark refuses for ``master``.
    """
    mode = chosen or conf.get("spark.submit.deployMode") or defaults.get("spark.submit.deployMode") or CLIENT
    if mode not in DEPLOY_MODES:
        raise KappaConfigError(f"deploy mode: {mode!r} is not a deploy mode; allowed: {list(DEPLOY_MODES)}")
    kind = cluster_kind(master)
    if mode == CLUSTER and kind == "local":
        raise KappaConfigError(f"deploy mode 'cluster' with master {master!r}: a local master runs in client mode only")
    if mode == CLUSTER and kind == "standalone":
        raise KappaConfigError(
            f"deploy mode 'cluster' with master {master!r}: Spark runs Python applications on a standalone "
            "cluster in client mode only; use deploy mode 'client' (the driver runs where kappa runs)"
        )
    return mode


def _user_conf(conf: Mapping[str, str], defaults: Mapping[str, str]) -> dict[str, str]:
    """spark-defaults < the job's conf (kappa's internal keys left out), the list keys joined."""
    user = {**defaults, **{k: v for k, v in conf.items() if not _internal(k)}}
    for key in LIST_KEYS:
        joined = _join(defaults.get(key), conf.get(key))
        if joined:
            user[key] = joined
    return user


def _set_python(
    out: dict[str, str], local_env: dict[str, str], *, kind: str, driver_here: bool, python: str, archive: str | None
) -> dict[str, str]:
    """Set the driver's and executors' Python in ``out`` (and ``local_env``): the user's choice wins; then
    the packed venv on a cluster; then this interpreter where it runs. Returns the driver's links."""
    if kind == "local":
        out.setdefault(PYTHON, python)
        out.setdefault(DRIVER_PYTHON, python)
        # also as the variables (what a local run always had): one machine, one answer
        local_env.update({"PYSPARK_PYTHON": out[PYTHON], "PYSPARK_DRIVER_PYTHON": out[DRIVER_PYTHON]})
        return {}
    if archive:
        out["spark.archives"] = _join(out.get("spark.archives"), f"{archive}#{ENV_ALIAS}")
        out.setdefault(PYTHON, f"./{ENV_ALIAS}/bin/python")
    if driver_here:
        out.setdefault(DRIVER_PYTHON, python)
        if out.get(PYTHON, "").startswith(f"./{ENV_ALIAS}/"):
            # One Python path serves executors and the driver's Python workers alike.
            return {ENV_ALIAS: str(Path(python).parent.parent)}
    return {}


def _set_env(
    out: dict[str, str],
    local_env: dict[str, str],
    env: Mapping[str, str],
    *,
    kind: str,
    driver_here: bool,
    master: str,
) -> None:
    """Pass ``env`` to the executors, then to the driver wherever it runs.

    :raises KappaConfigError: a cluster-mode driver on a master with no way to pass it.
    """
    for key, value in env.items():
        out.setdefault(f"spark.executorEnv.{key}", value)
        if driver_here:
            local_env[key] = value
        elif kind == "yarn":
            out.setdefault(f"spark.yarn.appMasterEnv.{key}", value)
        elif kind == "kubernetes":
            out.setdefault(f"spark.kubernetes.driverEnv.{key}", value)
        else:
            raise KappaConfigError(
                f"job.env: master {master!r} in cluster deploy mode has no way to pass the driver's environment; "
                "allowed: a YARN or Kubernetes master, or client deploy mode"
            )


def _ship_catalogs(out: dict[str, str], conf: Mapping[str, str], kind: str) -> list[str]:
    """Add the catalogs file to ``spark.files`` wherever the driver or executors are not this machine;
    returns what was shipped."""
    catalogs = conf.get(CATALOGS_FILE)
    if catalogs and kind != "local" and conf.get(CATALOGS_SHIP, "true").lower() != "false":
        out["spark.files"] = _join(out.get("spark.files"), catalogs)
        return [catalogs]
    return []


def _event_log(out: dict[str, str], user: Mapping[str, str], conf: Mapping[str, str]) -> tuple[str | None, bool]:
    """Event logs: the user's folder when set, else kappa's private one (plain JSON lines, one file).
    Returns the folder the run's event log goes to (if any) and whether it is the user's."""
    if EVENT_LOG_DIR in user:
        if PROGRESS_DIR in conf:
            out[EVENT_LOG_ENABLED] = "true"  # the slice's progress is read from it
            out.setdefault(EVENT_LOG_COMPRESS, "false")  # Spark 4 compresses by default; readable without a codec
        if out.get(EVENT_LOG_ENABLED, "false").lower() == "true":
            return user[EVENT_LOG_DIR], True
        return None, True
    if PROGRESS_DIR in conf:
        out.update(private_event_log(conf[PROGRESS_DIR]))
        return conf[PROGRESS_DIR], False
    if out.get(EVENT_LOG_ENABLED, "false").lower() == "true":
        return "file:/tmp/spark-events", True  # Spark's default folder
    return None, False


_SEPARATOR = re.compile(r"(?<!\\)[=:\s]")


def parse_spark_defaults(text: str) -> dict[str, str]:
    """Entries of a ``spark-defaults.conf`` (Java properties: ``key value``, ``key=value`` or ``key:value``;
    ``#``/``!`` comments; a trailing backslash continues the line).

    :param text: the file's content.
    """
    out: dict[str, str] = {}
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.lstrip()
        if not pending and (not line or line[0] in "#!"):
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending += line[:-1]
            continue
        logical.append(pending + line)
        pending = ""
    if pending:
        logical.append(pending)
    for line in logical:
        match = _SEPARATOR.search(line)
        if match is None:
            key, value = line, ""
        else:
            key, value = line[: match.start()], line[match.end() :].lstrip()
            if match.group() not in "=:" and value[:1] in "=:":
                value = value[1:].lstrip()
        key = key.replace("\\", "")
        out[key.strip()] = value.strip().replace("\\n", "\n").replace("\\\\", "\\")
    return out


def spark_defaults_path(environ: Mapping[str, str] | None = None, home: Path | None = None) -> Path | None:
    """The ``spark-defaults.conf`` spark-submit would read: ``$SPARK_CONF_DIR``, else ``<Spark home>/conf``.

    :param environ: the environment (default ``os.environ``).
    :param home: the Spark home (default: ``$SPARK_HOME``, else the pyspark package).
    """
    environ = os.environ if environ is None else environ
    if environ.get("SPARK_CONF_DIR"):
        return Path(environ["SPARK_CONF_DIR"]) / "spark-defaults.conf"
    if home is None:
        home = spark_home()
    return home / "conf" / "spark-defaults.conf" if home else None


def read_spark_defaults(path: Path | None) -> dict[str, str]:
    """The platform's spark-defaults entries; empty when there is no such file.

    :param path: from :func:`spark_defaults_path`.
    :raises KappaConfigError: the file exists but cannot be read.
    """
    if path is None or not path.is_file():
        return {}
    try:
        return parse_spark_defaults(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise KappaConfigError(f"spark-defaults: {str(path)!r} cannot be read: {e}") from e
