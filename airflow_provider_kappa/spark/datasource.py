"""The ``kappa_iceberg`` Python data source: streaming reads and streaming writes of Iceberg."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, DataSourceStreamWriter
from pyspark.sql.types import StructType

SHORT_NAME = "kappa_iceberg"


class KappaIcebergDataSource(DataSource):
    """Iceberg for Structured Streaming: a pinned, sliced, aligned reader and an idempotent writer."""

    @classmethod
    def name(cls) -> str:
        return SHORT_NAME

    def schema(self) -> StructType:
        from airflow_provider_kappa.spark.source.tables import table_spark_schema

        return table_spark_schema(self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from airflow_provider_kappa.spark.source.reader import KappaIcebergStreamReader

        return KappaIcebergStreamReader(schema, self.options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from airflow_provider_kappa.spark.sink import KappaIcebergStreamWriter

        return KappaIcebergStreamWriter(schema, self.options, overwrite)
