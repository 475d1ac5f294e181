"""Shared fixtures: one local SparkSession per test session, a real sqlite SqlCatalog per test.

Tests mirror the package's rooms by tier (each folder marks its tests):

- ``tests/unit/`` (marker ``unit``): no Spark, no Airflow metadata DB, no server; a file-backed
  sqlite catalog is allowed. ``make test-fast`` runs them.
- ``tests/integration/`` (marker ``integration``): real local Spark, ``dag.test()``, spark-submit.
- ``tests/deploy/`` (marker ``deploy``): real deployments started and stopped by the tests
  (Airflow api-server + scheduler, a Spark standalone cluster, headless chromium).

Helpers that several test modules need live in ``tests/lake.py``, ``tests/airflow_env.py`` and
the server helpers in ``tests/servers/``.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# Spark's Python workers must run this interpreter; avoid host-name lookups.
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
# Every JVM the tests start through the `java` launcher (spark-submit and its launcher, the Connect servers,
# the Kafka broker, the REST catalog, the Spark cluster's master, workers and executors) compiles with C1 only:
# on test-sized data a JVM spends its CPU starting, and C2's compiler threads are a large share of it (a small
# spark-submit: 26-31 CPU-s with C2, 17 with C1 only; the integration and deploy tiers 3348 -> 2464 CPU-s:
# docs/testing.md, session 31). The JVM prints "NOTE: Picked up JDK_JAVA_OPTIONS" on its stderr. Benchmarks
# and users keep the JVM's default (tiered C2).
JIT_OPTION = "-XX:TieredStopAtLevel=1"
if JIT_OPTION not in os.environ.get("JDK_JAVA_OPTIONS", ""):
    os.environ["JDK_JAVA_OPTIONS"] = f"{os.environ.get('JDK_JAVA_OPTIONS', '')} {JIT_OPTION}".strip()
# every spark-submit of the session shares one class archive, written by the first and removed at the end
# (never the user's ~/.cache); $KAPPA_TEST_CDS_DIR instead: a folder several sessions share and nobody removes
# (.ci/run's two streams: the second's sessions map the archives the first wrote)
_SHARED_CDS = os.environ.get("KAPPA_TEST_CDS_DIR")
_CDS = _SHARED_CDS or tempfile.mkdtemp(prefix="kappa-test-cds-")
os.environ["KAPPA_CACHE_DIR"] = _CDS
sys.path.insert(0, str(Path(__file__).parent))
# `make test-compat` (tests/compat/run.py) tests an installed wheel: the package must come from that
# venv's site-packages, never from a checkout
if os.environ.get("KAPPA_TEST_INSTALLED_IN"):
    import airflow_provider_kappa

    if not Path(airflow_provider_kappa.__file__).resolve().is_relative_to(os.environ["KAPPA_TEST_INSTALLED_IN"]):
        raise pytest.UsageError(
            f"airflow_provider_kappa is imported from {airflow_provider_kappa.__file__}, not from the wheel "
            f"installed in {os.environ['KAPPA_TEST_INSTALLED_IN']}"
        )
# py4j logs "Closing down clientserver connection" at INFO from a finalizer at interpreter exit, when
# the handler an Airflow test installed writes to a stream pytest has closed: a "--- Logging error ---"
# traceback after the summary. Its INFO lines say nothing a test needs.
logging.getLogger("py4j").setLevel(logging.WARNING)

from servers.connect_server import connect_server  # noqa: E402,F401  (session-scoped Spark Connect server)
from servers.kafka import kafka_broker  # noqa: E402,F401  (session-scoped Kafka broker, started on first use)
from stop_on_sigterm import pytest_runtest_setup, pytest_sessionstart  # noqa: E402,F401  (SIGTERM tears down)

TIERS = ("unit", "integration", "deploy")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test with the tier of its folder; a test outside the tier folders is an error."""
    for item in items:
        parts = Path(str(item.fspath)).relative_to(Path(__file__).parent).parts
        if parts[0] not in TIERS:
            raise pytest.UsageError(f"test {item.nodeid} lies outside tests/unit, tests/integration and tests/deploy")
        item.add_marker(parts[0])


