"""The pyiceberg adapter (``airflow_provider_kappa/compat/pyiceberg.py``): the private writer and schema
check it calls are still there in the installed pyiceberg, with the parameters it passes, and do what
the sink and publish rely on, on a real sqlite SqlCatalog: data files written in the table's partition
spec and committed nowhere, another schema refused."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from lake import create_summary_table, sorted_rows, summary_row, summary_table
from private_api import require_function

from airflow_provider_kappa.compat.pyiceberg import check_arrow_schema, write_data_files


def test_the_installed_pyiceberg_has_the_private_writer_and_schema_check_kappa_calls() -> None:
    require_function(
        "pyiceberg",
        "pyiceberg.io.pyarrow",
        "_dataframe_to_data_files",
        ("table_metadata", "df", "io", "write_uuid"),
        "pyiceberg",
    )
    require_function(
        "pyiceberg",
        "pyiceberg.io.pyarrow",
        "_check_pyarrow_schema_compatible",
        ("requested_schema", "provided_schema", "format_version"),
        "pyiceberg",
    )


def test_rows_become_uncommitted_data_files_of_the_tables_partitions(catalog: Any) -> None:
    catalog.create_namespace("prod")
    table = create_summary_table(catalog, "prod.summary")  # partitioned by hour(window_start)
    rows = [summary_row(0, 1, 1), summary_row(5, 2, 2), summary_row(61, 3, 3)]  # hours 0 and 1

    files = list(write_data_files(table.metadata, summary_table(rows), table.io))

    assert sorted(f.record_count for f in files) == [1, 2]
    assert len({f.partition[0] for f in files}) == 2
    assert all(table.io.new_input(f.file_path).exists() for f in files)
    assert catalog.load_table("prod.summary").current_snapshot() is None  # written, committed nowhere
    with table.transaction() as tx:  # what the sink's driver and publish do with them
        fast_append = tx.update_snapshot().fast_append()
        for f in files:
            fast_append.append_data_file(f)
        fast_append.commit()
    assert sorted_rows(catalog.load_table("prod.summary")) == sorted_rows(summary_table(rows))


def test_rows_of_another_schema_are_refused(catalog: Any) -> None:
    catalog.create_namespace("prod")
    table = create_summary_table(catalog, "prod.summary")
    good = summary_table([summary_row(0, 1, 1)])
    check_arrow_schema(table.schema(), good.schema, table.metadata.format_version)
    bad = good.drop_columns(["show_id"]).append_column("show", pa.array(["x"]))
    with pytest.raises(ValueError, match="show"):
        check_arrow_schema(table.schema(), bad.schema, table.metadata.format_version)
