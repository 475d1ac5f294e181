"""A real Apache Kafka broker for the tests (KRaft, one node on 127.0.0.1, free ports), from the jars
Spark's Ivy resolved into its cache (``make install`` runs ``kappa jars``; ``engine/jvm.py``): kappa's own :class:`~airflow_provider_kappa.demo.kafka_broker.KafkaBroker`,
started once per test session and stopped by its process id. Topics are created and events produced
with kafka-python: :func:`create_topic` and :func:`produce` are the demo's own (``demo/kafka_client.py``).

``$KAPPA_TEST_KAFKA_CONNECTOR_JARS`` (comma-separated local jars; ``make test-compat`` sets it on an end whose
connector this machine's Maven registry cannot serve whole) gives every job :func:`write_kafka_job_config`
writes Spark's Kafka connector through ``spark.jars`` in ``job.spark_conf``, as a cluster bringing its own
connector would (kappa then leaves the conf alone: ``engine/jvm.py``'s ``brings_connector``). Unset: the
product's own connector (``spark.jars.packages``, the running Spark's release)."""

from __future__ import annotations

import json
import os
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_kappa.demo.kafka_client import create_topic, produce

__all__ = ["connector_conf", "create_topic", "kafka_broker", "produce", "write_kafka_job_config"]

CONNECTOR_JARS_ENV = "KAPPA_TEST_KAFKA_CONNECTOR_JARS"


def connector_conf() -> dict[str, str]:
    """``{"spark.jars": <jars>}`` when ``$KAPPA_TEST_KAFKA_CONNECTOR_JARS`` names the connector's local
    jars (each must exist), else ``{}`` (the product's own connector)."""
    jars = [j.strip() for j in os.environ.get(CONNECTOR_JARS_ENV, "").split(",") if j.strip()]
    missing = [j for j in jars if not Path(j).is_file()]
    if missing:
        raise FileNotFoundError(f"${CONNECTOR_JARS_ENV} names jars that do not exist: {missing}")
    return {"spark.jars": ",".join(jars)} if jars else {}


def write_kafka_job_config(
    folder: Path,
    catalog_props: dict[str, str],
    bootstrap: str,
    topic: str,
    *,
    name: str,
    schema: str,
    job: str = "# the job itself is not run by kappa land\n",
    land: str = "{interval: 2s}",
    job_keys: str = "",
    kafka_keys: str = "",
) -> Path:
    """``folder/kappa.yaml`` (and ``folder/job.py``) of a job whose dynamic source ``events`` has a kafka
    candidate (``topic`` at ``bootstrap``, JSON values of ``schema``) and an iceberg one (``raw.events``
    of catalog ``lake``, ingestion column ``ingestion_ts``), sink ``summary`` (``prod.summary``,
    time column ``window_start``), local[2] Spark (and the connector of :func:`connector_conf`).

    :param job_keys: more ``job:`` keys, one YAML line each (``live_trigger: 2s``).
    :param kafka_keys: more keys of the kafka candidate, one YAML line each.
    """
    (folder / "job.py").write_text(job)
    props = "\n".join(f"    {k}: {v!r}" for k, v in catalog_props.items())
    more_job = "".join(f"  {line}\n" for line in job_keys.splitlines() if line.strip())
    more_kafka = "".join(f"    {line}\n" for line in kafka_keys.splitlines() if line.strip())
    spark_conf = json.dumps(  # JSON is YAML: one flow mapping
        {
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.session.timeZone": "UTC",
            "spark.python.authenticate.socketTimeout": "120s",
            **connector_conf(),
        }
    )
    path = folder / "kappa.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            job:
              name: {name}
              application: job.py
              checkpoint_root: {folder / "checkpoints"}
              master: local[2]
              spark_conf: {spark_conf}
            """
        )
        + more_job
        + f"land: {land}\ncatalogs:\n  lake:\n"
        + props
        + textwrap.dedent(
            f"""
            sources:
              events:
                type: dynamic
                selected: live-events
                candidates: [live-events, lake-events]
              live-events:
                type: kafka
                topics: {topic}
                bootstrap_servers: {bootstrap}
                schema: "{schema}"
            """
        )
        + more_kafka
        + textwrap.dedent(
            """\
              lake-events:
                type: iceberg
                catalog: lake
                table: raw.events
                ingestion_column: ingestion_ts
            sinks:
              summary: {type: iceberg, catalog: lake, table: prod.summary, time_column: window_start}
            """
        )
    )
    return path


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[Any]:
    """A running broker; ``.bootstrap_servers`` is ``127.0.0.1:<port>``."""
    from airflow_provider_kappa.demo.kafka_broker import KafkaBroker

    broker = KafkaBroker(Path(tempfile.mkdtemp(prefix="kappa-test-kafka-")))
    broker.start()
    print(f"Kafka broker {broker.bootstrap_servers} (pid {broker.pid}) started in {broker.seconds:.1f}s")
    try:
        yield broker
    finally:
        broker.stop()
