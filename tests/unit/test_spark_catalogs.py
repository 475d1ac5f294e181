"""A catalog of kappa.yaml given as Spark conf (``spark.sql.catalog.<name>.*``): each type's translation into
pyiceberg properties, refusals that name the key, and a real SqlCatalog opened from a ``jdbc:sqlite:`` one."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from sqlalchemy.engine import make_url

from airflow_provider_kappa.exceptions import KappaConfigError
from airflow_provider_kappa.job.catalogs import job_catalogs
from airflow_provider_kappa.job.config import load_config
from airflow_provider_kappa.redact import redact_uri

ICEBERG = "org.apache.iceberg.spark.SparkCatalog"
P = "spark.sql.catalog.lake"

BASE: dict[str, Any] = {
    "job": {"name": "rmi", "application": "job.py", "checkpoint_root": "/tmp/ckpt"},
    "catalogs": {},
    "sources": {
        "events": {"type": "iceberg", "catalog": "lake", "table": "raw.events", "ingestion_column": "ingestion_ts"}
    },
    "sinks": {"summary": {"type": "iceberg", "catalog": "lake", "table": "prod.summary", "time_column": "ts"}},
}


def load(tmp_path: Path, catalog: dict[str, Any], spark_conf: dict[str, str] | None = None) -> dict[str, str]:
    """The pyiceberg properties kappa.yaml's catalog ``lake`` loads as."""
    data = copy.deepcopy(BASE)
    data["catalogs"]["lake"] = catalog
    if spark_conf is not None:
        data["job"]["spark_conf"] = spark_conf
    path = tmp_path / "kappa.yaml"
    path.write_text(yaml.safe_dump(data))
    props = load_config(path).catalogs["lake"].properties
    assert props is not None
    return dict(props)


def spark(**keys: Any) -> dict[str, Any]:
    """``{spark_conf: {...}}`` of catalog ``lake``: ``spark.sql.catalog.lake`` plus ``.<key>`` for each key
    (``_`` for ``-`` and ``__`` for ``.`` in the names)."""
    conf: dict[str, Any] = {P: ICEBERG}
    conf.update({f"{P}.{k.replace('__', '.').replace('_', '-')}": v for k, v in keys.items()})
    return {"spark_conf": conf}


