"""The kappa_iceberg stream writer on real local Spark and a real sqlite SqlCatalog.

Input: Parquet files read by Spark's file stream source, one file per micro-batch
(``maxFilesPerTrigger=1``), so batch boundaries are deterministic.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from lake import T0, create_summary_table, sorted_rows, summary_row, summary_table

from airflow_provider_kappa.backfill.publish import publish_window
from airflow_provider_kappa.exceptions import KappaSinkError
from airflow_provider_kappa.spark.datasource import SHORT_NAME, KappaIcebergDataSource
from airflow_provider_kappa.spark.sink import KappaCommitMessage, KappaIcebergStreamWriter
from airflow_provider_kappa.spark.staging import clear_slice, ensure_staging_table, staging_table_name, staging_tables

TARGET = "prod.summary"
H = timedelta(hours=1)
SPARK_SCHEMA = "window_start TIMESTAMP, window_end TIMESTAMP, show_id BIGINT, attributed_plays BIGINT"
# two input files (one micro-batch each when read file by file); rows before, in and after [T0, T0+2h)
BATCHES = [
    [summary_row(-5, 9, 9), summary_row(0, 1, 3), summary_row(5, 1, 4), summary_row(30, 2, 1)],
    [
        summary_row(60, 2, 7),
        summary_row(60, 2, 7),
        summary_row(90, 3, 2),
        summary_row(115, 3, 5),
        summary_row(125, 9, 9),
    ],
]
ALL_ROWS = [r for b in BATCHES for r in b]


def _in(rows: list[dict[str, Any]], start: Any, end: Any) -> list[dict[str, Any]]:
    return [r for r in rows if start <= r["window_start"] < end]


@pytest.fixture()
def source_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "input"
    folder.mkdir()
    for i, rows in enumerate(BATCHES):
        pq.write_table(summary_table(rows), folder / f"part-{i}.parquet")
    return folder


@pytest.fixture()
def kappa_conf(spark: Any) -> Iterator[Any]:
    """Set spark.kappa.* on the shared session for one test, then remove it."""
    set_keys: set[str] = set()

    def apply(conf: dict[str, str]) -> None:
        for k in list(set_keys):
            spark.conf.unset(k)
        set_keys.clear()
        for k, v in conf.items():
            spark.conf.set(k, v)
            set_keys.add(k)

    yield apply
    for k in set_keys:
        spark.conf.unset(k)


def _stream(spark: Any, source_dir: Path, *, file_per_batch: bool = True) -> Any:
    reader = spark.readStream.schema(SPARK_SCHEMA)
    if file_per_batch:
        reader = reader.option("maxFilesPerTrigger", 1)
    return reader.parquet(str(source_dir))


def _writer_options(catalog_props: dict[str, str], table: str, **extra: str) -> dict[str, str]:
    return {
        "catalog": "lake",
        "catalog_properties": json.dumps(catalog_props),
        "table": table,
        "target_table": TARGET,
        "time_column": "window_start",
        "mode": "live",
        "writer_id": "test/summary/abc",
        **extra,
    }


def _run(spark: Any, df: Any, options: dict[str, str], checkpoint: Path) -> Any:
    spark.dataSource.register(KappaIcebergDataSource)
    query = (
        df.writeStream.format(SHORT_NAME)
        .options(**options)
        .outputMode("append")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return query


def _kappa_summaries(table: Any) -> list[dict[str, str]]:
    return [
        {k: v for k, v in s.summary.additional_properties.items() if k.startswith("kappa.")} for s in table.snapshots()
    ]


def _parquet_files(table: Any) -> set[str]:
    location = table.location()
    assert location.startswith("file://")
    return {f"file://{p}" for p in Path(location[len("file://") :]).rglob("*.parquet")}


def _live_files(table: Any) -> set[str]:
    return {t.file.file_path for t in table.scan().plan_files()}


def test_each_micro_batch_is_one_append_of_real_iceberg_data_files(
    spark: Any, catalog: Any, catalog_props: dict[str, str], source_dir: Path, tmp_path: Path
) -> None:
    create_summary_table(catalog, TARGET)  # partitioned by hour(window_start)
    query = _run(spark, _stream(spark, source_dir), _writer_options(catalog_props, TARGET), tmp_path / "ck")
    table = catalog.load_table(TARGET)
    assert sorted_rows(table) == sorted_rows(summary_table(ALL_ROWS))
    assert _kappa_summaries(table) == [
        {"kappa.writer-id": "test/summary/abc", "kappa.query-id": str(query.id), "kappa.batch-id": str(b)}
        for b in range(2)
    ]
    assert [s.summary.operation.value for s in table.snapshots()] == ["append"] * 2
    tasks = list(table.scan().plan_files())
    # partitioned by the table's spec, with column metrics a planner can prune on
    assert {t.file.partition[0] for t in tasks} == {int((T0 + k * H).timestamp()) // 3600 for k in (-1, 0, 1, 2)}
    for t in tasks:
        assert t.file.record_count > 0 and t.file.lower_bounds and t.file.upper_bounds and t.file.value_counts
    # a time-filtered scan prunes files by those metrics
    pruned = table.scan(row_filter=f"window_start >= '{(T0 + 2 * H).isoformat()}'").plan_files()
    assert len(list(pruned)) == 1


def test_backfill_stamps_slice_and_backfill_id_and_creates_its_staging_table(
    spark: Any, catalog: Any, catalog_props: dict[str, str], source_dir: Path, tmp_path: Path
) -> None:
    create_summary_table(catalog, TARGET)
    staging = staging_table_name(TARGET, "bf1", "s0")
    options = _writer_options(catalog_props, staging, mode="backfill", slice="s0", backfill_id="bf1")
    _run(spark, _stream(spark, source_dir, file_per_batch=False), options, tmp_path / "ck")
    staged = catalog.load_table(staging)
    assert sorted_rows(staged) == sorted_rows(summary_table(ALL_ROWS))
    assert {(s["kappa.slice"], s["kappa.backfill-id"]) for s in _kappa_summaries(staged)} == {("s0", "bf1")}
    assert catalog.load_table(TARGET).current_snapshot() is None  # the target is untouched


def test_a_backfill_may_not_write_its_target(catalog: Any, catalog_props: dict[str, str]) -> None:
    from pyspark.sql.types import StructType

    create_summary_table(catalog, TARGET)
    with pytest.raises(KappaSinkError, match="must write to a staging table"):
        KappaIcebergStreamWriter(
            StructType.fromDDL(SPARK_SCHEMA), _writer_options(catalog_props, TARGET, mode="backfill"), False
        )


def test_crash_between_iceberg_commit_and_checkpoint_commit_does_not_duplicate(
    spark: Any, catalog: Any, catalog_props: dict[str, str], source_dir: Path, tmp_path: Path
) -> None:
    from pyspark.errors import StreamingQueryException

    create_summary_table(catalog, TARGET)
    checkpoint = tmp_path / "ck"
    crashing = _writer_options(catalog_props, TARGET, fail_after_commit_batch="1")
    with pytest.raises(StreamingQueryException, match="fail_after_commit_batch=1"):
        _run(spark, _stream(spark, source_dir), crashing, checkpoint)
    table = catalog.load_table(TARGET)
    # batch 1 is in Iceberg, but Spark's commit log does not know it: it will be replayed
    assert [s["kappa.batch-id"] for s in _kappa_summaries(table)] == ["0", "1"]
    assert (checkpoint / "offsets" / "1").exists() and not (checkpoint / "commits" / "1").exists()

    late = [summary_row(150, 5, 5)]
    pq.write_table(summary_table(late), source_dir / "part-9.parquet")  # new input meanwhile: batch 2
    _run(spark, _stream(spark, source_dir), _writer_options(catalog_props, TARGET), checkpoint)

    table = catalog.load_table(TARGET)
    assert sorted_rows(table) == sorted_rows(summary_table(ALL_ROWS + late))  # no duplicate rows
    assert [s["kappa.batch-id"] for s in _kappa_summaries(table)] == ["0", "1", "2"]
    assert (checkpoint / "commits" / "1").exists() and (checkpoint / "commits" / "2").exists()
    assert _parquet_files(table) == _live_files(table)  # the replay's own files were deleted


def test_a_new_checkpoint_at_the_same_path_is_not_mistaken_for_a_replay(
    spark: Any, catalog: Any, catalog_props: dict[str, str], source_dir: Path, tmp_path: Path
) -> None:
    import shutil

    create_summary_table(catalog, TARGET)
    checkpoint = tmp_path / "ck"
    first = _run(
        spark, _stream(spark, source_dir, file_per_batch=False), _writer_options(catalog_props, TARGET), checkpoint
    )
    shutil.rmtree(checkpoint)  # same path, same writer id, batch ids restart at 0
    second = _run(
        spark, _stream(spark, source_dir, file_per_batch=False), _writer_options(catalog_props, TARGET), checkpoint
    )
    assert first.id != second.id
    table = catalog.load_table(TARGET)
    assert sorted_rows(table) == sorted_rows(summary_table(ALL_ROWS + ALL_ROWS))


def _slice_conf(
    catalog_props: dict[str, str], lake: Path, backfill: str, slice_id: str, start: Any, end: Any
) -> dict[str, str]:
    conf = {
        "spark.kappa.mode": "backfill",
        "spark.kappa.job": "summary_job",
        "spark.kappa.checkpoint": str(lake / "checkpoints" / backfill / slice_id),
        "spark.kappa.trigger": "availableNow",
        "spark.kappa.read.start": (start - H).isoformat(),
        "spark.kappa.read.end": (end + H).isoformat(),
        "spark.kappa.backfill.id": backfill,
        "spark.kappa.sink.summary.catalog": "lake",
        "spark.kappa.sink.summary.table": TARGET,
        "spark.kappa.sink.summary.time_column": "window_start",
        "spark.kappa.sink.summary.write_table": staging_table_name(TARGET, backfill, slice_id),
        "spark.kappa.sink.summary.owns.start": start.isoformat(),
        "spark.kappa.sink.summary.owns.end": end.isoformat(),
        "spark.kappa.sink.summary.slice": slice_id,
    }
    conf.update({f"spark.kappa.catalog.lake.{k}": v for k, v in catalog_props.items()})
    return conf


def test_slice_reruns_leave_exactly_what_one_clean_run_leaves(
    spark: Any, catalog: Any, catalog_props: dict[str, str], source_dir: Path, tmp_path: Path, kappa_conf: Any
) -> None:
    """Slices A=[T0, T0+1h) and B=[T0+1h, T0+2h) through write_sink (parallel-mode slices)."""
    import shutil

    from airflow_provider_kappa.spark import write_sink

    target = create_summary_table(catalog, TARGET)
    seeded = [summary_row(-30, 4, 4), summary_row(10, 4, 40), summary_row(150, 4, 4)]  # one row in the window
    target.append(summary_table(seeded))
    slices = {"a": (T0, T0 + H), "b": (T0 + H, T0 + 2 * H)}

    def run_slice(backfill: str, slice_id: str) -> None:
        start, end = slices[slice_id]
        conf = _slice_conf(catalog_props, tmp_path, backfill, slice_id, start, end)
        shutil.rmtree(conf["spark.kappa.checkpoint"], ignore_errors=True)  # a parallel slice restarts from scratch
        clear_slice(catalog, TARGET, conf["spark.kappa.sink.summary.write_table"])
        kappa_conf(conf)
        write_sink(_stream(spark, source_dir, file_per_batch=False), "summary").awaitTermination()

    # the clean run: each slice once
    for s in ("a", "b"):
        run_slice("clean", s)
    clean = staging_tables(catalog, TARGET, "clean")
    # the messy run: a, then b, b rerun twice, then a cleared and rerun
    for s in ("a", "b", "b", "b", "a"):
        run_slice("messy", s)
    messy = staging_tables(catalog, TARGET, "messy")

    def staged_rows(names: list[str]) -> list[tuple[Any, ...]]:
        return sorted((r for n in names for r in sorted_rows(catalog.load_table(n))), key=repr)

    assert staged_rows(messy) == staged_rows(clean) == sorted_rows(summary_table(_in(ALL_ROWS, T0, T0 + 2 * H)))
    for name in messy:  # each slice staged only the rows it owns
        slice_id = name.rsplit("__", 1)[1]
        assert sorted_rows(catalog.load_table(name)) == sorted_rows(summary_table(_in(ALL_ROWS, *slices[slice_id])))

    result = publish_window(catalog, TARGET, messy, "window_start", T0, T0 + 2 * H)
    expected = sorted_rows(
        summary_table(
            _in(seeded, T0 - 24 * H, T0) + _in(ALL_ROWS, T0, T0 + 2 * H) + _in(seeded, T0 + 2 * H, T0 + 24 * H)
        )
    )
    assert sorted_rows(catalog.load_table(TARGET)) == expected
    assert (result.rows_deleted, result.rows_added) == (1, 7)  # (10, 4, 40) out; 0, 5, 30, 60, 60, 90, 115 in


def test_schema_mismatch_fails_before_anything_is_written_naming_the_columns(
    spark: Any, catalog: Any, catalog_props: dict[str, str], source_dir: Path, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    create_summary_table(catalog, TARGET)
    staging = staging_table_name(TARGET, "bf1", "s0")
    ensure_staging_table(catalog, TARGET, staging)
    bad = (
        _stream(spark, source_dir)
        .withColumnRenamed("show_id", "show")
        .withColumn("attributed_plays", F.col("attributed_plays").cast("string"))
    )
    options = _writer_options(catalog_props, staging, mode="backfill")
    with pytest.raises(Exception) as info:
        _run(spark, bad, options, tmp_path / "ck")
    message = str(info.value)
    assert "missing columns ['show_id']" in message
    assert "columns not in the table ['show']" in message
    assert "mistyped columns ['attributed_plays (string given, int64 expected)']" in message
    assert "Nothing was written" in message
    staged = catalog.load_table(staging)
    assert staged.current_snapshot() is None and _parquet_files(staged) == set()


def test_live_mode_creates_a_missing_target_and_complete_mode_is_refused(
    spark: Any, catalog: Any, catalog_props: dict[str, str], source_dir: Path, tmp_path: Path
) -> None:
    _run(
        spark,
        _stream(spark, source_dir, file_per_batch=False),
        _writer_options(catalog_props, "prod.fresh"),
        tmp_path / "ck",
    )
    fresh = catalog.load_table("prod.fresh")
    assert [(f.name, str(f.field_type), f.required) for f in fresh.schema().fields] == [
        ("window_start", "timestamptz", False),
        ("window_end", "timestamptz", False),
        ("show_id", "long", False),
        ("attributed_plays", "long", False),
    ]
    assert [(f.name, str(f.transform)) for f in fresh.spec().fields] == [("window_start_day", "day")]
    assert sorted_rows(fresh) == sorted_rows(summary_table(ALL_ROWS))

    counts = _stream(spark, source_dir).groupBy("window_start").count()
    spark.dataSource.register(KappaIcebergDataSource)
    refusals = {
        "complete": "output mode 'complete' \\(overwrite\\) is not supported",
        "update": "does not support Update mode",
    }
    for mode, refusal in refusals.items():
        with pytest.raises(Exception, match=refusal):
            query = (
                counts.writeStream.format(SHORT_NAME)
                .options(**_writer_options(catalog_props, "prod.counts"))
                .outputMode(mode)
                .option("checkpointLocation", str(tmp_path / f"ck_{mode}"))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
    assert not catalog.table_exists("prod.counts")  # refused before the writer touched the catalog


def test_writer_abort_deletes_files_and_empty_batches_commit_nothing(
    catalog: Any, catalog_props: dict[str, str]
) -> None:
    """The writer's three phases called directly, as Spark calls them (write on executors)."""
    from pyspark.sql.types import StructType

    table = create_summary_table(catalog, TARGET)
    writer = KappaIcebergStreamWriter(StructType.fromDDL(SPARK_SCHEMA), _writer_options(catalog_props, TARGET), False)
    batch = summary_table(BATCHES[0]).to_batches()[0]
    message = writer.write(iter([batch]))
    assert message.rows == 4 and len(message.files) == 2  # two hour partitions (-1h, 0h)
    assert _parquet_files(table) == {f.file_path for f in message.files}
    writer.abort([message, None], 0)
    assert _parquet_files(table) == set()

    writer.commit([KappaCommitMessage(), writer.write(iter([]))], 0)
    assert catalog.load_table(TARGET).current_snapshot() is None

    committed = writer.write(iter([batch]))
    writer.commit([committed], 1)
    writer.abort([committed], 1)  # Spark aborts when commit raised after the Iceberg commit: files stay
    writer.commit([writer.write(iter([batch]))], 1)  # the same batch again: skipped, its new files deleted
    table = catalog.load_table(TARGET)
    assert len(table.snapshots()) == 1
    assert sorted_rows(table) == sorted_rows(summary_table(BATCHES[0]))
    assert _parquet_files(table) == _live_files(table)


