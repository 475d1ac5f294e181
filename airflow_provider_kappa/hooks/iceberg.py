"""The Iceberg catalogs of a job, for Airflow tasks.

A catalog of kappa.yaml is either inline pyiceberg properties or ``{conn_id: ...}``: an
Airflow connection read through the Iceberg provider's ``IcebergHook``. Properties are used
in this process and written only to a slice run's 0600 catalogs file; this hook never logs
them and never returns them through XCom.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook

from airflow_provider_kappa.backfill.config import JobConfig, load_config

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

    from airflow_provider_kappa.backfill.steps import CatalogFor


class KappaIcebergHook(BaseHook):
    """Opens the catalogs and tables a kappa.yaml names.

    :param config_path: path of the job's kappa.yaml (or pass ``config``).
    :param config: an already loaded job config.
    """

    hook_name = "Kappa Iceberg catalogs"

    def __init__(self, config_path: str | None = None, *, config: JobConfig | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if config is None and config_path is None:
            raise ValueError("KappaIcebergHook: give config_path (a kappa.yaml) or config")
        self.config_path = config_path
        self._config = config

    @cached_property
    def config(self) -> JobConfig:
        """The job config."""
        if self._config is not None:
            return self._config
        assert self.config_path is not None
        return load_config(self.config_path)

    def get_conn(self) -> CatalogFor:
        """A loader of the job's catalogs by name (cached per process)."""
        from airflow_provider_kappa.backfill.steps import job_catalogs

        return job_catalogs(self.config)

    def catalog(self, name: str) -> Catalog:
        """The pyiceberg catalog called ``name`` in ``catalogs:``.

        :param name: a catalog name.
        """
        return self.get_conn()(name)

    def table(self, catalog: str, identifier: str) -> Table:
        """Load table ``identifier`` of catalog ``catalog``, or raise naming both.

        :param catalog: a catalog name.
        :param identifier: ``namespace.table``.
        """
        from airflow_provider_kappa.spark.catalog import load_table

        return load_table(self.catalog(catalog), identifier)
