"""One Spark Connect server for the tests that can share it (session scope), started from this
venv's pyspark by kappa's own :class:`~airflow_provider_kappa.engine.connect_server.LocalConnectServer`
and stopped by its pid (its process group) at the end of the session. The tests give it to kappa as
a configured server (``job.connect.url``): its ``url`` carries the server's token
(``sc://localhost:PORT/;token=...``), as a user's URL of a server with a token does."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

#: The server's conf: what the tests' spark-submit runs get in job.spark_conf, minus session keys.
SERVER_CONF = {"spark.ui.enabled": "false", "spark.python.authenticate.socketTimeout": "120s"}


class SharedServer:
    """The shared server as a given server: ``url`` with its token, the rest :class:`LocalConnectServer`'s."""

    def __init__(self, server: Any) -> None:
        self.server = server

    @property
    def url(self) -> str:
        """``sc://localhost:PORT/;token=...``."""
        return f"{self.server.url}/;token={self.server.token}"

    def __getattr__(self, name: str) -> Any:
        return getattr(self.server, name)


@pytest.fixture(scope="session")
def connect_server() -> Iterator[object]:
    """A running :class:`~airflow_provider_kappa.engine.connect_server.LocalConnectServer` on 127.0.0.1
    (``.url`` is its ``sc://`` URL with its token), ``local[2]``."""
    from airflow_provider_kappa.engine.connect_server import LocalConnectServer

    work = Path(tempfile.mkdtemp(prefix="kappa-test-connect-"))
    # maps the session's server class archive if one is there, never writes it: it would hold the
    # archive's lock for the whole session, so no kappa-owned server of the session would write one
    server = LocalConnectServer(None, work, master="local[2]", conf=SERVER_CONF, write_archive=False)
    server.start()
    try:
        yield SharedServer(server)
    finally:
        server.stop()
