"""The kappa_iceberg stream reader through real local Spark and a real sqlite SqlCatalog."""

from __future__ import annotations

import ast
import json
import pickle
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from lake import T0, append_events, create_events_table, event

from airflow_provider_kappa.exceptions import KappaConfigError, KappaSourceError
from airflow_provider_kappa.spark.datasource import KappaIcebergDataSource
from airflow_provider_kappa.spark.resolve import start_available_now
from airflow_provider_kappa.spark.source.offsets import API
from airflow_provider_kappa.spark.source.partitions import FilePartition
from airflow_provider_kappa.spark.source.reader import KappaIcebergStreamReader
from airflow_provider_kappa.spark.source.tables import table_spark_schema
from airflow_provider_kappa.timeparse import to_micros

MIN = 60_000_000
HOUR = 60 * MIN
T0_US = to_micros(T0)


@pytest.fixture()
def sp(spark: Any) -> Any:
    spark.dataSource.register(KappaIcebergDataSource)
    return spark


def add(table: Any, prefix: str, minutes: list[float]) -> list[str]:
    """One snapshot of events ingested at T0 + minutes; returns their ids."""
    rows = [event(0, T0 + timedelta(minutes=m)) | {"event_id": f"{prefix}{i}-{m}"} for i, m in enumerate(minutes)]
    append_events(table, rows)
    return [r["event_id"] for r in rows]


def reader_options(props: dict[str, str], table: str, **extra: Any) -> dict[str, str]:
    opts = {
        "catalog": "lake",
        "catalog_properties": json.dumps(props),
        "table": table,
        "ingestion_column": "ingestion_ts",
        "mode": "bounded",
        "max_misalignment_threshold": "30min",
    }
    opts.update({k: str(v) for k, v in extra.items()})
    return opts


class Run:
    """One availableNow run of a streaming query into foreachBatch; what each batch saw."""

    def __init__(self) -> None:
        self.batches: dict[int, list[tuple[str, int]]] = {}
        self.progress: list[Any] = []

    def rows(self) -> Counter[str]:
        return Counter(eid for rows in self.batches.values() for eid, _ in rows)

    def offsets(self, source: int = 0) -> dict[int, tuple[int | None, int]]:
        """batch id -> (start pos or None, end pos) of one source."""
        out = {}
        for p in self.progress:
            src = p.sources[source]
            out[p.batchId] = (position(src.startOffset), position(src.endOffset))
        return out


def position(offset: str | None) -> Any:
    """``pos`` of a progress report's offset: JSON text (pyspark 4.2), the ``str()`` of the parsed JSON
    (pyspark 4.0 and 4.1: ``"{'pos': ...}"``, ``"None"``); ``None`` for no offset."""
    if offset in (None, "null", "None"):
        return None
    try:
        return json.loads(offset)["pos"]  # type: ignore[arg-type]
    except json.JSONDecodeError:
        return ast.literal_eval(offset)["pos"]  # type: ignore[arg-type]


def run_query(df: Any, checkpoint: Path, on_batch: Callable[[int], None] | None = None, run: Run | None = None) -> Run:
    from pyspark.sql import functions as F

    run = run or Run()

    def sink(batch: Any, batch_id: int) -> None:
        if on_batch is not None:
            on_batch(batch_id)
        rows = batch.select("event_id", (F.unix_micros("ingestion_ts")).alias("us")).collect()
        run.batches[batch_id] = [(r.event_id, r.us) for r in rows]  # a replayed batch replaces itself

    # availableNow, or where pyspark's Python sources lack it (4.0, 4.1) kappa's stand-in: the default
    # trigger, stopped once drained (what write_sink does)
    query = start_available_now(df.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint)))
    try:
        assert query.awaitTermination(120), "availableNow query did not terminate"
    finally:
        run.progress += [p for p in query.recentProgress if p.numInputRows is not None]
        if query.isActive:
            query.stop()
    if query.exception() is not None:
        raise query.exception()  # type: ignore[misc]
    return run


def load(sp: Any, opts: dict[str, str]) -> Any:
    return sp.readStream.format("kappa_iceberg").options(**opts).load()


