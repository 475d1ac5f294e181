"""What a spark-submit gets per master and deploy mode (engine/submit_args.py): from a real kappa.yaml's
live conf, the platform's spark-defaults, the master and the deploy mode to the properties and the
spark-submit process's environment. No Spark: the function is pure."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_provider_kappa.engine.launch import live_conf, write_catalogs_file
from airflow_provider_kappa.engine.progress import PROGRESS_DIR, event_log_conf
from airflow_provider_kappa.engine.submit_args import (
    SubmitArgs,
    parse_spark_defaults,
    read_spark_defaults,
    spark_defaults_path,
    submit_args,
)
from airflow_provider_kappa.exceptions import KappaConfigError
from airflow_provider_kappa.job.config import load_config

PY = "/opt/airflow/venv/bin/python"  # the Airflow worker's interpreter
VENV_BIN = "/opt/airflow/venv/bin"
ENVIRON = {"PATH": "/usr/bin"}
DEFAULTS = {
    "spark.eventLog.enabled": "true",
    "spark.eventLog.dir": "hdfs:///spark-history",
    "spark.files": "hdfs:///platform/log4j2.properties",
    "spark.executor.memory": "4g",
    "spark.sql.shuffle.partitions": "200",
}

JOB: dict[str, Any] = {
    "job": {
        "name": "rmi",
        "application": "job.py",
        "checkpoint_root": "/ckpt",
        "spark_conf": {"spark.sql.shuffle.partitions": "8"},
    },
    "catalogs": {
        "lake": {"type": "sql", "uri": "sqlite:////tmp/c.db", "warehouse": "file:///tmp/w", "credential": "s3cr3t"}
    },
    "sources": {
        "impressions": {
            "type": "iceberg",
            "catalog": "lake",
            "table": "raw.impressions",
            "ingestion_column": "ingestion_ts",
        }
    },
    "sinks": {
        "summary": {"type": "iceberg", "catalog": "lake", "table": "prod.summary", "time_column": "window_start"}
    },
}


def run_conf(tmp_path: Path, **job: Any) -> dict[str, str]:
    """The live conf of a kappa.yaml whose ``job:`` has ``job`` added, with kappa's progress folder."""
    raw = copy.deepcopy(JOB)
    raw["job"].update(job)
    (tmp_path / "job.py").write_text("")
    path = tmp_path / "kappa.yaml"
    path.write_text(yaml.safe_dump(raw))
    cfg = load_config(path)
    catalogs = write_catalogs_file(cfg, tmp_path / "private" / "catalogs.json")
    return {**live_conf(cfg, catalogs), **event_log_conf(tmp_path / "private" / "events")}


def args_for(conf: dict[str, str], master: str, deploy_mode: str | None = None, **kw: Any) -> SubmitArgs:
    kw.setdefault("defaults", DEFAULTS)
    return submit_args(
        conf, master=master, deploy_mode=deploy_mode, python=PY, environ=ENVIRON, venv_bin=VENV_BIN, **kw
    )


def no_secret(args: SubmitArgs) -> None:
    text = repr(args)
    assert "s3cr3t" not in text, "a catalog credential reached the spark-submit conf or environment"
    assert not any(
        k.startswith("spark.kappa.submit.") or k in (PROGRESS_DIR, "spark.kappa.catalogs.ship") for k in args.conf
    )


def test_local_master_runs_this_interpreter_and_keeps_the_platform_defaults(tmp_path: Path) -> None:
    conf = run_conf(tmp_path)
    args = args_for(conf, "local[*]", defaults={})
    assert args.deploy_mode == "client"
    assert args.conf["spark.pyspark.python"] == args.conf["spark.pyspark.driver.python"] == PY
    assert args.local_env == {
        "PATH": f"{VENV_BIN}:/usr/bin",
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": PY,
        "PYSPARK_DRIVER_PYTHON": PY,
    }
    assert "spark.files" not in args.conf  # a local driver reads the catalogs file where it is
    events = conf[PROGRESS_DIR]
    assert (args.event_log_dir, args.user_event_log) == (events, False)
    assert {k: args.conf[k] for k in ("spark.eventLog.enabled", "spark.eventLog.dir", "spark.eventLog.compress")} == {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": events,
        "spark.eventLog.compress": "false",
    }
    no_secret(args)


def test_spark_defaults_are_merged_under_the_job_conf_and_list_keys_joined(tmp_path: Path) -> None:
    conf = run_conf(tmp_path)
    args = args_for(conf, "spark://10.0.0.5:7077")
    assert args.conf["spark.executor.memory"] == "4g"  # only in spark-defaults: kept
    assert args.conf["spark.sql.shuffle.partitions"] == "8"  # job.spark_conf wins over spark-defaults
    catalogs = conf["spark.kappa.catalogs.file"]
    assert args.conf["spark.files"] == f"hdfs:///platform/log4j2.properties,{catalogs}"  # joined, not replaced
    assert args.shipped == [catalogs]
    # the user's event log folder is kept, and read back by run id
    assert args.conf["spark.eventLog.dir"] == "hdfs:///spark-history"
    assert (args.event_log_dir, args.user_event_log) == ("hdfs:///spark-history", True)
    assert args.conf["spark.eventLog.compress"] == "false"
    no_secret(args)


