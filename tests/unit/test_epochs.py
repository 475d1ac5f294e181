"""Fencing without Spark: slice epochs in the checkpoint store, the stream writer's refusal to
commit for a superseded epoch (called as Spark's driver and executors call it, on a real sqlite
SqlCatalog), children that die with their parent, and private folders of dead runs swept.
The same fence with real Spark runs kept alive through a retry: tests/integration/test_fencing.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from lake import create_summary_table, sorted_rows, summary_row, summary_table

from airflow_provider_kappa.engine.connect_server import with_session_id
from airflow_provider_kappa.engine.processes import private_folder, start_ticks, sweep_private_folders
from airflow_provider_kappa.exceptions import KappaConcurrencyError, KappaSupersededError
from airflow_provider_kappa.job.checkpoints import CheckpointStore
from airflow_provider_kappa.spark.staging import EPOCH_PROPERTY, clear_slice, ensure_staging_table, staging_table_name

TARGET = "prod.impression_play_summary"


def test_each_attempt_takes_a_new_higher_epoch_and_only_the_current_one_keeps_its_checkpoint(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "bf"))
    first = store.new_epoch("s0000")
    old = Path(store.start_sequential("s0000", 0, "s0001", first))
    (old / "offsets").mkdir(parents=True)
    (old / "offsets" / "0").write_text("old run")
    second = store.new_epoch("s0000")  # the retry, while the old run still runs
    assert int(second.split("-")[0]) == int(first.split("-")[0]) + 1 and second != first
    assert store.current_epoch("s0000") == second
    new = Path(store.start_sequential("s0000", 0, "s0001", second))
    assert new != old and not new.exists()  # its own, empty checkpoint: the old run's offsets are not in it
    (new / "offsets").mkdir(parents=True)
    (new / "offsets" / "0").write_text("retry")
    with pytest.raises(KappaSupersededError, match=f"epoch '{first}'.*superseded.*epoch '{second}'"):
        store.finish_sequential("s0000", "s0001", {"rows": 1}, first)
    assert not store.boundary_ready("s0001") and store.done("s0000") is None
    store.finish_sequential("s0000", "s0001", {"rows": 2}, second)
    assert (Path(str(store.kept_boundary("s0001"))) / "offsets" / "0").read_text() == "retry"
    assert store.done("s0000") == {"rows": 2} and not old.exists()
    # the next slice runs from a copy of that boundary; a third attempt of s0000 goes on numbering
    nxt = store.new_epoch("s0001")
    assert (Path(store.start_sequential("s0001", 1, None, nxt)) / "offsets" / "0").read_text() == "retry"
    assert store.new_epoch("s0000").startswith("0003-")
    with pytest.raises(KappaSupersededError):
        store.start_parallel("s0000", second)


def test_a_superseded_attempt_s_late_boundary_copy_never_becomes_the_next_slice_s_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #25: the stale attempt passes its epoch check, then the newer attempt starts, runs and
    keeps its boundary, and only then does the stale one copy its checkpoint to the same boundary."""
    store = CheckpointStore(str(tmp_path / "bf"))
    stale = store.new_epoch("s0000")
    folder = Path(store.start_sequential("s0000", 0, "s0001", stale))
    (folder / "offsets").mkdir(parents=True)
    (folder / "offsets" / "0").write_text("stale run")
    real_check = store.check_epoch
    newer: list[str] = []

    def racing_check(slice_id: str, epoch: str, cause: BaseException | None = None) -> None:
        real_check(slice_id, epoch, cause)
        if epoch == stale and not newer:  # right after the stale attempt's check: the retry runs to its end
            newer.append(store.new_epoch("s0000"))
            retry = Path(store.start_sequential("s0000", 0, "s0001", newer[0]))
            (retry / "offsets").mkdir(parents=True)
            (retry / "offsets" / "0").write_text("retry")
            store.finish_sequential("s0000", "s0001", {"rows": 2}, newer[0])

    monkeypatch.setattr(store, "check_epoch", racing_check)
    with pytest.raises(KappaSupersededError):
        store.finish_sequential("s0000", "s0001", {"rows": 1}, stale)  # its copy lands, then its 2nd check fails
    monkeypatch.undo()
    kept = store.kept_boundary("s0001")
    assert kept is not None and (Path(kept) / "offsets" / "0").read_text() == "retry", kept
    assert store.done("s0000") == {"rows": 2}
    nxt = store.new_epoch("s0001")
    assert (Path(store.start_sequential("s0001", 1, None, nxt)) / "offsets" / "0").read_text() == "retry"
    # a retry of s0000 now supersedes the kept boundary too: s0001 cannot start from it
    store.new_epoch("s0000")
    assert not store.boundary_ready("s0001")


def writer_options(catalog_props: dict[str, str], staging: str, epoch: str) -> dict[str, str]:
    return {
        "catalog": "lake",
        "catalog_properties": json.dumps(catalog_props),
        "table": staging,
        "target_table": TARGET,
        "time_column": "window_start",
        "mode": "backfill",
        "writer_id": "job/summary/abc",
        "slice": "s0000",
        "epoch": epoch,
    }


