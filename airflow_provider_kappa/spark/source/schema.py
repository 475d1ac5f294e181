"""The stream's schema: Iceberg -> Spark types, the check of a schema given by the job, and the
trimmed table metadata executors read with.

The mapping: ``timestamptz -> TimestampType``, ``timestamp -> TimestampNTZType``,
``uuid``/``fixed``/``binary -> BinaryType``, nullability from ``required`` (pyiceberg imported lazily).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from airflow_provider_kappa.exceptions import KappaSourceError

if TYPE_CHECKING:
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table
    from pyiceberg.types import IcebergType


def iceberg_to_spark(t: IcebergType, where: str) -> DataType:
    """The Spark type of an Iceberg type (``timestamptz`` -> ``TimestampType``,
    ``timestamp`` -> ``TimestampNTZType``, ``uuid``/``fixed``/``binary`` -> ``BinaryType``).

    :param t: an Iceberg type.
    :param where: the column path, for error messages.
    :raises KappaSourceError: for types Spark cannot hold (``time``, nanosecond timestamps...).
    """
    from pyiceberg import types as it

    simple: list[tuple[type, DataType]] = [
        (it.BooleanType, BooleanType()),
        (it.IntegerType, IntegerType()),
        (it.LongType, LongType()),
        (it.FloatType, FloatType()),
        (it.DoubleType, DoubleType()),
        (it.DateType, DateType()),
        (it.TimestamptzType, TimestampType()),
        (it.TimestampType, TimestampNTZType()),
        (it.StringType, StringType()),
        (it.BinaryType, BinaryType()),
        (it.FixedType, BinaryType()),
        (it.UUIDType, BinaryType()),
    ]
    for cls, spark_type in simple:
        if isinstance(t, cls):
            return spark_type
    if isinstance(t, it.DecimalType):
        return DecimalType(t.precision, t.scale)
    if isinstance(t, it.StructType):
        return StructType(
            [StructField(f.name, iceberg_to_spark(f.field_type, f"{where}.{f.name}"), not f.required) for f in t.fields]
        )
    if isinstance(t, it.ListType):
        return ArrayType(iceberg_to_spark(t.element_type, f"{where}.element"), not t.element_required)
    if isinstance(t, it.MapType):
        return MapType(
            iceberg_to_spark(t.key_type, f"{where}.key"),
            iceberg_to_spark(t.value_type, f"{where}.value"),
            not t.value_required,
        )
    raise KappaSourceError(f"column {where!r} has Iceberg type {t}, which kappa_iceberg cannot map to a Spark type")


def schema_to_spark(schema: Schema) -> StructType:
    """The Spark schema of an Iceberg schema (nullability from ``required``)."""
    return StructType(
        [StructField(f.name, iceberg_to_spark(f.field_type, f.name), not f.required) for f in schema.fields]
    )


def check_job_schema(given: StructType, table_schema: StructType, table: str) -> None:
    """Check a schema given by the job (``spark.readStream.schema(...)``) against the table:
    every column must exist in the table with the same type (a subset is a projection).

    :raises KappaSourceError: naming the column, its type and the table's.
    """
    by_name = {f.name: f for f in table_schema.fields}
    for f in given.fields:
        if f.name not in by_name:
            raise KappaSourceError(
                f"table {table!r}: the schema given by the job has column {f.name!r}, which the table does not "
                f"have; table columns: {[x.name for x in table_schema.fields]}"
            )
        want = by_name[f.name].dataType
        if f.dataType.simpleString() != want.simpleString():
            raise KappaSourceError(
                f"table {table!r}: the schema given by the job has {f.name!r} as {f.dataType.simpleString()}; "
                f"the table has it as {want.simpleString()}"
            )


def trimmed_metadata_json(table: Table, schema: Schema) -> str:
    """``table``'s metadata without snapshots, history or refs, ``schema`` as its current schema:
    what executors need to read data files with pyiceberg, small whatever the table's history."""
    metadata = table.metadata.model_copy(
        update={
            "snapshots": [],
            "snapshot_log": [],
            "metadata_log": [],
            "refs": {},
            "current_snapshot_id": None,
            "statistics": [],
            "partition_statistics": [],
            "current_schema_id": schema.schema_id,
        }
    )
    return str(metadata.model_dump_json())
