"""Faults during a backfill, each ending with the target table compared row for row to a clean run.

One tiny lake (tests/lake.py ``seed_sessions_incident``: playbacks 00:00-03:50, a bad window
[01:00, 03:00) in prod.playback_sessions) and one backfill of 2 sequential slices, run for real
(``kappa backfill``, local Spark). Spark runs are what costs, so:

- ``clean``: the clean run, once per module (engine connect on the session's shared Spark Connect
  server, the default engine); its target rows are the expectation.
- ``faulted``: the SAME backfill (same parameters, so the same id, tag, staging tables and
  checkpoints) rerun under every fault that needs Spark, in the order they would hit production:
  source appends between and during slices (ingestion goes on), snapshot expiry on the source,
  the driver SIGKILLed in the middle of the second slice then the slice retried, and a live
  writer appending to the target while publish commits (the first slice on the shared server, the
  second slice's killed and retried runs as spark-submits: 1.5 of them). Each test below
  checks one fault's part of that run; every one ends comparing the target with ``clean``.
- faults that need no Spark (the lock, an empty slice, where the slice log goes) run without it,
  on the real catalog and checkpoint code.

Row-for-row expectation with a live writer: the live job writes rows for the present, outside the
backfilled window; they are all kept, once each, so the target must equal the clean run's rows
plus exactly the live rows. (A live row inside the window committed before publish would be
replaced like the rest of the window: the window belongs to the backfill; see docs/airflow.md.)
"""

from __future__ import annotations

import itertools
import logging
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import airflow_env  # noqa: F401  (sets AIRFLOW_HOME before Airflow is imported)
import pytest
from airflow_env import write_job_config
from lake import (
    INCIDENT_END,
    INCIDENT_START,
    T0,
    append_events,
    event,
    seed_sessions_incident,
    sessions_arrow,
    sorted_rows,
)

from airflow_provider_kappa.backfill import lock as locks
from airflow_provider_kappa.backfill import plan as planning
from airflow_provider_kappa.backfill import publish as publishing
from airflow_provider_kappa.backfill import slices as slice_steps
from airflow_provider_kappa.backfill import snapshot
from airflow_provider_kappa.backfill import validate as validation
from airflow_provider_kappa.backfill.backfill import Backfill
from airflow_provider_kappa.backfill.lock import LOCK_PREFIX, lock_property, read_locks, take_lock
from airflow_provider_kappa.exceptions import KappaConcurrencyError
from airflow_provider_kappa.job.config import load_config
from airflow_provider_kappa.spark.source import file_list
from airflow_provider_kappa.timeparse import to_micros

SOURCE = "raw.playbacks"
TARGET = "prod.playback_sessions"
PARAMS = {
    "start": INCIDENT_START.isoformat(),
    "end": INCIDENT_END.isoformat(),
    "slice": "2h",
    "warmup": "30min",
    "tail": "45min",
    "max_misalignment_threshold": "1h",  # few micro-batches per slice: Spark time is what costs
}
CLI_OPTIONS = ["--slice", "2h", "--warmup", "30min", "--tail", "45min", "--max-misalignment", "1h"]


def at(h: int, m: int = 0) -> datetime:
    return T0 + timedelta(hours=h, minutes=m)


def load_catalog_of(props: dict[str, str]) -> Any:
    from pyiceberg.catalog import load_catalog

    return load_catalog("lake", **props)


def staged_rows(catalog: Any, bf: Backfill, slice_id: str) -> list[tuple[Any, ...]]:
    return sorted_rows(catalog.load_table(bf.staging_table(bf.cfg.sinks["sessions"], slice_id)))


def lock_keys(catalog: Any, table: str = TARGET) -> list[str]:
    return sorted(k for k in catalog.load_table(table).properties if k.startswith(LOCK_PREFIX))


# --------------------------------------------------------------------------- the clean run


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("faults")
    (folder / "warehouse").mkdir()
    props = {"type": "sql", "uri": f"sqlite:///{folder}/catalog.db", "warehouse": f"file://{folder}/warehouse"}
    catalog = load_catalog_of(props)
    oracle = seed_sessions_incident(catalog, SOURCE, TARGET)
    return {
        "folder": folder,
        "props": props,
        "catalog": catalog,
        "oracle": oracle,
        "config": write_job_config(folder, props, engine="submit"),  # the faulted rerun kills a spark-submit driver
    }