@pytest.mark.parametrize(
    ("catalog", "expected"),
    [
        (  # Databricks Unity Catalog / Polaris / any REST catalog, with S3 on MinIO
            spark(
                type="rest",
                uri="https://rest.example/api/catalog",
                credential="client:secret",
                warehouse="lakehouse",
                scope="PRINCIPAL_ROLE:ALL",
                oauth2_server_uri="https://auth.example/token",
                header__X_Iceberg_Access_Delegation="vended-credentials",
                io_impl="org.apache.iceberg.aws.s3.S3FileIO",
                s3__endpoint="http://minio:9000",
                s3__path_style_access=True,
                client__region="eu-west-1",
                cache_enabled=False,
            ),
            {
                "type": "rest",
                "uri": "https://rest.example/api/catalog",
                "credential": "client:secret",
                "warehouse": "lakehouse",
                "scope": "PRINCIPAL_ROLE:ALL",
                "oauth2-server-uri": "https://auth.example/token",
                "header.X-Iceberg-Access-Delegation": "vended-credentials",
                "s3.endpoint": "http://minio:9000",
                "s3.force-virtual-addressing": "false",
                "client.region": "eu-west-1",
            },
        ),
        (
            spark(
                type="rest", uri="https://r", token="t0k", rest__auth__type="sigv4", rest__signing_region="us-east-1"
            ),
            {
                "type": "rest",
                "uri": "https://r",
                "token": "t0k",
                "rest.sigv4-enabled": "true",
                "rest.signing-region": "us-east-1",
            },
        ),
        (
            spark(type="hive", uri="thrift://metastore:9083", warehouse="hdfs://nn:8020/warehouse", clients=4),
            {"type": "hive", "uri": "thrift://metastore:9083", "warehouse": "hdfs://nn:8020/warehouse"},
        ),
        (  # no type, no catalog-impl: Iceberg's default, hive
            spark(uri="thrift://metastore:9083"),
            {"type": "hive", "uri": "thrift://metastore:9083"},
        ),
        (  # EMR: Glue by type
            spark(type="glue", warehouse="s3://bucket/wh", glue__id="123456789012", client__region="us-east-1"),
            {"type": "glue", "warehouse": "s3://bucket/wh", "glue.id": "123456789012", "client.region": "us-east-1"},
        ),
        (  # EMR: Glue by catalog-impl, S3FileIO
            spark(
                catalog_impl="org.apache.iceberg.aws.glue.GlueCatalog",
                warehouse="s3://bucket/wh",
                io_impl="org.apache.iceberg.aws.s3.S3FileIO",
                glue__skip_archive="true",
            ),
            {"type": "glue", "warehouse": "s3://bucket/wh", "glue.skip-archive": "true"},
        ),
        (
            spark(
                type="jdbc",
                uri="jdbc:postgresql://db.internal:5432/lake?sslmode=require",
                jdbc__user="kappa",
                jdbc__password="pw",
                jdbc__schema_version="V1",
                jdbc__ApplicationName="kappa",
                warehouse="s3://bucket/wh",
            ),
            {
                "type": "sql",
                "uri": "postgresql+psycopg2://kappa:pw@db.internal:5432/lake?application_name=kappa&sslmode=require",
                "schema_version": "v1",
                "warehouse": "s3://bucket/wh",
            },
        ),
        (
            spark(catalog_impl="org.apache.iceberg.jdbc.JdbcCatalog", uri="jdbc:postgresql:lake"),
            {"type": "sql", "uri": "postgresql+psycopg2://localhost/lake"},
        ),
        (
            spark(type="jdbc", uri="jdbc:sqlite:/var/kappa/catalog.db", warehouse="file:///var/kappa/wh"),
            {"type": "sql", "uri": "sqlite:////var/kappa/catalog.db", "warehouse": "file:///var/kappa/wh"},
        ),
    ],
    ids=[
        "rest",
        "rest-sigv4",
        "hive",
        "hive-default",
        "glue",
        "glue-impl",
        "jdbc-postgresql",
        "jdbc-pg-short",
        "jdbc-sqlite",
    ],
)
def test_each_spark_catalog_type_translates_to_pyiceberg_properties(
    tmp_path: Path, catalog: dict[str, Any], expected: dict[str, str]
) -> None:
    assert load(tmp_path, catalog) == expected


def test_a_spark_catalog_of_job_spark_conf_is_taken_by_name_and_the_job_keeps_it(tmp_path: Path) -> None:
    conf = {
        "spark.sql.shuffle.partitions": "8",
        "spark.sql.catalog.lake": "org.apache.iceberg.spark.SparkSessionCatalog",
        "spark.sql.catalog.lake.type": "rest",
        "spark.sql.catalog.lake.uri": "http://rest:8181",
        "spark.sql.catalog.lakehouse": ICEBERG,  # another catalog, whose name starts the same
        "spark.sql.catalog.lakehouse.type": "hadoop",
    }
    assert load(tmp_path, {"spark_catalog": "lake"}, conf) == {"type": "rest", "uri": "http://rest:8181"}
    cfg = load_config(tmp_path / "kappa.yaml")
    assert cfg.job.spark_conf == conf  # the job's Spark still gets every key, its catalog included
    with pytest.raises(KappaConfigError, match=r"catalogs.lake.spark_catalog: 'lake2' is not a Spark catalog of "):
        load(tmp_path, {"spark_catalog": "lake2"}, conf)


@pytest.mark.parametrize(
    ("user", "password"),
    [("kappa", "p/?#@:%x"), ("ka@p:pa", "@@::"), ("kappa", "a b+c&d=e;f"), ("kappa", "%40%")],
)
def test_a_jdbc_password_with_url_delimiters_reaches_sqlalchemy_whole_and_is_masked(
    tmp_path: Path, user: str, password: str
) -> None:
    props = load(
        tmp_path,
        spark(type="jdbc", uri="jdbc:postgresql://db:5432/lake", jdbc__user=user, jdbc__password=password),
    )
    url = make_url(props["uri"])
    assert (url.username, url.password, url.host, url.port, url.database) == (user, password, "db", 5432, "lake")
    assert redact_uri(props["uri"]) == "postgresql+psycopg2://***:***@db:5432/lake"


