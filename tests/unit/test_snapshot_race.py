"""Backfills tagging the same source table at once all get their tag (issue 18 item 3): a tag
commit that loses the race to another writer is retried on the refreshed table, never reported
as bad input."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import load_catalog

from airflow_provider_kappa.backfill import snapshot
from airflow_provider_kappa.backfill.snapshot import _create_tag


def test_concurrent_tags_of_one_table_all_commit(catalog: Any, catalog_props: dict[str, str]) -> None:
    catalog.create_namespace("raw")
    table = catalog.create_table("raw.events", schema=pa.schema([("id", pa.int64())]))
    table.append(pa.table({"id": pa.array([1, 2, 3], pa.int64())}))
    snap = table.current_snapshot().snapshot_id
    # each "backfill" has its own catalog connection and a table loaded before anyone tagged
    tables = [load_catalog("lake", **catalog_props).load_table("raw.events") for _ in range(8)]
    barrier = threading.Barrier(len(tables))
    errors: list[BaseException] = []

    def tag(i: int) -> None:
        barrier.wait()
        try:
            _create_tag(tables[i], snap, f"kappa-bf_{i}", timedelta(days=1))
        except BaseException as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=tag, args=(i,)) for i in range(len(tables))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    refs = catalog.load_table("raw.events").metadata.refs
    assert {f"kappa-bf_{i}" for i in range(len(tables))} <= set(refs)
    assert all(refs[f"kappa-bf_{i}"].snapshot_id == snap for i in range(len(tables)))


def test_a_tag_of_the_same_name_on_another_snapshot_is_refused(catalog: Any) -> None:
    import pytest

    from airflow_provider_kappa.exceptions import KappaSourceError

    catalog.create_namespace("raw")
    table = catalog.create_table("raw.events", schema=pa.schema([("id", pa.int64())]))
    table.append(pa.table({"id": pa.array([1], pa.int64())}))
    first = table.current_snapshot().snapshot_id
    table.append(pa.table({"id": pa.array([2], pa.int64())}))
    second = table.current_snapshot().snapshot_id
    _create_tag(table, first, "kappa-bf_x", timedelta(days=1))
    with pytest.raises(KappaSourceError, match=r"tag 'kappa-bf_x' of 'raw.events' points at snapshot"):
        _create_tag(table, second, "kappa-bf_x", timedelta(days=1))
    assert snapshot.TAG_ATTEMPTS >= 2
