"""Publish on a real sqlite SqlCatalog: one atomic window replacement, conflicts retried."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from lake import T0, create_summary_table, sorted_rows, summary_row, summary_table

from airflow_provider_kappa.backfill.publish import publish_window, replace_window
from airflow_provider_kappa.backfill.validate import validate_window
from airflow_provider_kappa.exceptions import KappaSinkError
from airflow_provider_kappa.spark.staging import clear_slice, drop_staging, ensure_staging_table, staging_table_name

TARGET = "prod.summary"
H = timedelta(hours=1)
START, END = T0 + H, T0 + 3 * H  # the window: hours 1 and 2
BEFORE = [summary_row(0, 1, 1), summary_row(55, 2, 2)]  # hour 0
INSIDE = [summary_row(60, 1, 10), summary_row(65, 1, 11), summary_row(150, 3, 12)]  # hours 1, 2
AFTER = [summary_row(180, 1, 3), summary_row(200, 4, 4)]  # hour 3
STAGED = [summary_row(60, 1, 10), summary_row(65, 1, 99), summary_row(70, 2, 5), summary_row(175, 3, 1)]


def _path(uri: str) -> Path:
    assert uri.startswith("file://"), uri
    return Path(uri[len("file://") :])


def _files(table: Any) -> dict[str, str]:
    """Data files of the current snapshot -> sha256 of their bytes."""
    return {
        t.file.file_path: hashlib.sha256(_path(t.file.file_path).read_bytes()).hexdigest()
        for t in table.scan().plan_files()
    }


def _stage(catalog: Any, rows: list[dict[str, Any]], slice_id: str = "s1") -> str:
    name = staging_table_name(TARGET, "bf", slice_id)
    table = ensure_staging_table(catalog, TARGET, name)
    if rows:
        table.append(summary_table(rows))
    return name


def _data_dir_files(table: Any) -> set[str]:
    return {f"file://{p}" for p in _path(table.location()).joinpath("data").rglob("*.parquet")}


def test_publish_replaces_the_window_in_one_commit_and_leaves_other_files_byte_identical(catalog: Any) -> None:
    target = create_summary_table(catalog, TARGET)  # partitioned by hour(window_start)
    for rows in (BEFORE, INSIDE, AFTER):
        target.append(summary_table(rows))
    outside_files = {
        p: h
        for p, h in _files(target).items()
        if "window_hour=2026-11-01-01" not in p and "window_hour=2026-11-01-02" not in p
    }
    assert len(outside_files) == 2
    metadata_log = len(target.metadata.metadata_log)
    staging = [_stage(catalog, STAGED[:2]), _stage(catalog, STAGED[2:], "s2")]

    result = publish_window(
        catalog, TARGET, staging, "window_start", START, END, snapshot_properties={"kappa.backfill-id": "bf"}
    )

    after = catalog.load_table(TARGET)
    assert sorted_rows(after) == sorted_rows(summary_table(BEFORE + AFTER + STAGED))
    assert (result.rows_deleted, result.rows_added, result.attempts) == (3, 4, 1)
    assert result.snapshot_id == after.current_snapshot().snapshot_id
    # the files outside the window are the same files with the same bytes
    files_after = _files(after)
    assert {p: files_after[p] for p in outside_files} == outside_files
    # one catalog commit (one metadata swap), its snapshots stamped
    assert len(after.metadata.metadata_log) == metadata_log + 1
    summary = after.current_snapshot().summary
    assert summary["kappa.publish.window-start"] == START.isoformat()
    assert summary["kappa.publish.window-end"] == END.isoformat()
    assert summary["kappa.backfill-id"] == "bf"
    assert summary["kappa.publish.staging-tables"] == ",".join(staging)
    # and validation now agrees completely
    assert validate_window(catalog, TARGET, staging, "window_start", START, END).match_rate == 100.0


def test_files_straddling_the_window_are_rewritten_keeping_their_outside_rows(catalog: Any) -> None:
    target = create_summary_table(catalog, TARGET, partitioned=False)
    target.append(summary_table(BEFORE + INSIDE + AFTER))  # one file across the window
    (straddling,) = _files(target)
    result = replace_window(target, summary_table(STAGED), "window_start", START, END)
    after = catalog.load_table(TARGET)
    assert sorted_rows(after) == sorted_rows(summary_table(BEFORE + AFTER + STAGED))
    assert straddling not in _files(after)
    assert (result.rows_deleted, result.rows_added) == (3, 4)
    # every row outside the window keeps all its values
    outside = [r for r in after.scan().to_arrow().to_pylist() if not START <= r["window_start"] < END]
    assert sorted(outside, key=repr) == sorted(BEFORE + AFTER, key=repr)


def test_a_concurrent_live_append_is_kept(catalog: Any) -> None:
    create_summary_table(catalog, TARGET)
    catalog.load_table(TARGET).append(summary_table(BEFORE + INSIDE + AFTER))
    stale = catalog.load_table(TARGET)  # publish starts from this state ...
    live = catalog.load_table(TARGET)
    live_rows = [summary_row(300, 7, 70)]
    live.append(summary_table(live_rows))  # ... and the live job commits first

    result = replace_window(stale, summary_table(STAGED), "window_start", START, END)

    after = catalog.load_table(TARGET)
    assert sorted_rows(after) == sorted_rows(summary_table(BEFORE + AFTER + live_rows + STAGED))
    assert (result.rows_deleted, result.rows_added) == (3, 4)
    # the commit built on the stale state was refused and rebuilt on top of the live commit
    assert stale.current_snapshot().snapshot_id == result.snapshot_id  # the stale object was refreshed
    lineage = []
    snapshot = after.current_snapshot()
    while snapshot is not None:
        lineage.append(snapshot.snapshot_id)
        snapshot = after.snapshot_by_id(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id else None
    assert live.current_snapshot().snapshot_id in lineage


def test_a_live_append_inside_the_window_is_replaced_like_the_rest_of_the_window(catalog: Any) -> None:
    create_summary_table(catalog, TARGET)
    catalog.load_table(TARGET).append(summary_table(BEFORE + INSIDE))
    stale = catalog.load_table(TARGET)
    catalog.load_table(TARGET).append(summary_table([summary_row(90, 8, 80)]))
    result = replace_window(stale, summary_table(STAGED), "window_start", START, END)
    assert result.attempts == 2 and result.rows_deleted == 4
    assert sorted_rows(catalog.load_table(TARGET)) == sorted_rows(summary_table(BEFORE + STAGED))


def test_conflicts_beyond_max_attempts_fail_without_changing_the_target_or_leaving_files(catalog: Any) -> None:
    create_summary_table(catalog, TARGET)
    catalog.load_table(TARGET).append(summary_table(BEFORE + INSIDE))
    stale = catalog.load_table(TARGET)
    catalog.load_table(TARGET).append(summary_table([summary_row(90, 8, 80)]))  # inside the window
    expected = sorted_rows(catalog.load_table(TARGET))
    # pyiceberg 0.12 refuses the stale overwrite in its own validation, 0.11 at the catalog's commit
    with pytest.raises(KappaSinkError, match="conflicted 1 time.*(ValidationException|CommitFailedException)"):
        replace_window(stale, summary_table(STAGED), "window_start", START, END, max_attempts=1)
    after = catalog.load_table(TARGET)
    assert sorted_rows(after) == expected
    assert _data_dir_files(after) == set(_files(after))  # the staged files written for the attempt are gone


def test_staged_rows_outside_the_window_are_refused(catalog: Any) -> None:
    create_summary_table(catalog, TARGET)
    catalog.load_table(TARGET).append(summary_table(BEFORE + INSIDE))
    before = sorted_rows(catalog.load_table(TARGET))
    staging = [_stage(catalog, STAGED + [summary_row(10, 1, 1)])]
    with pytest.raises(KappaSinkError, match=r"1 staged row\(s\) have window_start outside the window"):
        publish_window(catalog, TARGET, staging, "window_start", START, END)
    assert sorted_rows(catalog.load_table(TARGET)) == before


def test_empty_staging_empties_the_window_and_an_empty_window_with_nothing_staged_commits_nothing(catalog: Any) -> None:
    target = create_summary_table(catalog, TARGET)
    target.append(summary_table(BEFORE + INSIDE + AFTER))
    staging = [_stage(catalog, [])]
    result = publish_window(catalog, TARGET, staging, "window_start", START, END)
    assert (result.rows_deleted, result.rows_added) == (3, 0)
    after = catalog.load_table(TARGET)
    assert sorted_rows(after) == sorted_rows(summary_table(BEFORE + AFTER))
    again = publish_window(catalog, TARGET, staging, "window_start", START, END)
    assert (again.rows_deleted, again.rows_added, again.snapshot_id) == (0, 0, after.current_snapshot().snapshot_id)


def test_publish_names_missing_tables(catalog: Any) -> None:
    with pytest.raises(KappaSinkError, match="target table 'prod.summary' does not exist"):
        publish_window(catalog, TARGET, [], "window_start", START, END)
    create_summary_table(catalog, TARGET)
    with pytest.raises(KappaSinkError, match="staging table 'kappa_staging.gone' does not exist"):
        publish_window(catalog, TARGET, ["kappa_staging.gone"], "window_start", START, END)


# --- by reference: the staged files become the target's files --------------------------------------


def _warehouse_parquet(catalog_props: dict[str, str]) -> set[str]:
    return {f"file://{p}" for p in _path(catalog_props["warehouse"]).rglob("*.parquet")}


def _staged_paths(catalog: Any, staging: list[str]) -> set[str]:
    return {t.file.file_path for name in staging for t in catalog.load_table(name).scan().plan_files()}


def _window_files(table: Any) -> set[str]:
    return {
        t.file.file_path
        for t in table.scan(
            row_filter=f"window_start >= '{START.isoformat()}' and window_start < '{END.isoformat()}'"
        ).plan_files()
    }


def test_publish_commits_the_staged_files_by_reference_and_writes_no_parquet(
    catalog: Any, catalog_props: dict[str, str]
) -> None:
    target = create_summary_table(catalog, TARGET)  # partitioned by hour: every target file is inside or outside
    for rows in (BEFORE, INSIDE, AFTER):
        target.append(summary_table(rows))
    staging = [_stage(catalog, STAGED[:2]), _stage(catalog, STAGED[2:], "s2")]
    staged = _staged_paths(catalog, staging)
    parquet_before = _warehouse_parquet(catalog_props)

    result = publish_window(catalog, TARGET, staging, "window_start", START, END)

    after = catalog.load_table(TARGET)
    assert sorted_rows(after) == sorted_rows(summary_table(BEFORE + AFTER + STAGED))
    assert (result.rows_deleted, result.rows_added) == (3, 4)
    assert _window_files(after) == staged  # the window's files ARE the staged files
    assert _warehouse_parquet(catalog_props) == parquet_before  # no Parquet written for the staged rows
    assert all(catalog.load_table(name).properties["kappa.published-to"] == TARGET for name in staging)


def test_published_files_survive_clearing_and_dropping_staging_but_unpublished_ones_do_not(catalog: Any) -> None:
    target = create_summary_table(catalog, TARGET)
    target.append(summary_table(BEFORE + INSIDE + AFTER))
    staging = [_stage(catalog, STAGED[:2]), _stage(catalog, STAGED[2:], "s2")]
    published = _staged_paths(catalog, staging)
    publish_window(catalog, TARGET, staging, "window_start", START, END)
    expected = sorted_rows(summary_table(BEFORE + AFTER + STAGED))

    # a later rerun of slice s1: cleared (table dropped and recreated), restaged, cleared again
    clear_slice(catalog, TARGET, staging[0])
    rerun = catalog.load_table(staging[0])
    rerun.append(summary_table([summary_row(61, 9, 9)]))
    unpublished = _staged_paths(catalog, staging[:1])
    clear_slice(catalog, TARGET, staging[0])
    assert drop_staging(catalog, TARGET, "bf") == sorted(staging)

    assert all(_path(p).exists() for p in published)  # the target's files are kept ...
    assert not any(_path(p).exists() for p in unpublished)  # ... the unpublished rerun's are purged
    assert sorted_rows(catalog.load_table(TARGET)) == expected  # and the target reads as before


def test_republishing_a_published_backfill_stays_exact(catalog: Any) -> None:
    target = create_summary_table(catalog, TARGET)
    target.append(summary_table(BEFORE + INSIDE + AFTER))
    staging = [_stage(catalog, STAGED[:2]), _stage(catalog, STAGED[2:], "s2")]
    first = publish_window(catalog, TARGET, staging, "window_start", START, END)
    # the same backfill again (kappa backfill --resume): the same staged files, published again
    again = publish_window(catalog, TARGET, staging, "window_start", START, END)
    after = catalog.load_table(TARGET)
    assert sorted_rows(after) == sorted_rows(summary_table(BEFORE + AFTER + STAGED))
    assert (again.rows_deleted, again.rows_added) == (4, 4) and again.snapshot_id != first.snapshot_id
    assert _window_files(after) == _staged_paths(catalog, staging)
    assert validate_window(catalog, TARGET, staging, "window_start", START, END).match_rate == 100.0
    drop_staging(catalog, TARGET, "bf")
    assert sorted_rows(catalog.load_table(TARGET)) == sorted_rows(summary_table(BEFORE + AFTER + STAGED))


def test_a_failed_publish_by_reference_leaves_the_staged_files_and_the_target(
    catalog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import airflow_provider_kappa.backfill.publish as publish_module

    create_summary_table(catalog, TARGET)
    catalog.load_table(TARGET).append(summary_table(BEFORE + INSIDE))
    staging = [_stage(catalog, STAGED)]
    real = publish_module.staged_files

    def staged_after_a_live_commit_in_the_window(*args: Any, **kwargs: Any) -> Any:
        catalog.load_table(TARGET).append(summary_table([summary_row(90, 8, 80)]))  # publish has loaded the target
        return real(*args, **kwargs)

    monkeypatch.setattr(publish_module, "staged_files", staged_after_a_live_commit_in_the_window)
    with pytest.raises(KappaSinkError, match="conflicted 1 time"):
        publish_window(catalog, TARGET, staging, "window_start", START, END, max_attempts=1)
    assert sorted_rows(catalog.load_table(TARGET)) == sorted_rows(
        summary_table(BEFORE + INSIDE + [summary_row(90, 8, 80)])
    )
    assert sorted_rows(catalog.load_table(staging[0])) == sorted_rows(summary_table(STAGED))  # staged files intact
    monkeypatch.undo()
    result = publish_window(catalog, TARGET, staging, "window_start", START, END, max_attempts=2)
    assert result.rows_deleted == 4
    assert sorted_rows(catalog.load_table(TARGET)) == sorted_rows(summary_table(BEFORE + STAGED))


def test_staging_of_an_older_target_spec_is_written_again_in_the_target_spec(
    catalog: Any, catalog_props: dict[str, str]
) -> None:
    from pyiceberg.transforms import IdentityTransform

    target = create_summary_table(catalog, TARGET)
    target.append(summary_table(BEFORE + INSIDE + AFTER))
    staging = [_stage(catalog, STAGED)]
    with target.update_spec() as spec:  # the target's spec evolves after the slice ran
        spec.add_field("show_id", IdentityTransform(), "show")
    result = publish_window(catalog, TARGET, staging, "window_start", START, END)
    after = catalog.load_table(TARGET)
    assert sorted_rows(after) == sorted_rows(summary_table(BEFORE + AFTER + STAGED))
    assert result.rows_added == 4
    window = _window_files(after)
    assert window.isdisjoint(_staged_paths(catalog, staging))  # rewritten, in the target's current spec
    assert {t.file.spec_id for t in after.scan().plan_files() if t.file.file_path in window} == {after.spec().spec_id}
