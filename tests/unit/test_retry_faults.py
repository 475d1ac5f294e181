"""Retries that match the fault: a transient catalog or storage fault (a locked sqlite catalog, a
refused connection, a REST catalog's 5xx) is raised for Airflow to retry; bad config or input
fails the task at once (``AirflowFailException``)."""

from __future__ import annotations

import errno
import sqlite3
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import airflow_env  # noqa: F401  (a private AIRFLOW_HOME before Airflow is imported)
import pytest
from airflow_env import write_job_config
from lake import T0, append_events, create_events_table, create_sessions_table, event

from airflow_provider_kappa.exceptions import (
    KappaCatalogConflictError,
    KappaCatalogUnavailableError,
    KappaConfigError,
    KappaSourceError,
)
from airflow_provider_kappa.faults import is_transient, transient_cause

#: the module's tests use Airflow (its operators and AirflowFailException): run on one xdist
#: worker, and collecting this module imports no Airflow (tests/unit/conftest.py)
pytestmark = pytest.mark.airflow

PARAMS = {
    "start": (T0 + timedelta(hours=1)).isoformat(),
    "end": (T0 + timedelta(hours=3)).isoformat(),
    "slice": "1h",
    "warmup": "30min",
    "tail": "15min",
}


@pytest.fixture()
def fast_lock_props(lake_dir: Path) -> dict[str, str]:
    """The sqlite catalog of ``lake_dir``, waiting 0.2 s (not sqlite's 5 s) for a lock."""
    return {
        "type": "sql",
        "uri": f"sqlite:///{lake_dir}/catalog.db?timeout=0.2",
        "warehouse": f"file://{lake_dir}/warehouse",
    }


@pytest.fixture()
def job(tmp_path: Path, fast_lock_props: dict[str, str]) -> Path:
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog("lake", **fast_lock_props)
    raw = create_events_table(catalog, "raw.playbacks")
    append_events(raw, [event(i, T0 + timedelta(minutes=10 * i)) for i in range(24)])
    create_sessions_table(catalog, "prod.playback_sessions")
    return write_job_config(tmp_path, fast_lock_props)


@pytest.fixture()
def locked(lake_dir: Path) -> Iterator[sqlite3.Connection]:
    """Another writer holding the sqlite catalog: an open exclusive write transaction."""
    other = sqlite3.connect(lake_dir / "catalog.db", isolation_level=None, timeout=0.2)
    other.execute("BEGIN EXCLUSIVE")
    other.execute("UPDATE iceberg_tables SET metadata_location = metadata_location")
    try:
        yield other
    finally:
        other.execute("ROLLBACK")
        other.close()


def snapshot_op(job: Path) -> Any:
    from airflow_provider_kappa.operators.snapshot import KappaSnapshotOperator

    return KappaSnapshotOperator(task_id="snapshot", config_path=str(job))


def run(op: Any, params: dict[str, Any] | None = None) -> Any:
    return op.execute({"params": dict(params or PARAMS)})


def test_a_locked_sqlite_catalog_during_a_step_is_retried_not_failed(job: Path, locked: sqlite3.Connection) -> None:
    from airflow_provider_kappa.compat.airflow import AirflowFailException

    with pytest.raises(Exception) as err:
        run(snapshot_op(job))
    assert not isinstance(err.value, AirflowFailException), err.value  # Airflow retries it
    cause = transient_cause(err.value)
    assert cause is not None and "database is locked" in str(cause), repr(err.value)
    assert isinstance(err.value, KappaCatalogUnavailableError)
    assert "catalog 'lake' cannot be reached for now" in str(err.value) and "retry the step" in str(err.value)


