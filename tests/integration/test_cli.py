"""``kappa plan`` and ``kappa backfill``: the slice table, bad input refused with exit code 2 and
nothing written, and a real end-to-end backfill (local Spark) replacing a seeded bad window."""

from __future__ import annotations

import json
import logging
import re
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
    create_events_table,
    event,
    seed_sessions_incident,
    sorted_rows,
)

from airflow_provider_kappa.cli import main

WINDOW = ["--start", INCIDENT_START.isoformat(), "--end", INCIDENT_END.isoformat()]
OPTIONS = ["--slice", "2h", "--warmup", "30min", "--tail", "45min"]


@pytest.fixture()
def config(tmp_path: Path, catalog_props: dict[str, str]) -> Path:
    return write_job_config(tmp_path, catalog_props)


def kappa(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_prints_the_slice_table_and_writes_nothing(
    config: Path, catalog: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    table = create_events_table(catalog, "raw.playbacks")
    append_events(table, [event(i, T0.replace(hour=0) + (INCIDENT_START - T0) * i / 10) for i in range(40)])
    code, out, err = kappa(capsys, "plan", "--config", str(config), *WINDOW, *OPTIONS, "--mode", "parallel")
    assert code == 0, err
    assert "2 parallel slice(s)" in out
    assert "s0000" in out and "s0001" in out and "s0002" not in out
    assert "11-01 00:30→11-01 02:45" in out and "11-01 01:00→11-01 02:00" in out  # reads / owns of slice 0
    assert "files / ~rows / ~bytes" in out
    assert not [r for r in catalog.load_table("raw.playbacks").metadata.refs if r.startswith("kappa-")]
    assert not (config.parent / "checkpoints").exists()


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (
            ["--start", "2026-11-01T03:00:00Z", "--end", "2026-11-01T01:00:00Z"],
            "backfill parameter end: '2026-11-01T01:00:00Z' is not after start",
        ),
        (["--start", "2026-11-01T01:00:00", "--end", "2026-11-01T03:00:00Z"], "is a naive timestamp; add an offset"),
        (
            WINDOW + ["--sources", "playbacks,clicks"],
            "unknown source(s) ['clicks'] for job 'playback_sessions'; allowed: ['playbacks']",
        ),
        (WINDOW + ["--max-misalignment", "0s"], "backfill parameter max_misalignment_threshold: '0s' must be positive"),
        (WINDOW + ["--slice=-1h"], "backfill parameter slice: '-1h' is not a duration"),
        (WINDOW + ["--slice", "1d"], "backfill parameter slice: 1d is larger than the range read"),
        (WINDOW + ["--min-match", "101"], "min_match: '101' must be between 0 and 100"),
        (["--start", "2026-11-02T01:00:00Z", "--end", "2026-11-02T03:00:00Z"], "is outside the tables' data"),
    ],
)
def test_bad_input_is_refused_with_exit_2_and_nothing_written(
    config: Path, catalog: Any, capsys: pytest.CaptureFixture[str], argv: list[str], reason: str
) -> None:
    seed_sessions_incident(catalog)
    before = sorted_rows(catalog.load_table("prod.playback_sessions"))
    for verb in ("plan", "backfill"):
        code, _, err = kappa(capsys, verb, "--config", str(config), *argv)
        assert code == 2 and err.startswith(f"kappa {verb}: error: ") and reason in err, err
    assert sorted_rows(catalog.load_table("prod.playback_sessions")) == before
    assert not (config.parent / "checkpoints").exists()


def test_a_missing_config_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = kappa(capsys, "backfill", "--config", str(tmp_path / "nope.yaml"), *WINDOW)
    assert code == 2 and "nope.yaml' cannot be read" in err


def record_compat_digest(name: str, rows: list[tuple[Any, ...]], out: str) -> None:
    """Under ``make test-compat`` (``$KAPPA_COMPAT_DIGEST_DIR``): this end's published rows of one fixed
    backfill, as a count and a SHA-256 of their canonical form, and each slice's micro-batch count. The
    runner (tests/compat/run.py) compares both ends' files: the lowest and the newest Spark must agree."""
    import hashlib
    import os

    folder = os.environ.get("KAPPA_COMPAT_DIGEST_DIR")
    if not folder:
        return
    canonical = "\n".join(repr(r) for r in rows)
    digest = {
        "rows": len(rows),
        "sha256": hashlib.sha256(canonical.encode()).hexdigest(),
        "micro_batches": dict(re.findall(r"(s\d{4}) rows read \d+, micro-batches (\d+)", out)),
    }
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / f"{name}.json").write_text(json.dumps(digest, indent=1, sort_keys=True))
    (Path(folder) / f"{name}.rows").write_text(canonical)


