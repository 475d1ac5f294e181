"""Staging tables on a real sqlite SqlCatalog: names, creation like the target, clear, listing, drop."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from lake import create_summary_table, sorted_rows, summary_row, summary_table

from airflow_provider_kappa.exceptions import KappaSinkError
from airflow_provider_kappa.spark.staging import (
    clear_slice,
    drop_staging,
    ensure_staging_table,
    staging_table_name,
    staging_tables,
)

TARGET = "prod.impression_play_summary"


def test_staging_table_name_is_a_sanitized_identifier() -> None:
    name = staging_table_name(TARGET, "bf-2026-11-01T00:00Z", "2026-11-01T03:00+00:00")
    namespace, table = name.split(".")
    assert namespace == "kappa_staging"
    assert re.fullmatch(r"[a-z0-9_]+", table)
    assert table.startswith("prod_impression_play_summary__bf_2026_11_01t00_00z_")
    assert table.endswith("__2026_11_01t03_00_00_00")
    assert staging_table_name(TARGET, "b", "s", namespace="stage").startswith("stage.")


def test_staging_table_names_do_not_collide_when_sanitized_names_do() -> None:
    a = staging_table_name(TARGET, "bf.1", "s1")
    b = staging_table_name(TARGET, "bf-1", "s1")
    assert a != b
    assert staging_table_name(TARGET, "bf.1", "s1") == a  # deterministic


def test_staging_table_name_refuses_empty_parts_and_bad_namespace() -> None:
    with pytest.raises(KappaSinkError, match="slice id '---'"):
        staging_table_name(TARGET, "bf", "---")
    with pytest.raises(KappaSinkError, match="staging namespace 'Bad-NS'"):
        staging_table_name(TARGET, "bf", "s1", namespace="Bad-NS")


def test_ensure_staging_table_copies_schema_and_spec(catalog: Any) -> None:
    target = create_summary_table(catalog, TARGET)
    name = staging_table_name(TARGET, "bf1", "s1")
    staged = ensure_staging_table(catalog, TARGET, name)
    assert [(f.name, str(f.field_type)) for f in staged.schema().fields] == [
        (f.name, str(f.field_type)) for f in target.schema().fields
    ]
    assert [(f.name, str(f.transform)) for f in staged.spec().fields] == [("window_hour", "hour")]
    assert staged.properties["kappa.target-table"] == TARGET
    # idempotent: the same table comes back, its data untouched
    staged.append(summary_table([summary_row(0, 1, 3)]))
    again = ensure_staging_table(catalog, TARGET, name)
    assert sorted_rows(again) == sorted_rows(summary_table([summary_row(0, 1, 3)]))


def test_ensure_staging_table_needs_the_target(catalog: Any) -> None:
    with pytest.raises(KappaSinkError, match="target table 'prod.missing' does not exist"):
        ensure_staging_table(catalog, "prod.missing", staging_table_name("prod.missing", "bf", "s"))


def test_ensure_staging_table_refuses_a_staging_table_of_another_shape(catalog: Any) -> None:
    create_summary_table(catalog, TARGET)
    name = staging_table_name(TARGET, "bf1", "s1")
    create_summary_table(catalog, name, partitioned=False)
    with pytest.raises(KappaSinkError, match="clear the slice"):
        ensure_staging_table(catalog, TARGET, name)


def test_clear_slice_empties_the_table_and_works_when_absent(catalog: Any) -> None:
    create_summary_table(catalog, TARGET)
    name = staging_table_name(TARGET, "bf1", "s1")
    clear_slice(catalog, TARGET, name)  # absent: created empty
    table = catalog.load_table(name)
    assert table.scan().to_arrow().num_rows == 0
    table.append(summary_table([summary_row(0, 1, 3), summary_row(5, 1, 4)]))
    data_files = [t.file.file_path for t in table.scan().plan_files()]
    assert data_files
    clear_slice(catalog, TARGET, name)
    clear_slice(catalog, TARGET, name)  # idempotent
    cleared = catalog.load_table(name)
    assert cleared.scan().to_arrow().num_rows == 0
    assert cleared.current_snapshot() is None
    for path in data_files:  # purged, not just forgotten
        assert path.startswith("file://")
        assert not Path(path[len("file://") :]).exists()


def test_staging_tables_lists_only_this_backfill_and_drop_staging_drops_them(catalog: Any) -> None:
    create_summary_table(catalog, TARGET)
    create_summary_table(catalog, "prod.other")
    assert staging_tables(catalog, TARGET, "bf1") == []  # no namespace yet
    mine = [staging_table_name(TARGET, "bf1", s) for s in ("s2", "s1")]
    others = [staging_table_name(TARGET, "bf10", "s1"), staging_table_name("prod.other", "bf1", "s1")]
    for name in mine:
        ensure_staging_table(catalog, TARGET, name)
    ensure_staging_table(catalog, TARGET, others[0])
    ensure_staging_table(catalog, "prod.other", others[1])
    assert staging_tables(catalog, TARGET, "bf1") == sorted(mine)
    assert drop_staging(catalog, TARGET, "bf1") == sorted(mine)
    assert staging_tables(catalog, TARGET, "bf1") == []
    assert drop_staging(catalog, TARGET, "bf1") == []
    assert all(catalog.table_exists(n) for n in others)
