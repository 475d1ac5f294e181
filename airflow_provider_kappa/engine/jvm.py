"""The JVM artifacts fetched at install time, and the Spark conf that puts them on the classpath.

``jvm/fetch.sh`` (run by ``make install``) copies from Maven Central, once:

- ``<jvm dir>/spark-kafka/``: Spark's Kafka connector (``spark-sql-kafka-0-10_2.13`` at the pinned
  Spark release) and what the pyspark wheel's ``jars/`` lacks (``spark-token-provider-kafka-0-10``,
  ``kafka-clients``, ``commons-pool2``);
- ``<jvm dir>/kafka/``: an Apache Kafka broker with its runtime jars (tests and the demo).

Nothing is downloaded while a job or a test runs: :func:`kafka_connector_conf` adds the cached jars as
local files (``spark.jars``) to the conf of a run that reads Kafka (``kappa run`` with a kafka candidate
selected, ``kappa land``), for spark-submit and for a local Spark Connect server alike (``spark.jars`` is
a server key: :class:`~airflow_provider_kappa.engine.connect_server.LocalConnectServer` takes it through its
``conf``). A conf that already brings the connector (``spark.jars.packages`` or ``spark.jars`` naming
``spark-sql-kafka``, e.g. a cluster with its own) is left as it is.

Pure Python: no pyspark import.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from airflow_provider_kappa.exceptions import KappaConfigError

JVM_DIR_ENV = "KAPPA_JVM_DIR"
"""Environment variable naming the folder ``jvm/fetch.sh`` fetched into."""

SPARK_KAFKA = "spark-kafka"
KAFKA_BROKER = "kafka"
CONNECTOR_ARTIFACT = "spark-sql-kafka-0-10"
JARS = "spark.jars"
PACKAGES = "spark.jars.packages"

_FETCH_HINT = "run `make install` in the project's checkout (or its jvm/fetch.sh; Maven and Java 17 needed once)"


def jvm_dirs() -> list[Path]:
    """Where the fetched artifacts may be, in the order they are looked for: ``$KAPPA_JVM_DIR``; the
    ``.cache/jvm`` of the source checkout this package runs from (``make install``'s default); the
    user's cache (``$XDG_CACHE_HOME`` or ``~/.cache``, under ``airflow-provider-kappa/jvm``)."""
    if os.environ.get(JVM_DIR_ENV):
        return [Path(os.environ[JVM_DIR_ENV]).expanduser()]
    checkout = Path(__file__).resolve().parents[2] / ".cache" / "jvm"
    user = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "airflow-provider-kappa" / "jvm"
    return [checkout, user]


def artifact_jars(name: str, dirs: Iterable[Path] | None = None) -> list[Path]:
    """The jars of artifact set ``name`` (``spark-kafka`` or ``kafka``), sorted, from the first folder
    that holds them.

    :param name: the set's folder name (a pom under ``jvm/``).
    :param dirs: folders to look in (default :func:`jvm_dirs`).
    :raises KappaConfigError: no folder holds the set; the message names where it looked and what to run.
    """
    looked = list(dirs if dirs is not None else jvm_dirs())
    for base in looked:
        jars = sorted((base / name).glob("*.jar"))
        if jars:
            return [j.resolve() for j in jars]
    where = ", ".join(str(b / name) for b in looked)
    raise KappaConfigError(f"the JVM artifacts {name!r} are not fetched (looked in {where}): {_FETCH_HINT}")


def brings_connector(conf: Mapping[str, str]) -> bool:
    """Whether ``conf`` already puts Spark's Kafka connector on the classpath (``spark.jars.packages``
    or ``spark.jars`` naming ``spark-sql-kafka``)."""
    return any(CONNECTOR_ARTIFACT in conf.get(key, "") for key in (PACKAGES, JARS))


def kafka_connector_conf(conf: Mapping[str, str], dirs: Iterable[Path] | None = None) -> dict[str, str]:
    """``conf`` with the cached Kafka connector jars appended to ``spark.jars`` (local paths), unless it
    already brings the connector (then unchanged).

    :param conf: a run's Spark conf (not modified).
    :param dirs: folders to look in (default :func:`jvm_dirs`).
    :raises KappaConfigError: the connector is not fetched.
    """
    out = dict(conf)
    if brings_connector(conf):
        return out
    jars = [str(j) for j in artifact_jars(SPARK_KAFKA, dirs)]
    if not any(CONNECTOR_ARTIFACT in Path(j).name for j in jars):
        raise KappaConfigError(f"{jars[0].rsplit('/', 1)[0]}: holds no {CONNECTOR_ARTIFACT} jar: {_FETCH_HINT}")
    existing = [j for j in out.get(JARS, "").split(",") if j.strip()]
    out[JARS] = ",".join(existing + [j for j in jars if j not in existing])
    return out


def broker_classpath(dirs: Iterable[Path] | None = None) -> str:
    """The class path of the Kafka broker (``java -cp``): every jar of the ``kafka`` set.

    :raises KappaConfigError: the broker is not fetched.
    """
    return os.pathsep.join(str(j) for j in artifact_jars(KAFKA_BROKER, dirs))