def test_bounded_read_gives_every_row_in_range_once_in_grid_batches(
    sp: Any, catalog: Any, catalog_props: dict[str, str], lake_dir: Path, tmp_path: Path
) -> None:
    table = create_events_table(catalog, "raw.events")
    ids = add(table, "a", [5, 12, 40, 61])
    ids += add(table, "b", [11, 29.5, 30])  # a later commit with earlier ingestion times
    ids += add(table, "c", [10, 415, 430])  # exactly at the start (in) and exactly at the end (out)
    start, end = T0_US + 10 * MIN, T0_US + 430 * MIN
    snapshot = table.current_snapshot().snapshot_id
    add(table, "late", [50, 60])  # after the pinned snapshot: never seen
    opts = reader_options(
        catalog_props, "raw.events", read_start_micros=start, read_end_micros=end, snapshot_id=snapshot
    )

    def drop_manifests(batch_id: int) -> None:
        if batch_id == 0:  # the query has planned: no later batch may need a manifest
            for f in (lake_dir / "warehouse").rglob("*.avro"):
                f.unlink()

    run = run_query(load(sp, opts), tmp_path / "ck", drop_manifests)

    expected = Counter(
        i for i in ids if not i.startswith("late") and start <= T0_US + float(i.split("-")[1]) * MIN < end
    )
    assert run.rows() == expected
    # one batch per 30-minute grid cell holding data: [10,30) [30,60) [60,90), then the empty
    # stretch up to 390 is folded into the batch of the cell [390,420): 4 batches, not 14; the
    # query stops by itself at read_end (availableNow)
    offsets = run.offsets()
    assert sorted(e for _, e in offsets.values()) == [T0_US + m * MIN for m in (30, 60, 90, 420)]
    for batch_id, rows in run.batches.items():
        lo, hi = offsets[batch_id]
        lo = start if lo is None else lo
        assert all(lo <= us < hi for _, us in rows)


def _two_skewed_tables(catalog: Any) -> tuple[list[str], list[str]]:
    big = create_events_table(catalog, "raw.impressions")
    small = create_events_table(catalog, "raw.playbacks")
    big_ids = add(big, "i", [m * 2.4 for m in range(0, 100)])  # every 2.4 min for 4 hours
    big_ids += add(big, "j", [m * 2.4 + 0.5 for m in range(0, 100)])
    small_ids = add(small, "p", [2, 4, 230, 235])  # 10x fewer rows, nothing in between
    return big_ids, small_ids


def test_aligned_sources_share_every_batch_end(
    sp: Any, catalog: Any, catalog_props: dict[str, str], tmp_path: Path
) -> None:
    big_ids, small_ids = _two_skewed_tables(catalog)
    align = json.dumps(
        [
            {"catalog": "lake", "table": t, "ingestion_column": "ingestion_ts", "snapshot_id": None}
            for t in ("raw.impressions", "raw.playbacks")
        ]
    )
    rng = {"read_start_micros": T0_US, "read_end_micros": T0_US + 5 * HOUR, "max_misalignment_threshold": "1h"}

    def both(align_with: str | None) -> Any:
        extra = dict(rng) | ({"align_with": align_with} if align_with else {})
        big = load(sp, reader_options(catalog_props, "raw.impressions", **extra))
        small = load(sp, reader_options(catalog_props, "raw.playbacks", **extra))
        return big.unionByName(small)

    aligned = run_query(both(align), tmp_path / "aligned")
    assert aligned.rows() == Counter(big_ids + small_ids)
    a, b = aligned.offsets(0), aligned.offsets(1)
    assert len(a) == 4  # one-hour cells over the 4 hours both tables span
    for batch_id in a:
        assert abs(a[batch_id][1] - b[batch_id][1]) <= HOUR
        assert a[batch_id][1] == b[batch_id][1]

    # without alignment the small source skips its empty stretch and runs ahead of the big one
    unaligned = run_query(both(None), tmp_path / "unaligned")
    assert unaligned.rows() == Counter(big_ids + small_ids)
    a, b = unaligned.offsets(0), unaligned.offsets(1)
    assert max(abs(a[i][1] - b[i][1]) for i in a) > HOUR


