"""Iceberg's own Spark connector in the job's Spark, where Iceberg has a build for the running Spark.

A job that reads an Iceberg table in Spark (a stream-static lookup: ``spark.table("lake.dim.shows")``)
declares the catalog the way Spark users do, in ``job.spark_conf``: ``spark.sql.catalog.<name>:
org.apache.iceberg.spark.SparkCatalog`` and its ``spark.sql.catalog.<name>.*`` keys (``catalogs: {<name>:
{spark_catalog: <name>}}`` makes the same catalog kappa's, written once: job/spark_catalogs.py).

Such a catalog needs Iceberg's Spark runtime on the class path, and that runtime is built per Spark minor
release. :func:`iceberg_spark_conf` adds it automatically (a catalog class of Iceberg's without its runtime
cannot work, so there is nothing to opt into): ``org.apache.iceberg:iceberg-spark-runtime-<minor>_2.13``
for the installed pyspark's minor release (:data:`BUILDS`), plus the JDBC driver a ``jdbc`` catalog's
``uri`` needs (:data:`JDBC_DRIVERS`), appended to ``spark.jars.packages``. A conf that already brings them
(``spark.jars.packages`` or ``spark.jars`` naming the artifact: a cluster's own Iceberg) is left as it is.
On a Spark with no Iceberg build (4.2 today) it refuses, naming the Spark release and the builds there are.

Applied where the job's Spark starts: a spark-submit run's conf
(:func:`~airflow_provider_kappa.engine.launch.common_conf`) and kappa's own Spark Connect server
(:class:`~airflow_provider_kappa.engine.connect_server.LocalConnectServer`); a ``job.connect`` server of
your own must have the runtime already. ``kappa jars`` warms the runtime of the installed Spark
(:func:`warm_packages`). Pure Python: no pyspark import.
"""

from __future__ import annotations

from collections.abc import Mapping

from airflow_provider_kappa.engine.jvm import resolve_cached, spark_version
from airflow_provider_kappa.exceptions import KappaConfigError
from airflow_provider_kappa.job.config import CONNECT, SUBMIT, JobConfig

CATALOG_PREFIX = "spark.sql.catalog."
#: ``spark.sql.catalog.<name>`` values that are Iceberg's Spark catalogs (SparkCatalog, SparkSessionCatalog).
ICEBERG_CLASS_PREFIX = "org.apache.iceberg.spark."
RUNTIME_ARTIFACT = "iceberg-spark-runtime"
#: Spark minor release -> the Iceberg releases Maven Central has an ``iceberg-spark-runtime-<minor>_2.13``
#: of (checked 2026-11), oldest first; kappa uses the newest.
BUILDS: dict[str, tuple[str, ...]] = {"4.0": ("1.10.1", "1.11.0"), "4.1": ("1.11.0", "1.12.0")}
#: A ``jdbc`` catalog's ``uri`` prefix -> the JDBC driver it needs (Iceberg's runtime brings none).
JDBC_DRIVERS = {
    "jdbc:sqlite:": "org.xerial:sqlite-jdbc:3.51.1.0",
    "jdbc:postgresql:": "org.postgresql:postgresql:42.7.8",
}
PACKAGES = "spark.jars.packages"
JARS = "spark.jars"


def spark_minor(version: str) -> str:
    """``4.1`` of ``4.1.3`` (``4.2.0.dev1`` too)."""
    return ".".join(version.split(".")[:2])


def runtime_package(version: str, where: str = "job.spark_conf") -> str:
    """Maven coordinates of Iceberg's Spark runtime for Spark ``version`` (the newest Iceberg built for it).

    :param version: the Spark release (``4.0.4``).
    :param where: what asks for it, for the message.
    :raises KappaConfigError: Iceberg has no build for that Spark; the message names the Spark release and
        the builds there are.
    """
    minor = spark_minor(version)
    if minor not in BUILDS:
        there = "; ".join(f"Spark {m}: Iceberg {', '.join(v)}" for m, v in BUILDS.items())
        raise KappaConfigError(
            f"{where} needs Iceberg's Spark runtime "
            f"(org.apache.iceberg:{RUNTIME_ARTIFACT}-<Spark minor>_2.13), and Maven Central has no build for "
            f"Spark {minor} (the installed pyspark is {version}); builds exist for {there}. Run the job on "
            f"pyspark 4.0.x or 4.1.x, or bring a runtime of your own in {PACKAGES} or {JARS}"
        )
    return f"org.apache.iceberg:{RUNTIME_ARTIFACT}-{minor}_2.13:{BUILDS[minor][-1]}"


def iceberg_catalogs(conf: Mapping[str, str]) -> list[str]:
    """The names of the Spark catalogs of ``conf`` that are Iceberg's (``spark.sql.catalog.<name>``)."""
    return sorted(
        key[len(CATALOG_PREFIX) :]
        for key, value in conf.items()
        if key.startswith(CATALOG_PREFIX)
        and "." not in key[len(CATALOG_PREFIX) :]
        and str(value).startswith(ICEBERG_CLASS_PREFIX)
    )


