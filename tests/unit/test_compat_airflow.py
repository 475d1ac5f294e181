"""compat/airflow.py: the Airflow names Airflow 3.1 keeps outside ``airflow.sdk`` come from one place,
are the installed Airflow's own classes, and nothing under ``spark/`` imports that module."""

from __future__ import annotations

import ast

import airflow_env  # noqa: F401  (a private AIRFLOW_HOME before Airflow is imported)
import pytest
from paths import PACKAGE

NAMES = (
    "AirflowException",
    "AirflowFailException",
    "AirflowRescheduleException",
    "AirflowSkipException",
    "BaseBranchOperator",
    "CronDataIntervalTimetable",
    "DeltaDataIntervalTimetable",
    "conf",
)


@pytest.mark.airflow
def test_every_name_is_the_installed_airflows_own() -> None:
    from airflow_provider_kappa.compat import airflow as compat_airflow

    assert sorted(compat_airflow.__all__) == sorted(NAMES)
    for name in NAMES:
        value = getattr(compat_airflow, name)
        module = getattr(value, "__module__", type(value).__module__)
        assert module.split(".")[0] == "airflow", f"{name} comes from {module}, not Airflow"
    assert issubclass(compat_airflow.AirflowFailException, compat_airflow.AirflowException)
    assert issubclass(compat_airflow.AirflowSkipException, compat_airflow.AirflowException)


@pytest.mark.airflow
def test_the_operators_raise_the_adapters_exceptions() -> None:
    import airflow_provider_kappa.operators as operators
    from airflow_provider_kappa.compat.airflow import AirflowFailException

    assert operators.AirflowFailException is AirflowFailException


def test_nothing_under_spark_imports_it() -> None:
    offenders = []
    for path in (PACKAGE / "spark").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            if any(n.endswith("compat.airflow") or n.split(".")[0] == "airflow" for n in names):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not offenders, offenders