@pytest.mark.heavy
def test_a_superseded_writer_commits_nothing_and_deletes_its_files(catalog: Any, catalog_props: dict[str, str]) -> None:
    """The writer as Spark drives it: built on the driver, ``write`` on executors, ``commit`` /
    ``abort`` on the driver by a writer built again. A retry clearing the slice in between refuses
    the old epoch's commit, even into the recreated table of the same name."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from airflow_provider_kappa.spark.sink import KappaIcebergStreamWriter

    create_summary_table(catalog, TARGET)
    staging = staging_table_name(TARGET, "bf", "s0000")
    rows = summary_table([summary_row(0, 1, 5), summary_row(5, 2, 7)])
    schema = from_arrow_schema(rows.schema)
    clear_slice(catalog, TARGET, staging, "0001-aaaa")
    old = KappaIcebergStreamWriter(schema, writer_options(catalog_props, staging, "0001-aaaa"), overwrite=False)
    message = old.write(iter(rows.to_batches()))
    files = [Path(f.file_path.removeprefix("file://")) for f in message.files]
    assert files and all(f.exists() for f in files)

    clear_slice(catalog, TARGET, staging, "0002-bbbb")  # the retry takes its epoch
    with pytest.raises(KappaSupersededError, match="belongs to epoch '0002-bbbb'.*epoch '0001-aaaa' was superseded"):
        KappaIcebergStreamWriter(schema, writer_options(catalog_props, staging, "0001-aaaa"), overwrite=False).commit(
            [message], 0
        )
    with pytest.raises(KappaSupersededError):
        old.commit([message], 0)  # the writer built before the retry too
    assert not any(f.exists() for f in files)
    assert catalog.load_table(staging).current_snapshot() is None
    # a writer of the old epoch built now writes nothing; its batch's abort deletes what it had
    late = KappaIcebergStreamWriter(schema, writer_options(catalog_props, staging, "0001-aaaa"), overwrite=False)
    with pytest.raises(KappaSupersededError):
        late.write(iter(rows.to_batches()))
    leftover = old.write(iter(rows.to_batches()))  # files of the old run written before the refusal
    late.abort([leftover], 1)
    assert not any(Path(f.file_path.removeprefix("file://")).exists() for f in leftover.files)

    new = KappaIcebergStreamWriter(schema, writer_options(catalog_props, staging, "0002-bbbb"), overwrite=False)
    new.commit([new.write(iter(rows.to_batches()))], 0)
    table = catalog.load_table(staging)
    assert sorted_rows(table) == sorted_rows(rows)
    assert [s.summary.get("kappa.epoch") for s in table.snapshots()] == ["0002-bbbb"]
    assert new.already_committed(table, 0)
    # the same epoch's table purged and recreated (another table, same name and epoch): refused
    pending = new.write(iter(rows.to_batches()))
    clear_slice(catalog, TARGET, staging, "0002-bbbb")
    with pytest.raises(KappaSupersededError, match="was recreated"):
        new.commit([pending], 1)


def test_a_staging_table_created_by_another_attempt_is_refused(catalog: Any) -> None:
    create_summary_table(catalog, TARGET)
    staging = staging_table_name(TARGET, "bf", "s0000")
    clear_slice(catalog, TARGET, staging, "0001-aaaa")
    assert catalog.load_table(staging).properties[EPOCH_PROPERTY] == "0001-aaaa"
    with pytest.raises(KappaConcurrencyError, match="created for epoch '0001-aaaa', not '0001-bbbb'"):
        ensure_staging_table(catalog, TARGET, staging, "0001-bbbb")


CHILD = """
import subprocess, sys, time
from airflow_provider_kappa.engine.processes import child_options
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], **child_options())
print(child.pid, flush=True)
time.sleep(120)
"""


def test_a_child_dies_with_its_parent_even_when_the_parent_is_sigkilled() -> None:
    parent = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    pid = int(parent.stdout.readline())
    ticks = start_ticks(pid)
    assert ticks is not None and os.getpgid(pid) == pid  # its own process group
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while start_ticks(pid) == ticks and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = start_ticks(pid) == ticks
    if alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive


def test_the_private_folder_of_a_dead_run_is_removed_by_the_next_run(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    left = tmp_path / f"kappa-run-{int(dead.stdout)}-12345-s0000-abc"
    left.mkdir()
    (left / "catalogs.json").write_text("{}")
    mine = os.getpid()
    alive = tmp_path / f"kappa-run-{mine}-{start_ticks(mine)}-s0001-def"
    alive.mkdir()
    other = tmp_path / "kappa-s0000-xyz"  # not one of ours
    other.mkdir()
    with private_folder("s0002", tmp_path) as folder:
        assert folder.is_dir() and oct(folder.stat().st_mode & 0o777) == "0o700"
        assert not left.exists() and alive.exists() and other.exists()
    assert not folder.exists()
    assert sweep_private_folders(tmp_path) == []


def test_a_session_id_goes_into_the_connect_url_next_to_its_other_parameters() -> None:
    sid = "0b1e3c1e-5d6f-4a7b-8c9d-0e1f2a3b4c5d"
    assert with_session_id("sc://127.0.0.1:15002", sid) == f"sc://127.0.0.1:15002/;session_id={sid}"
    assert with_session_id("sc://h:1/;token=abc", sid) == f"sc://h:1/;token=abc;session_id={sid}"
    assert with_session_id("sc://h:1/;session_id=old;token=t", sid) == f"sc://h:1/;token=t;session_id={sid}"
