"""OpenLineage naming of Iceberg tables, credentials kept out of events, and operators that work
without the OpenLineage provider (it is imported only inside functions). The events themselves,
through the provider's real listener, are checked in tests/integration/test_lineage.py."""

from __future__ import annotations

import ast
import sys
from typing import Any

import pytest
from paths import PACKAGE

from airflow_provider_kappa.redact import uri_location

OPERATORS = PACKAGE / "operators"
#: the module's tests use Airflow (the operators package imports it): run on one xdist worker, and
#: collecting this module imports no Airflow (tests/unit/conftest.py)
pytestmark = pytest.mark.airflow


def lineage() -> Any:
    """``airflow_provider_kappa.operators.lineage``, imported when a test first needs it."""
    from airflow_provider_kappa.operators import lineage

    return lineage


@pytest.mark.parametrize(
    ("location", "dataset"),
    [
        ("file:///var/kappa/warehouse/raw.db/impressions", ("file", "/var/kappa/warehouse/raw.db/impressions")),
        ("/var/kappa/warehouse/raw.db/impressions/", ("file", "/var/kappa/warehouse/raw.db/impressions")),
        ("file://nas/share/wh/t", ("file://nas", "/share/wh/t")),
        ("s3://lake/warehouse/raw.db/impressions", ("s3://lake", "warehouse/raw.db/impressions")),
        ("s3a://key:secret@lake/wh/t", ("s3a://lake", "wh/t")),
        ("gs://lake/wh/t", ("gs://lake", "wh/t")),
        ("hdfs://namenode:8020/wh/t", ("hdfs://namenode:8020", "/wh/t")),
    ],
)
def test_a_table_is_named_by_its_location(location: str, dataset: tuple[str, str]) -> None:
    """OpenLineage's naming: namespace the storage (scheme and authority), name the path (an
    object store's key has no leading slash); user and password never kept."""
    assert lineage().location_dataset(location) == dataset


def test_a_catalog_identifier_carries_no_credentials() -> None:
    assert (
        uri_location("postgresql+psycopg2://kappa:pw@db:5432/catalog?sslpassword=x#f")
        == "postgresql+psycopg2://db:5432/catalog"
    )
    assert uri_location("sqlite:////var/kappa/catalog.db") == "sqlite:////var/kappa/catalog.db"
    assert uri_location("https://token@rest.example/api/catalog") == "https://rest.example/api/catalog"
    assert (
        lineage().catalog_namespace("lake", {"uri": "http://u:p@127.0.0.1:8181", "warehouse": "s3://w"})
        == "http://127.0.0.1:8181"
    )
    assert lineage().catalog_namespace("lake", {"warehouse": "s3://k:s@w/path"}) == "s3://w/path"
    assert lineage().catalog_namespace("glue_lake", {"type": "glue"}) == "iceberg://glue_lake"


@pytest.mark.parametrize("password", ["pa/ss", "pa?ss", "pa#ss", "pa@ss", "pa:ss", "p/?#@:w"])
def test_a_catalog_namespace_never_holds_a_password_sqlalchemy_takes_unencoded(password: str) -> None:
    """SQLAlchemy reads ``/ ? # @ :`` unencoded in a password; urlsplit cuts such a URL elsewhere."""
    uri = f"postgresql+psycopg2://kappa:{password}@db:5432/catalog"
    assert lineage().catalog_namespace("lake", {"uri": uri}) == "postgresql+psycopg2://db:5432/catalog"
    jdbc = f"jdbc:postgresql://db:5432/catalog?user=kappa&password={password}&ssl=true"
    assert lineage().catalog_namespace("lake", {"uri": jdbc}) == "jdbc:postgresql://db:5432/catalog"
    assert lineage().location_dataset(f"s3a://key:{password}@lake/wh/t") == ("s3a://lake", "wh/t")


def test_without_the_openlineage_provider_a_slice_gets_no_parent_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if ``apache-airflow-providers-openlineage`` were not installed (its import fails)."""
    for name in ("airflow.providers.openlineage", "airflow.providers.openlineage.conf"):
        monkeypatch.setitem(sys.modules, name, None)
    assert lineage().openlineage_enabled() is False
    assert lineage().parent_job_conf({}, {"spark.sql.shuffle.partitions": "8"}) == {}  # type: ignore[arg-type]  # the context is not read


@pytest.mark.parametrize("module", ["lineage.py", "snapshot.py", "slice_run.py", "publish.py"])
def test_operators_import_openlineage_only_inside_functions(module: str) -> None:
    tree = ast.parse((OPERATORS / module).read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = [a.name for n in top if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in top if isinstance(n, ast.ImportFrom)]
    assert not [m for m in names if "openlineage" in m], names
