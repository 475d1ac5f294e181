"""Cleanup on a real sqlite SqlCatalog and real checkpoint folders: what goes after the retention,
what always stays (a lock holder, data files a target references), and empty slices that stage
nothing at all."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import airflow_env  # noqa: F401  (a private AIRFLOW_HOME before Airflow is imported)
import pytest
import yaml
from lake import (
    T0,
    append_events,
    create_events_table,
    create_summary_table,
    event,
    sorted_rows,
    summary_row,
    summary_table,
)
from pyiceberg.catalog import load_catalog

from airflow_provider_kappa.backfill.backfill import tag_name
from airflow_provider_kappa.backfill.cleanup import cleanup, find_leftovers, remove, remove_tag
from airflow_provider_kappa.backfill.lock import release_lock, take_lock
from airflow_provider_kappa.backfill.publish import publish_window
from airflow_provider_kappa.cli import main
from airflow_provider_kappa.exceptions import KappaConfigError
from airflow_provider_kappa.job.checkpoints import backfill_root
from airflow_provider_kappa.job.config import load_config
from airflow_provider_kappa.spark.staging import ensure_staging_table, staging_backfills, staging_table_name

SOURCE, TARGET = "raw.playbacks", "prod.summary"
H = timedelta(hours=1)
START, END = T0 + H, T0 + 3 * H
DAY = timedelta(days=1)


def write_config(folder: Path, catalog_props: dict[str, str], **job: Any) -> Path:
    (folder / "job.py").write_text("# the job's application (not run here)\n")
    raw = {
        "job": {"name": "summary_job", "application": "job.py", "checkpoint_root": str(folder / "checkpoints"), **job},
        "catalogs": {"lake": dict(catalog_props)},
        "sources": {
            "playbacks": {"type": "iceberg", "catalog": "lake", "table": SOURCE, "ingestion_column": "ingestion_ts"},
        },
        "sinks": {"summary": {"type": "iceberg", "catalog": "lake", "table": TARGET, "time_column": "window_start"}},
        "backfill": {"slice": "1h", "tail": "0s"},
    }
    path = folder / "kappa.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture()
def lake(tmp_path: Path, catalog: Any, catalog_props: dict[str, str]) -> Path:
    """A source with two snapshots, a target with rows in and around the window; returns kappa.yaml."""
    source = create_events_table(catalog, SOURCE)
    append_events(source, [event(i, T0 + i * 10 * timedelta(minutes=1)) for i in range(6)])
    append_events(source, [event(i, T0 + 3 * H + i * timedelta(minutes=1)) for i in range(10, 13)])
    target = create_summary_table(catalog, TARGET)
    target.append(summary_table([summary_row(0, 1, 1), summary_row(60, 1, 5), summary_row(190, 2, 2)]))
    return write_config(tmp_path, catalog_props)


def leave_backfill(
    catalog: Any, config: Path, backfill_id: str, *, publish: bool = False, lock: bool = False
) -> list[str]:
    """What a backfill leaves, made with the real steps' pieces: two staging tables with rows, its
    checkpoint folder (checkpoint, plan file, done record), a tag on the source, and optionally
    its publish (by reference) and its lock. Returns its staging tables."""
    cfg = load_config(config)
    staging = []
    for i, minute in enumerate((70, 130)):
        name = staging_table_name(TARGET, backfill_id, f"s000{i}")
        ensure_staging_table(catalog, TARGET, name).append(summary_table([summary_row(minute, 3, 7 + i)]))
        staging.append(name)
    root = Path(backfill_root(cfg.job.checkpoint_root, cfg.job.name, backfill_id))
    for rel, text in (
        ("shared/offsets/0", "{}"),
        ("plans/s0000/playbacks.json", "{}"),
        ("done/s0000.json", json.dumps({"rows_read": 6})),
    ):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    source = catalog.load_table(SOURCE)
    source.manage_snapshots().create_tag(source.current_snapshot().snapshot_id, tag_name(backfill_id)).commit()
    if lock:
        take_lock(
            catalog.load_table(TARGET),
            backfill_id,
            cfg.job.name,
            START,
            END,
            retention=7 * DAY,
            release=f"kappa backfill … {backfill_id} --release-lock",
        )
    if publish:
        publish_window(
            catalog, TARGET, staging, "window_start", START, END, snapshot_properties={"kappa.backfill-id": backfill_id}
        )
    return staging


def files_of(table: Any) -> set[Path]:
    return {Path(t.file.file_path.removeprefix("file://")) for t in table.scan().plan_files()}


def test_a_published_backfill_past_the_retention_is_removed_and_the_target_keeps_every_file_it_reads(
    catalog: Any, lake: Path
) -> None:
    staging = leave_backfill(catalog, lake, "bf_published", publish=True)
    target = catalog.load_table(TARGET)
    published_rows, published_files = sorted_rows(target), files_of(target)
    staged_files = set().union(*(files_of(catalog.load_table(s)) for s in staging))
    assert staged_files <= published_files  # committed by reference
    cfg = load_config(lake)
    folder = Path(backfill_root(cfg.job.checkpoint_root, cfg.job.name, "bf_published"))

    young = cleanup(cfg, now=datetime.now(timezone.utc) + 6 * DAY)  # default job.retention: 7d
    assert [(d.leftovers.backfill_id, d.remove) for d in young] == [("bf_published", False)]
    assert "younger than the retention 7d" in young[0].reason
    assert young[0].leftovers.published_at is not None and len(young[0].leftovers.staging) == 2
    assert young[0].leftovers.tags == (("lake", SOURCE),) and young[0].leftovers.checkpoint == str(folder)

    dry = cleanup(cfg, now=datetime.now(timezone.utc) + 8 * DAY, dry_run=True)
    assert [(d.leftovers.backfill_id, d.remove) for d in dry] == [("bf_published", True)]
    assert folder.is_dir() and staging_backfills(catalog, TARGET) == {"bf_published": staging}

    done = cleanup(cfg, now=datetime.now(timezone.utc) + 8 * DAY)
    assert [(d.leftovers.backfill_id, d.remove) for d in done] == [("bf_published", True)]
    assert staging_backfills(catalog, TARGET) == {}
    assert tag_name("bf_published") not in catalog.load_table(SOURCE).metadata.refs
    assert not folder.exists()
    target = catalog.load_table(TARGET)
    assert sorted_rows(target) == published_rows
    assert all(p.is_file() for p in published_files)  # not one file the target reads was deleted
    assert cleanup(cfg, older_than=timedelta(0)) == []  # nothing left to find


def test_unpublished_backfills_stay_until_the_retention_and_their_staged_files_then_go(
    catalog: Any, lake: Path, catalog_props: dict[str, str], tmp_path: Path
) -> None:
    staging = leave_backfill(catalog, lake, "bf_dry_run")
    staged_files = set().union(*(files_of(catalog.load_table(s)) for s in staging))
    config = write_config(tmp_path, catalog_props, retention="2d")
    cfg = load_config(config)
    assert cfg.job.retention == 2 * DAY
    assert [d.remove for d in cleanup(cfg, now=datetime.now(timezone.utc) + DAY)] == [False]
    assert staging_backfills(catalog, TARGET) == {"bf_dry_run": staging}
    decisions = cleanup(cfg, now=datetime.now(timezone.utc) + 3 * DAY)
    assert [(d.remove, d.leftovers.published_at) for d in decisions] == [(True, None)]
    assert staging_backfills(catalog, TARGET) == {}
    assert not any(p.exists() for p in staged_files)  # never published: its files are garbage


def test_zero_retention_removes_at_once_and_keep_spares_the_ids_asked_for(catalog: Any, lake: Path) -> None:
    leave_backfill(catalog, lake, "bf_a", publish=True)
    leave_backfill(catalog, lake, "bf_b")
    cfg = load_config(lake)
    decisions = cleanup(cfg, older_than=timedelta(0), keep={"bf_b": "this run's backfill, not published"})
    assert [(d.leftovers.backfill_id, d.remove, d.reason) for d in decisions] == [
        ("bf_a", True, "older than the retention 0s"),
        ("bf_b", False, "this run's backfill, not published"),
    ]
    assert list(staging_backfills(catalog, TARGET)) == ["bf_b"]
    assert [lo.backfill_id for lo in find_leftovers(cfg)] == ["bf_b"]


def test_a_backfill_holding_the_lock_is_never_removed(catalog: Any, lake: Path) -> None:
    staging = leave_backfill(catalog, lake, "bf_locked", lock=True)
    cfg = load_config(lake)
    decisions = cleanup(cfg, older_than=timedelta(0), now=datetime.now(timezone.utc) + 30 * DAY)
    assert [d.remove for d in decisions] == [False]
    assert (
        decisions[0].reason == f"holds the lock on {TARGET}; release it with: kappa backfill … bf_locked --release-lock"
    )
    assert staging_backfills(catalog, TARGET) == {"bf_locked": staging}
    assert tag_name("bf_locked") in catalog.load_table(SOURCE).metadata.refs
    # it takes the lock again between the decision and the removal: kept after all
    leftovers = find_leftovers(cfg)[0]
    assert remove(cfg, leftovers) == f"took the lock on {TARGET} during the cleanup"
    assert staging_backfills(catalog, TARGET) == {"bf_locked": staging}
    release_lock(catalog.load_table(TARGET), "bf_locked")
    assert [d.remove for d in cleanup(cfg, older_than=timedelta(0))] == [True]
    assert staging_backfills(catalog, TARGET) == {}


def test_a_tag_removed_concurrently_or_a_commit_conflict_does_not_stop_the_cleanup(
    catalog: Any, catalog_props: dict[str, str], lake: Path
) -> None:
    leave_backfill(catalog, lake, "bf_x")
    cfg = load_config(lake)
    leftovers = find_leftovers(cfg)[0]
    other = load_catalog("lake", **catalog_props)  # another process's view of the same catalog
    other.load_table(SOURCE).manage_snapshots().remove_tag(tag_name("bf_x")).commit()
    assert remove(cfg, leftovers) is None
    assert find_leftovers(cfg) == []
    # removed by the other process after we loaded the table: the catalog refuses our commit (the tag
    # is not where we saw it), the refreshed table shows it gone: done, not an error
    source = catalog.load_table(SOURCE)
    source.manage_snapshots().create_tag(source.current_snapshot().snapshot_id, "kappa-bf_y").commit()
    ours = catalog.load_table(SOURCE)
    append_events(other.load_table(SOURCE), [event(99, T0 + 5 * H)])  # an ingestion commit on the side
    other.load_table(SOURCE).manage_snapshots().remove_tag("kappa-bf_y").commit()
    assert "kappa-bf_y" in ours.metadata.refs
    assert remove_tag(ours, "kappa-bf_y") is False
    assert "kappa-bf_y" not in catalog.load_table(SOURCE).metadata.refs
    assert len(catalog.load_table(SOURCE).snapshots()) == 3  # the ingestion commit is kept


def test_what_is_not_the_jobs_is_left_alone(catalog: Any, lake: Path) -> None:
    cfg = load_config(lake)
    source = catalog.load_table(SOURCE)
    source.manage_snapshots().create_tag(source.current_snapshot().snapshot_id, "kappa-bf_of_another_job").commit()
    create_summary_table(catalog, "prod.summary_x")
    theirs = staging_table_name("prod.summary_x", "bf_other", "s0000")
    ensure_staging_table(catalog, "prod.summary_x", theirs)
    take_lock(catalog.load_table(TARGET), "bf_another_jobs", "another_job", T0, START, retention=DAY)
    assert cleanup(cfg, older_than=timedelta(0)) == []
    assert "kappa-bf_of_another_job" in catalog.load_table(SOURCE).metadata.refs
    assert catalog.table_exists(theirs)


def test_job_retention_is_a_duration_named_in_errors(tmp_path: Path, catalog_props: dict[str, str]) -> None:
    assert load_config(write_config(tmp_path, catalog_props)).job.retention == 7 * DAY
    assert load_config(write_config(tmp_path, catalog_props, retention="0s")).job.retention == timedelta(0)
    assert load_config(write_config(tmp_path, catalog_props, retention="PT12H")).job.retention == 12 * H
    for bad in ("soon", "-1d", ""):
        with pytest.raises(
            KappaConfigError, match=f"job.retention: {bad!r} is not a duration; expected a number with a unit"
        ):
            load_config(write_config(tmp_path, catalog_props, retention=bad))


def test_kappa_cleanup_prints_what_it_removes_and_refuses_bad_input(
    catalog: Any, lake: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    leave_backfill(catalog, lake, "bf_old", publish=True)
    leave_backfill(catalog, lake, "bf_locked", lock=True)

    assert main(["cleanup", "--config", str(lake)]) == 0
    out = capsys.readouterr().out
    assert "2 backfill(s) found, 0 removed" in out and "younger than the retention 7d" in out

    assert main(["cleanup", "--config", str(lake), "--older-than", "0s", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "(dry run: nothing is removed)" in out and "2 backfill(s) found, 1 would remove" in out
    assert "bf_old" in out and "holds the lock on prod.summary" in out
    assert sorted(staging_backfills(catalog, TARGET)) == ["bf_locked", "bf_old"]

    assert main(["cleanup", "--config", str(lake), "--older-than", "0s"]) == 0
    out = capsys.readouterr().out
    assert "2 backfill(s) found, 1 removed" in out and "removed (older than the retention 0s)" in out
    assert sorted(staging_backfills(catalog, TARGET)) == ["bf_locked"]

    assert main(["cleanup", "--config", str(lake), "--older-than", "soon"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kappa cleanup: error: --older-than: 'soon' is not a duration; expected a number with a unit")
    assert sorted(staging_backfills(catalog, TARGET)) == ["bf_locked"]


def test_an_empty_slice_creates_no_staging_table_and_validate_and_publish_count_it_as_zero_rows(
    catalog: Any, lake: Path
) -> None:
    from airflow_provider_kappa.backfill.backfill import Backfill
    from airflow_provider_kappa.backfill.plan import plan, slice_is_empty
    from airflow_provider_kappa.backfill.publish import publish
    from airflow_provider_kappa.backfill.slices import run_slice
    from airflow_provider_kappa.backfill.snapshot import pin
    from airflow_provider_kappa.backfill.validate import validate

    cfg = load_config(lake)
    sink = cfg.sinks["summary"]
    bf = Backfill.create(
        cfg,
        {
            "start": T0.isoformat(),
            "end": (T0 + 4 * H).isoformat(),
            "mode": "parallel",
            "max_misalignment_threshold": "15min",
        },
    )
    slices = plan(bf, pin(bf, tag=False))
    assert [s.slice_id for s in slices.slices if slice_is_empty(s)] == [
        "s0001",
        "s0002",
    ]  # the source has hours 0 and 3
    for sp in slices.slices:
        if slice_is_empty(sp):
            assert run_slice(bf, sp)["skipped"] is True  # no Spark run for an empty slice
        else:  # what a run of the slice stages (the job itself runs in tests/integration)
            rows = [summary_row(0, 1, 1), summary_row(60, 1, 5)] if sp.index == 0 else [summary_row(190, 2, 2)]
            ensure_staging_table(catalog, TARGET, bf.staging_table(sink, sp.slice_id)).append(summary_table(rows))
    assert list(staging_backfills(catalog, TARGET)) == [bf.id]
    assert staging_backfills(catalog, TARGET)[bf.id] == [
        bf.staging_table(sink, "s0000"),
        bf.staging_table(sink, "s0003"),
    ]
    report = validate(bf, slices)["summary"]
    assert (report.staged_rows, report.target_rows, report.matched_rows, len(report.staging_tables)) == (3, 3, 3, 2)
    before = sorted_rows(catalog.load_table(TARGET))
    assert publish(bf, slices)["summary"].rows_added == 3
    assert sorted_rows(catalog.load_table(TARGET)) == before


@pytest.mark.airflow
def test_the_cleanup_task_keeps_its_runs_backfill_unless_it_published(catalog: Any, lake: Path) -> None:
    from airflow_provider_kappa.backfill.backfill import Backfill
    from airflow_provider_kappa.compat.airflow import AirflowFailException
    from airflow_provider_kappa.operators.cleanup import KappaCleanupOperator

    params = {"start": START.isoformat(), "end": END.isoformat(), "slice": "1h", "dry_run": True}
    this_run = Backfill.create(load_config(lake), params).id
    leave_backfill(catalog, lake, this_run)  # what this dry run staged
    leave_backfill(catalog, lake, "bf_older")
    op = KappaCleanupOperator(task_id="cleanup", config_path=str(lake), older_than="0s")
    result = op.execute({"params": params})
    assert {d["backfill_id"]: (d["removed"], d["reason"]) for d in result} == {
        this_run: (False, "this run's backfill, not published: its staged rows stay for inspection"),
        "bf_older": (True, "older than the retention 0s"),
    }
    assert list(staging_backfills(catalog, TARGET)) == [this_run]
    # the same backfill run to publish (dry_run is not part of its id): its cleanup removes it
    result = op.execute({"params": {**params, "dry_run": False}})
    assert [(d["backfill_id"], d["removed"]) for d in result] == [(this_run, True)]
    assert staging_backfills(catalog, TARGET) == {}
    # job.retention (7d) when older_than is not given: nothing this young goes
    leave_backfill(catalog, lake, "bf_young")
    kept = KappaCleanupOperator(task_id="cleanup", config_path=str(lake), keep_run_backfill=False).execute({})
    assert [(d["backfill_id"], d["removed"], d["reason"]) for d in kept] == [
        ("bf_young", False, "younger than the retention 7d")
    ]
    with pytest.raises(AirflowFailException, match="older_than: 'soon' is not a duration"):
        KappaCleanupOperator(task_id="cleanup", config_path=str(lake), older_than="soon").execute({"params": params})
    assert list(staging_backfills(catalog, TARGET)) == ["bf_young"]


def test_a_backfill_whose_spark_connect_server_runs_is_kept(catalog: Any, lake: Path) -> None:
    import os

    from airflow_provider_kappa.engine.connect_server import ServerState
    from airflow_provider_kappa.job.checkpoints import connect_state_path

    leave_backfill(catalog, lake, "bf_running")
    cfg = load_config(lake)
    root = backfill_root(cfg.job.checkpoint_root, cfg.job.name, "bf_running")
    ticks = int(Path(f"/proc/{os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()[19])  # field 22: start time
    # this test's process stands for the server: alive, the same process as recorded
    ServerState("sc://127.0.0.1:1", os.getpid(), ticks, "").write(connect_state_path(root, "bf_running"))
    decisions = cleanup(cfg, older_than=timedelta(0))
    assert [(d.remove, d.reason) for d in decisions] == [
        (False, f"running: its Spark Connect server (pid {os.getpid()}) runs")
    ]
    ServerState("sc://127.0.0.1:1", os.getpid(), ticks + 1, "").write(
        connect_state_path(root, "bf_running")
    )  # a reused pid
    assert [d.remove for d in cleanup(cfg, older_than=timedelta(0))] == [True]
    assert not Path(root).exists() and staging_backfills(catalog, TARGET) == {}


# --------------------------------------------------------------------------- a running backfill (issue 25 item 3)


def test_a_fresh_heartbeat_keeps_a_running_backfill_even_at_older_than_0s(
    catalog: Any, lake: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_provider_kappa.job.checkpoints import CheckpointStore

    monkeypatch.setenv("COLUMNS", "400")  # the listing's table on one line per backfill

    leave_backfill(catalog, lake, "bf_running")  # a dry run on either engine: no lock, no publish
    cfg = load_config(lake)
    folder = Path(backfill_root(cfg.job.checkpoint_root, cfg.job.name, "bf_running"))
    CheckpointStore(str(folder)).touch_heartbeat()

    assert main(["cleanup", "--config", str(lake), "--older-than", "0s"]) == 0
    out = capsys.readouterr().out
    assert "bf_running" in out and "running: heartbeat" in out and "s ago" in out, out
    decisions = cleanup(cfg, older_than=timedelta(0))
    assert [(d.leftovers.backfill_id, d.remove) for d in decisions] == [("bf_running", False)]
    assert decisions[0].reason.startswith("running: heartbeat ") and "5min" in decisions[0].reason
    assert folder.is_dir() and (folder / "done" / "s0000.json").is_file()
    assert staging_backfills(catalog, TARGET) != {}
    assert tag_name("bf_running") in catalog.load_table(SOURCE).metadata.refs


def test_a_stale_heartbeat_lets_the_backfill_go(catalog: Any, lake: Path) -> None:
    import os

    from airflow_provider_kappa.backfill.cleanup import LIVENESS
    from airflow_provider_kappa.job.checkpoints import CheckpointStore

    leave_backfill(catalog, lake, "bf_stale")
    cfg = load_config(lake)
    folder = Path(backfill_root(cfg.job.checkpoint_root, cfg.job.name, "bf_stale"))
    store = CheckpointStore(str(folder))
    store.touch_heartbeat()
    stale = (datetime.now(timezone.utc) - LIVENESS - timedelta(seconds=5)).timestamp()
    os.utime(store.heartbeat_file(), (stale, stale))

    decisions = cleanup(cfg, older_than=timedelta(0))
    assert [(d.leftovers.backfill_id, d.remove) for d in decisions] == [("bf_stale", True)]
    assert not folder.exists() and staging_backfills(catalog, TARGET) == {}
    assert tag_name("bf_stale") not in catalog.load_table(SOURCE).metadata.refs


def test_a_heartbeat_older_than_the_publish_is_of_a_finished_run(catalog: Any, lake: Path) -> None:
    """Publish touches the heartbeat before its commit: the DAG's cleanup task, right after it, removes the run."""
    from airflow_provider_kappa.job.checkpoints import CheckpointStore

    cfg = load_config(lake)
    folder = Path(backfill_root(cfg.job.checkpoint_root, cfg.job.name, "bf_done"))
    CheckpointStore(str(folder)).touch_heartbeat()
    leave_backfill(catalog, lake, "bf_done", publish=True)

    decisions = cleanup(cfg, older_than=timedelta(0))
    assert [(d.leftovers.backfill_id, d.remove) for d in decisions] == [("bf_done", True)]
    assert not folder.exists()


