"""Spark's own resolution of kappa's JVM packages (``engine/jvm.py``): spark-submit's
``spark.jars.packages`` through Ivy, no Spark started. ``make install`` (``kappa jars``) warmed Spark's
Ivy cache; here every remote repository is a closed port of 127.0.0.1 (Spark's default ``central`` and
``spark-packages`` resolvers through ``DEFAULT_ARTIFACT_REPOSITORY``, ``spark.jars.repositories``) and the
JVM's home is an empty folder (no ``~/.m2`` to fall back on): a warm cache resolves, a cold one cannot."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_kappa.engine import jvm
from airflow_provider_kappa.engine.class_data_sharing import spark_home
from airflow_provider_kappa.engine.connect_server import TOKEN_ENV, LocalConnectServer, free_port
from airflow_provider_kappa.exceptions import KappaConfigError

pytestmark = pytest.mark.integration


def offline(tmp_path: Path, ivy: Path) -> tuple[dict[str, str], dict[str, str]]:
    """``(settings, env)`` of a resolution from ``ivy`` with no repository reachable."""
    nowhere = f"http://127.0.0.1:{free_port()}/"  # nothing listens there: connection refused
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    settings = {jvm.IVY: str(ivy), "spark.jars.repositories": nowhere}
    return settings, {"DEFAULT_ARTIFACT_REPOSITORY": nowhere, "SPARK_SUBMIT_OPTS": f"-Duser.home={home}"}


def warm_ivy() -> Path:
    """Spark's default Ivy folder, the one ``kappa jars`` filled (``ivy.home`` else ``~/.ivy2.5.2``)."""
    return Path.home() / ".ivy2.5.2"


def test_a_warm_cache_resolves_the_connector_and_the_broker_with_no_network(tmp_path: Path) -> None:
    settings, env = offline(tmp_path, warm_ivy())
    release = importlib.metadata.version("pyspark")
    jars = jvm.resolve([jvm.connector_package()], jvm.WHEEL_ARTIFACTS, settings, env)
    assert f"org.apache.spark_spark-sql-kafka-0-10_2.13-{release}.jar" in [j.name for j in jars]
    assert all(j.is_file() and j.parent == warm_ivy() / "jars" for j in jars)
    broker = jvm.resolve(jvm.BROKER_PACKAGES, jvm.BROKER_EXCLUDES, settings, env)
    assert f"org.apache.kafka_kafka_2.13-{jvm.KAFKA_VERSION}.jar" in [j.name for j in broker]


def test_a_cold_cache_with_no_network_fails_naming_the_package_and_the_repository(tmp_path: Path) -> None:
    settings, env = offline(tmp_path, tmp_path / "cold-ivy")
    with pytest.raises(KappaConfigError, match=r"spark-sql-kafka-0-10_2.13:.*could not be resolved") as e:
        jvm.resolve([jvm.connector_package()], jvm.WHEEL_ARTIFACTS, settings, env)
    assert settings["spark.jars.repositories"] in str(e.value) and "kappa jars" in str(e.value)


def test_the_connector_adds_nothing_the_pyspark_wheel_holds() -> None:
    """spark.jars.excludes keeps what the pyspark wheel's jars/ holds off the connector's jars."""
    home = spark_home()
    assert home is not None
    artifact = lambda p: re.sub(r"-\d+(\.\d+)+[\w.\-]*\.jar$", "", p.name.split("_", 1)[-1])  # noqa: E731
    wheel = {re.sub(r"-\d+(\.\d+)+[\w.\-]*\.jar$", "", p.name) for p in (home / "jars").glob("*.jar")}
    fetched = jvm.connector_jars()  # from the warm cache (remembered class path, else Ivy's cache)
    assert sorted(artifact(p) for p in fetched) == [
        "commons-pool2",
        "kafka-clients",
        "spark-sql-kafka-0-10_2.13",
        "spark-token-provider-kafka-0-10_2.13",
    ]
    assert not wheel & {artifact(p) for p in fetched}


#: A Connect client that only analyzes a Kafka stream (the broker is never contacted): the columns of
#: Spark's Kafka source, or "Failed to find data source: kafka" without the connector.
KAFKA_SCHEMA = """
from pyspark.sql import SparkSession
spark = SparkSession.builder.create()
stream = spark.readStream.format("kafka").option("kafka.bootstrap.servers", "127.0.0.1:9").option("subscribe", "t").load()
print("columns", ",".join(stream.columns))
"""


def test_a_local_spark_connect_server_gets_the_connector_from_its_conf(tmp_path: Path) -> None:
    conf = jvm.kafka_connector_conf({"spark.ui.enabled": "false"})
    with LocalConnectServer(None, tmp_path / "server", master="local[1]", conf=conf) as server:
        env = {**os.environ, "SPARK_REMOTE": server.url, TOKEN_ENV: server.token}
        done = subprocess.run(
            [sys.executable, "-c", KAFKA_SCHEMA], env=env, capture_output=True, text=True, timeout=300
        )
        log = server.log_file.read_text()
    assert done.returncode == 0, done.stderr[-2000:]
    assert "columns key,value,topic,partition,offset,timestamp,timestampType" in done.stdout
    assert f"spark-sql-kafka-0-10_2.13;{importlib.metadata.version('pyspark')}" in log  # resolved by Ivy at the start
