"""pyiceberg's private writer and schema check: the one module that names them.

pyiceberg has no public API that writes data files without committing them: ``Transaction.append``
and ``overwrite`` write and commit in one step. kappa needs the two apart: the sink's executors write
a micro-batch's files and the driver commits them once (exactly-once, fenced), and a publish retried
after a conflict must not write its rows again. The public ``write_file`` writes only the tasks it is
given, and cutting a partitioned table's rows into tasks is private too (``_determine_partitions``),
so the one private writer ``_dataframe_to_data_files`` that ``Transaction.append`` itself calls is used,
with the schema check ``_check_pyarrow_schema_compatible`` that ``append`` runs before it.

``tests/unit/test_compat_pyiceberg.py`` checks both, and the parameters passed here, against the
installed pyiceberg. pyiceberg is imported inside the functions (no pyiceberg at DAG-parse time).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.io import FileIO
    from pyiceberg.manifest import DataFile
    from pyiceberg.schema import Schema
    from pyiceberg.table.metadata import TableMetadata
    from pyiceberg.typedef import TableVersion


def write_data_files(table_metadata: TableMetadata, rows: pa.Table, io: FileIO) -> Iterator[DataFile]:
    """Write ``rows`` as Parquet data files of the table ``table_metadata`` describes (its location,
    partition spec, file size and column metrics), committing nothing; the files' descriptions, one
    per file as it is written.

    :param table_metadata: the table's metadata.
    :param rows: rows in the table's schema (:func:`check_arrow_schema`).
    :param io: the table's FileIO.
    """
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    yield from _dataframe_to_data_files(table_metadata=table_metadata, df=rows, io=io, write_uuid=uuid.uuid4())


def check_arrow_schema(schema: Schema, arrow_schema: pa.Schema, format_version: TableVersion) -> None:
    """Refuse Arrow rows whose schema the table cannot take (what ``Transaction.append`` checks).

    :param schema: the table's Iceberg schema.
    :param arrow_schema: the rows' schema.
    :param format_version: the table's format version.
    :raises ValueError: the schemas differ; pyiceberg's message shows both.
    """
    from pyiceberg.io.pyarrow import _check_pyarrow_schema_compatible

    _check_pyarrow_schema_compatible(
        requested_schema=schema, provided_schema=arrow_schema, format_version=format_version
    )
