"""Importing the package, its CLI and parsing dags/ loads neither pyspark, pyiceberg, pyarrow nor
numpy, and no demo module (the demo is the ``[demo]`` extra: Airflow workers never need it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]

PROBE = r"""
import runpy, sys, pathlib
import airflow_provider_kappa, airflow_provider_kappa.job.config, airflow_provider_kappa.engine.launch
import airflow_provider_kappa.spark, airflow_provider_kappa.spark.settings, airflow_provider_kappa.cli
airflow_provider_kappa.cli.build_parser()
info = airflow_provider_kappa.get_provider_info()
assert info["package-name"] == "airflow-provider-kappa", info
dag_files = sorted(pathlib.Path(sys.argv[1]).glob("*.py"))
for f in dag_files:
    runpy.run_path(str(f))
heavy = sorted(
    m for m in sys.modules
    if m.split(".")[0] in ("pyspark", "pyiceberg", "pyarrow", "numpy") or m.startswith("airflow_provider_kappa.demo")
)
print("DAGS", len(dag_files))
print("HEAVY", heavy, flush=True)
# then, in the same fresh process (its Airflow import is most of either check's time), what the
# `airflow` console script runs: `airflow providers list`
from airflow.__main__ import main
print("PROVIDERS LIST", flush=True)
sys.argv = ["airflow", "providers", "list"]
main()
"""


@pytest.fixture(scope="module")
def fresh_process(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """One fresh interpreter: the parse-time import probe, then ``airflow providers list`` (Airflow's
    home in a temporary folder)."""
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path_factory.mktemp("airflow_home"))}
    return subprocess.run(
        [sys.executable, "-c", PROBE, str(ROOT / "dags")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env=env,
    )


@pytest.mark.heavy
def test_no_heavy_imports_at_parse_time(fresh_process: subprocess.CompletedProcess[str]) -> None:
    probe = fresh_process.stdout.partition("PROVIDERS LIST")[0]
    assert "HEAVY" in probe, fresh_process.stderr
    assert "HEAVY []" in probe, probe


@pytest.mark.heavy
def test_provider_registered(fresh_process: subprocess.CompletedProcess[str]) -> None:
    assert fresh_process.returncode == 0, fresh_process.stderr
    assert "airflow-provider-kappa" in fresh_process.stdout.partition("PROVIDERS LIST")[2]


@pytest.mark.heavy
def test_kappa_version_prints_the_one_version() -> None:
    """``kappa --version`` prints the package's one version (setup.cfg reads the same attribute)."""
    import airflow_provider_kappa

    kappa = Path(sys.executable).parent / "kappa"
    out = subprocess.run([str(kappa), "--version"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"kappa {airflow_provider_kappa.__version__}"
    assert "version = attr: airflow_provider_kappa.__version__" in (ROOT / "setup.cfg").read_text()
