"""Exact by default (issue #25): ``ledger: auto`` replays the live ledger when it covers the range
read, and otherwise says in one line why not and aligns; ``kappa plan`` says how exact to expect
the backfill; the choice is pinned for reruns; ``ledger: true`` without a ledger is refused before
anything is written. A real sqlite SqlCatalog and a real ledger folder (``spark/ledger.py``'s files)."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from lake import T0, append_events, create_events_table, create_summary_table, event, summary_row, summary_table
from test_cli_output import write_config

from airflow_provider_kappa.backfill.backfill import Backfill
from airflow_provider_kappa.backfill.exactness import decide
from airflow_provider_kappa.backfill.plan import plan, slice_is_empty
from airflow_provider_kappa.backfill.snapshot import pin
from airflow_provider_kappa.cli import main
from airflow_provider_kappa.job.config import load_config
from airflow_provider_kappa.spark.ledger import Ledger, LedgerEntry, sink_ledger
from airflow_provider_kappa.timeparse import to_micros

H = timedelta(hours=1)
WINDOW = ["--start", (T0 + H).isoformat(), "--end", (T0 + 3 * H).isoformat()]


def ms(at: datetime) -> int:
    return to_micros(at) // 1000


def write_ledger(folder: str, first: datetime, last: datetime, *, from_offset: int = 5) -> int:
    """Live batches every 10 minutes from ``first`` to ``last``, one Kafka partition, 3 records each."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    at, batch, previous, offset = first, 0, None, from_offset
    while at <= last:
        entry = LedgerEntry("q", batch, ms(at), previous, 0, {"t": {0: (offset, offset + 3)}})
        (Path(folder) / entry.name).write_text(entry.to_json())
        at, batch, previous, offset = at + timedelta(minutes=10), batch + 1, ms(at), offset + 3
    return batch