def test_standalone_client_driver_here_executors_on_the_platform_python(tmp_path: Path) -> None:
    args = args_for(run_conf(tmp_path), "spark://10.0.0.5:7077")
    assert args.deploy_mode == "client"
    assert args.conf["spark.pyspark.driver.python"] == PY
    assert "spark.pyspark.python" not in args.conf  # not forced to this machine's path
    assert "SPARK_LOCAL_IP" not in args.local_env  # the driver must be reachable from the executors


def test_users_python_wins_on_every_mode(tmp_path: Path) -> None:
    conf = run_conf(
        tmp_path,
        spark_conf={"spark.pyspark.python": "/opt/py/bin/python3", "spark.pyspark.driver.python": "/usr/bin/python3"},
    )
    for master, mode in (
        ("local[2]", None),
        ("spark://h:7077", "client"),
        ("yarn", "cluster"),
        ("k8s://https://k:6443", "cluster"),
    ):
        args = args_for(conf, master, mode)
        assert (args.conf["spark.pyspark.python"], args.conf["spark.pyspark.driver.python"]) == (
            "/opt/py/bin/python3",
            "/usr/bin/python3",
        ), master


def test_packed_venv_goes_through_spark_archives(tmp_path: Path) -> None:
    conf = run_conf(tmp_path, python_archive="envs/kappa-env.tar.gz", deploy_mode="client")
    archive = str((tmp_path / "envs" / "kappa-env.tar.gz").resolve())
    client = args_for(conf, "spark://h:7077")
    assert client.conf["spark.archives"] == f"{archive}#kappa_env"
    assert client.conf["spark.pyspark.python"] == "./kappa_env/bin/python"  # executors: the unpacked venv
    assert client.conf["spark.pyspark.driver.python"] == PY  # the driver runs here
    # the driver's own Python workers (a data source's planner) take the same relative path: there it
    # is a link, in the driver's working directory, to this interpreter's environment
    assert client.driver_links == {"kappa_env": "/opt/airflow/venv"}
    cluster = args_for(conf, "yarn", "cluster")  # the deploy mode the hook resolved wins over job.deploy_mode
    assert cluster.conf["spark.pyspark.python"] == "./kappa_env/bin/python"
    assert "spark.pyspark.driver.python" not in cluster.conf  # the driver runs in the cluster, from the archive too
    assert cluster.driver_links == {}
    assert cluster.conf["spark.submit.deployMode"] == "cluster"


def test_yarn_cluster_environment_goes_to_the_application_master_and_executors(tmp_path: Path) -> None:
    conf = run_conf(tmp_path, env={"AWS_REGION": "eu-west-1"}, deploy_mode="cluster")
    args = args_for(conf, "yarn")
    assert args.deploy_mode == "cluster"
    assert args.conf["spark.yarn.appMasterEnv.AWS_REGION"] == "eu-west-1"
    assert args.conf["spark.executorEnv.AWS_REGION"] == "eu-west-1"
    assert "AWS_REGION" not in args.local_env
    assert args.conf["spark.files"].endswith(
        conf["spark.kappa.catalogs.file"]
    )  # read through SparkFiles / the container's cwd
    no_secret(args)


def test_kubernetes_cluster_environment_goes_to_the_driver_pod(tmp_path: Path) -> None:
    args = args_for(run_conf(tmp_path, env={"AWS_REGION": "eu-west-1"}), "k8s://https://k:6443", "cluster")
    assert args.conf["spark.kubernetes.driverEnv.AWS_REGION"] == "eu-west-1"
    assert args.conf["spark.executorEnv.AWS_REGION"] == "eu-west-1"
    assert not any(k.startswith("spark.yarn.") for k in args.conf)


@pytest.mark.parametrize("master", ["k8s://https://k:6443", "yarn", "spark://h:7077", "local[*]"])
def test_client_mode_environment_is_the_spark_submit_process(tmp_path: Path, master: str) -> None:
    args = args_for(run_conf(tmp_path, env={"AWS_REGION": "eu-west-1"}), master, "client")
    assert args.local_env["AWS_REGION"] == "eu-west-1"  # the driver is the spark-submit's child here
    assert args.conf["spark.executorEnv.AWS_REGION"] == "eu-west-1"
    assert not any(k.startswith(("spark.yarn.appMasterEnv.", "spark.kubernetes.driverEnv.")) for k in args.conf)


