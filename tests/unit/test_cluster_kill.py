"""Stopping a cluster-mode spark-submit stops its application on the cluster (issue #25): the
stop a task's ``on_kill`` and ``kappa backfill``'s SIGTERM go through (``engine/submit.stop_submit``)
kills the YARN application the way SparkSubmitHook does. Tested at the command level: the
``spark-submit`` and ``yarn`` on PATH are stand-ins that record how they were called (the process
boundary), the hook and the stop are real."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import airflow_env  # noqa: F401  (a private AIRFLOW_HOME before Airflow is imported)
import pytest

from airflow_provider_kappa.compat.spark_provider import cluster_application, submit_process
from airflow_provider_kappa.engine.submit import stop_submit

APP = "application_1700000000000_0042"


def stand_ins(folder: Path, calls: Path) -> None:
    """A ``spark-submit`` that says it submitted APP to YARN and waits like a client in cluster mode,
    and a ``yarn`` that records its arguments."""
    folder.mkdir()
    (folder / "spark-submit").write_text(
        f'#!/bin/sh\necho "INFO Client: Submitted application {APP}"\nexec sleep 300\n'
    )
    (folder / "yarn").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    for name in ("spark-submit", "yarn"):
        (folder / name).chmod(0o755)


@pytest.mark.airflow
@pytest.mark.parametrize("deploy_mode", ["cluster", "client"])
def test_stopping_a_yarn_cluster_submit_kills_its_application(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, deploy_mode: str
) -> None:
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    calls = tmp_path / "yarn-calls"
    stand_ins(tmp_path / "bin", calls)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv(
        "AIRFLOW_CONN_KAPPA_YARN",
        json.dumps({"conn_type": "spark", "host": "yarn", "extra": {"deploy-mode": deploy_mode}}),
    )
    hook = SparkSubmitHook(conn_id="kappa_yarn", name="kappa-test")
    (tmp_path / "job.py").write_text("")
    failed: list[BaseException] = []

    def run() -> None:
        try:
            hook.submit(application=str(tmp_path / "job.py"))
        except BaseException as e:  # killed: the hook raises on the non-zero exit
            failed.append(e)

    runner = threading.Thread(target=run)
    runner.start()
    deadline = time.monotonic() + 20
    while submit_process(hook) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if deploy_mode == "cluster":  # until the hook read the application id the client printed
        while cluster_application(hook) is None and time.monotonic() < deadline:
            time.sleep(0.02)
    else:  # the client printed the same line; give the hook the time to (not) take it
        time.sleep(0.5)
    assert cluster_application(hook) == (APP if deploy_mode == "cluster" else None)
    stop_submit(hook, timeout=5)
    runner.join(timeout=20)
    proc = submit_process(hook)
    assert not runner.is_alive() and proc is not None and proc.poll() is not None
    if deploy_mode == "cluster":
        assert calls.read_text().split() == ["application", "-kill", APP]
    else:  # client mode: the driver was the local process, stopped with it; nothing to kill on the cluster
        assert not calls.exists()
