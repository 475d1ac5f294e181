"""Pre-flight before any lock or tag (issue 18 item 4 and 6): a backfill of too many slices and a
``checkpoint_root`` that cannot be written are refused with exit 2, naming the key, the value and
what is allowed, and nothing is written (no lock, no tag, no checkpoint)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import airflow_env  # noqa: F401  (sets AIRFLOW_HOME before Airflow is imported)
import pytest
import yaml
from airflow_env import write_job_config
from lake import INCIDENT_END, INCIDENT_START, seed_sessions_incident, sorted_rows

from airflow_provider_kappa.backfill.checks import MAX_SLICES
from airflow_provider_kappa.cli import main


def refused(capsys: pytest.CaptureFixture[str], catalog: Any, config: Path, argv: list[str]) -> str:
    before = sorted_rows(catalog.load_table("prod.playback_sessions"))
    errors = []
    for verb in ("plan", "backfill"):
        code = main([verb, "--config", str(config), *argv])
        _, err = capsys.readouterr()
        assert code == 2 and err.startswith(f"kappa {verb}: error: "), err
        errors.append(err)
    target = catalog.load_table("prod.playback_sessions")
    assert sorted_rows(target) == before
    assert not [k for k in target.properties if k.startswith("kappa.backfill.lock.")]
    assert not [r for r in catalog.load_table("raw.playbacks").metadata.refs if r.startswith("kappa-")]
    return errors[-1]


def test_too_many_slices_are_refused_before_any_lock(
    tmp_path: Path, catalog_props: dict[str, str], catalog: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_job_config(tmp_path, catalog_props)
    seed_sessions_incident(catalog)
    err = refused(
        capsys,
        catalog,
        config,
        ["--start", INCIDENT_START.isoformat(), "--end", "2027-11-01T00:00:00Z", "--slice", "1h"],
    )
    assert "backfill parameter slice: 1h cuts the window" in err and f"at most {MAX_SLICES} are allowed" in err, err
    assert "use a slice of at least 9h" in err, err
    assert not (tmp_path / "checkpoints").exists()


def test_an_unwritable_checkpoint_root_is_refused_before_any_lock(
    tmp_path: Path, catalog_props: dict[str, str], catalog: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_job_config(tmp_path, catalog_props)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    raw = yaml.safe_load(config.read_text())
    raw["job"]["checkpoint_root"] = str(blocker / "checkpoints")
    config.write_text(yaml.safe_dump(raw))
    seed_sessions_incident(catalog)
    code = main(
        ["backfill", "--config", str(config), "--start", INCIDENT_START.isoformat(), "--end", INCIDENT_END.isoformat()]
    )
    _, err = capsys.readouterr()
    assert code == 2, err
    assert f"job.checkpoint_root: {str(blocker / 'checkpoints')!r} cannot be written" in err, err
    target = catalog.load_table("prod.playback_sessions")
    assert not [k for k in target.properties if k.startswith("kappa.backfill.lock.")]
    assert not [r for r in catalog.load_table("raw.playbacks").metadata.refs if r.startswith("kappa-")]


def test_the_probe_leaves_no_folder_behind(tmp_path: Path, catalog_props: dict[str, str]) -> None:
    from airflow_provider_kappa.backfill.checks import check_checkpoint_root
    from airflow_provider_kappa.job.config import load_config

    config = write_job_config(tmp_path, catalog_props)
    check_checkpoint_root(load_config(config))
    assert not (tmp_path / "checkpoints").exists()


def test_the_probe_keeps_what_a_backfill_starting_beside_it_wrote(
    tmp_path: Path, catalog_props: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two backfills of one job starting on a ``checkpoint_root`` not made yet: the other one's file,
    written while this one's probe is there, survives the probe's clean-up (it removed the whole
    folder it had created, the other's files in it too)."""
    from airflow_provider_kappa.backfill import checks
    from airflow_provider_kappa.job.checkpoints import job_root
    from airflow_provider_kappa.job.config import load_config

    cfg = load_config(write_job_config(tmp_path, catalog_props))
    other = Path(job_root(cfg.job.checkpoint_root, cfg.job.name)) / "the-other-backfill" / "attempt"
    write_probe = checks.write_text

    def probe_then_the_other_backfill_writes(fs: Any, path: str, text: str) -> None:
        write_probe(fs, path, text)
        other.parent.mkdir(parents=True)
        other.write_text("the other backfill's attempt")

    monkeypatch.setattr(checks, "write_text", probe_then_the_other_backfill_writes)
    checks.check_checkpoint_root(cfg)
    assert other.read_text() == "the other backfill's attempt"
    assert not list((tmp_path / "checkpoints").rglob(".kappa-write-probe-*"))


def test_remove_empty_folders_stops_at_the_first_folder_holding_anything(tmp_path: Path) -> None:
    from pyarrow.fs import LocalFileSystem

    from airflow_provider_kappa.spark.storage import remove_empty_folders

    fs = LocalFileSystem()
    top, deep = tmp_path / "root", tmp_path / "root" / "job" / "a" / "b"
    deep.mkdir(parents=True)
    (tmp_path / "root" / "job" / "kept.txt").write_text("written by another process")
    remove_empty_folders(fs, str(deep), str(top))
    assert not (tmp_path / "root" / "job" / "a").exists()
    assert (tmp_path / "root" / "job" / "kept.txt").exists()
    (tmp_path / "root" / "job" / "kept.txt").unlink()
    remove_empty_folders(fs, str(deep), str(top))  # "a" and "b" already gone: passed over
    assert not top.exists()
    assert tmp_path.is_dir()  # never above top
    remove_empty_folders(fs, str(tmp_path / "x"), str(tmp_path / "y"))  # not under top: nothing to do
    assert tmp_path.is_dir()


def test_remove_empty_folders_on_a_filesystem_that_is_not_local_ends_at_a_bucket() -> None:
    """The listing branch (object stores, HDFS), on an in-memory fsspec filesystem through pyarrow's
    PyFileSystem: a folder holding anything stays, and the walk ends at a top with no ``/`` in it."""
    from fsspec.implementations.memory import MemoryFileSystem
    from pyarrow.fs import FileType, FSSpecHandler, PyFileSystem

    from airflow_provider_kappa.spark.storage import remove_empty_folders

    fs = PyFileSystem(FSSpecHandler(MemoryFileSystem()))
    fs.create_dir("kappa-bucket/root/job/a", recursive=True)
    with fs.open_output_stream("kappa-bucket/root/kept.txt") as out:
        out.write(b"written by another process")
    remove_empty_folders(fs, "kappa-bucket/root/job/a", "kappa-bucket")
    assert fs.get_file_info("kappa-bucket/root/job").type == FileType.NotFound
    assert fs.get_file_info("kappa-bucket/root/kept.txt").type == FileType.File
    fs.delete_file("kappa-bucket/root/kept.txt")
    remove_empty_folders(fs, "kappa-bucket/root/job/a", "kappa-bucket")
    assert fs.get_file_info("kappa-bucket").type == FileType.NotFound


def test_first_missing_names_the_topmost_folder_a_write_would_create(tmp_path: Path) -> None:
    from pyarrow.fs import LocalFileSystem

    from airflow_provider_kappa.spark.storage import first_missing

    fs = LocalFileSystem()
    assert first_missing(fs, str(tmp_path)) is None
    assert first_missing(fs, str(tmp_path / "a" / "b" / "c")) == str(tmp_path / "a")
    (tmp_path / "a").mkdir()
    assert first_missing(fs, str(tmp_path / "a" / "b" / "c")) == str(tmp_path / "a" / "b")
