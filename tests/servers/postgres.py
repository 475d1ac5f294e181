"""A private PostgreSQL cluster for the tests (Debian's ``postgresql-15`` binaries): ``initdb`` in a temporary
folder, ``postgres`` listening on a free port of 127.0.0.1 (its unix socket in that folder too), started
by process id and stopped by it (a fast shutdown). PostgreSQL refuses to run as root: a root test run
starts it as the ``postgres`` system user (``setpriv``, which execs, so the pid is the postmaster's).

A pyiceberg SqlCatalog on it needs the ``postgres`` extra (``pyiceberg[sql-postgres]``: psycopg2).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from servers import DeploymentError, ServerProcess, free_port
from servers.tmp_server import ready_or_stopped, server_in_tmp

#: Where Debian installs the server binaries (``postgresql-15``); ``$KAPPA_PG_BIN`` overrides it.
PG_BIN = Path(os.environ.get("KAPPA_PG_BIN", "/usr/lib/postgresql/15/bin"))
USER = "kappa"


def _run_as() -> list[str]:
    """The prefix running a command as an unprivileged user when we are root (``postgres``)."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam("postgres")
    except KeyError as e:
        raise DeploymentError(
            "running as root and there is no 'postgres' user to run PostgreSQL as: apt-get install -y postgresql"
        ) from e
    return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"]


@dataclass
class PostgresServer:
    """A running cluster; the superuser is ``kappa`` (trust authentication, loopback only).

    :param process: the postmaster (leads its own process group).
    :param port: its TCP port on 127.0.0.1.
    :param work: its folder (``data/``, the socket, ``server.log``).
    """

    process: ServerProcess
    port: int
    work: Path

    @property
    def pid(self) -> int:
        """The postmaster's process id."""
        return self.process.pid

    def url(self, database: str = "postgres") -> str:
        """A SQLAlchemy URL of ``database`` (what pyiceberg's SqlCatalog ``uri`` takes)."""
        return f"postgresql+psycopg2://{USER}@127.0.0.1:{self.port}/{database}"

    def connect(self, database: str = "postgres") -> Any:
        """A psycopg2 connection (autocommit) to ``database``."""
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user=USER, dbname=database, connect_timeout=5)
        conn.autocommit = True
        return conn

    def create_database(self, name: str) -> str:
        """Create an empty database ``name``; return its SQLAlchemy URL."""
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(f'CREATE DATABASE "{name}"')
        finally:
            conn.close()
        return self.url(name)

    def stop(self, grace: float = 20.0) -> None:
        """Fast shutdown (SIGINT: clients are disconnected) by the postmaster's pid, then the process
        group's SIGTERM/SIGKILL if it is still there after ``grace`` seconds."""
        try:
            os.kill(self.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + grace
        while self.process.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.process.stop()


def start_postgres(work: Path, timeout: float = 60.0) -> PostgresServer:
    """``initdb`` a cluster in ``work/data`` and start it on a free port of 127.0.0.1.

    :param work: a fresh folder.
    :param timeout: seconds allowed until it accepts connections.
    :raises DeploymentError: the binaries are missing, ``initdb`` failed, or the server died or did
        not answer in time (with its log tail).
    """
    if not (PG_BIN / "postgres").exists():
        raise DeploymentError(
            f"PostgreSQL is not installed in {PG_BIN}: apt-get install -y postgresql-15 (or set KAPPA_PG_BIN)"
        )
    prefix = _run_as()
    if prefix:
        shutil.chown(work, "postgres", "postgres")
    data = work / "data"
    init = subprocess.run(
        [
            *prefix,
            str(PG_BIN / "initdb"),
            "-D",
            str(data),
            "-U",
            USER,
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
            "--no-instructions",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=work,
    )
    if init.returncode != 0:
        raise DeploymentError(
            f"initdb {data} failed ({init.returncode}):\n{init.stdout[-2000:]}\n{init.stderr[-2000:]}"
        )
    port = free_port()
    argv = [
        *prefix,
        str(PG_BIN / "postgres"),
        "-D",
        str(data),
        "-p",
        str(port),
        "-k",
        str(work),
        "-c",
        "listen_addresses=127.0.0.1",
        "-c",
        "fsync=off",
        "-c",
        "synchronous_commit=off",
        "-c",
        "full_page_writes=off",
        "-c",
        "max_connections=200",
    ]
    log = work / "server.log"
    log.touch()
    if prefix:
        shutil.chown(log, "postgres", "postgres")
    process = ServerProcess("postgres", argv, log, dict(os.environ), cwd=work)
    server = PostgresServer(process, port, work)
    return ready_or_stopped(
        server,
        lambda: server.connect().close() is None,
        what=f"PostgreSQL on 127.0.0.1:{port}",
        process=process,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL cluster shared by the tests of one module."""
    with server_in_tmp(
        "kappa-test-pg-", start_postgres, lambda s: f"PostgreSQL 127.0.0.1:{s.port} (pid {s.pid})"
    ) as server:
        yield server