@pytest.mark.parametrize(
    ("catalog", "match"),
    [
        (
            spark(type="hadoop", warehouse="hdfs://nn:8020/wh"),
            rf"catalogs.lake.spark_conf.{P}.type: 'hadoop' cannot be used: pyiceberg has no Hadoop catalog",
        ),
        (
            spark(catalog_impl="org.apache.iceberg.hadoop.HadoopCatalog", warehouse="hdfs://nn:8020/wh"),
            rf"{P}.catalog-impl: 'org.apache.iceberg.hadoop.HadoopCatalog' cannot be used: pyiceberg has no Hadoop",
        ),
        (spark(type="nessie", uri="http://n"), r"type: 'nessie' cannot be used: .*use type rest"),
        (spark(type="delta"), rf"{P}.type: 'delta' is not a catalog type; allowed: \['glue', 'hive', 'jdbc', 'rest'\]"),
        (spark(catalog_impl="com.example.MyCatalog"), r"catalog-impl: 'com.example.MyCatalog' is not a catalog kappa"),
        (spark(type="rest", catalog_impl="org.apache.iceberg.rest.RESTCatalog"), r"both .type and .catalog-impl"),
        (
            spark(type="rest", uri="http://r", cache_enabled=False, s3__sse__type="kms"),
            rf"{P}.s3.sse.type: not a key kappa can pass to pyiceberg for type 'rest'; allowed: \[.*'header.\*'\]",
        ),
        (spark(type="glue", uri="thrift://x"), rf"{P}.uri: not a key kappa can pass to pyiceberg for type 'glue'"),
        (spark(type="hive"), rf"{P}.uri: missing; a hive catalog needs it \(Spark may take hive.metastore.uris"),
        (spark(type="rest", uri="http://r", rest__auth__type="basic"), r"rest.auth.type: 'basic' cannot be passed"),
        (spark(type="rest", uri="http://r", io_impl="com.x.MyIO"), r"io-impl: 'com.x.MyIO' is not a FileIO"),
        (spark(type="rest", uri="http://r", s3__path_style_access="yes"), r"'yes' must be true or false"),
        (spark(type="jdbc", uri="jdbc:mysql://db/lake"), r"'jdbc:mysql://db/lake' is not a JDBC URL kappa can open"),
        (spark(type="jdbc", uri="jdbc:sqlite:catalog.db"), r"'jdbc:sqlite:catalog.db' is not a sqlite file kappa"),
        (spark(type="jdbc", uri="jdbc:sqlite::memory:"), r"allowed: jdbc:sqlite:/absolute/path"),
        (
            spark(type="jdbc", uri="jdbc:postgresql://h/db?user=a", jdbc__user="b"),
            r"'user' is given twice, as jdbc.user and in the uri",
        ),
        (spark(type="jdbc", uri="jdbc:postgresql://h/db?useSSL=true"), r"uri: parameter 'useSSL' has no libpq"),
        (spark(type="jdbc", uri="jdbc:postgresql://h/db", jdbc__useSSL="true"), rf"{P}.jdbc.useSSL: not a key kappa"),
        (spark(type="jdbc", uri="jdbc:postgresql://h1,h2/db"), r"must name one host"),
        (spark(type="jdbc", uri="jdbc:postgresql://h/db", jdbc__schema_version="V2"), r"'V2' is not a schema"),
        ({"spark_conf": {P + ".type": "rest", P + ".uri": "http://r"}}, rf"spark_conf.{P}: missing; allowed: \["),
        ({"spark_conf": {P: "org.apache.spark.sql.delta.catalog.DeltaCatalog"}}, r"DeltaCatalog'; allowed: \["),
        ({"spark_conf": {P: ICEBERG, "spark.sql.catalog.other.type": "rest"}}, r"keys of 2 Spark catalogs"),
        ({"spark_conf": {P: ICEBERG, "spark.executor.memory": "4g"}}, r"'spark.executor.memory' is not a catalog key"),
        ({**spark(type="rest", uri="http://r"), "uri": "http://r"}, r"catalogs.lake: 'spark_conf' stands alone"),
        ({"spark_catalog": "lake", "spark_conf": {P: ICEBERG}}, r"stands alone"),
        ({"spark_catalog": "my.lake"}, r"catalogs.lake.spark_catalog: 'my.lake' is not a Spark catalog name"),
    ],
)
def test_what_pyiceberg_has_no_counterpart_for_is_refused_naming_the_key(
    tmp_path: Path, catalog: dict[str, Any], match: str
) -> None:
    with pytest.raises(KappaConfigError, match=match):
        load(tmp_path, catalog)


