"""What ``kappa`` prints is text, never rich markup, and its tables fit any width outside a
terminal (issue #25). A real sqlite SqlCatalog; the output is captured, so not a TTY.

The job's folder is ``[/data/in]/[a-z0-9_]``: its path is in the header of every verb and in the
``--release-lock`` command of a locked backfill; as markup, ``[/data/in]`` is a closing tag (a
``MarkupError``) and ``[a-z0-9_]`` a style that vanishes.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import airflow_env  # noqa: F401  (a private AIRFLOW_HOME before Airflow is imported)
import pytest
import yaml
from airflow_env import patch_spark_submit
from lake import T0, append_events, create_events_table, create_summary_table, event, summary_row, summary_table

from airflow_provider_kappa.backfill.backfill import Backfill
from airflow_provider_kappa.backfill.lock import lock, release_command
from airflow_provider_kappa.cli import main
from airflow_provider_kappa.job.config import load_config

H = timedelta(hours=1)
WINDOW = ["--start", (T0 + H).isoformat(), "--end", (T0 + 3 * H).isoformat()]
FAULT = "input [/data/in] refused: names must match [a-z0-9_]+"


def write_config(tmp_path: Path, catalog_props: dict[str, str], **job: Any) -> Path:
    """The job's kappa.yaml in the folder ``[/data/in]/[a-z0-9_]`` of ``tmp_path``."""
    folder = tmp_path / "[" / "data" / "in]" / "[a-z0-9_]"
    folder.mkdir(parents=True)
    (folder / "job.py").write_text("# the job's application (not run here)\n")
    raw = {
        "job": {
            "name": "summary_job",
            "application": "job.py",
            "checkpoint_root": str(tmp_path / "checkpoints"),
            "engine": "submit",
            **job,
        },
        "catalogs": {"lake": dict(catalog_props)},
        "sources": {
            "playbacks": {
                "type": "iceberg",
                "catalog": "lake",
                "table": "raw.playbacks",
                "ingestion_column": "ingestion_ts",
            },
        },
        "sinks": {
            "summary": {"type": "iceberg", "catalog": "lake", "table": "prod.summary", "time_column": "window_start"}
        },
        "backfill": {"slice": "1h", "tail": "0s", "warmup": "0s"},
    }
    path = folder / "kappa.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture()
def config(tmp_path: Path, catalog: Any, catalog_props: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Path:
    """Four hours of landed events, a target table with rows; the captured console is 80 wide."""
    monkeypatch.delenv("COLUMNS", raising=False)
    source = create_events_table(catalog, "raw.playbacks")
    append_events(source, [event(i, T0 + i * timedelta(minutes=10)) for i in range(24)])
    create_summary_table(catalog, "prod.summary").append(summary_table([summary_row(60, 1, 5)]))
    return write_config(tmp_path, catalog_props)


def test_kappa_cleanup_prints_a_locked_backfills_release_command_whole_on_one_line(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bf = Backfill.create(load_config(config), {"start": WINDOW[1], "end": WINDOW[3]})
    lock(bf)
    command = release_command(bf)
    assert "[/data/in]/[a-z0-9_]/kappa.yaml" in command and len(command) > 160

    assert main(["cleanup", "--config", str(config), "--older-than", "0s"]) == 0
    out, err = capsys.readouterr()
    assert f"cleanup of job summary_job ({config})" in out, out + err
    assert "1 backfill(s) found, 0 removed" in out
    lines = [line for line in out.splitlines() if command in line]
    assert len(lines) == 1, out
    assert bf.id in lines[0] and f"kept: holds the lock on prod.summary; release it with: {command}" in lines[0]


def test_kappa_plan_prints_its_path_verbatim_and_one_whole_line_per_slice(
    config: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    assert main(["plan", "--config", str(config), *WINDOW]) == 0
    out, err = capsys.readouterr()
    assert f"of job summary_job ({config})" in out, out + err
    slices = [line for line in out.splitlines() if line.startswith("  s000")]
    assert len(slices) == 2, out
    assert "reads (ingestion, UTC): 11-01 01:00→11-01 02:00" in slices[0]
    assert "owns (output, UTC): 11-01 01:00→11-01 03:00" in slices[0]  # sequential: the last slice's end
    assert "playbacks files / ~rows / ~bytes: 1 / 6 / " in slices[0]
    assert "reads (ingestion, UTC): 11-01 02:00→11-01 03:00" in slices[1], out


@pytest.mark.airflow
def test_kappa_backfill_prints_a_slice_failure_whose_message_has_brackets_verbatim(
    config: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_submit(application: str, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(f"Cannot execute: spark-submit --master local[*] {application}: {FAULT}")

    patch_spark_submit(monkeypatch, failing_submit)
    assert main(["backfill", "--config", str(config), *WINDOW]) == 1
    out, err = capsys.readouterr()
    assert "MarkupError" not in out + err
    assert f"of job summary_job ({config})" in out, out + err
    application = config.parent / "job.py"
    failed = f"slice s0000 failed: RuntimeError: Cannot execute: spark-submit --master local[*] {application}: {FAULT}"
    assert failed in out.splitlines(), out


def test_a_refused_kappa_yaml_value_is_printed_verbatim(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = yaml.safe_load(config.read_text())
    raw["job"]["staging_namespace"] = "x[/data/in][a-z0-9_]"
    config.write_text(yaml.safe_dump(raw))
    assert main(["plan", "--config", str(config), *WINDOW]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("kappa plan: error: job.staging_namespace: 'x[/data/in][a-z0-9_]' ")
    assert "[a-z0-9_]+" in err and len(err.strip().splitlines()) == 1