def test_a_configured_catalogs_file_is_read_where_it_is(tmp_path: Path) -> None:
    conf = run_conf(tmp_path, catalogs_file="/mnt/secrets/kappa/catalogs.json")
    assert conf["spark.kappa.catalogs.file"] == "/mnt/secrets/kappa/catalogs.json"
    assert not (tmp_path / "private" / "catalogs.json").exists()  # kappa wrote no copy
    args = args_for(conf, "k8s://https://k:6443", "cluster")
    assert args.shipped == [] and conf["spark.kappa.catalogs.file"] not in args.conf.get("spark.files", "")


def test_no_event_log_when_the_run_asks_for_no_progress(tmp_path: Path) -> None:
    conf = {k: v for k, v in run_conf(tmp_path).items() if k != PROGRESS_DIR}
    assert args_for(conf, "local[*]", defaults={}).event_log_dir is None


@pytest.mark.parametrize(
    ("master", "mode", "expected"),
    [
        ("local[*]", "cluster", "a local master runs in client mode only"),
        ("spark://h:7077", "cluster", "Spark runs Python applications on a standalone cluster in client mode only"),
        ("yarn", "both", "is not a deploy mode; allowed: ['client', 'cluster']"),
    ],
)
def test_deploy_modes_spark_refuses_are_refused_naming_them(
    tmp_path: Path, master: str, mode: str, expected: str
) -> None:
    with pytest.raises(KappaConfigError, match=expected.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        args_for(run_conf(tmp_path), master, mode)


def test_spark_defaults_file_format(tmp_path: Path) -> None:
    text = "# platform\n\nspark.master  yarn\nspark.a=1\nspark.b : two words\n! comment\nspark.c \\\n  continued\n"
    assert parse_spark_defaults(text) == {
        "spark.master": "yarn",
        "spark.a": "1",
        "spark.b": "two words",
        "spark.c": "continued",
    }
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(text)
    path = spark_defaults_path({"SPARK_CONF_DIR": str(conf_dir)})
    assert path == conf_dir / "spark-defaults.conf" and read_spark_defaults(path)["spark.a"] == "1"
    assert spark_defaults_path({}, home=tmp_path) == tmp_path / "conf" / "spark-defaults.conf"
    assert read_spark_defaults(tmp_path / "missing.conf") == {}


def test_job_deploy_mode_is_checked_when_the_config_loads(tmp_path: Path) -> None:
    with pytest.raises(
        KappaConfigError,
        match=r"job.deploy_mode: 'yarn-cluster' is not a deploy mode; allowed: \['client', 'cluster'\]",
    ):
        run_conf(tmp_path, deploy_mode="yarn-cluster")
    conf = run_conf(tmp_path, python_archive="hdfs:///apps/kappa-env.tar.gz", deploy_mode="cluster")
    assert conf["spark.kappa.submit.python_archive"] == "hdfs:///apps/kappa-env.tar.gz"  # a URL is kept as it is
    assert args_for(conf, "yarn").deploy_mode == "cluster"  # job.deploy_mode when the connection names none


def test_a_live_run_keeps_the_users_event_log_settings_as_they_are(tmp_path: Path) -> None:
    conf = {k: v for k, v in run_conf(tmp_path).items() if k != PROGRESS_DIR}  # kappa run: no progress read
    off = args_for(conf, "yarn", defaults={**DEFAULTS, "spark.eventLog.enabled": "false"})
    assert (off.conf["spark.eventLog.enabled"], off.event_log_dir) == ("false", None)
    on = args_for(conf, "yarn")
    assert (on.event_log_dir, on.user_event_log, "spark.eventLog.compress" in on.conf) == (
        "hdfs:///spark-history",
        True,
        False,
    )


@pytest.mark.airflow
@pytest.mark.parametrize("via_connection", [False, True])
def test_a_kubernetes_master_without_the_kubernetes_provider_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_kubernetes_provider: None, via_connection: bool
) -> None:
    """Airflow's Spark provider fails with ``NameError: kube_client`` here; kappa names the
    setting and the package instead, before spark-submit starts or its properties file is written."""
    from airflow_provider_kappa.engine.submit import submit

    app = tmp_path / "job.py"
    app.write_text("print('never runs')\n")
    props = tmp_path / "run.properties"
    master, conn_id = "k8s://https://127.0.0.1:6443", None
    if via_connection:
        conn_id = "spark_k8s"
        monkeypatch.setenv("AIRFLOW_CONN_SPARK_K8S", '{"conn_type": "spark", "host": "k8s://https://127.0.0.1:6443"}')
    with pytest.raises(KappaConfigError) as err:
        submit(app, {"spark.kappa.job": "j"}, properties_file=props, name="j", master=master, conn_id=conn_id)
    where = (
        "the master of Spark connection 'spark_k8s'" if via_connection else "job.master 'k8s://https://127.0.0.1:6443'"
    )
    assert str(err.value).startswith(where + " is a Kubernetes master (k8s://)")
    assert "pip install 'airflow-provider-kappa[kubernetes]'" in str(err.value)
    if via_connection:  # the master is known once the hook has read the connection: its NameError, translated
        assert isinstance(err.value.__cause__, NameError)
    assert not props.exists()