def _brings(conf: Mapping[str, str], artifact: str) -> bool:
    return any(artifact in conf.get(key, "") for key in (PACKAGES, JARS))


def _artifact(coordinates: str) -> str:
    return coordinates.split(":")[1]


def needed_packages(conf: Mapping[str, str], version: str, where: str = "job.spark_conf") -> list[str]:
    """The packages the Iceberg catalogs of ``conf`` need and ``conf`` does not bring: the runtime, the JDBC
    drivers of ``jdbc`` catalogs (empty: no Iceberg catalog, or all brought).

    :raises KappaConfigError: an Iceberg catalog on a Spark Iceberg has no build for (:func:`runtime_package`).
    """
    names = iceberg_catalogs(conf)
    if not names:
        return []
    out = []
    if not _brings(conf, RUNTIME_ARTIFACT):
        key = f"{CATALOG_PREFIX}{names[0]}"
        out.append(runtime_package(version, f"{where}.{key}: {conf[key]!r}"))
    for name in names:
        uri = str(conf.get(f"{CATALOG_PREFIX}{name}.uri", "")).lower()
        for prefix, driver in JDBC_DRIVERS.items():
            if uri.startswith(prefix) and not _brings(conf, _artifact(driver)) and driver not in out:
                out.append(driver)
    return out


def iceberg_spark_conf(
    conf: Mapping[str, str], version: str | None = None, where: str = "job.spark_conf"
) -> dict[str, str]:
    """``conf`` with :func:`needed_packages` appended to ``spark.jars.packages`` (unchanged when none).

    :param conf: the job's Spark conf (not modified).
    :param version: the running Spark's release (default: the installed pyspark's).
    :param where: where ``conf`` comes from, for messages.
    :raises KappaConfigError: an Iceberg catalog on a Spark Iceberg has no build for.
    """
    out = dict(conf)
    if not iceberg_catalogs(conf):  # most jobs: no Iceberg Spark catalog, no need to ask the installed Spark
        return out
    extra = needed_packages(conf, version or spark_version(), where)
    if extra:
        existing = [p.strip() for p in out.get(PACKAGES, "").split(",") if p.strip()]
        out[PACKAGES] = ",".join(existing + extra)
    return out


def job_spark_conf(cfg: JobConfig) -> dict[str, str]:
    """``job.spark_conf`` as the job's Spark gets it: with Iceberg's runtime (:func:`iceberg_spark_conf`)
    when kappa starts that Spark (engine ``submit``, or ``connect`` without ``job.connect``: kappa's own
    server); as it is for a ``job.connect`` server, whose class path is its own.

    :raises KappaConfigError: an Iceberg catalog on a Spark Iceberg has no build for.
    """
    if cfg.job.engine == CONNECT and cfg.job.connect is not None:
        return dict(cfg.job.spark_conf)
    conf = iceberg_spark_conf(cfg.job.spark_conf)
    if cfg.job.engine == SUBMIT and cfg.job.master.startswith("local") and cfg.job.deploy_mode != "cluster":
        return as_local_jars(cfg.job.spark_conf, conf)
    return conf


def as_local_jars(given: Mapping[str, str], conf: Mapping[str, str]) -> dict[str, str]:
    """``conf`` with the packages it has beyond ``given`` (what :func:`iceberg_spark_conf` added) resolved now
    (from Spark's Ivy cache; remembered) and put on ``spark.jars`` instead of ``spark.jars.packages``.

    For a local spark-submit of a Python application: spark-submit also puts every jar of
    ``spark.jars.packages`` on the Python workers' path (its ``pyFiles``), and each worker then reads the
    48 MB runtime's zip index when it starts; Spark 4.0 gives a streaming source's worker 10 seconds to
    connect back, which a loaded machine then misses. Jars on ``spark.jars`` stay off that path.
    """
    added = [p for p in conf.get(PACKAGES, "").split(",") if p and p not in given.get(PACKAGES, "").split(",")]
    if not added:
        return dict(conf)
    out = dict(conf)
    if given.get(PACKAGES):
        out[PACKAGES] = given[PACKAGES]
    else:
        out.pop(PACKAGES)
    jars = [str(j) for j in resolve_cached(added, (), conf)]
    out[JARS] = ",".join([j for j in given.get(JARS, "").split(",") if j] + jars)
    return out


def warm_packages(version: str) -> list[str]:
    """What ``kappa jars`` warms for Iceberg's Spark catalogs on Spark ``version``: the runtime and the
    sqlite JDBC driver (the demo's and the tests' catalogs); empty where Iceberg has no build."""
    if spark_minor(version) not in BUILDS:
        return []
    return [runtime_package(version), JDBC_DRIVERS["jdbc:sqlite:"]]
