"""The Iceberg catalogs of a job: a ``catalogs:`` entry of kappa.yaml -> pyiceberg properties
(:func:`job_catalog_properties`), and the job's loader of catalogs by name (:func:`job_catalogs`).

The one place the CLI, the operators and the launcher turn a catalog of the job into
properties or a Catalog. An entry is either inline pyiceberg properties, or
``{conn_id: ...}``: an Airflow connection read through
:class:`~airflow_provider_kappa.hooks.iceberg.KappaIcebergHook` (the Iceberg provider's
IcebergHook; Airflow is imported only then). Either way the catalog is opened under its
kappa.yaml name (pyiceberg's SqlCatalog keys its tables by that name), by
:func:`airflow_provider_kappa.spark.catalog.load_catalog`, cached per process.

Credentials: properties are used in this process and written only to a run's 0600 catalogs
file (:func:`airflow_provider_kappa.engine.launch.write_catalogs_file`); nothing here logs
them, and a catalog that cannot be loaded is reported with its secrets masked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from airflow_provider_kappa.job.config import JobConfig
from airflow_provider_kappa.spark.catalog import load_catalog

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

#: Opens a catalog of the job by its name under ``catalogs:``.
CatalogFor = Callable[[str], "Catalog"]

#: The Airflow connection of a ``{conn_id: ...}`` catalog without one (IcebergHook's default).
DEFAULT_CONN_ID = "iceberg_default"


def job_catalog_properties(cfg: JobConfig, name: str) -> dict[str, str]:
    """pyiceberg properties of catalog ``name``; a ``conn_id`` catalog asks Airflow's IcebergHook.

    :param cfg: the job config.
    :param name: a catalog name of ``catalogs:``.
    :raises KappaConfigError: ``name`` is not a catalog of the job.
    """
    cat = cfg.catalog(name)
    if cat.properties is not None:
        return dict(cat.properties)
    from airflow_provider_kappa.hooks.iceberg import KappaIcebergHook

    return KappaIcebergHook(iceberg_conn_id=cat.conn_id or DEFAULT_CONN_ID).catalog_properties()


def job_catalogs(cfg: JobConfig) -> CatalogFor:
    """A loader of the job's catalogs by name (``Backfill.catalog_for``): inline properties, or
    an Airflow connection (``conn_id``) through IcebergHook, opened by
    :func:`~airflow_provider_kappa.spark.catalog.load_catalog` (cached per process).

    The loader raises :class:`KappaConfigError` for an unknown catalog or a misconfigured one
    (permanent), :class:`KappaCatalogUnavailableError` for one that cannot be reached for now
    (transient: connection refused, a timeout, a 5xx answer, a locked sqlite file).

    :param cfg: the job config.
    """

    def catalog_for(name: str) -> Catalog:
        return load_catalog(name, job_catalog_properties(cfg, name))

    return catalog_for