@pytest.fixture(scope="module")
def clean(lake: dict[str, Any], connect_server: Any) -> dict[str, Any]:
    """The clean run: ``kappa backfill`` (2 sequential slices), as a user runs it, with the default
    engine (connect) on the session's shared server: the faulted reruns (engine submit, whose driver
    they kill) must end where it ends, so the two engines are held to the same rows as well."""
    import pyarrow as pa
    import yaml

    from airflow_provider_kappa.cli import main

    raw = yaml.safe_load(lake["config"].read_text())  # the same job, backfill id, checkpoints and catalog
    raw["job"]["engine"], raw["job"]["connect"] = "connect", {"url": connect_server.url}
    config = lake["folder"] / "kappa-connect.yaml"
    config.write_text(yaml.safe_dump(raw))
    began = time.monotonic()
    code = main(["backfill", "--config", str(config), "--start", PARAMS["start"], "--end", PARAMS["end"], *CLI_OPTIONS])
    seconds = time.monotonic() - began
    assert code == 0
    catalog = lake["catalog"]
    bf = Backfill.create(load_config(lake["config"]), PARAMS)
    pinned = {"backfill-playbacks": catalog.load_table(SOURCE).metadata.refs[bf.tag].snapshot_id}
    plan = planning.plan(bf, pinned)
    assert [s.slice_id for s in plan.slices] == ["s0000", "s0001"]
    target = sorted_rows(catalog.load_table(TARGET))
    # the clean run itself is right: it equals an independent oracle of the sessionizer
    assert target == sorted_rows(pa.Table.from_pylist(lake["oracle"], schema=sessions_arrow()))
    assert lock_keys(catalog) == []  # publish released the lock
    store = bf.store()
    return {
        "bf": bf,
        "pinned": pinned,
        "plan": plan,
        "target": target,
        "staged": {s.slice_id: staged_rows(catalog, bf, s.slice_id) for s in plan.slices},
        "rows_read": {s.slice_id: store.done(s.slice_id)["rows_read"] for s in plan.slices},  # type: ignore[index]
        "seconds": seconds,
        "config": config,  # engine connect on the shared server
    }


# --------------------------------------------------------------------------- the faulted rerun


class SourceAppender:
    """Ingestion going on: appends playbacks of account 9 (a session per append) to the source, with
    ingestion times inside the backfill's read range. Seen by the backfill, they would add sessions."""

    def __init__(self, props: dict[str, str]) -> None:
        self.props = props
        self.minutes = itertools.cycle(range(35, 220, 7))
        self.count = 0

    def append(self) -> None:
        m = next(self.minutes)
        table = load_catalog_of(self.props).load_table(SOURCE)
        append_events(
            table,
            [event(900_000 + m, at(0, m), account=9, show=9), event(900_500 + m, at(0, m + 1), account=9, show=9)],
        )
        self.count += 1


#: how often :class:`Repeatedly` looks again for its ``start_when``
START_POLL_SECONDS = 0.05


class Repeatedly:
    """Call ``fn`` every ``interval`` seconds in a thread until stopped (errors are re-raised on stop); with
    ``start_when``, only while it holds, looked for every :data:`START_POLL_SECONDS` while it does not."""

    def __init__(self, fn: Any, interval: float, start_when: Any = None, max_calls: int = 1000) -> None:
        self.fn, self.interval, self.start_when, self.max_calls = fn, interval, start_when, max_calls
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.calls = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            while not self.stop_event.is_set() and self.calls < self.max_calls:
                if self.start_when is None or self.start_when():
                    self.fn()
                    self.calls += 1
                    self.stop_event.wait(self.interval)
                else:  # looked for again soon: a slice on a warm engine can end within one interval
                    self.stop_event.wait(min(self.interval, START_POLL_SECONDS))
        except BaseException as e:  # noqa: BLE001  (re-raised in stop())
            self.error = e

    def __enter__(self) -> Repeatedly:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        self.thread.join(timeout=60)
        if self.error is not None:
            raise self.error


def alive(pid: int) -> bool:
    import psutil  # type: ignore[import-untyped]

    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def spark_children(before: set[int]) -> list[Any]:
    """The Spark processes this test process started since ``before`` (its direct children): a
    spark-submit, or engine connect's job process."""
    import psutil

    return [c for c in psutil.Process().children() if c.pid not in before and c.is_running()]