@pytest.mark.parametrize("engine", ["submit", "connect"])
def test_backfill_replaces_the_bad_window_end_to_end(
    tmp_path: Path,
    catalog_props: dict[str, str],
    catalog: Any,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    engine: str,
) -> None:
    """Both engines: spark-submit per slice, and sessions of the tests' shared Spark Connect server."""
    import pyarrow as pa
    from lake import sessions_arrow

    url = request.getfixturevalue("connect_server").url if engine == "connect" else None
    config = write_job_config(tmp_path, catalog_props, engine=engine, connect_url=url)
    monkeypatch.setenv("COLUMNS", "200")
    # the warm zygote's own log, on its logger (Airflow's logging setup replaces the root's handlers)
    submit_log: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: submit_log.append(record.getMessage())  # type: ignore[method-assign]
    engine_logger = logging.getLogger("airflow_provider_kappa.engine.warm_python")
    engine_logger.addHandler(handler)
    monkeypatch.setattr(engine_logger, "level", logging.INFO)
    request.addfinalizer(lambda: engine_logger.removeHandler(handler))
    expected = seed_sessions_incident(catalog)
    code, out, err = kappa(capsys, "backfill", "--config", str(config), *WINDOW, *OPTIONS, "--min-match", "50")
    assert code == 0, out + err
    target = catalog.load_table("prod.playback_sessions")
    assert sorted_rows(target) == sorted_rows(pa.Table.from_pylist(expected, schema=sessions_arrow()))
    assert "s0000 rows read" in out and "s0001 rows read" in out and "micro-batches" in out
    if engine == "submit":  # local master: both slices' Python processes forked from one warm zygote
        said = "\n".join(submit_log)
        forked = [int(n) for n in re.findall(r"warm daemon: (\d+) of Spark's Python processes forked warm", said)]
        assert len(forked) == 1 and forked[0] >= 2 * 4, said[-3000:]
    record_compat_digest(f"backfill-{engine}", sorted_rows(target), out)
    assert "match rate" in out and "slices run 2/2" in out and "published snapshot" in out
    published = target.current_snapshot().snapshot_id
    # the same command again with --resume: nothing reruns, nothing changes but one more identical publish
    code, out, err = kappa(capsys, "backfill", "--config", str(config), *WINDOW, *OPTIONS, "--resume")
    assert code == 0, out + err
    assert "s0000 already done (--resume)" in out and "s0001 already done (--resume)" in out
    n = sum(1 for s in expected if INCIDENT_START <= s["session_start"] < INCIDENT_END)
    assert f"match rate 100.000% (staged {n}, target {n}, matched {n})" in out
    after = catalog.load_table("prod.playback_sessions")
    assert sorted_rows(after) == sorted_rows(pa.Table.from_pylist(expected, schema=sessions_arrow()))
    assert after.current_snapshot().snapshot_id != published
    # a dry run writes nothing outside staging
    code, out, err = kappa(capsys, "backfill", "--config", str(config), *WINDOW, *OPTIONS, "--resume", "--dry-run")
    assert code == 0 and "dry run: nothing published" in out
    assert (
        catalog.load_table("prod.playback_sessions").current_snapshot().snapshot_id
        == after.current_snapshot().snapshot_id
    )
    if engine == "connect":  # the heartbeat is the command's, whatever the engine: checked on the cheaper one
        # a dry run that runs its slices, then ends: it no longer counts as running, so a cleanup at 0s
        # removes it at once (its heartbeat used to keep it for 5 minutes after the command ended)
        code, out, err = kappa(capsys, "backfill", "--config", str(config), *WINDOW, *OPTIONS, "--dry-run")
        assert code == 0 and "s0000 rows read" in out and "dry run: nothing published" in out, out + err
        monkeypatch.setenv("COLUMNS", "300")  # the table's action column whole
        code, out, err = kappa(capsys, "cleanup", "--config", str(config), "--older-than", "0s")
        assert code == 0, out + err
        assert "running: heartbeat" not in out and "removed (older than the retention 0s)" in out, out
