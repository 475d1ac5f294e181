"""An Iceberg catalog from an Airflow connection, for a kappa.yaml catalog given as ``{conn_id: ...}``.

A thin hook over the Iceberg provider's ``IcebergHook``: it reads the connection into pyiceberg
properties, and opens the catalog under the name kappa.yaml gives it (pyiceberg's SqlCatalog
keys its tables by that name; IcebergHook would name it after the connection). The backfill
steps use it through :mod:`airflow_provider_kappa.job.catalogs`; it knows nothing of them.

Properties (credentials included) are returned to the caller only: this hook never logs them,
and they never go to XCom.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook

from airflow_provider_kappa.spark.catalog import load_catalog

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog


class KappaIcebergHook(BaseHook):
    """The pyiceberg catalog of an Airflow Iceberg connection, opened under a kappa.yaml name.

    :param iceberg_conn_id: the Airflow connection (type ``iceberg``), read through IcebergHook.
    :param catalog_name: the catalog's name under kappa.yaml's ``catalogs:`` (default: the
        connection id).
    """

    hook_name = "Kappa Iceberg catalog"

    def __init__(
        self, iceberg_conn_id: str = "iceberg_default", catalog_name: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.iceberg_conn_id = iceberg_conn_id
        self.catalog_name = catalog_name or iceberg_conn_id

    def catalog_properties(self) -> dict[str, str]:
        """The connection's pyiceberg catalog properties (as the catalog IcebergHook opens has them)."""
        from airflow.providers.apache.iceberg.hooks.iceberg import IcebergHook

        catalog = IcebergHook(iceberg_conn_id=self.iceberg_conn_id).catalog
        return {k: str(v) for k, v in catalog.properties.items()}

    def get_conn(self) -> Catalog:
        """The catalog, named ``catalog_name`` (cached per process by its properties)."""

        return load_catalog(self.catalog_name, self.catalog_properties())