class DriverKiller:
    """Waits for the slice's spark-submit to commit its first micro-batch to the staging table,
    then SIGKILLs the driver JVM (the spark-submit child we started, by pid) and every process
    under it (the job's Python driver and Python workers), as when the driver's host dies."""

    def __init__(self, catalog: Any, staging: str, before: set[int]) -> None:
        self.catalog, self.staging, self.before = catalog, staging, before
        self.killed: list[int] = []
        self.staging_commits_at_kill = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        import psutil

        try:
            deadline = time.monotonic() + 900
            while time.monotonic() < deadline:
                children = spark_children(self.before)
                if children:
                    snapshots = list(self.catalog.load_table(self.staging).snapshots())
                    if snapshots:
                        driver = children[0]
                        tree = driver.children(recursive=True)
                        driver.kill()  # SIGKILL, by pid
                        for p in tree:
                            try:
                                p.kill()
                            except psutil.NoSuchProcess:
                                pass
                        self.killed = [driver.pid, *(p.pid for p in tree)]
                        self.staging_commits_at_kill = len(snapshots)
                        return
                time.sleep(0.1)
        except BaseException as e:  # noqa: BLE001  (checked by the fixture)
            self.error = e


@pytest.fixture(scope="module")
def faulted(lake: dict[str, Any], clean: dict[str, Any]) -> dict[str, Any]:
    """The same backfill rerun (every slice of it completed in ``clean``) under faults."""
    import psutil

    import airflow_provider_kappa.backfill.publish as publish_module

    catalog, props = lake["catalog"], lake["props"]
    out: dict[str, Any] = {"durations": {}}
    bf = Backfill.create(load_config(lake["config"]), PARAMS)  # engine submit: the slice whose driver is killed
    on_connect = Backfill.create(load_config(clean["config"]), PARAMS)  # the other slice runs, on the shared server
    assert bf.id == on_connect.id == clean["bf"].id
    store = bf.store()
    appender = SourceAppender(props)

    # snapshot: reuses the tag (the pinned snapshot of the clean run) and re-takes the lock
    pinned = snapshot.snapshot(bf)
    out["pinned"] = pinned
    out["locks_during"] = lock_keys(catalog)
    plan = planning.plan(bf, pinned)
    s0, s1 = plan.slices

    # ingestion goes on: before the first slice ...
    appender.append()
    # ... and while it runs (appends only once its job process exists: engine connect, the shared server)
    before = {c.pid for c in psutil.Process().children()}
    began = time.monotonic()
    with Repeatedly(appender.append, 3.0, start_when=lambda: bool(spark_children(before)), max_calls=3) as during:
        out["s0000"] = slice_steps.run_slice(on_connect, s0)
    out["durations"]["s0000 rerun, source appends meanwhile"] = time.monotonic() - began
    out["appends_during_slice"] = during.calls
    out["staged_s0000"] = staged_rows(catalog, bf, "s0000")
    # ... and between slices; then snapshot expiry of everything older than now on the source
    appender.append()
    appender.append()
    source = catalog.load_table(SOURCE)
    before_expiry = {s.snapshot_id for s in source.snapshots()}
    source.maintenance.expire_snapshots().older_than(datetime.now(timezone.utc)).commit()
    after_expiry = {s.snapshot_id for s in catalog.load_table(SOURCE).snapshots()}
    out["expired"] = before_expiry - after_expiry
    out["kept_after_expiry"] = after_expiry
    out["source_current"] = catalog.load_table(SOURCE).current_snapshot().snapshot_id

    # the driver of the second slice SIGKILLed mid-slice ...
    staging_s1 = bf.staging_table(bf.cfg.sinks["sessions"], "s0001")
    before = {c.pid for c in psutil.Process().children()}
    killer = DriverKiller(catalog, staging_s1, before)
    killer.thread.start()
    began = time.monotonic()
    with pytest.raises(Exception) as killed:
        slice_steps.run_slice(bf, s1)
    out["durations"]["s0001 killed"] = time.monotonic() - began
    killer.thread.join(timeout=60)
    assert killer.error is None, killer.error
    out["kill_error"] = f"{type(killed.value).__name__}: {killed.value}"
    out["killed_pids"] = killer.killed
    out["staging_commits_at_kill"] = killer.staging_commits_at_kill
    out["done_after_kill"] = store.done("s0001")
    # SIGKILL is delivered asynchronously (a process in uninterruptible I/O dies when that ends):
    # what must not happen is a killed process living on, so allow them a bounded time to go
    deadline = time.monotonic() + 30
    while [pid for pid in killer.killed if alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.2)
    out["alive_after_kill"] = [pid for pid in killer.killed if alive(pid)]
    # ... then the slice retried, as Airflow's retry does
    began = time.monotonic()
    out["s0001"] = slice_steps.run_slice(bf, s1)
    out["durations"]["s0001 retry"] = time.monotonic() - began
    out["staged_s0001"] = staged_rows(catalog, bf, "s0001")

    # validate, then publish while the live job appends to the target
    reports = validation.validate(bf, plan)
    validation.check_gate(bf, plan, reports)
    live_rows: list[dict[str, Any]] = []
    numbers = itertools.count()
    numbering = threading.Lock()

    def live_append() -> None:
        """One commit of the live job: a session of the present (05:00 on), outside the window."""
        import pyarrow as pa

        with numbering:
            n = next(numbers)
        row = {
            "account_id": 100 + n,
            "session_start": at(5, n),
            "session_end": at(5, n + 5),
            "plays": 1,
            "last_play_ts": at(5, n),
        }
        load_catalog_of(props).load_table(TARGET).append(pa.Table.from_pylist([row], schema=sessions_arrow()))
        live_rows.append(row)

    real_staged_files = publish_module.staged_files
    injected: list[int] = []

    def staged_files_after_a_live_commit(*args: Any, **kwargs: Any) -> Any:
        # publish has loaded the target; the live job commits before publish does
        live_append()
        injected.append(load_catalog_of(props).load_table(TARGET).current_snapshot().snapshot_id)
        return real_staged_files(*args, **kwargs)

    began = time.monotonic()
    with pytest.MonkeyPatch.context() as mp, Repeatedly(live_append, 0.2):
        mp.setattr(publish_module, "staged_files", staged_files_after_a_live_commit)
        out["published"] = publishing.publish(bf, plan)["sessions"]
    out["durations"]["validate + publish with a live writer"] = time.monotonic() - began
    live_append()  # and the live job goes on after publish
    out["live_rows"] = live_rows
    out["injected_live_snapshot"] = injected[0]
    target = catalog.load_table(TARGET)
    lineage, snap = [], target.current_snapshot()
    while snap is not None:
        lineage.append(snap.snapshot_id)
        snap = target.snapshot_by_id(snap.parent_snapshot_id) if snap.parent_snapshot_id else None
    out["lineage"] = lineage
    out["live_after_publish"] = target.scan(row_filter=f"session_start >= '{at(5).isoformat()}'").to_arrow().num_rows
    out["locks_after"] = lock_keys(catalog)
    out["target"] = sorted_rows(target)
    print(f"clean run (kappa backfill, 2 slices): {clean['seconds']:.1f}s")
    for step, seconds in out["durations"].items():
        print(f"faulted rerun: {step}: {seconds:.1f}s")
    return out


