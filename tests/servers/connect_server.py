"""One Spark Connect server for the tests that can share it (session scope), started from this
venv's pyspark by kappa's own :class:`~airflow_provider_kappa.engine.connect_server.LocalConnectServer`
and stopped by its pid (its process group) at the end of the session."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

#: The server's conf: what the tests' spark-submit runs get in job.spark_conf, minus session keys.
SERVER_CONF = {"spark.ui.enabled": "false", "spark.python.authenticate.socketTimeout": "120s"}


@pytest.fixture(scope="session")
def connect_server() -> Iterator[object]:
    """A running :class:`~airflow_provider_kappa.engine.connect_server.LocalConnectServer` on 127.0.0.1
    (``.url`` is its ``sc://`` URL), ``local[2]``."""
    from airflow_provider_kappa.engine.connect_server import LocalConnectServer

    work = Path(tempfile.mkdtemp(prefix="kappa-test-connect-"))
    server = LocalConnectServer(None, work, master="local[2]", conf=SERVER_CONF)
    server.start()
    try:
        yield server
    finally:
        server.stop()
