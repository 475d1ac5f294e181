"""Honest dependencies: every requirement of setup.cfg is imported by the package, and the Python
versions declared (classifiers, python_requires, mypy, the Makefile) are the range whose two ends
`make test-compat` runs, and its low end installs the lowest versions setup.cfg declares."""

from __future__ import annotations

import configparser
import hashlib
import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from paths import PACKAGE, REPO

#: distribution -> the module it provides to the package (pyspark-client installs ``pyspark`` too)
MODULES = {
    "apache-airflow": "airflow",
    "apache-airflow-providers-apache-spark": "airflow.providers.apache.spark",
    "apache-airflow-providers-apache-iceberg": "airflow.providers.apache.iceberg",
    "pyspark": "pyspark",
    "pyspark-client": "pyspark",
    "pandas": "pandas",
    "pyiceberg": "pyiceberg",
    "pyyaml": "yaml",
    "rich": "rich",
}


def setup_cfg() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    return cfg


def requirements() -> list[str]:
    lines = setup_cfg()["options"]["install_requires"].splitlines()
    return [
        re.split(r"[\[<>=!~ ]", line.strip(), maxsplit=1)[0].lower()
        for line in lines
        if line.strip() and not line.strip().startswith("#")
    ]


def test_every_requirement_is_imported_by_the_package() -> None:
    source = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py"))
    unknown = [r for r in requirements() if r not in MODULES]
    assert not unknown, f"requirements without a module in MODULES: {unknown}"
    unused = [r for r in requirements() if not re.search(rf"^\s*(from|import) {re.escape(MODULES[r])}\b", source, re.M)]
    assert not unused, f"declared but never imported by the package: {unused}"


def compat_run() -> Any:
    """``make test-compat``'s runner, tests/compat/run.py, loaded from the file."""
    spec = importlib.util.spec_from_file_location("compat_run", REPO / "tests" / "compat" / "run.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def compat_ends() -> dict[str, object]:
    """``make test-compat``'s ends (tests/compat/run.py's ENDS)."""
    return dict(compat_run().ENDS)


def test_the_python_versions_declared_are_the_range_whose_ends_make_test_compat_runs() -> None:
    cfg = setup_cfg()
    classifiers = re.findall(r"Programming Language :: Python :: (\d+\.\d+)", cfg["metadata"]["classifiers"])
    minors = [int(c.split(".")[1]) for c in classifiers]
    low, high = minors[0], minors[-1]
    assert minors == list(range(low, high + 1)), classifiers
    assert cfg["options"]["python_requires"] == f">=3.{low},<3.{high + 1}"
    assert cfg["mypy"]["python_version"] == f"3.{low}"
    ends = compat_ends()
    assert [ends["low"].python, ends["high"].python] == [f"3.{low}", f"3.{high}"]  # type: ignore[attr-defined]
    assert low <= sys.version_info.minor <= high
    default = re.search(r"^PYTHON \?= python3\.(\d+)$", (REPO / "Makefile").read_text(), re.M)
    assert default and low <= int(default.group(1)) <= high


def test_the_low_end_pins_the_lowest_versions_setup_cfg_declares() -> None:
    """tests/compat/lowest.txt pins each of its distributions at setup.cfg's own lower bound."""
    declared = {
        re.split(r"[\[<>=!~ ]", line.strip(), maxsplit=1)[0].lower(): line.strip()
        for line in setup_cfg()["options"]["install_requires"].splitlines()
        if line.strip() and not line.strip().startswith("#")
    }
    pins = [
        line.split("==")
        for line in (REPO / "tests" / "compat" / "lowest.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert {name for name, _ in pins} >= {"apache-airflow", "pyiceberg"}
    for name, version in pins:
        assert re.search(rf">={re.escape(version)}(,|$)", declared[name]), (name, version, declared[name])


def test_test_compat_fails_naming_the_backfill_and_the_rows_where_the_ends_differ(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """make test-compat compares the digests each end's fixed backfills wrote: equal ends pass; a
    differing row or micro-batch count fails, naming the backfill, both ends and the rows; no digest
    fails a whole run only."""
    run = compat_run()
    monkeypatch.setattr(run, "CACHE", tmp_path)
    low, high = run.ENDS["low"], run.ENDS["high"]
    # nothing written: a failure for the whole run, not for one filtered with pytest arguments (-k)
    assert run.compare_digests([low, high]) == [f"py3.10 wrote no digest in {run.digest_dir(low.name)}"]
    assert run.compare_digests([low, high], required=False) == []

    def write(end: object, rows: list[str], batches: dict[str, str]) -> None:
        folder = run.digest_dir(end.name)  # type: ignore[attr-defined]
        folder.mkdir(parents=True, exist_ok=True)
        canonical = "\n".join(rows)
        digest = {"rows": len(rows), "sha256": hashlib.sha256(canonical.encode()).hexdigest(), "micro_batches": batches}
        (folder / "backfill-submit.json").write_text(json.dumps(digest))
        (folder / "backfill-submit.rows").write_text(canonical)

    write(low, ["('a', 1)", "('b', 2)"], {"s0000": "3"})
    write(high, ["('a', 1)", "('b', 2)"], {"s0000": "3"})
    assert run.compare_digests([low, high]) == []
    write(high, ["('a', 1)", "('b', 3)"], {"s0000": "4"})
    problems = run.compare_digests([low, high])
    assert any("backfill-submit: micro_batches" in p and "py3.10" in p and "py3.13" in p for p in problems)
    assert any("1 row(s) only on py3.10 (first [\"('b', 2)\"])" in p for p in problems), problems


def test_test_compat_waits_for_the_file_it_is_given_and_exits_naming_it_after_its_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--wait-for PATH`` (CI: the ends' tests wait for stream 1's `make install`): returns once PATH
    is there, polling; exits naming PATH when it does not come within ``WAIT_SECONDS``."""
    run = compat_run()
    ready = tmp_path / "ci-venv-ready"
    polls: list[float] = []

    def sleep(seconds: float) -> None:  # the file comes during the first poll
        polls.append(seconds)
        ready.touch()

    monkeypatch.setattr(run.time, "sleep", sleep)
    run.wait_for(ready)
    assert polls == [1]
    run.wait_for(ready)  # already there: no poll
    assert polls == [1]
    monkeypatch.setattr(run, "WAIT_SECONDS", -1)
    with pytest.raises(SystemExit, match=re.escape(f"{tmp_path / 'missing'} did not appear within -1 s")):
        run.wait_for(tmp_path / "missing")
