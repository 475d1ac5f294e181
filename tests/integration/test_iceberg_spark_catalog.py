"""Iceberg's own Spark connector in the job (issue 24, deliverable 4): a job that joins its stream with an
Iceberg dimension table through ``spark.table("lake.dim.accounts")`` on Iceberg's SparkCatalog, the catalog
given once as Spark conf (``job.spark_conf``) and made kappa's by ``{spark_catalog: lake}``.

Where Iceberg has a Spark runtime for the installed pyspark (4.0, 4.1: the compat low end), kappa adds it
and the sqlite JDBC driver to ``spark.jars.packages`` and the backfill is exact; where it has none (4.2, the
main venv), the same backfill is refused before anything is written, naming the Spark release and the
builds there are. Both are this one test: which one runs depends on the installed Spark, nothing is skipped.
The packages come from Spark's Ivy cache (``kappa jars`` warms it); the test downloads nothing when warm.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any

import airflow_env  # noqa: F401  (sets AIRFLOW_HOME before Airflow is imported)
import pytest
import yaml
from airflow_env import write_job_config
from lake import INCIDENT_END, INCIDENT_START, seed_sessions_incident, sessions_arrow, sorted_rows
from paths import EXAMPLES

from airflow_provider_kappa.cli import main
from airflow_provider_kappa.engine.iceberg_spark import BUILDS, spark_minor

# on a Spark with an Iceberg build, Iceberg's 48 MB runtime joins every spark-submit: on a loaded 2-core machine the
# exact branch took 15 min (the refusal, on 4.2, seconds)
pytestmark = pytest.mark.timeout(1800)

WINDOW = ["--start", INCIDENT_START.isoformat(), "--end", INCIDENT_END.isoformat()]
OPTIONS = ["--slice", "2h", "--warmup", "30min", "--tail", "45min", "--min-match", "50"]
INACTIVE = 2  # the account the dimension table marks inactive: the job drops its plays

#: the example sessionizer's read line, and the same joined with the dimension's active accounts
EXAMPLE_READ = 'plays = read_source(spark, "playbacks").withWatermark("event_ts", "10 minutes")'
DIMENSION_READ = (
    'active = spark.table("lake.dim.accounts").where("active").select("account_id")\n'
    + EXAMPLE_READ
    + '.join(active, "account_id")'
)


def dimension_job() -> str:
    """examples/playback_sessions' sessionizer with its stream joined with ``lake.dim.accounts`` through
    Spark: only the plays of active accounts form sessions."""
    example = (EXAMPLES / "playback_sessions" / "playback_sessions.py").read_text()
    assert example.count(EXAMPLE_READ) == 1, "the example's read line changed: update EXAMPLE_READ"
    return example.replace(EXAMPLE_READ, DIMENSION_READ)


def dimension_job_config(tmp_path: Path, catalog_props: dict[str, str], engine: str) -> Path:
    """kappa.yaml of :func:`dimension_job`: the catalog ``lake`` as Iceberg's SparkCatalog (type jdbc on the test's
    sqlite catalog file) in ``job.spark_conf``, and kappa's ``lake`` the same Spark catalog."""
    path = write_job_config(tmp_path, catalog_props, engine=engine)  # engine connect: kappa's own server
    raw = yaml.safe_load(path.read_text())
    application = tmp_path / "dimension_job.py"
    application.write_text(dimension_job())
    raw["job"]["application"] = str(application)
    raw["job"]["spark_conf"].update(
        {
            "spark.sql.catalog.lake": "org.apache.iceberg.spark.SparkCatalog",
            "spark.sql.catalog.lake.type": "jdbc",
            "spark.sql.catalog.lake.uri": "jdbc:sqlite:" + catalog_props["uri"].removeprefix("sqlite:///"),
            "spark.sql.catalog.lake.warehouse": catalog_props["warehouse"],
        }
    )
    raw["catalogs"] = {"lake": {"spark_catalog": "lake"}}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def create_accounts(catalog: Any) -> None:
    """``dim.accounts``: accounts 1-7, all active but :data:`INACTIVE`."""
    import pyarrow as pa

    catalog.create_namespace("dim")
    schema = pa.schema([("account_id", pa.int64()), ("active", pa.bool_())])
    table = catalog.create_table("dim.accounts", schema)
    table.append(pa.Table.from_pylist([{"account_id": a, "active": a != INACTIVE} for a in range(1, 8)], schema))


@pytest.mark.parametrize("engine", ["submit", "connect"])
def test_a_job_joining_an_iceberg_dimension_through_sparkcatalog_backfills_exactly_or_is_refused(
    tmp_path: Path,
    catalog_props: dict[str, str],
    catalog: Any,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    engine: str,
) -> None:
    import pyarrow as pa

    monkeypatch.setenv("COLUMNS", "200")
    config = dimension_job_config(tmp_path, catalog_props, engine)
    all_sessions = seed_sessions_incident(catalog)
    create_accounts(catalog)
    before = sorted_rows(catalog.load_table("prod.playback_sessions"))
    code = main(["backfill", "--config", str(config), *WINDOW, *OPTIONS])
    out, err = capsys.readouterr()
    spark = importlib.metadata.version("pyspark")
    after = sorted_rows(catalog.load_table("prod.playback_sessions"))
    if spark_minor(spark) not in BUILDS:  # 4.2: no Iceberg runtime exists; refused, nothing written
        assert code == 2, out + err
        assert "job.spark_conf.spark.sql.catalog.lake: 'org.apache.iceberg.spark.SparkCatalog' needs" in err, err
        assert f"no build for Spark {spark_minor(spark)} (the installed pyspark is {spark})" in err, err
        assert "Spark 4.0: Iceberg 1.10.1, 1.11.0; Spark 4.1: Iceberg 1.11.0, 1.12.0" in err, err
        assert after == before and not (tmp_path / "checkpoints").exists()
        return
    assert code == 0, out + err
    expected = [
        s
        for s in all_sessions
        if not (INCIDENT_START <= s["session_start"] < INCIDENT_END and s["account_id"] == INACTIVE)
    ]
    assert any(
        s["account_id"] == INACTIVE and INCIDENT_START <= s["session_start"] < INCIDENT_END for s in all_sessions
    )
    assert after == sorted_rows(pa.Table.from_pylist(expected, schema=sessions_arrow()))
    assert "slices run 2/2" in out and "published snapshot" in out, out
