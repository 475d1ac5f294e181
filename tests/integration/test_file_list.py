"""The launcher's file list of a source (spark/source/file_list.py, option plan_file): what it
keeps, and readers that use it through real local Spark with the catalog out of reach."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from datetime import date, datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from lake import create_events_table
from test_source import HOUR, MIN, T0_US, add, load, reader_options, run_query

from airflow_provider_kappa.exceptions import KappaConfigError, KappaSourceError
from airflow_provider_kappa.spark.source import file_list
from airflow_provider_kappa.spark.source.file_index import DeleteRef, FileSpan, spans_between
from airflow_provider_kappa.spark.source.manifests import file_spans
from airflow_provider_kappa.spark.source.reader import KappaIcebergStreamReader
from airflow_provider_kappa.spark.source.tables import table_spark_schema


@pytest.fixture()
def sp(spark: Any) -> Any:
    from airflow_provider_kappa.spark.datasource import KappaIcebergDataSource

    spark.dataSource.register(KappaIcebergDataSource)
    return spark


def unreachable(catalog_props: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The same catalog name with a database that does not exist: loading it fails."""
    return dict(catalog_props, uri=f"sqlite:///{tmp_path}/no/such/dir/catalog.db")


def test_json_keeps_every_field_and_partition_value_type() -> None:
    span = FileSpan(
        path="file:///w/a.parquet",
        file_format="PARQUET",
        record_count=3,
        file_size_in_bytes=100,
        lower_micros=None,
        upper_micros=7,
        spec_id=2,
        partition=(
            5,
            "x",
            None,
            True,
            1.5,
            b"\x00\xff",
            Decimal("1.20"),
            uuid.UUID(int=7),
            date(2026, 1, 2),
            datetime(2026, 1, 2, 3, tzinfo=timezone.utc),
        ),
        deletes=(DeleteRef("file:///w/d.parquet", "PARQUET"),),
    )
    listed = file_list.FileList(
        table="raw.e",
        snapshot_id=9,
        ingestion_column="ts",
        start_micros=0,
        end_micros=None,
        location="file:///w",
        spark_schema_json="{}",
        metadata_json="{}",
        fields=(("ts", 1, True), ("tags", 2, False)),
        spans=(span,),
    )
    back = file_list.FileList.from_json(listed.to_json())
    assert back == listed
    assert [type(v) for v in back.spans[0].partition] == [type(v) for v in span.partition]
    assert back.top_field_ids(["ts"]) == (("ts", 1),)
    assert back.top_field_ids(["ts", "tags"]) == ()  # nested: the reader falls back to pyiceberg
    with pytest.raises(KappaSourceError, match=r"x.json is not a kappa file list: version None"):
        file_list.FileList.from_json('{"table": "raw.e"}', "x.json")


def test_a_plan_holds_the_files_of_its_range_and_the_snapshot_schema(catalog: Any) -> None:
    table = create_events_table(catalog, "raw.events")
    add(table, "a", [5, 40])
    add(table, "b", [70, 100])
    add(table, "c", [200])
    snapshot = table.current_snapshot().snapshot_id
    start, end = T0_US + 60 * MIN, T0_US + 2 * HOUR
    files = file_list.build(table, snapshot, "ingestion_ts", start, end)
    assert files.spans == tuple(file_spans(table, snapshot, "ingestion_ts", start, end))
    assert [s.path for s in files.spans] == [s.path for s in file_spans(table, snapshot, "ingestion_ts", None, None)][
        1:2
    ]
    assert (files.table, files.snapshot_id, files.start_micros, files.end_micros) == (
        "raw.events",
        snapshot,
        start,
        end,
    )
    assert "s3" not in files.to_json() and "sqlite" not in files.to_json()  # no catalog property
    # narrowing a wider file list gives what listing the narrow range gives
    wide = file_list.build(table, snapshot, "ingestion_ts", None, None)
    assert tuple(spans_between(wide.spans, start, end)) == files.spans
    with pytest.raises(KappaSourceError, match=r"ingestion column 'landed_at' does not exist"):
        file_list.build(table, snapshot, "landed_at", start, end)


def test_a_reader_given_a_plan_reads_what_planning_reads_without_the_catalog(
    sp: Any, catalog: Any, catalog_props: dict[str, str], lake_dir: Path, tmp_path: Path
) -> None:
    table = create_events_table(catalog, "raw.events")
    ids = add(table, "a", [5, 12, 40, 61])
    ids += add(table, "b", [11, 29.5, 30, 95])
    snapshot = table.current_snapshot().snapshot_id
    start, end = T0_US + 10 * MIN, T0_US + 90 * MIN
    rng = {"read_start_micros": start, "read_end_micros": end, "snapshot_id": snapshot}
    planned = run_query(load(sp, reader_options(catalog_props, "raw.events", **rng)), tmp_path / "ck1")

    plan_file = file_list.write(
        str(tmp_path / "plans" / "events.json"),
        file_list.build(table, snapshot, "ingestion_ts", T0_US, T0_US + 3 * HOUR),
    )
    for f in (lake_dir / "warehouse").rglob("*.avro"):
        f.unlink()  # no manifest left to read: only the file list knows the files
    opts = reader_options(unreachable(catalog_props, tmp_path), "raw.events", **rng, plan_file=plan_file)
    with pytest.raises(KappaConfigError, match=r"catalog 'lake': sqlite file .* does not exist"):
        table_spark_schema({k: v for k, v in opts.items() if k != "plan_file"})  # the catalog is out of reach
    given = run_query(load(sp, opts), tmp_path / "ck2")

    expected = Counter(i for i in ids if start <= T0_US + float(i.split("-")[1]) * MIN < end)
    assert given.rows() == planned.rows() == expected
    assert given.offsets() == planned.offsets()
    # the job's projection works from the file list too (field ids kept per top-level column)
    projected = (
        sp.readStream.format("kappa_iceberg").schema("event_id STRING, ingestion_ts TIMESTAMP").options(**opts).load()
    )
    assert run_query(projected, tmp_path / "ck3").rows() == expected


