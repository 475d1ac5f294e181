"""Backfills of different targets started together on a fresh catalog all create their staging
tables (issue 18 item 2): creating the staging namespace tolerates a concurrent creator."""

from __future__ import annotations

import threading
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import load_catalog

from airflow_provider_kappa.spark.staging import ensure_staging_table


def test_concurrent_first_staging_tables_all_get_created(catalog: Any, catalog_props: dict[str, str]) -> None:
    catalog.create_namespace("prod")
    n = 8
    for i in range(n):
        catalog.create_table(f"prod.t{i}", schema=pa.schema([("id", pa.int64())]))
    catalogs = [load_catalog("lake", **catalog_props) for _ in range(n)]
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []

    def stage(i: int) -> None:
        barrier.wait()
        try:
            ensure_staging_table(catalogs[i], f"prod.t{i}", f"kappa_staging.t{i}__bf__s0000")
        except BaseException as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=stage, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert {f"t{i}__bf__s0000" for i in range(n)} <= {t[-1] for t in catalog.list_tables("kappa_staging")}
