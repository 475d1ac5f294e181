"""A private Airflow for tests: AIRFLOW_HOME in a temporary folder, a sqlite metadata DB created
once per test session (only by the tests that need one), the repo's dags/ as the DAG folder.

Import this module before anything imports Airflow (it sets the environment at import).
Also: a job config writer for backfill tests.
"""

from __future__ import annotations

import os
import runpy
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from paths import EXAMPLES, REPO

#: A secret planted in catalog properties: it must appear in no log, XCom or command line.
PLANTED_SECRET = "PLANTED-s3cr3t-7f1d"

if "airflow" not in sys.modules:
    _home = Path(tempfile.mkdtemp(prefix="kappa-airflow-home-"))
    os.environ["AIRFLOW_HOME"] = str(_home)
    os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{_home}/airflow.db"
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO / "dags")
    os.environ["AIRFLOW__CORE__UNIT_TEST_MODE"] = "False"
    os.environ["AIRFLOW__LOGGING__LOGGING_LEVEL"] = "INFO"


@pytest.fixture(scope="session")
def airflow_db() -> Iterator[None]:
    """Create Airflow's metadata DB (sqlite) once per session."""
    from airflow.utils.db import initdb

    initdb()
    yield


def write_job_config(
    folder: Path,
    catalog_props: Mapping[str, str],
    *,
    example: str = "playback_sessions",
    extra_catalog_props: Mapping[str, str] | None = None,
    backfill: Mapping[str, Any] | None = None,
    engine: str = "connect",
    connect_url: str | None = None,
) -> Path:
    """Write a kappa.yaml of an example job whose lake is the test's catalog.

    :param folder: where to write it (checkpoints go to ``folder/checkpoints``).
    :param catalog_props: the ``catalog_props`` fixture (catalog ``lake``).
    :param example: ``playback_sessions`` or ``rmi``.
    :param extra_catalog_props: more catalog properties (e.g. a planted secret).
    :param backfill: the ``backfill:`` section (default: the example's).
    :param engine: ``job.engine``: ``connect`` (the product's default, one local Spark Connect server
        per backfill, started by ``kappa backfill`` or the DAG), or ``submit`` (a spark-submit per
        slice) for the tests whose subject is spark-submit itself (its driver, command or process).
    :param connect_url: ``job.connect.url`` (absent: ``kappa backfill`` starts a local server).
    """
    raw = yaml.safe_load((EXAMPLES / example / "kappa.yaml").read_text())
    raw["job"]["application"] = str(EXAMPLES / example / f"{example}.py")
    raw["job"]["checkpoint_root"] = str(folder / "checkpoints")
    raw["job"]["master"] = "local[2]"
    raw["job"]["spark_conf"] = {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"}
    raw["job"]["engine"] = engine
    if connect_url is not None:
        raw["job"]["connect"] = {"url": connect_url}
    raw["catalogs"] = {"lake": {**catalog_props, **(extra_catalog_props or {})}}
    if backfill is not None:
        raw["backfill"] = dict(backfill)
    path = folder / "kappa.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def load_dag_file(dag_file: Path, config: Path | None = None) -> Any:
    """The ``dag`` of a DAG file of the repo's dags/; with ``config``, the same DAG (the file's own
    arguments: id, schedule, verify, ...) built from that kappa.yaml instead of the packaged example's,
    e.g. one of :func:`write_job_config` on the tests' shared Connect server.

    :raises AssertionError: the file has no single ``CONFIG = ...`` line to swap.
    """
    if config is None:
        return runpy.run_path(str(dag_file))["dag"]
    source = dag_file.read_text()
    lines = [line for line in source.splitlines() if line.startswith("CONFIG = ")]
    assert len(lines) == 1, f"{dag_file}: expected one 'CONFIG = ...' line, found {lines}"
    code = compile(source.replace(lines[0], f"CONFIG = Path({str(config)!r})"), str(dag_file), "exec")
    scope: dict[str, Any] = {"__name__": "kappa_test_dag", "__file__": str(dag_file)}
    exec(code, scope)  # noqa: S102  (a repo DAG file, as runpy would run it)
    return scope["dag"]


def patch_spark_submit(monkeypatch: pytest.MonkeyPatch, stand_in: Any) -> None:
    """Replace ``engine.submit.submit`` (every spark-submit kappa starts) with ``stand_in`` for one test.

    ``kappa land``, ``kappa run`` and the demo's live reference bind ``submit`` by name when first
    imported: imported for the first time under the patch (the first import in the process, as when a
    test ordering or a pytest-xdist worker runs this test before any landing), they would keep the stand-in
    for the rest of the session and fail every later landing or live run. So they are imported first.
    """
    import airflow_provider_kappa.cli.land  # noqa: F401
    import airflow_provider_kappa.cli.run  # noqa: F401
    import airflow_provider_kappa.demo.live_reference  # noqa: F401

    monkeypatch.setattr("airflow_provider_kappa.engine.submit.submit", stand_in)
