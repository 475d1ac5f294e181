"""The tables a ``kappa_iceberg`` reader reads: loading the source's table or an aligned one,
and the stream's schema (what ``DataSource.schema()`` returns).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

from pyspark.sql.types import StructType

from airflow_provider_kappa.exceptions import KappaConfigError
from airflow_provider_kappa.spark.catalog import catalog_properties, load_catalog, load_table
from airflow_provider_kappa.spark.source import file_list
from airflow_provider_kappa.spark.source.options import BOUNDED, IcebergReadSpec
from airflow_provider_kappa.spark.source.schema import schema_to_spark
from airflow_provider_kappa.spark.source.snapshots import ingestion_field, resolve_snapshot, snapshot_schema

if TYPE_CHECKING:
    from pyiceberg.table import Table


def table_spark_schema(options: Mapping[str, str]) -> StructType:
    """The Spark schema of the table a ``kappa_iceberg`` reader is pointed at: the pinned
    snapshot's schema in bounded mode, the current schema in tail mode.

    :param options: the reader options.
    :raises KappaSourceError: missing table, unknown snapshot, bad ingestion column.
    """
    spec = IcebergReadSpec.from_options(options)
    if spec.plan_file is not None:
        files = file_list.read(spec.plan_file)
        files.check(spec.table, spec.snapshot_id, spec.ingestion_column, spec.read_start_micros, spec.read_end_micros)
        return StructType.fromJson(json.loads(files.spark_schema_json))
    table = load_source_table(spec.catalog, spec.table, options)
    snapshot = resolve_snapshot(table, spec.snapshot_id if spec.mode == BOUNDED else None)
    schema = snapshot_schema(table, snapshot)
    ingestion_field(schema, spec.ingestion_column, spec.table)
    return schema_to_spark(schema)


def load_source_table(
    catalog: str, identifier: str, options: Mapping[str, str], inline: Mapping[str, str] | None = None
) -> Table:
    """Load ``identifier`` from ``catalog``: the reader's own catalog, or another one (an aligned
    table's, with the ``inline`` properties of its ``align_with`` entry); see
    :func:`~airflow_provider_kappa.spark.catalog.catalog_properties`.

    :raises KappaConfigError: when no properties of the catalog are known.
    """
    props = catalog_properties(options, catalog, inline)
    if not props:
        raise KappaConfigError(
            f"kappa_iceberg: no properties for catalog {catalog!r} (needed to read {identifier!r}): give them "
            "in the catalogs file, or inline as catalog_properties of its align_with entry"
        )
    return load_table(load_catalog(catalog, props), identifier)