@pytest.fixture()
def config(tmp_path: Path, catalog: Any, catalog_props: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Path:
    """Four hours of landed events (one every 10 minutes from T0), a target table with rows."""
    monkeypatch.setenv("COLUMNS", "200")
    source = create_events_table(catalog, "raw.playbacks")
    append_events(source, [event(i, T0 + i * timedelta(minutes=10)) for i in range(24)])
    create_summary_table(catalog, "prod.summary").append(summary_table([summary_row(60, 1, 5)]))
    return write_config(tmp_path, catalog_props)


def ledger_of(config: Path) -> str:
    cfg = load_config(config)
    return sink_ledger(cfg.job.ledger, "summary")


def test_a_ledger_covering_the_range_read_is_replayed_by_default_and_the_plan_says_exact(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_ledger(ledger_of(config), T0 - timedelta(minutes=5), T0 + 4 * H)
    # a tail of one live trigger: the batch live started after the range reads only records landed
    # after the window (at tail 0s, the records of the window's last 10 minutes were read by a batch
    # started after the range: not covered, see the backlog test below)
    assert main(["plan", "--config", str(config), *WINDOW, "--tail", "10min"]) == 0
    out = capsys.readouterr().out
    assert "ledger auto" in out, out
    assert (
        f"exactness: exact: the live ledger covers [{(T0 + H).isoformat()}, "
        f"{(T0 + 3 * H + timedelta(minutes=10)).isoformat()}); 13 live batch(es) replayed" in out
    ), out
    assert "micro-batches as live cut them (max_misalignment_threshold unused)" in out, out
    rows = [line for line in out.splitlines() if line.lstrip().startswith("s000")]
    assert len(rows) == 3 and all(" 6 " in row for row in rows[:2]) and " 1 " in rows[2], out  # 6 a 1 h slice


def test_the_backfill_header_says_the_threshold_is_unused_when_the_ledger_is_replayed(config: Path) -> None:
    """The header is printed before the plan: with ``ledger: true`` it says the threshold cuts nothing (issue
    25: it printed "threshold 1min" for a replay); with ``auto`` the plan's exactness line says it."""
    import io

    from rich.console import Console

    from airflow_provider_kappa.cli.plan import print_header

    def header(**raw: str) -> str:
        console = Console(file=io.StringIO(), width=400, no_color=True)
        print_header(console, Backfill.create(load_config(config), {"start": WINDOW[1], "end": WINDOW[3], **raw}))
        return console.file.getvalue()  # type: ignore[attr-defined]

    assert "threshold 15min (max_misalignment_threshold unused: ledger true)," in header(ledger="true")
    assert "threshold 15min, " in header() and "unused" not in header()


def test_a_ledger_begun_after_the_range_read_is_not_replayed_and_the_plan_says_why(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_ledger(ledger_of(config), T0 + 2 * H, T0 + 4 * H)
    assert main(["plan", "--config", str(config), *WINDOW]) == 0
    out = capsys.readouterr().out
    assert "exactness: aligned to 15min: micro-batches cut on the ingestion grid" in out, out
    assert (
        f"the live ledger is not replayed: live's first recorded batch starts at {(T0 + 2 * H).isoformat()}, "
        f"after the range read begins ({(T0 + H).isoformat()})" in out
    ), out
    assert "live batches" not in out


def test_a_ledger_whose_first_batch_read_from_the_first_offsets_covers_an_earlier_start(config: Path) -> None:
    write_ledger(ledger_of(config), T0 + 2 * H, T0 + 4 * H, from_offset=0)
    book = Ledger(ledger_of(config))
    assert book.gap(ms(T0 + H), ms(T0 + 3 * H), None) is None
    assert book.count(ms(T0 + H), ms(T0 + 3 * H)) == 6  # 2 h, 2h10 ... 2h50


def test_a_ledger_ending_before_the_landed_data_is_not_replayed(config: Path) -> None:
    write_ledger(ledger_of(config), T0 - H, T0 + 2 * H)
    book = Ledger(ledger_of(config))
    gap = book.gap(ms(T0 + H), ms(T0 + 3 * H), ms(T0 + 2 * H + timedelta(minutes=50)))
    assert gap is not None and gap.startswith(f"live's last recorded batch ends at {(T0 + 2 * H).isoformat()}")
    # the landed data of the range ends before live's last batch: covered, though the range reads on
    assert book.gap(ms(T0 + H), ms(T0 + 3 * H), ms(T0 + H + timedelta(minutes=50))) is None


def test_without_a_ledger_the_plan_aligns_and_says_so(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--config", str(config), *WINDOW]) == 0
    out = capsys.readouterr().out
    assert f"the live ledger is not replayed: no live ledger at {ledger_of(config)}" in out, out
    assert main(["plan", "--config", str(config), *WINDOW, "--ledger", "false"]) == 0
    out = capsys.readouterr().out
    assert "late-event drops can differ near window ends (ledger: false)" in out, out


def test_ledger_true_without_a_ledger_is_refused_before_anything_is_written(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoints = Path(load_config(config).job.checkpoint_root)
    assert main(["backfill", "--config", str(config), *WINDOW, "--ledger"]) == 2
    err = capsys.readouterr().err
    assert f"backfill parameter ledger: true, but no live ledger at '{ledger_of(config)}'" in err, err
    assert "use ledger auto or false" in err
    assert not checkpoints.exists() or not any(checkpoints.rglob("*.json")), list(checkpoints.rglob("*"))


def test_the_ledger_choice_is_pinned_by_the_first_plan_and_kept_by_reruns(config: Path) -> None:
    bf = Backfill.create(load_config(config), {"start": WINDOW[1], "end": WINDOW[3], "tail": "10min", "dry_run": True})
    pinned = pin(bf, tag=False)
    first = plan(bf, pinned, pin=True)
    assert not first.replays_ledger and all(s.ledger_batches is None for s in first.slices)
    write_ledger(ledger_of(config), T0 - H, T0 + 4 * H)  # live's ledger appears (or grows) since
    assert decide(bf, None, pin=False)[0].exact  # a fresh backfill would replay it
    again = plan(bf, pinned, pin=True)
    assert not again.replays_ledger, again.exactness  # this one goes on as it began
    assert bf.params.min_match_for(again.replays_ledger) == 0.0


def test_min_match_defaults_to_100_for_a_ledger_replay_that_does_not_publish(config: Path) -> None:
    cfg = load_config(config)
    window = {"start": WINDOW[1], "end": WINDOW[3]}
    verify = Backfill.create(cfg, {**window, "dry_run": True}).params
    repair = Backfill.create(cfg, window).params
    given = Backfill.create(cfg, {**window, "dry_run": True, "min_match": 99.5}).params
    assert (verify.min_match_for(True), verify.min_match_for(False)) == (100.0, 0.0)
    assert repair.min_match_for(True) == 0.0  # a publishing backfill exists to replace output that differs
    assert given.min_match_for(True) == 99.5
    assert (given.min_match_for(verification=True), verify.min_match_for(False, verification=True)) == (99.5, 100.0)


def test_an_unreadable_ledger_is_refused_before_the_lock_with_true_and_said_with_auto(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = ledger_of(config)
    write_ledger(folder, T0 - H, T0 + 4 * H)
    first = sorted(Path(folder).iterdir())[0]
    first.write_text("{not json")
    assert main(["plan", "--config", str(config), *WINDOW]) == 0
    out = capsys.readouterr().out
    assert "the live ledger is not replayed: the live ledger cannot be read: live ledger entry" in out, out
    assert main(["backfill", "--config", str(config), *WINDOW, "--ledger", "--dry-run"]) != 0
    err = capsys.readouterr().err
    assert f"live ledger entry '{first}' is not a kappa ledger entry" in err, err
    assert not (Path(load_config(config).job.checkpoint_root) / "summary_job" / "backfill").exists()


def test_a_backlog_live_caught_up_after_the_range_is_not_replayed_and_the_plan_says_why(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Live stopped at T0 + 1h50 and caught the backlog up at T0 + 4h (one batch reading 2 h of
    records): the range's records were read by a batch live started after the range read ends, so a
    replay would miss them (and the windows they closed); the plan aligns and says why."""
    folder = ledger_of(config)
    write_ledger(folder, T0 - timedelta(minutes=5), T0 + H + timedelta(minutes=50))  # 12 batches, offsets 5..41
    caught_up = LedgerEntry("q", 12, ms(T0 + 4 * H), ms(T0 + H + timedelta(minutes=50)), 0, {"t": {0: (41, 80)}})
    (Path(folder) / caught_up.name).write_text(caught_up.to_json())
    book = Ledger(folder)
    window_end = ms(T0 + 3 * H)
    gap = book.gap(ms(T0 + H), ms(T0 + 3 * H + timedelta(minutes=30)), None, window_end)
    assert gap is not None and gap.startswith(
        f"live's batch 12, placed at {(T0 + 4 * H).isoformat()} after the range read ends"
    ), gap
    assert "a backlog live caught up after the range" in gap
    assert book.gap(ms(T0 + H), ms(T0 + 3 * H), None) is None  # the ends alone look covered
    assert main(["plan", "--config", str(config), *WINDOW]) == 0
    out = capsys.readouterr().out
    assert "exactness: aligned to 15min" in out and "a backlog live caught up after the range" in out, out
    # live running steadily past the range: the batch after it reads only records landed after the window
    steady = ledger_of(config) + "-steady"
    write_ledger(steady, T0 - timedelta(minutes=5), T0 + 4 * H)
    assert Ledger(steady).gap(ms(T0 + H), ms(T0 + 3 * H + timedelta(minutes=30)), None, window_end) is None


def test_a_slice_without_landed_files_runs_when_it_replays_live_batches(
    tmp_path: Path, catalog: Any, catalog_props: dict[str, str]
) -> None:
    """Nothing landed in [T0 + 1h, T0 + 2h) (the data stopped, then came back), but live ran its batches
    through that hour: its no-data batches close the windows of the data before it, so the slice replaying
    them runs. Without the ledger nothing in that slice can change the output, and it is skipped as before
    (issue 25: slices without landed files were skipped even when live batches started in them)."""
    source = create_events_table(catalog, "raw.playbacks")
    append_events(source, [event(i, T0 + i * timedelta(minutes=10)) for i in range(6)])  # T0 .. T0 + 50min
    append_events(source, [event(i, T0 + 2 * H + i * timedelta(minutes=10)) for i in range(12)])  # from T0 + 2h
    create_summary_table(catalog, "prod.summary").append(summary_table([summary_row(60, 1, 5)]))
    config = write_config(tmp_path, catalog_props)
    write_ledger(ledger_of(config), T0 - timedelta(minutes=5), T0 + 4 * H)
    window = {"start": WINDOW[1], "end": WINDOW[3], "tail": "10min", "dry_run": True}
    for ledger, empty in (("true", []), ("false", ["s0000"])):
        bf = Backfill.create(load_config(config), {**window, "ledger": ledger})
        planned = plan(bf, pin(bf, tag=False), pin=True)
        first = planned.slices[0]
        assert [s.files for s in first.stats] == [0], first  # no landed file in [T0 + 1h, T0 + 2h)
        assert first.ledger_batches == (6 if ledger == "true" else None), first
        assert [s.slice_id for s in planned.slices if slice_is_empty(s)] == empty, ledger


@pytest.mark.airflow
def test_the_plan_step_records_its_exactness_for_the_dag_s_later_tasks(config: Path) -> None:
    """A DAG's plan task pushes the slices only; validate's report reads the plan step's statement
    from the backfill's folder."""
    import airflow_env  # noqa: F401  (a private AIRFLOW_HOME before Airflow is imported)

    from airflow_provider_kappa.operators import KappaBackfillBaseOperator

    write_ledger(ledger_of(config), T0 - timedelta(minutes=5), T0 + 4 * H)
    bf = Backfill.create(load_config(config), {"start": WINDOW[1], "end": WINDOW[3], "tail": "10min"})
    planned = plan(bf, pin(bf, tag=False), pin=True)
    assert planned.exactness is not None and planned.exactness.exact
    loaded = KappaBackfillBaseOperator.load_plan([s.to_dict() for s in planned.slices], bf, "validate")
    assert loaded.exactness_line == planned.exactness.statement
    assert loaded.exactness_line.startswith("exact: the live ledger covers")