_TIER_SECONDS: dict[str, float] = {}
_MODULE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    tier = next((t for t in TIERS if t in report.keywords), None)
    if tier is not None:
        _TIER_SECONDS[tier] = _TIER_SECONDS.get(tier, 0.0) + report.duration
    module = report.nodeid.split("::", 1)[0]
    _MODULE_SECONDS[module] = _MODULE_SECONDS.get(module, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Time spent per tier and by the slowest modules (setup + call + teardown of their tests), for
    the README's figures and for keeping CI inside its budget."""
    if _TIER_SECONDS:
        parts = ", ".join(f"{t} {_TIER_SECONDS[t]:.0f} s" for t in TIERS if t in _TIER_SECONDS)
        terminalreporter.write_line(f"time per tier: {parts}")
    slowest = sorted(_MODULE_SECONDS.items(), key=lambda kv: -kv[1])[:12]
    if len(_MODULE_SECONDS) > 1:
        terminalreporter.write_line("slowest modules: " + ", ".join(f"{m} {s:.0f} s" for m, s in slowest))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not _SHARED_CDS:
        shutil.rmtree(_CDS, ignore_errors=True)


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One local SparkSession for the whole test run (2 cores on CI). Its Python processes fork from kappa's
    warm daemon, as those of every Spark kappa starts on this machine (engine/warm_python.py), not from Spark's
    own daemon, whose every worker and runner imported pyarrow, pyiceberg and kappa's source and sink again (the
    modules using it: 122-139 busy CPU-s cold, 62-64 warm; docs/testing.md, session 37). Spark's own daemon with
    ``KAPPA_WARM_DAEMON=0``."""
    from pyspark.sql import SparkSession

    from airflow_provider_kappa.engine.warm_python import WarmPython, warm_enabled

    warm = WarmPython() if warm_enabled() else None
    if warm is not None:
        warm.start(dict(os.environ), watch_pid=os.getpid())
    # the JVM (launched with this process's environment) and the SparkContext (PYSPARK_PYTHON, the workers'
    # Python) take the wrapper as the session starts; every other process the tests start keeps this one's
    wrapper = warm.env() if warm is not None else {}
    saved = {key: os.environ.get(key) for key in wrapper}
    os.environ.update(wrapper)
    try:
        session = (
            SparkSession.builder.master("local[2]")
            .appName("kappa-tests")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.sql.streaming.stopTimeout", "30s")
            # a loaded 2-core machine can take long to start a Python worker
            .config("spark.python.authenticate.socketTimeout", "120s")
            .getOrCreate()
        )
    except BaseException:
        if warm is not None:  # no session: its zygote goes now, not at the end of the run
            warm.stop()
        raise
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    yield session
    session.stop()
    if warm is not None:
        warm.stop()


@pytest.fixture()
def lake_dir(tmp_path: Path) -> Path:
    """A fresh folder holding catalog.db and warehouse/."""
    (tmp_path / "warehouse").mkdir()
    return tmp_path


@pytest.fixture()
def catalog_props(lake_dir: Path) -> dict[str, str]:
    """pyiceberg properties of a file-backed sqlite SqlCatalog in ``lake_dir``."""
    return {
        "type": "sql",
        "uri": f"sqlite:///{lake_dir}/catalog.db",
        "warehouse": f"file://{lake_dir}/warehouse",
    }


@pytest.fixture()
def catalog(catalog_props: dict[str, str]) -> object:
    """A real pyiceberg SqlCatalog named ``lake``."""
    from pyiceberg.catalog import load_catalog

    return load_catalog("lake", **catalog_props)


@pytest.fixture()
def no_kubernetes_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    """Airflow as it is without the Kubernetes provider: its ``kube_client`` module does not import,
    and the Spark provider's hook module, which imports it under ``contextlib.suppress``, lacks the
    name. This venv installs no Kubernetes provider, but a machine may."""
    import airflow.providers.apache.spark.hooks.spark_submit as spark_submit_hook

    monkeypatch.setitem(sys.modules, "airflow.providers.cncf.kubernetes.kube_client", None)
    monkeypatch.delattr(spark_submit_hook, "kube_client", raising=False)
