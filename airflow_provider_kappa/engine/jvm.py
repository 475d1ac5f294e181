"""The JVM packages kappa runs beside PySpark, resolved by Spark's own ``spark.jars.packages`` (Ivy).

- Spark's Kafka connector, ``org.apache.spark:spark-sql-kafka-0-10_2.13:<version>``, ``<version>`` being
  the installed pyspark's (:func:`spark_version`, read from its package metadata: Spark is not started).
  :func:`kafka_connector_conf` adds it to ``spark.jars.packages`` of a run that reads Kafka (``kappa
  run`` with a kafka candidate selected, ``kappa land``, the demo's live reference), with
  ``spark.jars.excludes`` naming what the pyspark wheel's ``jars/`` already holds (:data:`WHEEL_ARTIFACTS`).
  spark-submit resolves it when the run starts, for a spark-submit run and for a local Spark Connect
  server alike (``spark.jars.packages`` is a server key:
  :class:`~airflow_provider_kappa.engine.connect_server.LocalConnectServer` takes it through its
  ``conf``). A conf that already brings the connector (``spark.jars.packages`` or ``spark.jars``
  naming ``spark-sql-kafka``, e.g. a cluster with its own) is left as it is.
- An Apache Kafka broker (:data:`BROKER_PACKAGES`) for the demo and the tests: its class path is
  resolved the same way (:func:`broker_classpath`), plus the Scala library of the pyspark wheel (Spark's
  resolution leaves ``scala-library`` out: Spark brings its own).

Spark's Ivy keeps what it resolved in its cache (``spark.jars.ivy``, default ``~/.ivy2.5.2``); a package
found there is not fetched again, and a resolution from a warm cache needs no network (shown by
``tests/integration/test_jvm_packages.py`` with every remote repository on a closed port of 127.0.0.1).
:func:`resolve` runs that resolution alone, without starting Spark: spark-submit with
``spark.jars.packages`` and a primary resource that prints the jars Spark put on ``spark.jars``
(:mod:`~airflow_provider_kappa.engine.ivy_probe`). ``kappa jars`` (``make install`` runs it) warms
the cache once; a pip user's first run that needs a package otherwise fetches it from Maven Central then.

The Iceberg REST catalog server of the tests alone still comes from ``jvm/fetch.sh`` (Maven, run by
``make install``) into ``.cache/jvm`` of the checkout: :func:`artifact_jars`.

Pure Python: no pyspark import.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from airflow_provider_kappa.engine.class_data_sharing import spark_home
from airflow_provider_kappa.engine.submit import spark_env, write_properties_file
from airflow_provider_kappa.exceptions import KappaConfigError

JVM_DIR_ENV = "KAPPA_JVM_DIR"
"""Environment variable naming the folder ``jvm/fetch.sh`` fetched into (the tests' REST catalog)."""

CONNECTOR_ARTIFACT = "spark-sql-kafka-0-10"
JARS = "spark.jars"
PACKAGES = "spark.jars.packages"
EXCLUDES = "spark.jars.excludes"
IVY = "spark.jars.ivy"
#: The Spark keys that steer a resolution (and are passed on to :func:`resolve`'s spark-submit).
RESOLUTION_KEYS = (IVY, "spark.jars.repositories", "spark.jars.ivySettings")

KAFKA_VERSION = "3.9.2"
"""The broker's Kafka release: the ``kafka-clients`` of Spark's connector."""
BROKER_PACKAGES = (f"org.apache.kafka:kafka_2.13:{KAFKA_VERSION}", "org.slf4j:slf4j-simple:1.7.36")
"""A one-node broker (``kafka.Kafka``) and its log lines on stderr (Kafka's log4j setup is not used)."""
BROKER_EXCLUDES = ("org.scala-lang:scala-reflect",)
"""Taken from the pyspark wheel with its ``scala-library``, so both are one Scala release."""
WHEEL_ARTIFACTS = (
    "org.apache.hadoop:hadoop-client-runtime",
    "org.apache.hadoop:hadoop-client-api",
    "org.scala-lang.modules:scala-parallel-collections_2.13",
    "org.apache.spark:spark-tags_2.13",
    "com.google.code.findbugs:jsr305",
    "at.yawk.lz4:lz4-java",
    "org.lz4:lz4-java",
    "org.xerial.snappy:snappy-java",
    "org.slf4j:slf4j-api",
)
"""Dependencies of the connector the pyspark wheel's ``jars/`` already holds: ``spark.jars.excludes``
keeps a second copy (60 MB of Hadoop client) off the class path."""

_WARM_HINT = (
    "run `kappa jars` once where Maven Central (or the repositories of spark.jars.repositories) can be "
    "reached; it fills Spark's Ivy cache"
)
PROBE_MARK = "KAPPA_RESOLVED_JARS="
"""The line :mod:`~airflow_provider_kappa.engine.ivy_probe` prints the resolved jars on."""


def spark_version() -> str:
    """The installed pyspark's release (its package metadata; Spark is not started).

    :raises KappaConfigError: pyspark is not installed.
    """
    try:
        return importlib.metadata.version("pyspark")
    except importlib.metadata.PackageNotFoundError as e:
        raise KappaConfigError("pyspark is not installed: pip install 'airflow-provider-kappa'") from e


def connector_package(version: str | None = None) -> str:
    """Maven coordinates of Spark's Kafka connector for Spark ``version`` (default: the installed pyspark's)."""
    return f"org.apache.spark:{CONNECTOR_ARTIFACT}_2.13:{version or spark_version()}"


def brings_connector(conf: Mapping[str, str]) -> bool:
    """Whether ``conf`` already puts Spark's Kafka connector on the classpath (``spark.jars.packages``
    or ``spark.jars`` naming ``spark-sql-kafka``)."""
    return any(CONNECTOR_ARTIFACT in conf.get(key, "") for key in (PACKAGES, JARS))


def _append(conf: dict[str, str], key: str, items: Iterable[str]) -> None:
    existing = [i.strip() for i in conf.get(key, "").split(",") if i.strip()]
    conf[key] = ",".join(existing + [i for i in items if i not in existing])


def kafka_connector_conf(conf: Mapping[str, str], version: str | None = None) -> dict[str, str]:
    """``conf`` with Spark's Kafka connector appended to ``spark.jars.packages`` (and what the pyspark
    wheel holds to ``spark.jars.excludes``), unless it already brings the connector (then unchanged).

    :param conf: a run's Spark conf (not modified).
    :param version: the Spark release (default: the installed pyspark's, :func:`spark_version`).
    """
    out = dict(conf)
    if brings_connector(conf):
        return out
    _append(out, PACKAGES, [connector_package(version)])
    _append(out, EXCLUDES, WHEEL_ARTIFACTS)
    return out


# --------------------------------------------------------------------------- resolution


def probe_command(properties: Path) -> list[str]:
    """The spark-submit that resolves the packages of ``properties`` and runs the probe (no Spark started)."""
    spark_submit = Path(sys.executable).parent / "spark-submit"
    probe = Path(__file__).with_name("ivy_probe.py")
    return [str(spark_submit), "--master", "local[1]", "--properties-file", str(properties), str(probe)]


def resolve(
    packages: Iterable[str],
    excludes: Iterable[str] = (),
    settings: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 900,
) -> list[Path]:
    """Resolve Maven ``packages`` (and their dependencies) with Spark's own resolution (spark-submit's
    ``spark.jars.packages``, Ivy), filling its cache; the jars, in Spark's order.

    :param packages: ``group:artifact:version`` coordinates.
    :param excludes: ``group:artifact`` left out (``spark.jars.excludes``).
    :param settings: ``spark.jars.ivy``, ``spark.jars.repositories``, ``spark.jars.ivySettings`` (others ignored).
    :param env: environment overrides for spark-submit (e.g. ``DEFAULT_ARTIFACT_REPOSITORY``).
    :raises KappaConfigError: the resolution failed (no network and a cold cache, a wrong coordinate, ...):
        the message holds Ivy's first error lines and what to run.
    """
    conf = {k: v for k, v in (settings or {}).items() if k in RESOLUTION_KEYS}
    conf[PACKAGES] = ",".join(packages)
    if excludes:
        conf[EXCLUDES] = ",".join(excludes)
    with tempfile.TemporaryDirectory(prefix="kappa-ivy-") as work:
        properties = write_properties_file(conf, Path(work) / "resolve.properties")
        run_env = {**os.environ, **spark_env(), **(env or {})}
        try:
            done = subprocess.run(
                probe_command(properties), capture_output=True, text=True, env=run_env, timeout=timeout, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise KappaConfigError(
                f"{PACKAGES}={conf[PACKAGES]}: spark-submit did not resolve ({e}): {_WARM_HINT}"
            ) from e
    found = [line[len(PROBE_MARK) :] for line in done.stdout.splitlines() if line.startswith(PROBE_MARK)]
    if done.returncode != 0 or not found:
        lines = [ln.strip() for ln in done.stderr.splitlines() if ln.strip()]
        errors = [
            ln for ln in lines if "unresolved" in ln.lower() or "error" in ln.lower() or "exception" in ln.lower()
        ]
        said = "; ".join((errors or lines[-3:])[:3]) or f"exit {done.returncode}"
        raise KappaConfigError(f"{PACKAGES}={conf[PACKAGES]}: could not be resolved ({said}): {_WARM_HINT}")
    return [Path(j.removeprefix("file:")) for j in found[0].split(",") if j]


def classpath_cache() -> Path:
    """Where resolved class paths are remembered (``$XDG_CACHE_HOME`` or ``~/.cache``, under
    ``airflow-provider-kappa``): a second call needs no spark-submit."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "airflow-provider-kappa"


def resolve_cached(
    packages: Iterable[str],
    excludes: Iterable[str] = (),
    settings: Mapping[str, str] | None = None,
    refresh: bool = False,
) -> list[Path]:
    """:func:`resolve`, remembered in :func:`classpath_cache` while every jar it named still exists
    (``refresh``: resolved again all the same)."""
    packages, excludes = list(packages), list(excludes)
    steer = {k: v for k, v in (settings or {}).items() if k in RESOLUTION_KEYS}
    key = hashlib.sha256(repr((packages, excludes, sorted(steer.items()))).encode()).hexdigest()[:16]
    remembered = classpath_cache() / f"classpath-{key}.txt"
    if remembered.is_file() and not refresh:
        jars = [Path(line) for line in remembered.read_text().splitlines() if line]
        if jars and all(j.is_file() for j in jars):
            return jars
    jars = resolve(packages, excludes, steer)
    remembered.parent.mkdir(parents=True, exist_ok=True)
    tmp = remembered.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text("".join(f"{j}\n" for j in jars))
    tmp.replace(remembered)
    return jars


def connector_jars(settings: Mapping[str, str] | None = None) -> list[Path]:
    """The jars of Spark's Kafka connector for the installed pyspark, resolved (and cached) now."""
    return resolve_cached([connector_package()], WHEEL_ARTIFACTS, settings)


def wheel_scala_jars() -> list[Path]:
    """``scala-library`` and ``scala-reflect`` of the pyspark wheel (``$SPARK_HOME/jars``).

    :raises KappaConfigError: pyspark's jars are not found.
    """
    home = spark_home()
    jars = (
        sorted((home / "jars").glob("scala-library-*.jar")) + sorted((home / "jars").glob("scala-reflect-*.jar"))
        if home
        else []
    )
    if len(jars) != 2:
        raise KappaConfigError(
            f"no scala-library and scala-reflect jars in {home and home / 'jars'}: reinstall pyspark"
        )
    return jars


def broker_classpath(settings: Mapping[str, str] | None = None) -> str:
    """The class path of the Kafka broker (``java -cp``): the pyspark wheel's Scala, then
    :data:`BROKER_PACKAGES` resolved through Spark's Ivy (cached).

    :raises KappaConfigError: the broker's packages cannot be resolved.
    """
    jars = wheel_scala_jars() + resolve_cached(BROKER_PACKAGES, BROKER_EXCLUDES, settings)
    return os.pathsep.join(str(j) for j in jars)


def warm(settings: Mapping[str, str] | None = None) -> dict[str, list[Path]]:
    """Resolve every package kappa uses into Spark's Ivy cache (``kappa jars``; ``make install``):
    ``{what: jars}``.

    :raises KappaConfigError: a resolution failed.
    """
    return {
        connector_package(): resolve_cached([connector_package()], WHEEL_ARTIFACTS, settings, refresh=True),
        "Kafka broker " + KAFKA_VERSION: wheel_scala_jars()
        + resolve_cached(BROKER_PACKAGES, BROKER_EXCLUDES, settings, refresh=True),
    }


# --------------------------------------------------------------------------- jvm/fetch.sh (tests)


def jvm_dirs() -> list[Path]:
    """Where ``jvm/fetch.sh``'s artifacts may be, in the order they are looked for: ``$KAPPA_JVM_DIR``;
    the ``.cache/jvm`` of the source checkout this package runs from (``make install``'s default); the
    user's cache (``$XDG_CACHE_HOME`` or ``~/.cache``, under ``airflow-provider-kappa/jvm``)."""
    if os.environ.get(JVM_DIR_ENV):
        return [Path(os.environ[JVM_DIR_ENV]).expanduser()]
    checkout = Path(__file__).resolve().parents[2] / ".cache" / "jvm"
    return [checkout, classpath_cache() / "jvm"]


def artifact_jars(name: str, dirs: Iterable[Path] | None = None) -> list[Path]:
    """The jars of ``jvm/fetch.sh``'s artifact set ``name`` (``rest-catalog``), sorted, from the first
    folder that holds them.

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
    raise KappaConfigError(
        f"the JVM artifacts {name!r} are not fetched (looked in {where}): run `make install` in the "
        "project's checkout (or its jvm/fetch.sh; Maven and Java 17 needed once)"
    )
