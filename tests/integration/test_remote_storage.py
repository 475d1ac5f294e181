"""kappa_iceberg over object storage: a table whose data files live in S3 (an S3-compatible
server, moto's, started on 127.0.0.1 by this module and stopped by its process id), read through
real local Spark. Executors take the remote branch of the direct Parquet read: each file opened
through pyiceberg's FileIO with the S3 properties the partitions carry (never the catalog's
URI)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from lake import T0, append_events, create_events_table, event
from test_source import HOUR, MIN, T0_US, load, reader_options, run_query

from airflow_provider_kappa.spark.source import file_list
from airflow_provider_kappa.spark.source.read import read_parquet_direct
from airflow_provider_kappa.spark.source.reader import KappaIcebergStreamReader
from airflow_provider_kappa.spark.source.tables import table_spark_schema

BUCKET = "kappa"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """An S3-compatible server on a free loopback port, with the bucket created."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the S3 server did not start on port {port} (exit code {server.poll()})"
                    ) from None
                time.sleep(0.2)
        from pyarrow.fs import S3FileSystem

        fs = S3FileSystem(
            endpoint_override=f"127.0.0.1:{port}",
            scheme="http",
            access_key="kappa",
            secret_key="s3cr3t",
            region="us-east-1",
            allow_bucket_creation=True,
        )
        fs.create_dir(BUCKET)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture()
def s3_props(s3_endpoint: str, tmp_path: Path) -> dict[str, str]:
    """A sqlite SqlCatalog whose warehouse is in the S3 bucket (one folder per test)."""
    return {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path}/catalog.db",
        "warehouse": f"s3://{BUCKET}/{tmp_path.name}/warehouse",
        "s3.endpoint": s3_endpoint,
        "s3.access-key-id": "kappa",
        "s3.secret-access-key": "s3cr3t",
        "s3.region": "us-east-1",
    }


@pytest.fixture()
def s3_table(s3_props: dict[str, str]) -> tuple[Any, list[str]]:
    from pyiceberg.catalog import load_catalog

    table = create_events_table(load_catalog("lake", **s3_props), "raw.events")
    ids = []
    for chunk in range(3):  # three files: ingestion minutes 0-18, 20-38, 40-58 (every 2 minutes)
        rows = [event(100 * chunk + i, T0 + timedelta(minutes=20 * chunk + 2 * i)) for i in range(10)]
        append_events(table, rows)
        ids += [r["event_id"] for r in rows]
    return table, ids


def test_the_direct_parquet_read_opens_s3_files_through_the_file_io(
    s3_table: tuple[Any, list[str]], s3_props: dict[str, str]
) -> None:
    table, _ = s3_table
    opts = reader_options(s3_props, "raw.events", read_start_micros=T0_US + 10 * MIN, read_end_micros=T0_US + 30 * MIN)
    reader = KappaIcebergStreamReader(table_spark_schema(opts), opts)
    start = reader.initialOffset()
    parts = reader.partitions(start, reader.latestOffset(start, reader.getDefaultReadLimit()))
    spans = [s for p in parts for s in p.files]
    assert spans and all(s.path.startswith(f"s3://{BUCKET}/") for s in spans)
    context = parts[0].context
    assert context.io_properties["s3.endpoint"] == s3_props["s3.endpoint"] and "uri" not in context.io_properties
    direct = [
        r
        for s in spans
        for r in read_parquet_direct(s.path, context, T0_US + 10 * MIN, T0_US + 30 * MIN).column("event_id").to_pylist()
    ]
    scanned = table.scan(
        row_filter=f"ingestion_ts >= '{(T0 + timedelta(minutes=10)).isoformat()}' and ingestion_ts < '{(T0 + timedelta(minutes=30)).isoformat()}'"
    )
    assert sorted(direct) == sorted(scanned.to_arrow().column("event_id").to_pylist())
    assert len(direct) == 10  # minutes 10, 12, ... 18 of the first file and 20 ... 28 of the second
    # the launcher hands a file list over only when the catalog properties give the table's FileIO
    # everything it has (a credential vended with the table would be missing on executors)
    assert file_list.listable(table, s3_props)
    assert not file_list.listable(table, {k: v for k, v in s3_props.items() if k != "s3.secret-access-key"})


@pytest.mark.parametrize("listed", [False, True], ids=["reader-lists", "launcher-file-list"])
def test_a_streaming_read_of_an_s3_table_gives_every_row_in_range_once(
    spark: Any, s3_table: tuple[Any, list[str]], s3_props: dict[str, str], tmp_path: Path, listed: bool
) -> None:
    from airflow_provider_kappa.spark.datasource import KappaIcebergDataSource

    spark.dataSource.register(KappaIcebergDataSource)
    table, ids = s3_table
    start, end = T0_US + 15 * MIN, T0_US + HOUR
    extra: dict[str, Any] = {"read_start_micros": start, "read_end_micros": end, "max_misalignment_threshold": "20min"}
    if listed:
        files = file_list.build(table, table.current_snapshot().snapshot_id, "ingestion_ts", start, end)
        extra["plan_file"] = file_list.write(str(tmp_path / "files.json"), files)
        assert "s3cr3t" not in json.dumps(files.to_json())  # the file list carries no credential
    run = run_query(load(spark, reader_options(s3_props, "raw.events", **extra)), tmp_path / "ck")
    expected = Counter(i for n, i in enumerate(ids) if start <= T0_US + (20 * (n // 10) + 2 * (n % 10)) * MIN < end)
    assert run.rows() == expected and len(expected) == 22
    assert [e for _, (_, e) in sorted(run.offsets().items())] == [T0_US + 20 * MIN, T0_US + 40 * MIN, T0_US + HOUR]