def expected_with_live(clean: dict[str, Any], faulted: dict[str, Any]) -> list[tuple[Any, ...]]:
    import pyarrow as pa

    live = pa.Table.from_pylist(faulted["live_rows"], schema=sessions_arrow())
    return sorted(clean["target"] + sorted_rows(live), key=repr)


def test_driver_sigkilled_mid_slice_then_the_slice_retried_is_exact(
    clean: dict[str, Any], faulted: dict[str, Any]
) -> None:
    # the kill hit a running slice: after its first micro-batch reached staging, before it finished
    assert faulted["killed_pids"], "the driver was never killed"
    assert faulted["staging_commits_at_kill"] >= 1
    assert "-9" in faulted["kill_error"] or "Cannot execute" in faulted["kill_error"], faulted["kill_error"]
    assert faulted["done_after_kill"] is None  # a killed slice is not recorded done
    assert faulted["alive_after_kill"] == []
    # the retry restored the checkpoint kept at the slice's start and cleared its staging table
    assert faulted["staged_s0001"] == clean["staged"]["s0001"]
    assert faulted["s0001"]["rows_read"] == clean["rows_read"]["s0001"]
    assert faulted["target"] == expected_with_live(clean, faulted)


def test_ingestion_during_the_backfill_is_not_seen(
    lake: dict[str, Any], clean: dict[str, Any], faulted: dict[str, Any]
) -> None:
    catalog = lake["catalog"]
    assert faulted["appends_during_slice"] >= 1  # appended while the slice's job process ran
    assert faulted["source_current"] != clean["pinned"]["backfill-playbacks"]
    account_9 = [r for r in catalog.load_table(SOURCE).scan(row_filter="account_id == 9").to_arrow().to_pylist()]
    assert account_9 and all(
        INCIDENT_START - timedelta(minutes=30) <= r["ingestion_ts"] < INCIDENT_END + timedelta(minutes=45)
        for r in account_9
    )
    # the pinned snapshot: same input per slice, same output, no session of account 9
    assert faulted["pinned"] == clean["pinned"]
    assert faulted["s0000"]["rows_read"] == clean["rows_read"]["s0000"]
    assert faulted["staged_s0000"] == clean["staged"]["s0000"]
    assert not [r for r in faulted["target"] if r[0] == 9]
    assert faulted["target"] == expected_with_live(clean, faulted)


