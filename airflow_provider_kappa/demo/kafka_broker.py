"""A one-node Apache Kafka broker in KRaft mode on 127.0.0.1, for the tests and the demo.

Runs from the jars Spark's Ivy resolved (:func:`~airflow_provider_kappa.engine.jvm.broker_classpath`, cached):
the storage is formatted with ``kafka.tools.StorageTool``, then ``kafka.Kafka`` runs as broker and
controller in one JVM, on two free ports of 127.0.0.1, in its own process group, and is stopped
by its process id (SIGTERM, a clean shutdown; SIGKILL after a timeout).
Use it as a context manager, or :meth:`KafkaBroker.start` / :meth:`KafkaBroker.stop`.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path
from types import TracebackType

from airflow_provider_kappa.engine.connect_server import free_port, log_tail
from airflow_provider_kappa.engine.jvm import broker_classpath
from airflow_provider_kappa.exceptions import KappaEngineError

STARTED = "Kafka Server started"


def _java() -> str:
    java = Path(os.environ["JAVA_HOME"]) / "bin" / "java" if os.environ.get("JAVA_HOME") else None
    found = str(java) if java and java.exists() else shutil.which("java")
    if not found:
        raise KappaEngineError("java is not on PATH: install Java 17 ('apt-get install -y openjdk-17-jre-headless')")
    return found


def cluster_id() -> str:
    """A random KRaft cluster id: a UUID in URL-safe base64, never starting with ``-`` (the storage
    tool's argument parser would read it as an option: 1 id in 64; Kafka's ``Uuid.randomUuid`` draws
    again for the same reason)."""
    while True:
        found = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not found.startswith("-"):
            return found


class KafkaBroker:
    """One Kafka node (broker + controller) on 127.0.0.1.

    :param work: a folder for its properties, data and log (``broker.log``).
    :param start_timeout: seconds to wait for it to serve.
    :param partitions: ``num.partitions``, the default partition count of a new topic.
    """

    def __init__(self, work: str | Path, start_timeout: float = 120.0, partitions: int = 1) -> None:
        self.work = Path(work)
        self.start_timeout = start_timeout
        self.partitions = partitions
        self.port = 0
        self.controller_port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.seconds = 0.0
        self.cluster_id = cluster_id()

    @property
    def bootstrap_servers(self) -> str:
        """``127.0.0.1:<port>``, what clients and Spark's Kafka source connect to."""
        return f"127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        """The broker's stdout and stderr."""
        return self.work / "broker.log"

    @property
    def pid(self) -> int | None:
        """The broker's process id (it leads its process group)."""
        return self.proc.pid if self.proc else None

    def properties(self) -> Path:
        """Write ``server.properties`` for the chosen ports (a single-node KRaft quorum)."""
        data = self.work / "data"
        lines = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(data),
            "num.partitions": str(self.partitions),
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "log.retention.hours": "-1",
            # how often the active controller appends a no-op record to the metadata log (Kafka's default:
            # 500 ms); at 10 s an idle broker took 1.5 CPU-s a minute against 2.4-2.6 (docs/testing.md)
            "metadata.max.idle.interval.ms": "10000",
        }
        path = self.work / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in lines.items()))
        return path

    def _java_command(self, main: str, *args: str) -> list[str]:
        return [
            _java(),
            "-Xms64m",
            "-Xmx512m",
            "-XX:+UseSerialGC",
            "-Djava.awt.headless=true",
            "-cp",
            broker_classpath(),
            main,
            *args,
        ]

    def start(self) -> KafkaBroker:
        """Format the storage (first start only), start the node and wait until it serves.

        A broker stopped with :meth:`stop` may be started again: the same ports and data.

        :raises KappaEngineError: it exits or does not serve within ``start_timeout``; the message
            holds the tail of its log.
        """
        self.work.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        if not self.port:
            self.port = free_port()
            self.controller_port = free_port()
            while self.controller_port == self.port:  # the OS may hand the just-closed port out again
                self.controller_port = free_port()
        props = self.properties()
        if not (self.work / "data" / "meta.properties").exists():
            fmt = subprocess.run(
                self._java_command(
                    "kafka.tools.StorageTool", "format", "-t", self.cluster_id, "-c", str(props), "--ignore-formatted"
                ),
                capture_output=True,
                text=True,
                stdin=subprocess.DEVNULL,
            )
            if fmt.returncode != 0:
                raise KappaEngineError(f"formatting the Kafka storage in {self.work} failed: {fmt.stdout}{fmt.stderr}")
        with self.log_file.open("ab") as out:
            self.proc = subprocess.Popen(
                self._java_command("kafka.Kafka", str(props)),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        offset = self.log_file.stat().st_size if self.log_file.exists() else 0
        while not self._started(offset):
            if self.proc.poll() is not None or time.monotonic() - began > self.start_timeout:
                code = self.proc.poll()
                self.stop()
                why = (
                    f"exited with code {code}"
                    if code is not None
                    else f"did not start within {self.start_timeout:.0f}s"
                )
                raise KappaEngineError(
                    f"Kafka broker on {self.bootstrap_servers} {why}; log {self.log_file}:\n{log_tail(self.log_file)}"
                )
            time.sleep(0.2)
        self.seconds = time.monotonic() - began
        return self

    def _started(self, offset: int) -> bool:
        try:
            with self.log_file.open("rb") as fh:
                fh.seek(max(0, offset - 4096))
                return STARTED.encode() in fh.read()[-1_000_000:] and self._port_open()
        except OSError:
            return False

    def _port_open(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the broker's process group: SIGTERM (a controlled shutdown), SIGKILL after ``timeout``."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
