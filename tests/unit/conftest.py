"""The fast tier: a test here that asks for Spark or an Airflow metadata DB is an error.

Its ``tmp_path`` folders (the sqlite catalogs and warehouses of ``lake_dir``) live in RAM when the
machine has a RAM-backed folder (``/dev/shm``, or ``$KAPPA_TEST_RAM_DIR``) with 1 GiB free: every
pyiceberg commit on a file-backed sqlite catalog is an fsync, and on a disk a fast-tier run spends
a fifth of its time in them. Nothing here tests durability; the sqlite files, their locks and the
Parquet files behave the same on tmpfs. The folders go at the end of a session without failures
(kept for a look otherwise); set ``KAPPA_TEST_RAM_DIR=`` (empty) for pytest's own ``tmp_path``.

Once the tests are collected, the objects alive then (the modules of Airflow, pyiceberg, pyarrow and
SQLAlchemy, which every worker loads anyway) are moved out of the garbage collector's sight
(``gc.freeze``): they live to the end of the process, yet each full collection walked them all again;
the youngest generation is collected less often. The collector took 6-8% of a fast-tier run's
time, a fifth less after this. Objects the tests create are collected as before.

Tests marked ``heavy`` (several seconds each: a fresh interpreter, a large lake, a first import of
pyspark) run first. pytest-xdist hands each worker runs of consecutive tests and keeps the last ones
queued on whichever worker asks first; a heavy test among the last leaves the other worker idle
while it runs. Run first, the light tests that follow even the workers out.

Tests marked ``airflow`` (the few that import Airflow in-process: operators, hooks, Airflow's own
exceptions) come next, and no test module imports Airflow when it is collected. Importing Airflow
costs ~2.7 s of CPU per process; with ``--dist worksteal`` the first worker is handed the front of
the list (the heavy and the Airflow tests) and the others steal from the back of its queue, so
Airflow is imported by one worker instead of by every worker at collection.
"""

from __future__ import annotations

import gc
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

RAM_DIR = os.environ.get("KAPPA_TEST_RAM_DIR", "/dev/shm")
RAM_FREE_BYTES = 1 << 30


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "heavy: a fast-tier test of several seconds; run first (tests/unit/conftest.py)")
    config.addinivalue_line(
        "markers", "airflow: a fast-tier test that imports Airflow; run after the heavy ones (tests/unit/conftest.py)"
    )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The ``heavy`` tests first, then the ``airflow`` ones, each group keeping its order (see the
    module docstring)."""
    items.sort(key=lambda item: (item.get_closest_marker("heavy") is None, item.get_closest_marker("airflow") is None))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what is alive after collection, the heavy libraries the tests use imported first."""
    import pyarrow.parquet  # noqa: F401
    import pyiceberg.catalog.sql  # noqa: F401
    import pyiceberg.table  # noqa: F401

    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)  # fewer young collections: each test makes many short-lived objects


@pytest.fixture(scope="session")
def spark() -> None:
    raise pytest.UsageError("tests/unit is the fast tier: no Spark here (move the test to tests/integration)")


@pytest.fixture(scope="session")
def airflow_db() -> None:
    raise pytest.UsageError("tests/unit is the fast tier: no Airflow metadata DB (move the test to tests/integration)")


def _ram_dir() -> Path | None:
    """The RAM-backed folder to use, or None (not set, missing, not writable, or short of room)."""
    if not RAM_DIR:
        return None
    ram = Path(RAM_DIR)
    try:
        usable = ram.is_dir() and os.access(ram, os.W_OK) and shutil.disk_usage(ram).free >= RAM_FREE_BYTES
    except OSError:
        return None
    return ram if usable else None


@pytest.fixture(scope="session")
def _ram_tmp_root(request: pytest.FixtureRequest) -> Iterator[Path | None]:
    """This session's folder in RAM (one per xdist worker), or None when there is no usable one."""
    ram = _ram_dir()
    if ram is None:
        yield None
        return
    root = Path(tempfile.mkdtemp(prefix="kappa-unit-", dir=ram))
    yield root
    if request.session.testsfailed == 0:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture()
def tmp_path(
    request: pytest.FixtureRequest, _ram_tmp_root: Path | None, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A fresh empty folder per test, in RAM when possible (see the module docstring)."""
    return _fresh_dir(request.node.name, _ram_tmp_root, tmp_path_factory)


@pytest.fixture(scope="module")
def module_lake_dir(
    request: pytest.FixtureRequest, _ram_tmp_root: Path | None, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A fresh folder with ``warehouse/`` for one lake that the tests of a module share, in RAM when
    possible: only for a lake its tests read and never change (the module's fixture checks that)."""
    folder = _fresh_dir(request.node.name, _ram_tmp_root, tmp_path_factory)
    (folder / "warehouse").mkdir()
    return folder


def _fresh_dir(name: str, ram_root: Path | None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    name = re.sub(r"\W", "_", name)[:30]
    if ram_root is None:
        return tmp_path_factory.mktemp(name, numbered=True)
    return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=ram_root))