def test_a_catalog_locked_while_a_batch_commits_is_retried_in_place(
    spark: Any, catalog: Any, catalog_props: dict[str, str], lake_dir: Path
) -> None:
    """Issue #25: another writer holds the sqlite catalog past its busy timeout (5 s) just as the
    driver commits a micro-batch. The commit is retried in place (as publish is), the batch lands once."""
    import sqlite3
    import threading

    from pyspark.sql.types import StructType

    table = create_summary_table(catalog, TARGET)
    writer = KappaIcebergStreamWriter(StructType.fromDDL(SPARK_SCHEMA), _writer_options(catalog_props, TARGET), False)
    message = writer.write(iter([summary_table(BATCHES[0]).to_batches()[0]]))
    other = sqlite3.connect(lake_dir / "catalog.db", isolation_level=None, check_same_thread=False)
    other.execute("BEGIN EXCLUSIVE")
    release = threading.Timer(6.5, lambda: (other.execute("ROLLBACK"), other.close()))
    release.start()
    try:
        writer.commit([message], 0)  # before: "database is locked" failed the batch, and so the slice
    finally:
        release.join()
    table = catalog.load_table(TARGET)
    assert len(table.snapshots()) == 1
    assert sorted_rows(table) == sorted_rows(summary_table(BATCHES[0]))
    assert _parquet_files(table) == _live_files(table)
