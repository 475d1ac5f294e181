"""The Spark provider adapter (``airflow_provider_kappa/compat/spark_provider.py``): the private attributes
of ``SparkSubmitHook`` it reads are still set by the installed provider, with what kappa expects in
them, on a real hook over an in-process Airflow connection. The stop that reads the running process is
tested end to end in test_cluster_kill.py; the Kubernetes check, public, agrees with the hook's own."""

from __future__ import annotations

import inspect
import json

import airflow_env  # noqa: F401  (a private AIRFLOW_HOME before Airflow is imported)
import pytest
from private_api import changed, require_attributes

from airflow_provider_kappa.compat.spark_provider import cluster_application, resolved_connection, submit_process
from airflow_provider_kappa.engine.submit_args import kubernetes_provider_installed

ATTRIBUTES = ("_connection", "_submit_sp", "_yarn_application_id", "_kubernetes_driver_pod", "_driver_id")
DIST = "apache-airflow-providers-apache-spark"


@pytest.mark.airflow
@pytest.mark.parametrize(
    ("extra", "deploy_mode", "expected"), [({}, None, None), ({"deploy-mode": "cluster"}, "client", "client")]
)
def test_the_installed_provider_keeps_what_kappa_reads_on_its_hook(
    monkeypatch: pytest.MonkeyPatch, extra: dict[str, str], deploy_mode: str | None, expected: str | None
) -> None:
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    monkeypatch.setenv("AIRFLOW_CONN_KAPPA_COMPAT", json.dumps({"conn_type": "spark", "host": "yarn", "extra": extra}))
    hook = SparkSubmitHook(conn_id="kappa_compat", name="kappa-compat", deploy_mode=deploy_mode)
    require_attributes(DIST, hook, "SparkSubmitHook()", ATTRIBUTES, "spark_provider")

    connection = resolved_connection(hook)
    if not isinstance(connection, dict) or connection.get("master") != "yarn" or "deploy_mode" not in connection:
        pytest.fail(changed(DIST, "SparkSubmitHook._connection", f"holds {connection!r}", "spark_provider"))
    assert connection["deploy_mode"] == expected  # the hook's argument wins over the connection's extra
    assert submit_process(hook) is None and cluster_application(hook) is None  # nothing submitted yet

    # kappa passes the spark-submit process's options (env, cwd, its own process group) through submit
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(hook.submit).parameters.values()):
        pytest.fail(
            changed(
                DIST,
                f"SparkSubmitHook.submit{inspect.signature(hook.submit)}",
                "takes no Popen options",
                "spark_provider",
            )
        )


@pytest.mark.airflow
def test_the_kubernetes_check_agrees_with_the_hook() -> None:
    """kappa asks the Kubernetes provider (public); the hook module holds ``kube_client`` exactly when
    that import worked for it."""
    import airflow.providers.apache.spark.hooks.spark_submit as spark_submit_hook

    assert kubernetes_provider_installed() == hasattr(spark_submit_hook, "kube_client")