def test_a_jdbc_catalog_named_otherwise_in_spark_is_refused_its_tables_are_keyed_by_the_name(tmp_path: Path) -> None:
    conf = {"spark.sql.catalog.prod": ICEBERG, "spark.sql.catalog.prod.type": "jdbc"}
    conf["spark.sql.catalog.prod.uri"] = "jdbc:sqlite:/tmp/c.db"
    with pytest.raises(KappaConfigError, match=r"this one is 'prod' in Spark but 'lake' in kappa.yaml; name the kappa"):
        load(tmp_path, {"spark_catalog": "prod"}, conf)
    rest = {"spark.sql.catalog.prod": ICEBERG, "spark.sql.catalog.prod.type": "rest", "spark.sql.catalog.prod.uri": "h"}
    assert load(tmp_path, {"spark_catalog": "prod"}, rest) == {"type": "rest", "uri": "h"}  # a REST name is free


@pytest.mark.parametrize(
    "catalog",
    [
        spark(type="jdbc", uri="jdbc:postgresql://h/db?password=s3cr%40t&foo=1"),
        spark(type="jdbc", uri="jdbc:mysql://u:s3cr@t@h/db"),
        spark(type="jdbc", uri="jdbc:postgresql://h/db", jdbc__password="s3cr@t", jdbc__foo="1"),
        spark(type="jdbc", uri="jdbc:sqlite:/tmp/c.db", jdbc__password="s3cr@t"),
        spark(type="rest", uri="https://u:s3cr@t@r", credential="c:s3cr@t", rest__auth__type="basic"),
    ],
)
def test_a_refusal_never_quotes_a_secret(tmp_path: Path, catalog: dict[str, Any]) -> None:
    with pytest.raises(KappaConfigError) as e:
        load(tmp_path, catalog)
    assert "s3cr" not in str(e.value), str(e.value)


def test_a_kappa_yaml_catalog_given_as_spark_jdbc_sqlite_conf_opens_a_real_sqlcatalog_and_reads_its_table(
    tmp_path: Path, lake_dir: Path, catalog: Any
) -> None:
    """The conftest's file-backed SqlCatalog ``lake`` holds a table; kappa.yaml names the same database as
    Spark conf of Iceberg's JdbcCatalog, and kappa's catalog loader reads the table's rows back."""
    schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
    catalog.create_namespace("raw")
    table = catalog.create_table("raw.events", schema=schema)
    table.append(pa.table({"id": [1, 2, 3], "name": ["a", "b", "c"]}, schema=schema))
    data = copy.deepcopy(BASE)
    data["catalogs"]["lake"] = spark(
        type="jdbc",
        uri=f"jdbc:sqlite:{lake_dir}/catalog.db",
        warehouse=f"file://{lake_dir}/warehouse",
        io_impl="org.apache.iceberg.hadoop.HadoopFileIO",
    )
    path = tmp_path / "kappa.yaml"
    path.write_text(yaml.safe_dump(data))

    opened = job_catalogs(load_config(path))("lake")

    assert type(opened).__name__ == "SqlCatalog" and opened.name == "lake"
    rows = opened.load_table("raw.events").scan().to_arrow().sort_by("id")
    assert rows.to_pylist() == [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}, {"id": 3, "name": "c"}]
