"""engine/iceberg_spark.py: Iceberg's Spark runtime (and a jdbc catalog's driver) added to the job's
``spark.jars.packages`` for the running Spark, left alone when brought, refused where no build exists."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_kappa.engine.iceberg_spark import (
    iceberg_catalogs,
    iceberg_spark_conf,
    job_spark_conf,
    needed_packages,
    runtime_package,
    warm_packages,
)
from airflow_provider_kappa.exceptions import KappaConfigError
from airflow_provider_kappa.job.config import parse_config

SQLITE = {
    "spark.sql.catalog.lake": "org.apache.iceberg.spark.SparkCatalog",
    "spark.sql.catalog.lake.type": "jdbc",
    "spark.sql.catalog.lake.uri": "jdbc:sqlite:/lake/catalog.db",
}
RUNTIME_40 = "org.apache.iceberg:iceberg-spark-runtime-4.0_2.13:1.11.0"
RUNTIME_41 = "org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:1.12.0"


def test_the_runtime_of_the_running_spark_minor_is_the_newest_iceberg_built_for_it() -> None:
    assert runtime_package("4.0.4") == RUNTIME_40
    assert runtime_package("4.1.0") == RUNTIME_41


@pytest.mark.parametrize("version", ["4.2.0", "4.3.0", "3.5.2"])
def test_a_spark_without_an_iceberg_build_is_refused_naming_it_and_the_builds_there_are(version: str) -> None:
    with pytest.raises(KappaConfigError) as e:
        iceberg_spark_conf(SQLITE, version)
    minor = ".".join(version.split(".")[:2])
    assert str(e.value).startswith(
        "job.spark_conf.spark.sql.catalog.lake: 'org.apache.iceberg.spark.SparkCatalog' needs Iceberg's Spark runtime"
    )
    assert f"no build for Spark {minor} (the installed pyspark is {version})" in str(e.value)
    assert "Spark 4.0: Iceberg 1.10.1, 1.11.0; Spark 4.1: Iceberg 1.11.0, 1.12.0" in str(e.value)
    assert "spark.jars.packages or spark.jars" in str(e.value)


def test_the_runtime_and_the_sqlite_driver_are_appended_to_the_packages_given() -> None:
    conf = {**SQLITE, "spark.jars.packages": "com.example:udfs:1.0"}
    out = iceberg_spark_conf(conf, "4.0.4")
    assert out["spark.jars.packages"] == f"com.example:udfs:1.0,{RUNTIME_40},org.xerial:sqlite-jdbc:3.51.1.0"
    assert conf["spark.jars.packages"] == "com.example:udfs:1.0"  # not modified
    assert {k: v for k, v in out.items() if k != "spark.jars.packages"} == SQLITE


def test_a_postgresql_catalog_gets_its_driver_and_a_rest_catalog_none() -> None:
    pg = {**SQLITE, "spark.sql.catalog.lake.uri": "jdbc:postgresql://db:5432/lake"}
    assert needed_packages(pg, "4.1.1") == [RUNTIME_41, "org.postgresql:postgresql:42.7.8"]
    rest = {"spark.sql.catalog.prod": "org.apache.iceberg.spark.SparkCatalog", "spark.sql.catalog.prod.type": "rest"}
    assert needed_packages(rest, "4.1.1") == [RUNTIME_41]


def test_a_conf_that_brings_its_own_is_left_alone_even_on_a_spark_without_a_build() -> None:
    own = {
        **SQLITE,
        "spark.jars": "/opt/iceberg/iceberg-spark-runtime-4.2_2.13-1.13.0.jar",
        "spark.jars.packages": "org.xerial:sqlite-jdbc:3.46.0.0",
    }
    assert iceberg_spark_conf(own, "4.2.0") == own


def test_a_conf_without_an_iceberg_catalog_is_unchanged() -> None:
    conf = {
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.catalog.other": "com.example.Catalog",
        "spark.sql.catalog.lake.type": "jdbc",  # a key of a catalog, not a catalog
    }
    assert iceberg_catalogs(conf) == []
    assert iceberg_spark_conf(conf, "4.2.0") == conf
    assert iceberg_catalogs({**SQLITE, "spark.sql.catalog.s": "org.apache.iceberg.spark.SparkSessionCatalog"}) == [
        "lake",
        "s",
    ]


def test_kappa_jars_warms_the_runtime_and_sqlite_driver_where_a_build_exists() -> None:
    assert warm_packages("4.0.4") == [RUNTIME_40, "org.xerial:sqlite-jdbc:3.51.1.0"]
    assert warm_packages("4.2.0") == []


def _config(tmp_path: Path, job: dict[str, object]) -> object:
    raw = {
        "job": {"name": "j", "application": "j.py", "checkpoint_root": str(tmp_path), "spark_conf": SQLITE, **job},
        "catalogs": {"lake": {"spark_catalog": "lake"}},
        "sources": {"s": {"type": "iceberg", "catalog": "lake", "table": "raw.t", "ingestion_column": "ts"}},
        "sinks": {"k": {"type": "iceberg", "catalog": "lake", "table": "prod.t", "time_column": "ts"}},
    }
    return parse_config(raw, tmp_path / "kappa.yaml")


def test_a_job_connect_server_keeps_its_own_class_path(tmp_path: Path) -> None:
    """Engine connect with job.connect: the server is not kappa's to start; its conf is passed as it is."""
    cfg = _config(tmp_path, {"engine": "connect", "connect": {"url": "sc://spark.internal:15002"}})
    assert job_spark_conf(cfg) == SQLITE  # type: ignore[arg-type]
