"""A test run stopped by SIGTERM stops the way Ctrl-C stops it: the fixtures' finalizers run.

By default SIGTERM ends the pytest process at once, and every server a fixture started in its own
session (tests/servers: Airflow, PostgreSQL, Kafka, Spark Connect) keeps running, orphaned, with
nobody left to stop it by its process group. Here SIGTERM raises ``KeyboardInterrupt`` in the main
thread instead: pytest ends the session as interrupted and tears down every fixture set up so far,
which stops each server by the process group it started. The handler is put back before each test,
in case a test's code replaced it (test_fencing installs its own, standing in for Airflow's task runner).

tests/conftest.py takes these hooks; a pytest run outside the suite can load them with
``-p stop_on_sigterm`` (tests/ on ``PYTHONPATH``).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

import pytest


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"stopped by signal {signal.Signals(signum).name}: tearing down the fixtures")


def install() -> None:
    """Route SIGTERM to :func:`_interrupt` (only the main thread may set a handler; a worker thread's
    run keeps the default)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)


def pytest_sessionstart(session: pytest.Session) -> None:
    install()


def pytest_runtest_setup(item: pytest.Item) -> None:
    install()