def test_snapshot_expiry_during_the_backfill_keeps_the_tagged_snapshot(
    lake: dict[str, Any], clean: dict[str, Any], faulted: dict[str, Any]
) -> None:
    catalog = lake["catalog"]
    pinned = clean["pinned"]["backfill-playbacks"]
    assert faulted["expired"]  # the expiry did remove snapshots (the appends made between them) ...
    assert pinned in faulted["kept_after_expiry"] and pinned != faulted["source_current"]  # ... not the tagged one
    assert faulted["target"] == expected_with_live(clean, faulted)  # and the slice after it read it exactly
    # without the tag, the same expiry removes the pinned snapshot
    source = catalog.load_table(SOURCE)
    source.manage_snapshots().remove_tag(clean["bf"].tag).commit()
    source.maintenance.expire_snapshots().older_than(datetime.now(timezone.utc)).commit()
    assert catalog.load_table(SOURCE).snapshot_by_id(pinned) is None


def test_a_live_writer_appending_during_publish_keeps_every_row_once(
    clean: dict[str, Any], faulted: dict[str, Any]
) -> None:
    live = faulted["live_rows"]
    assert len(live) >= 3  # the injected commit, the writer thread's, and one after publish
    # the live commit made while publish was building its commit is under the published snapshot:
    # the publish was refused by the catalog and rebuilt on top of it
    published = faulted["published"].snapshot_id
    assert faulted["lineage"].index(faulted["injected_live_snapshot"]) > faulted["lineage"].index(published)
    assert faulted["live_after_publish"] == len(live) == len({r["account_id"] for r in live})
    assert faulted["target"] == expected_with_live(clean, faulted)


def test_completed_slices_and_the_whole_backfill_rerun_with_the_same_parameters_are_exact(
    clean: dict[str, Any], faulted: dict[str, Any]
) -> None:
    # every slice of ``faulted`` had completed in ``clean``: each rerun left exactly what the clean run left
    assert faulted["staged_s0000"] == clean["staged"]["s0000"]
    assert faulted["staged_s0001"] == clean["staged"]["s0001"]
    assert faulted["locks_during"] == [lock_property(clean["bf"].id)]  # the rerun re-took its own lock
    assert faulted["locks_after"] == []  # and publish released it
    assert faulted["published"].rows_added == len([r for r in clean["target"] if INCIDENT_START <= r[1] < INCIDENT_END])
    assert faulted["target"] == expected_with_live(clean, faulted)


# --------------------------------------------------------------------------- the lock (no Spark)


