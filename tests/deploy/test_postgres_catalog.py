"""The concurrency tests again, on a PostgreSQL-backed pyiceberg SqlCatalog (a private cluster of
Debian's PostgreSQL started by the tests, :mod:`servers.postgres`), where concurrent writers really
run in parallel inside the database (sqlite serialises them on its file lock).

The test bodies are the fast tier's (sqlite) and the integration tier's own, imported here unchanged;
this module only overrides ``catalog_props`` and ``catalog`` so that each test gets a fresh database
of the shared cluster:

- two and more concurrent creators of the staging namespace (``tests/unit/test_namespace_race.py``):
  every staging table gets created, no ``IntegrityError`` leaks;
- backfills tagging the same source table at once (``tests/unit/test_snapshot_race.py``): every tag
  commits, a lost race is retried;
- two takers of overlapping backfill locks (``tests/integration/test_faults.py``, no Spark): a forced
  interleaving and free races, exactly one wins each time, the other is refused and leaves nothing.

And the fault classes of a PostgreSQL catalog: a server that cannot be reached is transient (the step
is retried), a database that does not exist is a configuration error (not retried).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from integration.test_faults import test_the_lock_check_and_set_is_atomic_under_a_forced_race  # noqa: F401
from servers import free_port
from servers.postgres import PostgresServer, postgres  # noqa: F401  (module-scoped cluster)
from servers.processes import listening_ports  # /proc/net/tcp* of a server's process group
from unit.test_namespace_race import test_concurrent_first_staging_tables_all_get_created  # noqa: F401
from unit.test_snapshot_race import test_concurrent_tags_of_one_table_all_commit  # noqa: F401

_databases = itertools.count()


@pytest.fixture()
def catalog_props(postgres: PostgresServer, lake_dir: Path) -> dict[str, str]:  # noqa: F811
    """pyiceberg properties of a SqlCatalog in a fresh PostgreSQL database (warehouse in ``lake_dir``)."""
    uri = postgres.create_database(f"lake_{next(_databases)}")
    return {"type": "sql", "uri": uri, "warehouse": f"file://{lake_dir}/warehouse"}


@pytest.fixture()
def catalog(catalog_props: dict[str, str]) -> Any:
    """A real pyiceberg SqlCatalog named ``lake`` on PostgreSQL."""
    from pyiceberg.catalog import load_catalog

    return load_catalog("lake", **catalog_props)


def test_the_catalog_of_these_tests_is_postgres(catalog: Any) -> None:
    assert catalog.engine.dialect.name == "postgresql"


def test_postgres_listens_on_loopback_only(postgres: PostgresServer) -> None:  # noqa: F811
    listening = listening_ports([postgres.process.pid])
    assert list(listening) == [postgres.port], listening
    assert all(addr.startswith(("127.", "::ffff:127.")) for addr in listening.values()), listening


def test_an_unreachable_postgres_is_transient_and_a_missing_database_is_not(
    postgres: PostgresServer, lake_dir: Path
) -> None:  # noqa: F811
    from airflow_provider_kappa.exceptions import KappaCatalogUnavailableError, KappaConfigError
    from airflow_provider_kappa.spark.catalog import load_catalog

    warehouse = f"file://{lake_dir}/warehouse"
    closed = f"postgresql+psycopg2://kappa@127.0.0.1:{free_port()}/lake"
    with pytest.raises(
        KappaCatalogUnavailableError, match="catalog 'lake' cannot be reached for now: .*Connection refused"
    ):
        load_catalog("lake", {"type": "sql", "uri": closed, "warehouse": warehouse})
    with pytest.raises(
        KappaConfigError, match="catalog 'lake' cannot be loaded: .*database \"no_such_db\" does not exist"
    ):
        load_catalog("lake", {"type": "sql", "uri": postgres.url("no_such_db"), "warehouse": warehouse})
