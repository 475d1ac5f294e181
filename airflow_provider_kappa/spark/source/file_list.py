"""A source's file list handed from the launcher to the ``kappa_iceberg`` reader (option ``plan_file``).

Without it, every slice's Spark driver starts two Python processes per source (the data
source's ``schema()`` and the stream reader) that each import pyiceberg, open the catalog and
load the table, and the reader then reads the pinned snapshot's manifests. The launcher has
done all of that already (it pinned the snapshot and planned the backfill), so it writes what
the reader needs into one JSON file next to the backfill's checkpoints: the snapshot's Spark
schema, the trimmed table metadata executors read with, and the data files that may hold rows
in the slice's read range (:class:`~airflow_provider_kappa.spark.source.file_index.FileSpan`).
The reader then needs neither pyiceberg nor the catalog on the driver.

A file list holds no credentials: executors' FileIO properties still come from the catalog
properties (the catalogs file). A table whose FileIO has properties the catalog did not give
(credentials vended by a REST catalog) gets no file list (:func:`listable`). A file list names
its table, snapshot, ingestion column and the read range it covers; the reader refuses one
that does not match its options.

Pure Python with pyarrow for I/O: no pyspark import (the Spark schema is kept as JSON;
:func:`build` imports pyspark and pyiceberg when called).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_provider_kappa.exceptions import KappaSourceError
from airflow_provider_kappa.spark.source import manifests
from airflow_provider_kappa.spark.source.file_index import FileSpan, span_from_list, span_to_list
from airflow_provider_kappa.spark.source.snapshots import ingestion_field, resolve_snapshot, snapshot_schema
from airflow_provider_kappa.spark.storage import filesystem, read_text, write_text

if TYPE_CHECKING:
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table

VERSION = 1
#: FileIO property prefixes executors receive (never the catalog's own URI or credentials).
FILE_IO_PREFIXES = ("s3.", "client.", "gcs.", "adls.", "hdfs.", "oss.", "hf.", "py-io-impl")


@dataclass(frozen=True)
class FileList:
    """What a bounded ``kappa_iceberg`` reader needs of one table at one pinned snapshot.

    :param table: the table identifier.
    :param snapshot_id: the pinned snapshot.
    :param ingestion_column: the ingestion column.
    :param start_micros: inclusive start of the read range the spans cover (``None``: open).
    :param end_micros: exclusive end of it (``None``: open).
    :param location: the table's location (executors' FileIO).
    :param spark_schema_json: the snapshot schema as a Spark ``StructType`` JSON string.
    :param metadata_json: table metadata without snapshots, its current schema the snapshot's
        (what executors need for the pyiceberg read path).
    :param fields: ``(name, field id, primitive)`` of each top-level column.
    :param spans: the data files that may hold rows in the range, in lower-bound order.
    """

    table: str
    snapshot_id: int | None
    ingestion_column: str
    start_micros: int | None
    end_micros: int | None
    location: str
    spark_schema_json: str
    metadata_json: str
    fields: tuple[tuple[str, int, bool], ...]
    spans: tuple[FileSpan, ...]

    def covers(self, start_micros: int | None, end_micros: int | None) -> bool:
        """Whether the file list's range contains ``[start_micros, end_micros)``."""
        if self.start_micros is not None and (start_micros is None or start_micros < self.start_micros):
            return False
        if self.end_micros is not None and (end_micros is None or end_micros > self.end_micros):
            return False
        return True

    def check(
        self, table: str, snapshot_id: int | None, ingestion_column: str, start: int | None, end: int | None
    ) -> None:
        """Refuse a file list written for another read.

        :raises KappaSourceError: naming what differs.
        """
        want = {"table": table, "ingestion_column": ingestion_column}
        if snapshot_id is not None:
            want["snapshot_id"] = snapshot_id  # type: ignore[assignment]
        have = {"table": self.table, "ingestion_column": self.ingestion_column, "snapshot_id": self.snapshot_id}
        wrong = {k: (have[k], v) for k, v in want.items() if have[k] != v}
        if wrong:
            raise KappaSourceError(
                "kappa_iceberg: option plan_file is the file list of another read: "
                + ", ".join(f"{k} is {h!r} in the file list, {w!r} in the options" for k, (h, w) in wrong.items())
            )
        if not self.covers(start, end):
            raise KappaSourceError(
                f"kappa_iceberg: option plan_file covers [{self.start_micros}, {self.end_micros}) of table "
                f"{table!r}, not the read range [{start}, {end})"
            )

    def top_field_ids(self, names: Sequence[str]) -> tuple[tuple[str, int], ...]:
        """See :func:`direct_field_ids`."""
        return direct_field_ids(self.fields, names)

    # ------------------------------------------------------------------------------ JSON

    def to_json(self) -> str:
        """The file list as JSON (partition values of non-JSON types are tagged)."""
        return json.dumps(
            {
                "version": VERSION,
                "table": self.table,
                "snapshot_id": self.snapshot_id,
                "ingestion_column": self.ingestion_column,
                "start_micros": self.start_micros,
                "end_micros": self.end_micros,
                "location": self.location,
                "spark_schema": self.spark_schema_json,
                "metadata": self.metadata_json,
                "fields": [list(f) for f in self.fields],
                "spans": [span_to_list(s) for s in self.spans],
            },
            separators=(",", ":"),
        )

    @staticmethod
    def from_json(text: str, where: str = "file list") -> FileList:
        """Parse :meth:`to_json`'s output.

        :raises KappaSourceError: when the text is not a file list of this version.
        """
        try:
            data = json.loads(text)
            if data.get("version") != VERSION:
                raise ValueError(f"version {data.get('version')!r}, expected {VERSION}")
            return FileList(
                table=str(data["table"]),
                snapshot_id=data["snapshot_id"],
                ingestion_column=str(data["ingestion_column"]),
                start_micros=data["start_micros"],
                end_micros=data["end_micros"],
                location=str(data["location"]),
                spark_schema_json=str(data["spark_schema"]),
                metadata_json=str(data["metadata"]),
                fields=tuple((str(n), int(i), bool(p)) for n, i, p in data["fields"]),
                spans=tuple(span_from_list(s) for s in data["spans"]),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise KappaSourceError(f"kappa_iceberg: {where} is not a kappa file list: {e}") from e


def top_fields(schema: Schema) -> tuple[tuple[str, int, bool], ...]:
    """``(name, field id, primitive)`` of each top-level column of an Iceberg schema."""
    return tuple((f.name, f.field_id, f.field_type.is_primitive) for f in schema.fields)


def direct_field_ids(fields: Sequence[tuple[str, int, bool]], names: Sequence[str]) -> tuple[tuple[str, int], ...]:
    """``(name, field id)`` of ``names`` when each is a top-level primitive column among
    ``fields`` (:func:`top_fields`), else ``()``: the direct Parquet read's precondition (without
    it, executors read with pyiceberg)."""
    top = {name: (fid, primitive) for name, fid, primitive in fields}
    out: dict[str, int] = {}
    for name in names:
        found = top.get(name)
        if found is None or not found[1]:
            return ()
        out[name] = found[0]
    return tuple(out.items())


# ---------------------------------------------------------------------------------- build


def file_io_properties(properties: Mapping[str, str]) -> dict[str, str]:
    """The FileIO properties executors receive from catalog or table properties."""
    return {k: v for k, v in properties.items() if k.startswith(FILE_IO_PREFIXES)}


def listable(table: Table, catalog_properties: Mapping[str, str]) -> bool:
    """Whether a reader can read ``table`` from a file list: its FileIO has no property the
    catalog properties do not give (a REST catalog may vend credentials with the table)."""
    return file_io_properties(table.io.properties) == file_io_properties(catalog_properties)


def build(
    table: Table,
    snapshot_id: int,
    ingestion_column: str,
    start_micros: int | None,
    end_micros: int | None,
) -> FileList:
    """The file list of ``table`` at ``snapshot_id`` for reads inside ``[start_micros, end_micros)``.

    :param table: a loaded pyiceberg table.
    :param snapshot_id: the pinned snapshot.
    :param ingestion_column: the ingestion column (checked).
    :param start_micros: inclusive start of the range (``None``: open).
    :param end_micros: exclusive end (``None``: open).
    :raises KappaSourceError: unknown snapshot, bad ingestion column, unmappable types.
    """
    from airflow_provider_kappa.spark.source.schema import schema_to_spark, trimmed_metadata_json

    snapshot = resolve_snapshot(table, snapshot_id)
    schema = snapshot_schema(table, snapshot)
    name = ".".join(table.name())
    ingestion_field(schema, ingestion_column, name)
    spans = manifests.file_spans(table, snapshot_id, ingestion_column, start_micros, end_micros)
    return FileList(
        table=name,
        snapshot_id=snapshot_id,
        ingestion_column=ingestion_column,
        start_micros=start_micros,
        end_micros=end_micros,
        location=table.metadata.location,
        spark_schema_json=schema_to_spark(schema).json(),
        metadata_json=trimmed_metadata_json(table, schema),
        fields=top_fields(schema),
        spans=tuple(spans),
    )


# ---------------------------------------------------------------------------------- I/O


def write(uri: str, files: FileList) -> str:
    """Write ``files`` to ``uri`` (a local path or any URI ``pyarrow.fs`` knows); return ``uri``."""
    fs, path = filesystem(uri, "kappa_iceberg: option plan_file", KappaSourceError)
    write_text(fs, path, files.to_json())
    return uri


def read(uri: str) -> FileList:
    """Read the file list at ``uri``.

    :raises KappaSourceError: when it cannot be read or is not a file list.
    """
    fs, path = filesystem(uri, "kappa_iceberg: option plan_file", KappaSourceError)
    try:
        text = read_text(fs, path)
    except OSError as e:
        raise KappaSourceError(f"kappa_iceberg: option plan_file={uri!r} cannot be read: {e}") from e
    return FileList.from_json(text, f"plan_file {uri!r}")