def test_two_overlapping_backfills_started_together_one_is_refused_and_writes_nothing(
    tmp_path: Path, catalog: Any, catalog_props: dict[str, str], clean: dict[str, Any]
) -> None:
    import pyarrow as pa

    from airflow_provider_kappa.spark.staging import ensure_staging_table

    seed_sessions_incident(catalog, SOURCE, TARGET)
    config = write_job_config(tmp_path, catalog_props)
    cfg = load_config(config)
    before = sorted_rows(catalog.load_table(TARGET))
    # same window, different slicing: two different backfills of overlapping windows
    a = Backfill.create(cfg, PARAMS)
    b = Backfill.create(cfg, {**PARAMS, "start": at(2).isoformat(), "end": at(4).isoformat(), "tail": "15min"})
    assert a.id != b.id
    barrier = threading.Barrier(2)
    outcome: dict[str, Any] = {}

    def start(bf: Backfill) -> None:
        barrier.wait()
        try:
            outcome[bf.id] = snapshot.snapshot(bf)
        except KappaConcurrencyError as e:
            outcome[bf.id] = e

    threads = [threading.Thread(target=start, args=(bf,)) for bf in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    refused = [bf for bf in (a, b) if isinstance(outcome[bf.id], KappaConcurrencyError)]
    assert len(refused) == 1, outcome
    loser = refused[0]
    winner = a if loser is b else b
    message = str(outcome[loser.id])
    held = f"[{winner.params.start.isoformat()}, {winner.params.end.isoformat()})"
    assert f"locked by running backfill {winner.id} of job playback_sessions over {held}" in message
    assert "nothing was written" in message and "--release-lock" in message
    # the refused backfill wrote nothing: no lock, no tag, no checkpoint
    assert lock_keys(catalog) == [lock_property(winner.id)]
    assert loser.tag not in catalog.load_table(SOURCE).metadata.refs
    assert not Path(loser.store().root).exists()
    # and it cannot publish either: never interleaved
    current = {"backfill-playbacks": catalog.load_table(SOURCE).current_snapshot().snapshot_id}
    with pytest.raises(KappaConcurrencyError, match=f"locked by running backfill {winner.id}"):
        publishing.publish(loser, planning.plan(loser, current))
    assert sorted_rows(catalog.load_table(TARGET)) == before
    # a backfill of a window that overlaps neither proceeds meanwhile
    disjoint = Backfill.create(
        cfg, {**PARAMS, "start": at(4).isoformat(), "end": at(5).isoformat(), "slice": "1h", "tail": "15min"}
    )
    snapshot.snapshot(disjoint)
    assert lock_keys(catalog) == sorted([lock_property(winner.id), lock_property(disjoint.id)])
    locks.release(disjoint)
    if winner is b:  # b is abandoned: released with the command its lock names (the refusal's hint)
        release_with_hint(catalog, b)
        snapshot.snapshot(a)  # now a takes the lock: serialised after b, never interleaved
    # a runs to completion; its staged rows are the clean run's (the Spark part is tested above)
    wplan = planning.plan(a, snapshot.snapshot(a))  # a rerun re-takes its own lock
    sink = a.cfg.sinks["sessions"]
    cols = sessions_arrow().names
    for i, sp in enumerate(wplan.slices):
        table = ensure_staging_table(catalog, TARGET, a.staging_table(sink, sp.slice_id))
        if i == 0:
            rows = [dict(zip(cols, r)) for slice_rows in clean["staged"].values() for r in slice_rows]
            table.append(pa.Table.from_pylist(rows, schema=sessions_arrow()))
    publishing.publish(a, wplan)
    assert lock_keys(catalog) == []
    if winner is a:  # b may go now, serialised after a; then it is abandoned and released
        snapshot.snapshot(b)
        assert lock_keys(catalog) == [lock_property(b.id)]
        release_with_hint(catalog, b)
    assert lock_keys(catalog) == []
    assert sorted_rows(catalog.load_table(TARGET)) == clean["target"]


def release_with_hint(catalog: Any, bf: Backfill) -> None:
    """Run the ``kappa backfill ... --release-lock`` command ``bf``'s lock names."""
    import shlex

    from airflow_provider_kappa.cli import main

    (held,) = [lk for lk in read_locks(catalog.load_table(TARGET)) if lk.backfill_id == bf.id]
    argv = shlex.split(held.release)
    assert argv[:2] == ["kappa", "backfill"] and argv[-1] == "--release-lock"
    assert main(argv[1:]) == 0
    assert lock_property(bf.id) not in lock_keys(catalog)


def test_the_lock_check_and_set_is_atomic_under_a_forced_race(catalog: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two takers both read the locks (none) before either commits; ``first`` commits, then
    ``second`` commits on top of it. The catalog returns to ``second`` the state it committed,
    holding ``first``'s lock: ``second`` withdraws and is refused. (Without that check after the
    commit both would hold overlapping locks.) Then the same with commits racing freely."""
    from lake import create_sessions_table

    import airflow_provider_kappa.backfill.lock as lock_module

    create_sessions_table(catalog, TARGET)
    real = lock_module.read_locks
    both_read = threading.Barrier(2)
    first_committed = threading.Event()
    reads: dict[str, int] = {}

    def read_in_order(table: Any) -> Any:
        locks = real(table)
        me = threading.current_thread().name
        reads[me] = reads.get(me, 0) + 1
        if reads[me] == 1:  # the read before committing: both see no lock
            both_read.wait(timeout=30)
            if me == "second":
                assert first_committed.wait(timeout=30)
        elif me == "first":  # first's read after its commit
            first_committed.set()
        return locks

    outcome: dict[str, Any] = {}

    def take(name: str, start: datetime, end: datetime) -> None:
        try:
            outcome[name] = take_lock(
                catalog.load_table(TARGET), f"bf_{name}", "job", start, end, retention=timedelta(hours=1)
            )
        except BaseException as e:  # noqa: BLE001  (checked below)
            outcome[name] = e

    def race(windows: dict[str, tuple[datetime, datetime]]) -> None:
        outcome.clear()
        threads = [threading.Thread(target=take, args=(n, *w), name=n) for n, w in windows.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)

    monkeypatch.setattr(lock_module, "read_locks", read_in_order)
    race({"first": (at(1), at(3)), "second": (at(2), at(4))})
    monkeypatch.setattr(lock_module, "read_locks", real)
    assert isinstance(outcome["second"], KappaConcurrencyError), outcome
    assert "locked by running backfill bf_first" in str(outcome["second"])
    assert lock_keys(catalog) == [lock_property("bf_first")]
    table = catalog.load_table(TARGET)
    # second's lock was committed, then withdrawn: it is in the table's history, not in its state
    history = [catalog.load_table(TARGET).io.new_input(m.metadata_file) for m in table.metadata.metadata_log]
    assert any(b"bf_second" in f.open().read() for f in history)
    lock_module.release_lock(table, "bf_first")
    for n in range(3):  # free races: exactly one of two overlapping takers wins each time
        race({f"x{n}": (at(1), at(3)), f"y{n}": (at(1), at(3))})
        winners = [k for k, v in outcome.items() if not isinstance(v, BaseException)]
        assert len(winners) == 1 and all(
            isinstance(v, KappaConcurrencyError) for k, v in outcome.items() if k not in winners
        ), outcome
        assert lock_keys(catalog) == [lock_property(f"bf_{winners[0]}")]
        lock_module.release_lock(catalog.load_table(TARGET), f"bf_{winners[0]}")


def test_a_stale_lock_is_taken_over_and_the_same_backfill_retakes_its_own(
    tmp_path: Path, catalog: Any, catalog_props: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    seed_sessions_incident(catalog, SOURCE, TARGET)
    bf = Backfill.create(load_config(write_job_config(tmp_path, catalog_props)), PARAMS)
    long_ago = datetime.now(timezone.utc) - timedelta(days=8)
    take_lock(
        catalog.load_table(TARGET),
        "bf_abandoned",
        "playback_sessions",
        at(2),
        at(4),
        retention=timedelta(days=7),
        now=long_ago,
    )
    with caplog.at_level(logging.WARNING, logger="airflow_provider_kappa.backfill.lock"):
        snapshot.snapshot(bf)
    assert "taking over the stale lock of backfill bf_abandoned" in caplog.text
    assert lock_keys(catalog) == [lock_property(bf.id)]
    (held,) = read_locks(catalog.load_table(TARGET))
    assert (held.start, held.end) == (INCIDENT_START, INCIDENT_END) and "--release-lock" in held.release
    snapshot.snapshot(bf)  # rerun / --resume / Airflow retry of the same backfill
    assert lock_keys(catalog) == [lock_property(bf.id)]
    # a dry run writes nothing outside staging: it takes no lock
    dry = Backfill.create(bf.cfg, {**PARAMS, "tail": "30min", "dry_run": True})
    snapshot.snapshot(dry)
    assert lock_keys(catalog) == [lock_property(bf.id)]


# --------------------------------------------------------------------------- product gaps (no Spark)


def test_an_empty_slice_is_skipped_without_spark_and_keeps_the_checkpoint_chain(
    tmp_path: Path, catalog: Any, catalog_props: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    from lake import create_events_table, create_sessions_table

    raw = create_events_table(catalog, SOURCE)
    append_events(raw, [event(i, at(0, 5 * i)) for i in range(12)])  # 00:00 .. 00:55
    append_events(raw, [event(100 + i, at(2, 5 * i)) for i in range(12)])  # 02:00 .. 02:55: nothing in 01:xx
    create_sessions_table(catalog, TARGET)
    bf = Backfill.create(
        load_config(write_job_config(tmp_path, catalog_props)),
        {**PARAMS, "slice": "1h", "max_misalignment_threshold": "15min"},
    )
    plan = planning.plan(bf, snapshot.snapshot(bf))
    assert [(s.slice_id, s.files) for s in plan.slices] == [("s0000", 1), ("s0001", 0), ("s0002", 1), ("s0003", 0)]
    runs: list[dict[str, Any]] = []

    def spark_stand_in(application: str, conf: dict[str, str], **_: Any) -> None:
        """The process boundary: records what the run was given and leaves a checkpoint file, as Spark would."""
        checkpoint = Path(conf["spark.kappa.checkpoint"])
        plan_file = conf["spark.kappa.source.playbacks.plan_file"]
        runs.append({"found": sorted(p.name for p in checkpoint.glob("offsets/*")), "plan": file_list.read(plan_file)})
        (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
        (checkpoint / "offsets" / str(len(runs) - 1)).write_text(f"after run {len(runs)}")

    def no_spark(*_: Any, **__: Any) -> None:
        raise AssertionError("spark-submit was called for a slice without source data")

    slice_steps.run_slice(bf, plan.slices[0], submit_fn=spark_stand_in)
    # the launcher handed the slice's reader its scan plan: the pinned snapshot, the files of its read range
    first = runs[0]["plan"]
    assert (first.table, [first.snapshot_id]) == (SOURCE, list(plan.slices[0].snapshot_ids.values()))
    assert (first.start_micros, first.end_micros) == (
        to_micros(plan.slices[0].read_start),
        to_micros(plan.slices[0].read_end),
    )
    assert len(first.spans) == plan.slices[0].files == 1
    began = time.monotonic()
    with caplog.at_level(logging.INFO, logger="airflow_provider_kappa.backfill.slices"):
        skipped = slice_steps.run_slice(bf, plan.slices[1], submit_fn=no_spark)
    assert time.monotonic() - began < 10
    assert skipped["skipped"] is True and skipped["rows_read"] == 0 and skipped["batches"] == 0
    assert "slice s0001 (2/4, sequential): skipped, no source has data in its read range" in caplog.text
    store = bf.store()
    assert store.done("s0001") == skipped
    # an empty slice creates no staging table (validate and publish count it as zero rows)
    assert not catalog.table_exists(bf.staging_table(bf.cfg.sinks["sessions"], "s0001"))
    assert bf.staging_table(bf.cfg.sinks["sessions"], "s0001") not in planning.staging_tables(
        bf, bf.cfg.sinks["sessions"], plan
    )
    # the next slice starts from the checkpoint the slice before the empty one left
    assert slice_steps.slice_ready(bf, plan.slices[2])
    slice_steps.run_slice(bf, plan.slices[2], submit_fn=spark_stand_in)
    assert runs[1]["found"] == ["0"]  # what the run of s0000 left, carried over the skipped s0001
    assert (
        Path(store.attempt("s0002", store.current_epoch("s0002") or "")) / "offsets" / "0"
    ).read_text() == "after run 1"
    slice_steps.run_slice(bf, plan.slices[3], submit_fn=no_spark)  # the empty last slice
    assert all(store.done(s.slice_id) is not None for s in plan.slices)


def test_the_first_slice_log_gets_the_spark_submit_output(tmp_path: Path) -> None:
    """Airflow configures its logging when first imported; ``slice_log`` must win over it even
    when the first slice's spark-submit is what first imports Airflow (a fresh ``kappa`` process)."""
    log = tmp_path / "s0000.log"
    code = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parents[1])!r})
import airflow_env
from pathlib import Path
from airflow_provider_kappa.cli.backfill import slice_log
assert "airflow" not in sys.modules
with slice_log(Path({str(log)!r})):
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
    SparkSubmitHook(conn_id="kappa_local_spark").log.info("spark-submit output line")
print("finished")
"""
    env = {"AIRFLOW_CONN_KAPPA_LOCAL_SPARK": '{"conn_type": "spark", "host": "local[2]"}'}
    import os

    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env={**os.environ, **env}
    )
    assert done.returncode == 0, done.stderr
    assert "finished" in done.stdout and "spark-submit output line" not in done.stdout + done.stderr
    assert "spark-submit output line" in log.read_text()
