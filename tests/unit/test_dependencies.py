"""Honest dependencies: every requirement of setup.cfg is imported by the package, and the Python
versions declared (classifiers, python_requires, mypy, the Makefile) are the one tested."""

from __future__ import annotations

import configparser
import re
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
PACKAGE = ROOT / "airflow_provider_kappa"

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
    cfg.read(ROOT / "setup.cfg")
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


def test_the_python_versions_declared_are_the_one_tested() -> None:
    cfg = setup_cfg()
    tested = f"{sys.version_info.major}.{sys.version_info.minor}"
    classifiers = re.findall(r"Programming Language :: Python :: (\d+\.\d+)", cfg["metadata"]["classifiers"])
    assert classifiers == [tested]
    minor = sys.version_info.minor
    assert cfg["options"]["python_requires"] == f">=3.{minor},<3.{minor + 1}"
    assert cfg["mypy"]["python_version"] == tested
    assert f"PYTHON ?= python{tested}" in (ROOT / "Makefile").read_text()
