"""The landed-event table layout shared by the examples, the lake generator and tests.

Kafka events landed in Iceberg: the event's own fields plus ``ingestion_ts``, the
time the router wrote it (a ``timestamptz``), partitioned by ingestion hour.
pyiceberg/pyarrow are imported lazily (module attributes built on first use).
"""

from __future__ import annotations

from typing import Any

from airflow_provider_kappa.spark.catalog import ensure_namespace

INGESTION_COLUMN = "ingestion_ts"


def _schema() -> Any:
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType, TimestamptzType

    return Schema(
        NestedField(1, "event_id", StringType(), required=False),
        NestedField(2, "account_id", LongType(), required=False),
        NestedField(3, "show_id", LongType(), required=False),
        NestedField(4, "event_ts", TimestamptzType(), required=False),
        NestedField(5, INGESTION_COLUMN, TimestamptzType(), required=False),
    )


def _arrow() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("event_id", pa.string()),
            ("account_id", pa.int64()),
            ("show_id", pa.int64()),
            ("event_ts", pa.timestamp("us", tz="UTC")),
            (INGESTION_COLUMN, pa.timestamp("us", tz="UTC")),
        ]
    )


def create_raw_table(catalog: Any, identifier: str) -> Any:
    """Create a landed-event table partitioned by ``hour(ingestion_ts)`` (namespace too).

    :param catalog: a pyiceberg catalog.
    :param identifier: ``namespace.table``.
    """
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import HourTransform

    namespace = identifier.rsplit(".", 1)[0]
    ensure_namespace(catalog, namespace)
    spec = PartitionSpec(PartitionField(source_id=5, field_id=1000, transform=HourTransform(), name="ingestion_hour"))
    return catalog.create_table(identifier, schema=_schema(), partition_spec=spec)


def __getattr__(name: str) -> Any:
    if name == "RAW_EVENTS_SCHEMA":
        return _schema()
    if name == "RAW_EVENTS_ARROW":
        return _arrow()
    raise AttributeError(name)