def test_restarts_resume_without_loss_or_duplicates(
    sp: Any, catalog: Any, catalog_props: dict[str, str], tmp_path: Path
) -> None:
    table = create_events_table(catalog, "raw.events")
    ids = add(table, "a", [1, 25, 35, 50, 65, 80, 95, 110])
    snapshot = table.current_snapshot().snapshot_id
    checkpoint = tmp_path / "shared"
    first = reader_options(
        catalog_props, "raw.events", read_start_micros=T0_US, read_end_micros=T0_US + HOUR, snapshot_id=snapshot
    )
    run = Run()  # a replayed batch id replaces what it wrote before, as an idempotent sink does

    def crash_once(batch_id: int) -> None:
        if batch_id == 1 and not getattr(crash_once, "done", False):
            crash_once.done = True  # type: ignore[attr-defined]
            raise RuntimeError("sink failed")

    # slice 1 crashes in its second batch (logged in the offset log, not committed) ...
    with pytest.raises(Exception, match="sink failed"):
        run_query(load(sp, first), checkpoint, crash_once, run)
    assert set(run.batches) == {0}
    # ... its rerun replays that batch from the offset log and finishes the slice
    run_query(load(sp, first), checkpoint, crash_once, run)
    assert sorted(run.batches) == [0, 1]
    # slice 2 reuses the checkpoint with the next read range and resumes where slice 1 ended
    second = dict(first, read_start_micros=str(T0_US + HOUR), read_end_micros=str(T0_US + 2 * HOUR))
    run2 = run_query(load(sp, second), checkpoint, None, run)

    assert run.rows() == Counter(ids)
    assert sorted(run.batches) == [0, 1, 2, 3]
    assert run2.offsets()[2] == (T0_US + HOUR, T0_US + 90 * MIN)


def test_max_files_per_batch_caps_by_whole_files(
    sp: Any, catalog: Any, catalog_props: dict[str, str], tmp_path: Path
) -> None:
    table = create_events_table(catalog, "raw.events")
    ids = add(table, "a", [1, 2]) + add(table, "b", [5, 7]) + add(table, "c", [12, 40])
    opts = reader_options(
        catalog_props, "raw.events", read_start_micros=T0_US, read_end_micros=T0_US + HOUR, max_files_per_batch=1
    )

    run = run_query(load(sp, opts), tmp_path / "ck")

    assert run.rows() == Counter(ids)
    # three files [1,2] [5,7] [12,40], one per batch: the batches end where the next file starts
    # (5, 12), then on the grid (30); [12,40] straddles 30 so it is read again, filtered, up to 60
    assert sorted(e for _, e in run.offsets().values()) == [T0_US + m * MIN for m in (5, 12, 30, 60)]


def test_tail_mode_follows_new_snapshots_including_late_rows(
    sp: Any, catalog: Any, catalog_props: dict[str, str], tmp_path: Path
) -> None:
    table = create_events_table(catalog, "raw.events")
    ids = add(table, "a", [1, 2])
    opts = reader_options(catalog_props, "raw.events", mode="tail")
    seen: list[str] = []

    def sink(batch: Any, _batch_id: int) -> None:
        seen.extend(r.event_id for r in batch.select("event_id").collect())

    query = (
        load(sp, opts)
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="1 second")
        .start()
    )
    try:
        query.processAllAvailable()
        assert Counter(seen) == Counter(ids)
        ids += add(table, "b", [90])
        ids += add(table, "late", [0.5])  # committed last, ingested earliest: still read
        query.processAllAvailable()
        assert Counter(seen) == Counter(ids)
    finally:
        query.stop()
    # a restart continues after the last snapshot read
    ids += add(table, "c", [120])
    run = run_query(load(sp, opts), tmp_path / "ck")
    assert run.rows() == Counter(["c0-120"])


def test_partitions_are_picklable_and_carry_no_catalog_secrets(catalog: Any, catalog_props: dict[str, str]) -> None:
    table = create_events_table(catalog, "raw.events")
    ids = add(table, "a", [1, 40, 70])
    secret_props = dict(catalog_props, **{"s3.secret-access-key": "s3cr3t"})
    opts = reader_options(secret_props, "raw.events", read_start_micros=T0_US, read_end_micros=T0_US + 2 * HOUR)
    reader = KappaIcebergStreamReader(table_spark_schema(opts), opts)
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    parts = reader.partitions(start, end)
    assert parts and all(isinstance(p, FilePartition) for p in parts)
    assert b"sqlite" not in pickle.dumps(parts)  # the catalog URI and database stay on the driver
    executor_reader, executor_parts = pickle.loads(pickle.dumps((reader, parts)))
    assert executor_reader._state is None
    rows = [r for p in executor_parts for b in executor_reader.read(p) for r in b.column("event_id").to_pylist()]
    assert rows == ids[:1]  # the first batch is [T0, T0+30min): of the file [1, 40] only the row at 1
    assert parts[0].context.io_properties == {"s3.secret-access-key": "s3cr3t"}


