"""``land:`` in kappa.yaml, the choice of what ``kappa land`` lands and its Spark conf, and the
JVM packages of ``engine/jvm.py`` (Spark's Kafka connector through ``spark.jars.packages``): no Spark, no broker."""

from __future__ import annotations

import copy
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_provider_kappa.engine import jvm
from airflow_provider_kappa.engine.landing import land_conf, landings
from airflow_provider_kappa.exceptions import KappaConfigError
from airflow_provider_kappa.job.config import load_config
from airflow_provider_kappa.spark.settings import KafkaSourceSettings, load_settings

BASE: dict[str, Any] = {
    "job": {
        "name": "rmi",
        "application": "job.py",
        "checkpoint_root": "/tmp/ckpt",
        "spark_conf": {"spark.sql.shuffle.partitions": "4"},
    },
    "catalogs": {"lake": {"type": "sql", "uri": "sqlite:////tmp/c.db", "warehouse": "file:///tmp/w"}},
    "sources": {
        "impressions": {
            "type": "dynamic",
            "selected": "live-impressions",
            "candidates": ["live-impressions", "lake-impressions"],
        },
        "live-impressions": {
            "type": "kafka",
            "topics": "impressions",
            "bootstrap_servers": "kafka:9092",
            "schema": "id STRING",
        },
        "lake-impressions": {
            "type": "iceberg",
            "catalog": "lake",
            "table": "raw.impressions",
            "ingestion_column": "ingestion_ts",
        },
        "plays": {"type": "iceberg", "catalog": "lake", "table": "raw.plays", "ingestion_column": "ingestion_ts"},
    },
    "sinks": {
        "summary": {"type": "iceberg", "catalog": "lake", "table": "prod.summary", "time_column": "window_start"}
    },
}


def config(tmp_path: Path, **changes: Any) -> Any:
    data = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        node = data
        *parents, last = dotted.split("__")
        for key in parents:
            node = node[key]
        if value is None:
            del node[last]
        else:
            node[last] = value
    path = tmp_path / "kappa.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config(path)