def test_aligned_tables_are_read_from_their_plans(catalog: Any, catalog_props: dict[str, str], tmp_path: Path) -> None:
    big = create_events_table(catalog, "raw.impressions")
    small = create_events_table(catalog, "raw.clicks")
    add(big, "i", [m * 10 for m in range(0, 24)])  # 4 hours
    add(small, "c", [2, 230])
    snaps = {t.name()[-1]: t.current_snapshot().snapshot_id for t in (big, small)}
    rng = (T0_US, T0_US + 4 * HOUR)
    lists = {
        name: file_list.write(str(tmp_path / f"{name}.json"), file_list.build(t, snaps[name], "ingestion_ts", *rng))
        for name, t in (("impressions", big), ("clicks", small))
    }
    align = json.dumps(
        [
            {
                "catalog": "lake",
                "table": f"raw.{n}",
                "ingestion_column": "ingestion_ts",
                "snapshot_id": snaps[n],
                "plan_file": lists[n],
            }
            for n in ("impressions", "clicks")
        ]
    )

    def ends(props: dict[str, str], listed: bool) -> list[int]:
        opts = reader_options(
            props,
            "raw.clicks",
            read_start_micros=rng[0],
            read_end_micros=rng[1],
            snapshot_id=snaps["clicks"],
            max_misalignment_threshold="1h",
            align_with=align if listed else json.dumps([{**a, "plan_file": None} for a in json.loads(align)]),
            **({"plan_file": lists["clicks"]} if listed else {}),
        )
        reader = KappaIcebergStreamReader(table_spark_schema(opts), opts)
        pos, out = reader.initialOffset(), []
        while (nxt := reader.latestOffset(pos, reader.getDefaultReadLimit())) != pos:
            out.append(nxt["pos"])
            pos = nxt
        return out

    from_catalog = ends(catalog_props, listed=False)
    assert from_catalog == [T0_US + h * HOUR for h in (1, 2, 3, 4)]  # the big table's data sets the grid
    assert ends(unreachable(catalog_props, tmp_path), listed=True) == from_catalog


def test_a_plan_of_another_read_is_refused(catalog: Any, catalog_props: dict[str, str], tmp_path: Path) -> None:
    table = create_events_table(catalog, "raw.events")
    add(table, "a", [5])
    first = table.current_snapshot().snapshot_id
    add(table, "b", [6])
    plan_file = file_list.write(
        str(tmp_path / "p.json"), file_list.build(table, first, "ingestion_ts", T0_US, T0_US + HOUR)
    )
    opts = reader_options(
        catalog_props, "raw.events", read_start_micros=T0_US, read_end_micros=T0_US + HOUR, plan_file=plan_file
    )
    assert table_spark_schema(opts) == table_spark_schema({k: v for k, v in opts.items() if k != "plan_file"})
    cases = [
        ({"snapshot_id": str(table.current_snapshot().snapshot_id)}, rf"snapshot_id is {first} in the file list"),
        ({"table": "raw.other"}, r"table is 'raw.events' in the file list, 'raw.other' in the options"),
        ({"read_end_micros": str(T0_US + 2 * HOUR)}, r"covers \[\d+, \d+\) of table 'raw.events', not the read range"),
        ({"plan_file": str(tmp_path / "missing.json")}, r"plan_file='.*missing.json' cannot be read"),
    ]
    for change, match in cases:
        with pytest.raises(KappaSourceError, match=match):
            table_spark_schema(opts | change)
        with pytest.raises(KappaSourceError, match=match):
            KappaIcebergStreamReader(table_spark_schema(opts), opts | change).initialOffset()
    with pytest.raises(KappaConfigError, match=r"option plan_file=.* is for mode 'bounded', not 'tail'"):
        table_spark_schema(opts | {"mode": "tail"})


def test_a_reader_given_a_plan_imports_no_pyiceberg(
    catalog: Any, catalog_props: dict[str, str], tmp_path: Path
) -> None:
    """What the file list is for: the driver's Python processes of a slice (schema() and the stream
    reader) skip pyiceberg's imports, the catalog and the manifests."""
    import subprocess
    import sys

    table = create_events_table(catalog, "raw.events")
    add(table, "a", [5, 40])
    snapshot = table.current_snapshot().snapshot_id
    plan_file = file_list.write(
        str(tmp_path / "p.json"), file_list.build(table, snapshot, "ingestion_ts", T0_US, T0_US + HOUR)
    )
    opts = reader_options(
        catalog_props, "raw.events", read_start_micros=T0_US, read_end_micros=T0_US + HOUR, plan_file=plan_file
    )
    code = (
        "import json, sys\n"
        "from airflow_provider_kappa.spark.source.reader import KappaIcebergStreamReader\n"
        "from airflow_provider_kappa.spark.source.tables import table_spark_schema\n"
        f"opts = json.loads({json.dumps(json.dumps(opts))})\n"
        "reader = KappaIcebergStreamReader(table_spark_schema(opts), opts)\n"
        "start = reader.initialOffset()\n"
        "parts = reader.partitions(start, reader.latestOffset(start, reader.getDefaultReadLimit()))\n"
        "print(len(parts), sorted(m for m in sys.modules if m.split('.')[0] in ('pyiceberg', 'sqlalchemy')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    assert out == ["1", "[]"]