def test_offset_from_another_mode_is_refused(catalog: Any, catalog_props: dict[str, str]) -> None:
    table = create_events_table(catalog, "raw.events")
    add(table, "a", [1])
    opts = reader_options(catalog_props, "raw.events", read_start_micros=T0_US, read_end_micros=T0_US + HOUR)
    reader = KappaIcebergStreamReader(table_spark_schema(opts), opts)
    with pytest.raises(KappaSourceError, match=r"offset \{'snapshot_id': 7.*use a fresh checkpoint"):
        reader.latestOffset({"snapshot_id": 7, "sequence_number": 1}, API.ReadAllAvailable())


def test_missing_table_fails_at_load(sp: Any, catalog: Any, catalog_props: dict[str, str]) -> None:
    catalog.create_namespace("raw")
    with pytest.raises(Exception, match=r"table 'raw.nope' does not exist in catalog 'lake'"):
        load(sp, reader_options(catalog_props, "raw.nope"))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"snapshot_id": "123"}, r"table 'raw.events': snapshot 123 does not exist"),
        ({"ingestion_column": "landed_at"}, r"table 'raw.events': ingestion column 'landed_at' does not exist"),
        ({"ingestion_column": "show_id"}, r"ingestion column 'show_id' has type long; expected timestamptz"),
        ({"mode": "replay"}, r"option mode='replay'; allowed: \['bounded', 'tail'\]"),
    ],
)
def test_schema_errors_name_the_thing(
    catalog: Any, catalog_props: dict[str, str], change: dict[str, str], match: str
) -> None:
    # table_spark_schema is what KappaIcebergDataSource.schema() calls when the job loads the stream
    table = create_events_table(catalog, "raw.events")
    add(table, "a", [1])
    opts = reader_options(catalog_props, "raw.events", read_start_micros=T0_US, read_end_micros=T0_US + HOUR) | change
    with pytest.raises((KappaSourceError, KappaConfigError), match=match):
        table_spark_schema(opts)


def test_job_schema_not_matching_the_table_fails_the_query(
    sp: Any, catalog: Any, catalog_props: dict[str, str], tmp_path: Path
) -> None:
    table = create_events_table(catalog, "raw.events")
    add(table, "a", [1])
    opts = reader_options(catalog_props, "raw.events", read_start_micros=T0_US, read_end_micros=T0_US + HOUR)
    df = sp.readStream.format("kappa_iceberg").schema("event_id STRING, show_id STRING").options(**opts).load()
    with pytest.raises(Exception, match=r"has 'show_id' as string; the table has it as bigint"):
        run_query(df, tmp_path / "ck")


