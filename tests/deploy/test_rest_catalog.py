"""A backfill whose lake is an Iceberg REST catalog (Apache Iceberg's own REST catalog test server on
127.0.0.1, :mod:`servers.rest_catalog`), given to kappa as an Airflow Iceberg connection.

kappa.yaml names the catalog ``{conn_id: kappa_rest_lake}``; the connection (type ``iceberg``, its host
the server's URI, the shared ``file://`` warehouse in its extra) is read through the Iceberg provider's
IcebergHook, in the backfill's process and, through the run's catalogs file, by every slice's Spark
driver. The run is ``kappa backfill`` (one slice on the default engine, connect: the local Spark Connect
server it starts and stops), and the published
window must equal an independent oracle of the job, row for row.
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlparse

import airflow_env  # noqa: F401  (sets AIRFLOW_HOME before Airflow is imported)
import pytest
from airflow_env import write_job_config
from lake import INCIDENT_END, INCIDENT_START, seed_sessions_incident, sessions_arrow, sorted_rows
from servers.processes import listening_ports  # /proc/net/tcp* of a server's process group
from servers.rest_catalog import RestCatalogServer, rest_catalog  # noqa: F401  (module-scoped server)

SOURCE = "raw.playbacks"
TARGET = "prod.playback_sessions"
CONN_ID = "kappa_rest_lake"


def test_a_backfill_through_a_rest_catalog_from_an_airflow_connection_is_exact(
    rest_catalog: RestCatalogServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    import pyarrow as pa
    from pyiceberg.catalog import load_catalog

    from airflow_provider_kappa.cli import main
    from airflow_provider_kappa.job.catalogs import job_catalog_properties
    from airflow_provider_kappa.job.config import load_config

    connection = {
        "conn_type": "iceberg",
        "host": rest_catalog.uri,
        "extra": {"warehouse": rest_catalog.warehouse.as_uri()},
    }
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(connection))
    client = load_catalog("lake", **rest_catalog.properties())
    oracle = seed_sessions_incident(client, SOURCE, TARGET)
    expected = sorted_rows(pa.Table.from_pylist(oracle, schema=sessions_arrow()))
    before = client.load_table(TARGET)
    assert sorted_rows(before) != expected  # the incident: the window is wrong
    config = write_job_config(tmp_path, {"conn_id": CONN_ID})
    # the catalog kappa resolves is the connection's REST catalog (IcebergHook), not a file of its own
    props = job_catalog_properties(load_config(config), "lake")
    assert (props["type"], props["uri"]) == ("rest", rest_catalog.uri)

    # one slice (one Spark Connect session): 195min is the one grid (multiples of the slice since the epoch)
    # whose single cell holds the whole read range [00:30, 03:45)
    code = main(
        [
            "backfill",
            "--config",
            str(config),
            "--start",
            INCIDENT_START.isoformat(),
            "--end",
            INCIDENT_END.isoformat(),
            "--slice",
            "195min",
            "--warmup",
            "30min",
            "--tail",
            "45min",
            "--max-misalignment",
            "1h",
        ]
    )
    assert code == 0
    target = client.load_table(TARGET)
    assert sorted_rows(target) == expected
    # the backfill went through the server: its tag on the source and its publish on the target are
    # in the metadata the REST catalog serves, written under the shared warehouse
    assert any(ref.startswith("kappa-") for ref in client.load_table(SOURCE).metadata.refs)
    assert target.current_snapshot().snapshot_id != before.current_snapshot().snapshot_id
    assert urlparse(target.metadata_location).path.startswith(f"{rest_catalog.warehouse}/prod/")


def test_the_rest_catalog_listens_on_loopback_only(rest_catalog: RestCatalogServer) -> None:  # noqa: F811
    # upstream's RESTCatalogServer binds every interface; kappa's launcher binds 127.0.0.1
    listening = listening_ports([rest_catalog.process.pid])
    assert list(listening) == [rest_catalog.port], listening
    assert all(addr.startswith(("127.", "::ffff:127.")) for addr in listening.values()), listening