def test_a_slice_beats_while_it_runs(tmp_path: Path) -> None:
    import time

    from airflow_provider_kappa.job.checkpoints import CheckpointStore

    store = CheckpointStore(str(tmp_path / "bf"))
    assert store.heartbeat() is None
    with store.beating(every=0.05):
        first = store.heartbeat()
        deadline = time.monotonic() + 10
        while store.heartbeat() == first and time.monotonic() < deadline:
            time.sleep(0.02)
        assert store.heartbeat() > first  # type: ignore[operator]
    assert store.heartbeat() is not None and Path(store.heartbeat_file()).is_file()


def write_ledger(cfg: Any, first_ms: int, count: int, every_ms: int = 60_000) -> list[Any]:
    """``count`` single-entry files in the job's live ledger of sink ``summary``, ``every_ms`` apart."""
    from airflow_provider_kappa.spark.ledger import LedgerEntry, sink_ledger

    folder = Path(sink_ledger(cfg.job.ledger, "summary"))
    folder.mkdir(parents=True)
    entries = []
    for i in range(count):
        entry = LedgerEntry("q", i, first_ms + i * every_ms, None, 0, {"t": {0: (i, i + 1)}})
        (folder / entry.name).write_text(entry.to_json())
        entries.append(entry)
    return entries


