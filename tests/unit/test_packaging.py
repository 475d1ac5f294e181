"""What the wheel ships beside the code (setup.cfg): LICENSE (Apache-2.0), py.typed, the changelog
in the package's long description, the version written once (read from setup.cfg)."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import airflow_provider_kappa

ROOT = Path(__file__).resolve().parents[2]


def setup_cfg() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return cfg


def test_license_changelog_and_py_typed_ship_in_the_wheel() -> None:
    cfg = setup_cfg()
    assert cfg["metadata"]["license"] == "Apache-2.0" and cfg["metadata"]["license_files"] == "LICENSE"
    assert (
        "Apache License" in (ROOT / "LICENSE").read_text()[:200]
        and "Version 2.0" in (ROOT / "LICENSE").read_text()[:300]
    )
    described = [f.strip() for f in cfg["metadata"]["long_description"].removeprefix("file:").split(",")]
    assert described == ["README.md", "CHANGELOG.md"] and all((ROOT / f).is_file() for f in described)
    assert "py.typed" in cfg["options.package_data"]["airflow_provider_kappa"]
    assert (Path(airflow_provider_kappa.__file__).parent / "py.typed").is_file()


def test_the_version_is_written_once() -> None:
    assert setup_cfg()["metadata"]["version"] == "attr: airflow_provider_kappa.__version__"
    written = [
        p
        for p in [
            ROOT / "setup.cfg",
            ROOT / "pyproject.toml",
            *Path(airflow_provider_kappa.__file__).parent.rglob("*.py"),
        ]
        if re.search(r"^\s*(__version__|version)\s*=\s*['\"]\d", p.read_text(), re.M)
    ]
    assert written == [Path(airflow_provider_kappa.__file__)]
