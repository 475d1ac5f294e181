"""The demo's folder and its Airflow homes: the workdir made fresh, a private sqlite-backed
Airflow home, the DAG file ``dag.test()`` finds there, and ``airflow db migrate`` run in a child
process while the lake lands."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from airflow_provider_kappa.demo.options import EXAMPLES
from airflow_provider_kappa.exceptions import KappaConfigError, KappaError

MARKER = ".kappa-demo"

DAG_FILE = """\
# Written by kappa demo: one backfill DAG per example job, built from its kappa.yaml.
from airflow_provider_kappa.dag import kappa_backfill_dag

{lines}
"""


def prepare_workdir(workdir: Path) -> Path:
    """Create ``workdir`` fresh: an earlier demo's folder is wiped, any other non-empty folder refused."""
    workdir = workdir.expanduser().resolve()
    if workdir.exists() and any(workdir.iterdir()):
        if not (workdir / MARKER).exists():
            raise KappaConfigError(
                f"--workdir: {str(workdir)!r} is not empty and was not made by kappa demo; choose an empty or new folder"
            )
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / MARKER).write_text("made by kappa demo; wiped by the next run\n")
    return workdir


def airflow_environment(home: Path) -> dict[str, str]:
    """Environment of a private, sqlite-backed Airflow home.

    :param home: the Airflow home (``<workdir>/airflow`` for the migrated DB, and
        ``<workdir>/airflow/<job>`` for each job's story); its ``dags`` folder is created.
    """
    (home / "dags").mkdir(parents=True, exist_ok=True)
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
    }


def write_dag_file(env: dict[str, str], jobs: tuple[str, ...]) -> Path:
    """Write the demo's DAG file into the Airflow home's dags folder (``dag.test()`` runs a DAG
    the DAG processor can find there)."""
    lines = "\n".join(f"dag_{job} = kappa_backfill_dag({str(EXAMPLES / job / 'kappa.yaml')!r})" for job in jobs)
    path = Path(env["AIRFLOW__CORE__DAGS_FOLDER"]) / "kappa_demo_dags.py"
    path.write_text(DAG_FILE.format(lines=lines))
    return path


def start_airflow_db(env: dict[str, str]) -> subprocess.Popen[str]:
    """Apply ``env`` to this process and start creating Airflow's metadata DB
    (``airflow db migrate``) in a child process; :func:`wait_airflow_db` waits for it. The
    demo generates its lake meanwhile.

    :param env: from :func:`airflow_environment`.
    """
    os.environ.update(env)
    airflow = Path(sys.executable).parent / "airflow"
    return subprocess.Popen(
        [str(airflow), "db", "migrate"],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_airflow_db(proc: subprocess.Popen[str], timeout: float = 600) -> None:
    """Wait for :func:`start_airflow_db`'s process; raise if it failed.

    :param proc: the ``airflow db migrate`` process.
    :param timeout: seconds to wait at most.
    """
    try:
        _, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as e:
        proc.kill()
        proc.communicate()
        raise KappaError(f"airflow db migrate did not finish within {timeout:.0f}s") from e
    if proc.returncode != 0:
        raise KappaError(f"airflow db migrate failed (exit {proc.returncode}): {stderr.strip()[-2000:]}")