def test_cleanup_compacts_the_ledger_and_drops_only_what_no_kept_backfill_may_replay(
    catalog: Any, lake: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_provider_kappa.backfill.ledger_upkeep import ledger_upkeep
    from airflow_provider_kappa.job.checkpoints import CheckpointStore
    from airflow_provider_kappa.spark.ledger import Ledger, sink_ledger

    monkeypatch.setenv("COLUMNS", "250")
    cfg = load_config(lake)
    uri = sink_ledger(cfg.job.ledger, "summary")
    first_ms = int((datetime.now(timezone.utc) - 3 * DAY).timestamp() * 1000)
    entries = write_ledger(cfg, first_ms, 2500)  # one a minute, from 3 days ago
    leave_backfill(catalog, lake, "bf_kept")  # young: kept by the default retention
    store = CheckpointStore(backfill_root(cfg.job.checkpoint_root, cfg.job.name, "bf_kept"))

    # a kept backfill that has not chosen yet keeps the whole ledger; nothing is compacted in a dry run
    (dry,) = ledger_upkeep(cfg, cleanup(cfg, dry_run=True), older_than=DAY, dry_run=True)
    assert (dry.entries, dry.trimmed, dry.compacted, dry.kept_from) == (2500, 0, 0, None)
    assert "bf_kept is kept and has not chosen yet" in dry.note

    store.pin("ledger", {"ledger": uri, "from_ms": entries[1000].end_ms})
    assert main(["cleanup", "--config", str(lake), "--ledger-older-than", "1d", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"live ledger {uri}: 2500 entries; 1000 older than" in out and "would be dropped" in out
    assert len(Ledger(uri)) == 2500  # a dry run changes nothing

    assert main(["cleanup", "--config", str(lake), "--ledger-older-than", "1d"]) == 0
    out = capsys.readouterr().out
    assert f"live ledger {uri}: 2500 entries; 1000 compacted; 1000 older than" in out
    assert "kept more: backfill bf_kept is kept and replays it from there" in out
    book = Ledger(uri)
    assert [book.entry(name) for _, _, name in book.keys] == entries[1000:]  # in order, each once
    assert len(list(Path(uri).iterdir())) == 1 + 500  # one compacted file, 500 single files

    # without --ledger-older-than nothing is dropped, whatever the age
    assert main(["cleanup", "--config", str(lake), "--older-than", "0s"]) == 0
    assert f"live ledger {uri}: 1500 entries; 0 compacted" in capsys.readouterr().out
    assert len(Ledger(uri)) == 1500