def test_land_defaults_to_five_minutes_from_the_earliest_offsets(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    assert cfg.land.interval == timedelta(minutes=5) and cfg.land.starting_offsets == "earliest"
    cfg = config(tmp_path, land={"interval": "PT30S", "starting_offsets": "latest"})
    assert cfg.land.interval == timedelta(seconds=30) and cfg.land.starting_offsets == "latest"


@pytest.mark.parametrize(
    ("land", "match"),
    [
        ({"interval": "0s"}, "land.interval: '0s' must be positive"),
        ({"interval": "-5min"}, "land.interval: '-5min'"),
        ({"interval": "often"}, "land.interval: 'often' is not a duration"),
        ({"interval": "1min", "trigger": "x"}, r"land: unknown key\(s\) \['trigger'\]"),
        ({"starting_offsets": "now"}, "land.starting_offsets: 'now' is not a starting position"),
        ("5min", "land: expected a mapping"),
    ],
)
def test_bad_land_section_names_key_and_value(tmp_path: Path, land: Any, match: str) -> None:
    with pytest.raises(KappaConfigError, match=match):
        config(tmp_path, land=land)


def test_landings_default_to_every_dynamic_source_with_both_candidates(tmp_path: Path) -> None:
    [item] = landings(config(tmp_path))
    assert (item.source, item.kafka.name, item.iceberg.table) == ("impressions", "live-impressions", "raw.impressions")


def test_landings_refuse_what_cannot_land(tmp_path: Path) -> None:
    with pytest.raises(KappaConfigError, match="'plays' is not a dynamic source"):
        landings(config(tmp_path), ["plays"])
    with pytest.raises(KappaConfigError, match=r"sources.live-impressions.schema: missing; kappa land parses"):
        landings(config(tmp_path, **{"sources__live-impressions__schema": None}))
    only_iceberg = {"type": "dynamic", "selected": "lake-impressions", "candidates": ["lake-impressions"]}
    with pytest.raises(KappaConfigError, match="no dynamic source has both a 'kafka' and an 'iceberg' candidate"):
        landings(config(tmp_path, sources__impressions=only_iceberg))
    with pytest.raises(KappaConfigError, match=r"must hold exactly one 'kafka' and one 'iceberg' candidate"):
        landings(config(tmp_path, sources__impressions=only_iceberg), ["impressions"])


def test_land_conf_reads_the_kafka_candidate_into_the_iceberg_table(tmp_path: Path) -> None:
    cfg = config(tmp_path, land={"interval": "1min"})
    conf = land_conf(cfg, landings(cfg), "/secret/catalogs.json")
    settings = load_settings(conf)
    src = settings.source("impressions")
    assert isinstance(src, KafkaSourceSettings)
    assert (src.topics, src.ingestion_column, src.starting_offsets, src.schema) == (
        "impressions",
        "ingestion_ts",
        "earliest",
        "id STRING",
    )
    sink = settings.sink("impressions")
    assert (sink.table, sink.write_table, sink.time_column, sink.catalog) == (
        "raw.impressions",
        "raw.impressions",
        "ingestion_ts",
        "lake",
    )
    assert (settings.mode, settings.trigger, settings.trigger_interval) == (
        "live",
        "processingTime",
        timedelta(minutes=1),
    )
    assert settings.checkpoint == "/tmp/ckpt/rmi/land"
    assert conf["spark.kappa.land.sources"] == "impressions" and conf["spark.sql.shuffle.partitions"] == "4"
    assert load_settings(land_conf(cfg, landings(cfg), "/c.json", available_now=True)).trigger == "availableNow"


def test_land_conf_carries_the_jobs_launch_choices_like_every_other_run(tmp_path: Path) -> None:
    """kappa land goes through the same launcher as kappa run and the slices: the packed venv,
    job.env and deploy mode reach its spark-submit too (read and dropped by submit_args)."""
    cfg = config(tmp_path, job__python_archive="hdfs:///envs/kappa.tar.gz", job__env={"TZ": "UTC"})
    conf = land_conf(cfg, landings(cfg), "/c.json")
    assert conf["spark.kappa.submit.python_archive"] == "hdfs:///envs/kappa.tar.gz"
    assert conf["spark.kappa.submit.env.TZ"] == "UTC"


# --------------------------------------------------------------------------- jars


def failing_java(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The process boundary: a JAVA_HOME whose java fails, so any spark-submit started fails at once."""
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("#!/bin/sh\necho 'Error: no JVM here' >&2\nexit 1\n")
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))


def test_the_connector_goes_to_spark_jars_packages_at_the_installed_spark_release() -> None:
    import importlib.metadata

    release = importlib.metadata.version("pyspark")
    conf = jvm.kafka_connector_conf(
        {"spark.jars.packages": "org.example:udf:1.0", "spark.jars": "/opt/udf.jar", "x": "1"}
    )
    assert conf["spark.jars.packages"] == f"org.example:udf:1.0,org.apache.spark:spark-sql-kafka-0-10_2.13:{release}"
    assert conf["spark.jars"] == "/opt/udf.jar" and conf["x"] == "1"
    excluded = conf["spark.jars.excludes"].split(",")
    assert "org.apache.hadoop:hadoop-client-runtime" in excluded and len(excluded) == len(set(excluded))
    assert jvm.kafka_connector_conf({}, "4.0.1")["spark.jars.packages"].endswith("_2.13:4.0.1")
    again = jvm.kafka_connector_conf({"spark.jars.excludes": "org.slf4j:slf4j-api"}, "4.1.0")
    assert again["spark.jars.excludes"].split(",").count("org.slf4j:slf4j-api") == 1


def test_a_conf_that_brings_its_own_connector_is_left_alone() -> None:
    own = {"spark.jars.packages": "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"}
    assert jvm.kafka_connector_conf(own) == own
    jars = {"spark.jars": "/opt/spark-sql-kafka-0-10_2.13-4.0.0.jar"}
    assert jvm.kafka_connector_conf(jars) == jars


def test_a_failed_resolution_names_the_package_and_what_to_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    failing_java(tmp_path, monkeypatch)
    with pytest.raises(KappaConfigError, match=r"org\.example:nothing:1\.0: could not be resolved .*kappa jars") as e:
        jvm.resolve(["org.example:nothing:1.0"])
    assert "\n" not in str(e.value)


def test_a_resolved_class_path_is_remembered_while_its_jars_exist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    failing_java(tmp_path, monkeypatch)  # a resolution would fail: the remembered one is used without it
    jar = tmp_path / "ivy" / "jars" / "org.example_a-1.0.jar"
    jar.parent.mkdir(parents=True)
    jar.write_bytes(b"PK")
    calls: list[list[str]] = []
    real = jvm.resolve

    def counted(packages: Any, *args: Any, **kwargs: Any) -> list[Path]:
        calls.append(list(packages))
        return real(packages, *args, **kwargs)

    monkeypatch.setattr(jvm, "resolve", counted)
    with pytest.raises(KappaConfigError):  # nothing remembered yet: spark-submit runs (and fails here)
        jvm.resolve_cached(["org.example:a:1.0"])
    assert calls == [["org.example:a:1.0"]]
    remembered = list((tmp_path / "xdg" / "airflow-provider-kappa").glob("classpath-*.txt"))
    assert remembered == []  # a failure is not remembered
    monkeypatch.setattr(jvm, "resolve", lambda *a, **k: [jar])
    assert jvm.resolve_cached(["org.example:a:1.0"]) == [jar]
    monkeypatch.setattr(jvm, "resolve", counted)
    assert jvm.resolve_cached(["org.example:a:1.0"]) == [jar] and len(calls) == 1  # remembered: no spark-submit
    jar.unlink()
    with pytest.raises(KappaConfigError):  # a jar gone from the cache: resolved again
        jvm.resolve_cached(["org.example:a:1.0"])
    assert len(calls) == 2


def test_the_broker_runs_on_the_scala_of_the_pyspark_wheel() -> None:
    names = [p.name for p in jvm.wheel_scala_jars()]
    assert names[0].startswith("scala-library-2.13.") and names[1].startswith("scala-reflect-2.13.")
    assert names[0].removeprefix("scala-library-") == names[1].removeprefix("scala-reflect-")


def test_missing_fetched_artifacts_say_what_to_run(tmp_path: Path) -> None:
    with pytest.raises(KappaConfigError, match=r"'rest-catalog' are not fetched .*make install"):
        jvm.artifact_jars("rest-catalog", [tmp_path])


def test_the_jar_folder_comes_from_the_environment_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(jvm.JVM_DIR_ENV, str(tmp_path))
    assert jvm.jvm_dirs() == [tmp_path]
    monkeypatch.delenv(jvm.JVM_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    checkout, user = jvm.jvm_dirs()
    assert checkout == Path(jvm.__file__).resolve().parents[2] / ".cache" / "jvm"
    assert user == tmp_path / "xdg" / "airflow-provider-kappa" / "jvm"
