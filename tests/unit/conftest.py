"""The fast tier: a test here that asks for Spark or an Airflow metadata DB is an error."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark() -> None:
    raise pytest.UsageError("tests/unit is the fast tier: no Spark here (move the test to tests/integration)")


@pytest.fixture(scope="session")
def airflow_db() -> None:
    raise pytest.UsageError("tests/unit is the fast tier: no Airflow metadata DB (move the test to tests/integration)")
