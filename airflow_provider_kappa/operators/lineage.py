"""OpenLineage of the backfill operators: datasets of Iceberg tables, and the parent job
information a slice run gives Spark.

The OpenLineage provider (``apache-airflow-providers-openlineage``, the ``[openlineage]``
extra) is imported only inside the functions that need it, when its listener asks an operator
for its lineage or when a slice builds its Spark conf: the operators work without it.

Datasets follow OpenLineage's naming for table formats (as its Spark integration names Iceberg
tables): the table's location is the dataset, ``namespace`` its storage (``file`` for a local
path, ``s3://bucket``, ``hdfs://host:port``, …) and ``name`` the path; the catalog's identifier
of the table is a ``symlinks`` facet (``type: TABLE``, namespace the catalog's ``uri``, else
its ``warehouse``, else ``iceberg://<catalog>``; user and password removed). Facets: ``catalog``
(framework ``iceberg``, the catalog's type and name), ``storage`` (layer ``iceberg``, file
format), ``schema``, and ``version``: the snapshot id (a source at its pinned snapshot, a target
at the snapshot its publish committed). Nothing of a catalog's credentials goes into an event.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from airflow_provider_kappa.redact import uri_location, without_userinfo
from airflow_provider_kappa.spark.catalog import load_table

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_kappa.backfill.backfill import Backfill

#: Schemes whose dataset name is the path with its leading ``/`` (file systems); for the
#: others (object stores: ``s3``, ``gs``, ``abfss``, …) the name is the object key, without it.
_PATH_SCHEMES = ("file", "hdfs", "viewfs", "dbfs")


@dataclass(frozen=True)
class TableRef:
    """One Iceberg table an operator read or wrote.

    :param catalog: the catalog's name under ``catalogs:`` of kappa.yaml.
    :param table: ``namespace.table``.
    :param snapshot_id: the snapshot read (a pinned source) or committed (a published target).
    """

    catalog: str
    table: str
    snapshot_id: int | None = None


@dataclass(frozen=True)
class Lineage:
    """What an operator read and wrote, kept by ``execute`` for the OpenLineage listener.

    :param backfill: the backfill (its catalogs open the tables).
    :param inputs: tables read.
    :param outputs: tables written.
    """

    backfill: Backfill
    inputs: tuple[TableRef, ...] = ()
    outputs: tuple[TableRef, ...] = ()


def source_tables(bf: Backfill, snapshot_ids: Mapping[str, int]) -> tuple[TableRef, ...]:
    """The backfill's source tables at their pinned snapshots (one per concrete source).

    :param bf: the backfill.
    :param snapshot_ids: concrete source name -> pinned snapshot id.
    """
    concrete = {src.name: src for src in bf.sources().values()}
    return tuple(TableRef(s.catalog, s.table, snapshot_ids.get(name)) for name, s in concrete.items())


def target_tables(bf: Backfill, snapshot_ids: Mapping[str, int | None] | None = None) -> tuple[TableRef, ...]:
    """The job's target tables, one per sink.

    :param bf: the backfill.
    :param snapshot_ids: sink name -> the snapshot its publish committed.
    """
    ids = snapshot_ids or {}
    return tuple(TableRef(sink.catalog, sink.table, ids.get(name)) for name, sink in bf.cfg.sinks.items())


def staging_tables(bf: Backfill, slice_id: str) -> tuple[TableRef, ...]:
    """The staging tables one slice writes, one per sink.

    :param bf: the backfill.
    :param slice_id: the slice.
    """
    return tuple(TableRef(sink.catalog, bf.staging_table(sink, slice_id)) for sink in bf.cfg.sinks.values())


def location_dataset(location: str) -> tuple[str, str]:
    """``(namespace, name)`` of the data at ``location`` by OpenLineage's naming: a local path
    is ``("file", "/path")``, ``s3://bucket/key`` is ``("s3://bucket", "key")``,
    ``hdfs://nn:8020/path`` is ``("hdfs://nn:8020", "/path")``.

    :param location: a table's location (a URI, or a local path).
    """
    parts = urlsplit(without_userinfo(location))
    scheme = parts.scheme.lower()
    if not scheme or scheme == "file":
        path = (parts.path if scheme else location).rstrip("/") or "/"
        return ("file://" + parts.netloc if parts.netloc else "file"), path
    path = parts.path.rstrip("/")
    if scheme not in _PATH_SCHEMES:
        path = path.lstrip("/")
    return f"{scheme}://{parts.netloc}", path


def catalog_namespace(catalog: str, properties: Mapping[str, str]) -> str:
    """The namespace of the catalog's own identifier of a table (the ``symlinks`` facet).

    :param catalog: the catalog's name.
    :param properties: its pyiceberg properties (only ``uri`` and ``warehouse`` are read).
    """
    for key in ("uri", "warehouse"):
        if properties.get(key):
            return uri_location(str(properties[key]))
    return f"iceberg://{catalog}"


def table_dataset(bf: Backfill, ref: TableRef, output: bool) -> Any:
    """The OpenLineage input or output dataset of ``ref`` (loads the table: its location,
    schema and format).

    :param bf: the backfill (its catalogs).
    :param ref: the table.
    :param output: an ``OutputDataset`` rather than an ``InputDataset``.
    """
    from airflow.providers.common.compat.openlineage.facet import (
        Identifier,
        InputDataset,
        OutputDataset,
        SchemaDatasetFacet,
        SchemaDatasetFacetFields,
        SymlinksDatasetFacet,
    )
    from openlineage.client.generated.catalog_dataset import CatalogDatasetFacet
    from openlineage.client.generated.dataset_version_dataset import DatasetVersionDatasetFacet
    from openlineage.client.generated.storage_dataset import StorageDatasetFacet

    catalog = bf.catalog_for(ref.catalog)
    table = load_table(catalog, ref.table)
    properties = {k: str(v) for k, v in catalog.properties.items() if k in ("uri", "warehouse", "type")}
    namespace, name = location_dataset(table.location())
    kind = properties.get("type") or type(catalog).__name__.removesuffix("Catalog").lower()
    facets: dict[str, Any] = {
        "symlinks": SymlinksDatasetFacet(
            identifiers=[Identifier(namespace=catalog_namespace(ref.catalog, properties), name=ref.table, type="TABLE")]
        ),
        "catalog": CatalogDatasetFacet(
            framework="iceberg",
            type=kind,
            name=ref.catalog,
            metadataUri=uri_location(properties["uri"]) if properties.get("uri") else None,
            warehouseUri=uri_location(properties["warehouse"]) if properties.get("warehouse") else None,
        ),
        "storage": StorageDatasetFacet(
            storageLayer="iceberg", fileFormat=str(table.properties.get("write.format.default", "parquet")).lower()
        ),
        "schema": SchemaDatasetFacet(
            fields=[SchemaDatasetFacetFields(name=f.name, type=str(f.field_type)) for f in table.schema().fields]
        ),
    }
    if ref.snapshot_id is not None:
        facets["version"] = DatasetVersionDatasetFacet(datasetVersion=str(ref.snapshot_id))
    cls = OutputDataset if output else InputDataset
    return cls(namespace=namespace, name=name, facets=facets)


def operator_lineage(lineage: Lineage | None) -> Any:
    """The ``OperatorLineage`` of what an operator kept (empty when it kept nothing: it failed
    before it read anything).

    :param lineage: kept by the operator's ``execute``.
    """
    from airflow.providers.openlineage.extractors import OperatorLineage

    if lineage is None:
        return OperatorLineage()
    bf = lineage.backfill
    return OperatorLineage(
        inputs=[table_dataset(bf, ref, output=False) for ref in lineage.inputs],
        outputs=[table_dataset(bf, ref, output=True) for ref in lineage.outputs],
    )


class KappaLineageMixin:
    """``get_openlineage_facets_on_complete`` for a backfill operator: the tables its
    ``execute`` kept in ``kappa_lineage``. Mixed in before the operator's base class."""

    kappa_lineage: Lineage | None = None

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The OpenLineage provider's ``OperatorLineage`` of this task's run: inputs and outputs
        with their snapshot ids (see :mod:`airflow_provider_kappa.operators.lineage`).

        :param task_instance: the finished task instance (unused: ``execute`` kept the tables).
        """
        return operator_lineage(self.kappa_lineage)


def openlineage_enabled() -> bool:
    """Whether the OpenLineage provider is installed and configured (a transport is set and it
    is not disabled)."""
    try:
        from airflow.providers.openlineage.conf import is_disabled
    except ImportError:
        return False
    return not is_disabled()


def parent_job_conf(context: Context, spark_conf: Mapping[str, str]) -> dict[str, str]:
    """The ``spark.openlineage.*`` keys that name this task's run as the parent job of the Spark
    application it launches (the Spark provider's helper,
    ``inject_parent_job_information_into_spark_properties``); ``{}`` when OpenLineage is not
    installed or not configured, or when ``spark_conf`` (the job's own) already names a parent.

    :param context: the task's context.
    :param spark_conf: the job's ``spark_conf``.
    """
    if not openlineage_enabled():
        return {}
    from airflow.providers.common.compat.openlineage.utils.spark import (
        inject_parent_job_information_into_spark_properties,
    )

    injected = inject_parent_job_information_into_spark_properties(dict(spark_conf), context)
    return {str(k): str(v) for k, v in injected.items() if k not in spark_conf}
