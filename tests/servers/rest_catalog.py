"""An Iceberg REST catalog server for the tests: Apache Iceberg's own REST catalog test server (the code
behind the apache/iceberg-rest-fixture image), run from the Maven Central jars ``make install`` fetched
(``jvm/rest-catalog/``, ``jvm/fetch.sh``) through kappa's small launcher that binds it to 127.0.0.1.

Its backend is a JdbcCatalog on a sqlite file, its warehouse a local ``file://`` folder that the server
(metadata files) and the clients (pyiceberg writing data files, kappa's Spark source reading them) share.
Started by process id on a free loopback port, ready once ``GET /v1/config`` answers, stopped by that pid.
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from servers import ServerProcess, free_port
from servers.tmp_server import ready_or_stopped, server_in_tmp

#: The launcher's main class (jvm/rest-catalog/KappaRESTCatalogServer.java).
MAIN_CLASS = "org.apache.iceberg.rest.KappaRESTCatalogServer"


@dataclass
class RestCatalogServer:
    """A running REST catalog server.

    :param process: the JVM (leads its own process group).
    :param port: its port on 127.0.0.1.
    :param warehouse: the shared warehouse folder.
    """

    process: ServerProcess
    port: int
    warehouse: Path

    @property
    def uri(self) -> str:
        """``http://127.0.0.1:<port>``: the catalog's ``uri`` property."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        """The server's process id."""
        return self.process.pid

    def properties(self) -> dict[str, str]:
        """pyiceberg properties of a client of this server."""
        return {"type": "rest", "uri": self.uri, "warehouse": self.warehouse.as_uri()}

    def config(self) -> dict[str, Any]:
        """The server's answer to ``GET /v1/config``."""
        with urllib.request.urlopen(f"{self.uri}/v1/config", timeout=5) as resp:
            return dict(json.load(resp))

    def stop(self) -> None:
        """Stop the server by its process id."""
        self.process.stop()


def start_rest_catalog(work: Path, timeout: float = 90.0) -> RestCatalogServer:
    """Start a REST catalog server whose backend and warehouse live in ``work``.

    :param work: a fresh folder (``catalog.db``, ``warehouse/``, ``server.log``).
    :param timeout: seconds allowed until ``/v1/config`` answers.
    :raises DeploymentError: the server died or did not answer in time (with its log tail).
    """
    from airflow_provider_kappa.engine.jvm import artifact_jars

    classpath = ":".join(str(j) for j in artifact_jars("rest-catalog"))
    warehouse = work / "warehouse"
    warehouse.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {
        **os.environ,
        "REST_HOST": "127.0.0.1",
        "CATALOG_REST_PORT": str(port),
        "CATALOG_WAREHOUSE": warehouse.as_uri(),
        "CATALOG_URI": f"jdbc:sqlite:{work / 'catalog.db'}",
        "CATALOG_JDBC_USER": "kappa",
        "CATALOG_JDBC_PASSWORD": "kappa",
    }
    argv = ["java", "-Xmx256m", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", classpath, MAIN_CLASS]
    process = ServerProcess("iceberg-rest-catalog", argv, work / "server.log", env, cwd=work)
    server = RestCatalogServer(process, port, warehouse)
    return ready_or_stopped(
        server, lambda: "defaults" in server.config(), what=f"{server.uri}/v1/config", process=process, timeout=timeout
    )


@pytest.fixture(scope="module")
def rest_catalog() -> Iterator[RestCatalogServer]:
    """A REST catalog server shared by the tests of one module."""
    with server_in_tmp(
        "kappa-test-rest-", start_rest_catalog, lambda s: f"Iceberg REST catalog {s.uri} (pid {s.pid})"
    ) as server:
        yield server
