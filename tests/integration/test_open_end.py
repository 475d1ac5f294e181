"""The issue's window past the landed data, through the real ``kappa backfill`` (issue 18 items 5
and 6): a window [05:00, next day) over playbacks ending at 06:00, with ``min_match`` 0.

Without ``--allow-open-end`` it is refused before anything is written (before the fix it ran and
replaced the target's correct rows with fewer: the sessions no watermark could close). With it,
one Spark run stages the window; its publish meets the sqlite catalog locked by another
connection (a real ``BEGIN EXCLUSIVE``, held by another thread): one error line, the lock kept
and named with its release command; once the catalog is free, ``--resume`` publishes what the
landed data closes, and the target holds every correct row."""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from airflow_env import write_job_config
from lake import (
    T0,
    append_events,
    create_events_table,
    create_sessions_table,
    event,
    expected_sessions,
    sessions_arrow,
    sorted_rows,
)

from airflow_provider_kappa.backfill.backfill import Backfill
from airflow_provider_kappa.backfill.lock import read_locks, release_command
from airflow_provider_kappa.cli import main
from airflow_provider_kappa.job.config import load_config

SOURCE = "raw.playbacks"
TARGET = "prod.playback_sessions"


def at(h: int, m: int = 0) -> Any:
    return T0 + timedelta(hours=h, minutes=m)


EVENTS = [event(700 + i, at(4, 6 * i), account=7, show=7) for i in range(20)] + [
    event(100 + i, at(5, m), account=a, show=a)
    for i, (a, m) in enumerate([(1, 20), (1, 22), (1, 24), (2, 41), (2, 43), (3, 57), (3, 59)])
]
ARGV = [
    "--start",
    at(5).isoformat(),
    "--end",
    at(24).isoformat(),
    "--slice",
    "6h",
    "--warmup",
    "30min",
    "--tail",
    "20min",
    "--max-misalignment",
    "1h",
    "--min-match",
    "0",
]


class LockAtPublish(logging.Handler):
    """When publish starts (its first log line), another thread takes the sqlite catalog's
    exclusive lock with its own connection and holds it until :meth:`free`."""

    def __init__(self, db: Path) -> None:
        super().__init__(logging.INFO)
        self.db = db
        self.held = threading.Event()
        self.done = threading.Event()
        self.thread: threading.Thread | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.thread is None and record.getMessage().startswith("sink sessions: publishing"):
            self.thread = threading.Thread(target=self._hold, daemon=True)
            self.thread.start()
            assert self.held.wait(30), "the catalog's lock was not taken"

    def _hold(self) -> None:
        conn = sqlite3.connect(self.db, isolation_level=None)
        conn.execute("BEGIN EXCLUSIVE")
        self.held.set()
        self.done.wait(300)
        conn.execute("ROLLBACK")
        conn.close()

    def free(self) -> None:
        self.done.set()
        if self.thread is not None:
            self.thread.join(30)


@pytest.fixture()
def lock_at_publish(catalog_props: dict[str, str]) -> Iterator[LockAtPublish]:
    handler = LockAtPublish(Path(catalog_props["uri"].removeprefix("sqlite:///")))
    logger = logging.getLogger("airflow_provider_kappa.backfill.publish")
    saved = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        handler.free()
        logger.removeHandler(handler)
        logger.setLevel(saved)


def test_an_open_end_is_refused_then_published_up_to_what_the_data_closes_through_a_locked_catalog(
    tmp_path: Path,
    catalog: Any,
    catalog_props: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    lock_at_publish: LockAtPublish,
    connect_server: Any,
) -> None:
    append_events(create_events_table(catalog, SOURCE), EVENTS)
    oracle = expected_sessions(EVENTS)  # the correct rows (live went on past 06:00 and closed them all)
    damaged = [dict(s, plays=99) if s["account_id"] == 1 else s for s in oracle]  # the incident, at 05:20
    create_sessions_table(catalog, TARGET).append(pa.Table.from_pylist(damaged, schema=sessions_arrow()))
    before = sorted_rows(catalog.load_table(TARGET))
    # the sqlite catalog waits 2 s for a lock held by another connection, then says "database is locked"
    # (its slices run on the session's shared Spark Connect server: the engine is not what this tests)
    config = write_job_config(
        tmp_path,
        {**catalog_props, "uri": catalog_props["uri"] + "?timeout=2"},
        engine="connect",
        connect_url=connect_server.url,
    )

    # kappa plan (writes nothing) says what the backfill will do with the open end
    for extra, says in (
        ([], "kappa backfill refuses this window"),
        (["--allow-open-end"], "validates and publishes [2026-11-01T05:00:00+00:00, 2026-11-01T05:40:00+00:00)"),
    ):
        assert main(["plan", "--config", str(config), *ARGV, *extra]) == 0
        text = " ".join(capsys.readouterr().out.split())
        assert "past the landed data" in text and says in text, text[-2000:]
    later = list(ARGV)
    later[later.index("--start") + 1] = at(6).isoformat()  # the data (landed through 06:00) closes none of it
    assert main(["plan", "--config", str(config), *later, "--allow-open-end"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "refuses this window, even with --allow-open-end" in text, text[-2000:]
    code = main(["backfill", "--config", str(config), *ARGV])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "past the landed data" in err and "--allow-open-end" in err, err
    assert sorted_rows(catalog.load_table(TARGET)) == before  # not one correct row replaced
    assert read_locks(catalog.load_table(TARGET)) == [] and not (tmp_path / "checkpoints").exists()

    code = main(["backfill", "--config", str(config), *ARGV, "--allow-open-end"])
    out, err = capsys.readouterr()
    assert code == 1, out[-3000:] + err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err  # one line, no traceback
    bf = Backfill.create(load_config(config), _params())
    assert err.startswith(f"kappa backfill: error: backfill {bf.id}: publish stopped by a catalog fault")
    assert "(OperationalError: database is locked)" in err and "--resume" in err
    assert release_command(bf) in err  # exactly how to release the lock it keeps
    lock_at_publish.free()
    (held,) = read_locks(catalog.load_table(TARGET))
    assert held.backfill_id == bf.id
    assert sorted_rows(catalog.load_table(TARGET)) == before

    code = main(["backfill", "--config", str(config), *ARGV, "--allow-open-end", "--resume"])
    out, err = capsys.readouterr()
    assert code == 0, out[-3000:] + err
    text = " ".join(out.split())
    assert "validated and published [2026-11-01T05:00:00+00:00, 2026-11-01T05:40:00+00:00)" in text, text[-3000:]
    # the window up to 05:40 repaired; the sessions after it, which the data cannot close, kept
    assert sorted_rows(catalog.load_table(TARGET)) == sorted_rows(pa.Table.from_pylist(oracle, schema=sessions_arrow()))
    assert read_locks(catalog.load_table(TARGET)) == []


def _params() -> dict[str, Any]:
    raw = dict(zip((a.removeprefix("--") for a in ARGV[::2]), ARGV[1::2]))
    raw["max_misalignment_threshold"] = raw.pop("max-misalignment")
    raw["min_match"] = raw.pop("min-match")
    return {**raw, "allow_open_end": True}