def test_direct_parquet_read_gives_exactly_the_rows_of_a_pyiceberg_scan(
    catalog: Any, catalog_props: dict[str, str]
) -> None:
    """The executor's pyarrow-only read (row groups pruned by statistics, range filter, columns
    by field id) returns the rows pyiceberg's own scan returns, batch by batch; files it cannot
    read that way (a column added after they were written) fall back to pyiceberg."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan
    from pyiceberg.types import StringType
    from pyspark.sql.types import StructType

    from airflow_provider_kappa.spark.source.read import read_parquet_direct

    table = create_events_table(catalog, "raw.events")
    with table.transaction() as tx:
        tx.set_properties(**{"write.parquet.row-group-limit": "2"})  # several row groups per file
    add(table, "a", [1, 5, 20, 44, 45, 46])
    add(table, "b", [3, 30, 59, 61, 29.9])
    with table.update_schema() as update:
        update.rename_column("show_id", "show")
        update.add_column("note", StringType())
    table = catalog.load_table("raw.events")
    rows = [event(0, T0 + timedelta(minutes=m)) | {"event_id": f"c{m}", "note": f"n{m}"} for m in (2, 31, 62)]
    rows.append(event(0, T0) | {"event_id": "null-ingestion", "ingestion_ts": None, "note": None})
    arrow = pa.Table.from_pylist(
        [{("show" if k == "show_id" else k): v for k, v in r.items()} for r in rows], schema=table.schema().as_arrow()
    )
    table.append(arrow)
    start, end = T0_US + 2 * MIN, T0_US + 62 * MIN

    def read_all(
        columns: list[str],
    ) -> tuple[list[list[tuple[Any, ...]]], list[list[tuple[Any, ...]]], KappaIcebergStreamReader]:
        opts = reader_options(catalog_props, "raw.events", read_start_micros=start, read_end_micros=end)
        full = table_spark_schema(opts)
        schema = StructType([f for f in full.fields if f.name in columns])
        reader = KappaIcebergStreamReader(schema, opts)
        got, want = [], []
        pos = reader.initialOffset()
        while (nxt := reader.latestOffset(pos, reader.getDefaultReadLimit())) != pos:
            batch = [
                tuple(r[c] for c in columns)
                for p in reader.partitions(pos, nxt)
                for b in reader.read(p)
                for r in b.to_pylist()
            ]
            got.append(sorted(batch))
            expr = And(GreaterThanOrEqual("ingestion_ts", pos["pos"]), LessThan("ingestion_ts", nxt["pos"]))
            scan = table.scan(row_filter=expr, selected_fields=tuple(columns)).to_arrow()
            want.append(sorted(tuple(r[c] for c in columns) for r in scan.to_pylist()))
            pos = nxt
        return got, want, reader

    narrow, narrow_want, reader = read_all(["event_id", "show", "ingestion_ts"])
    assert narrow == narrow_want
    assert [r[0] for b in narrow for r in b] and "null-ingestion" not in {r[0] for b in narrow for r in b}
    assert sorted(r[0] for b in narrow for r in b) == sorted(
        ["a1-5", "a2-20", "a3-44", "a4-45", "a5-46", "b0-3", "b1-30", "b2-59", "b3-61", "b4-29.9", "c2", "c31"]
    )
    assert len(narrow) == 3  # grid cells [2,30) [30,60) [60,62)
    ctx = reader._driver().context
    first_file = reader._driver().index.all()[0].path
    assert read_parquet_direct(first_file, ctx, start, end) is not None  # renamed column found by field id
    assert pq.ParquetFile(first_file.removeprefix("file://")).metadata.num_row_groups > 1  # pruning is exercised

    full, full_want, reader = read_all(["event_id", "show", "note", "ingestion_ts"])
    assert full == full_want
    assert {r[2] for b in full for r in b} == {None, "n2", "n31"}  # old files: note is null
    ctx = reader._driver().context
    assert read_parquet_direct(first_file, ctx, start, end) is None  # 'note' is not in the old file: pyiceberg reads it


def test_make_partitions_balances_in_range_bytes_and_keeps_every_file_once_in_order() -> None:
    """Files straddling the batch start (late rows of the previous cell) weigh only their share
    of the range, so two tasks get about the same work; every file lands in exactly one task,
    tasks are contiguous runs of the lower-bound order."""
    from airflow_provider_kappa.spark.source.file_index import FileSpan
    from airflow_provider_kappa.spark.source.partitions import ReadContext, in_range_bytes, make_partitions

    ctx = ReadContext("raw.e", "file:///w", "{}", {}, ("event_id",), "ingestion_ts")
    a, b = 100 * MIN, 115 * MIN

    def span(i: int, lo: float, hi: float) -> FileSpan:
        return FileSpan(f"f{i:02d}", "PARQUET", 1000, 1000, int(lo * MIN), int(hi * MIN))

    straddlers = [
        span(i, 96 + i, 100.9 + i) for i in range(4)
    ]  # files of the previous cell: 18% to 80% of their range inside
    inside = [span(4 + i, 100 + i, 100.99 + i) for i in range(15)]  # one file per minute of the cell
    spans = straddlers + inside
    assert in_range_bytes(straddlers[0], a, b) < 200 and in_range_bytes(inside[0], a, b) == 1000
    assert (
        in_range_bytes(span(99, 90, 95), a, b) == 1
        and in_range_bytes(FileSpan("u", "PARQUET", 1, 500, None, None), a, b) == 500
    )
    parts = make_partitions(spans, a, b, ctx, 2, 64 << 20)
    assert [s for p in parts for s in p.files] == spans
    assert len(parts) == 2 and all(p.start_micros == a and p.end_micros == b for p in parts)
    work = [sum(in_range_bytes(s, a, b) for s in p.files) for p in parts]
    assert abs(work[0] - work[1]) <= 1000  # within one file of each other
    assert len(make_partitions(spans, a, b, ctx, 2, 4000)) == 5  # ~17,000 bytes of work / 4,000 per task
    assert len(make_partitions(spans[:1], a, b, ctx, 2, 64 << 20)) == 1