def test_the_same_step_succeeds_once_the_lock_is_gone(job: Path, lake_dir: Path) -> None:
    other = sqlite3.connect(lake_dir / "catalog.db", isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    with pytest.raises(KappaCatalogUnavailableError):
        run(snapshot_op(job))
    other.execute("ROLLBACK")
    other.close()
    out = run(snapshot_op(job))  # the retry
    assert set(out["snapshot_ids"]) == {"backfill-playbacks"}


@pytest.mark.parametrize(
    ("props", "reason"),
    [
        ({"type": "sql"}, "URI missing|URI is required"),  # pyiceberg 0.12 | 0.11
        ({"type": "no-such-catalog-type", "uri": "sqlite:///x.db"}, "cannot be loaded"),
    ],
)
def test_a_bad_catalog_property_stays_permanent(tmp_path: Path, job: Path, props: dict[str, str], reason: str) -> None:
    from airflow_provider_kappa.compat.airflow import AirflowFailException

    (tmp_path / "bad").mkdir()
    bad = write_job_config(tmp_path / "bad", props)
    with pytest.raises(AirflowFailException, match=reason) as err:
        run(snapshot_op(bad))
    assert isinstance(err.value.__cause__, KappaConfigError)
    assert transient_cause(err.value.__cause__) is None


def _third_party(module: str, name: str, message: str = "boom") -> Exception:
    """An exception of a class named like a third-party one (classified by qualified name)."""
    cls = type(name, (Exception,), {"__module__": module, "__qualname__": name})
    return cls(message)  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"),
        TimeoutError("timed out"),
        OSError(errno.EIO, "Input/output error"),
        OSError("AWS Error NETWORK_CONNECTION during GetObject operation"),
        KappaCatalogConflictError("tag: the catalog refused 5 commits"),
        KappaCatalogUnavailableError("catalog 'lake' cannot be reached for now"),
        _third_party("pyiceberg.exceptions", "ServerError", "Internal Server Error"),
        _third_party("pyiceberg.exceptions", "ServiceUnavailableError", "503"),
        _third_party("sqlalchemy.exc", "OperationalError", "(sqlite3.OperationalError) database is locked"),
        _third_party("sqlalchemy.exc", "OperationalError", 'connection to server at "db" failed: Connection refused'),
    ],
    ids=repr,
)
def test_transient_faults(exc: Exception) -> None:
    assert is_transient(exc)


@pytest.mark.parametrize(
    "exc",
    [
        FileNotFoundError(errno.ENOENT, "No such file or directory"),
        PermissionError(errno.EACCES, "Permission denied"),
        KappaConfigError("catalog 'lake' cannot be loaded: NoSuchPropertyException"),
        KappaSourceError("table 'raw.x' does not exist in catalog 'lake'"),
        ValueError("bad value"),
        _third_party("pyiceberg.exceptions", "UnauthorizedError", "401: bad credentials"),
        _third_party("pyiceberg.exceptions", "BadRequestError", "400"),
        _third_party("sqlalchemy.exc", "OperationalError", 'FATAL: password authentication failed for user "kappa"'),
    ],
    ids=repr,
)
def test_permanent_faults(exc: Exception) -> None:
    assert not is_transient(exc) and transient_cause(exc) is None


def test_a_permanent_wrapper_of_a_transient_fault_is_retried() -> None:
    from airflow_provider_kappa.compat.airflow import AirflowFailException
    from airflow_provider_kappa.operators import fail_fast

    def wrapped() -> None:
        try:
            raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")
        except OSError as e:
            raise KappaConfigError("job.checkpoint_root: 's3://b/cp' cannot be written") from e

    with pytest.raises(KappaConfigError):  # raised as it is: Airflow retries it
        with fail_fast("snapshot"):
            wrapped()
    with pytest.raises(AirflowFailException, match="snapshot: KappaConfigError: bad"), fail_fast("snapshot"):
        raise KappaConfigError("bad")


def test_a_sequential_slice_next_in_line_checks_often_and_the_ones_behind_less() -> None:
    from airflow_provider_kappa.operators.slice_run import wait_delay

    assert wait_delay(1, 2.0, 30.0) == 2.0  # the next slice in line starts within seconds
    assert wait_delay(5, 2.0, 30.0) == 10.0
    assert wait_delay(40, 2.0, 30.0) == 30.0  # far behind: the longest wait
    assert wait_delay(0, 2.0, 30.0) == 2.0  # never a zero-delay loop
