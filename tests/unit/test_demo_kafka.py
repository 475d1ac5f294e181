"""The demo's choice of live path (Kafka or the iceberg tail fallback) and the pure parts of its Kafka
story: micro-batch limits and the ledger put back on the lake's time axis."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from airflow_provider_kappa.demo.kafka_broker import cluster_id
from airflow_provider_kappa.demo.kafka_client import Ack
from airflow_provider_kappa.demo.kafka_lake import Topic, batch_limits, kafka_unavailable
from airflow_provider_kappa.demo.lake import start_broker
from airflow_provider_kappa.demo.options import DemoOptions
from airflow_provider_kappa.exceptions import KappaConfigError


def test_without_resolvable_jars_the_demo_falls_back_saying_why_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the process boundary: nothing remembered, and a java that fails as spark-submit's resolution would offline
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("#!/bin/sh\necho ':: UNRESOLVED DEPENDENCIES ::' >&2\nexit 1\n")
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    why = kafka_unavailable()
    assert why is not None and "\n" not in why
    assert "org.apache.kafka:kafka_2.13" in why and "could not be resolved" in why and "`kappa jars`" in why
    broker, said = start_broker(DemoOptions(workdir=tmp_path / "demo"), tmp_path / "demo")
    assert broker is None and said == why
    assert not (tmp_path / "demo" / "kafka").exists()  # nothing started


def test_a_broker_that_does_not_start_falls_back_in_one_line_keeping_the_whole_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    java = tmp_path / "jdk" / "bin" / "java"  # the process boundary: a java that fails as the storage tool did
    java.parent.mkdir(parents=True)
    java.write_text(
        "#!/bin/sh\necho 'usage: kafka-storage format [-h] --config CONFIG' >&2\necho 'kafka-storage: error: expected one argument' >&2\nexit 1\n"
    )
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    # the packages count as resolved (this test's subject is the start after them), whatever this
    # machine's Ivy cache holds for the installed Spark release
    monkeypatch.setattr("airflow_provider_kappa.demo.lake.kafka_unavailable", lambda: None)
    monkeypatch.setattr("airflow_provider_kappa.demo.kafka_broker.broker_classpath", lambda: str(tmp_path / "x.jar"))
    broker, said = start_broker(DemoOptions(workdir=tmp_path / "demo"), tmp_path / "demo")
    kept = tmp_path / "demo" / "kafka" / "start-error.log"
    assert (
        broker is None
        and "\n" not in said
        and said.startswith("the broker did not start: formatting the Kafka storage")
    )
    assert (
        str(kept) in said and "expected one argument" in kept.read_text() and "usage: kafka-storage" in kept.read_text()
    )


def test_a_cluster_id_is_a_uuid_the_storage_tool_never_reads_as_an_option() -> None:
    # one plain base64url UUID in 64 starts with '-': kafka-storage then failed 'expected one argument'
    ids = [cluster_id() for _ in range(3000)]  # a plain draw would give ~47 such ids
    assert not [i for i in ids if i.startswith("-")]
    assert all(len(base64.urlsafe_b64decode(i + "==")) == 16 for i in ids) and len(set(ids)) == len(ids)


def test_no_kafka_option_chooses_the_iceberg_tail_without_looking_for_a_broker(tmp_path: Path) -> None:
    broker, said = start_broker(DemoOptions(workdir=tmp_path, kafka=False), tmp_path)
    assert broker is None and said == "--no-kafka"


def topic(name: str, stamps: list[int]) -> Topic:
    acks: list[Ack] = [(0, offset, ms) for offset, ms in enumerate(stamps)]
    return Topic(name, f"raw.{name}", acks)


def test_batch_limits_read_every_topic_in_about_as_many_batches() -> None:
    topics = {"impressions": topic("impressions", list(range(1000))), "playbacks": topic("playbacks", list(range(95)))}
    assert batch_limits(topics, 10) == {"impressions": 100, "playbacks": 10}
    assert batch_limits({"t": topic("t", [])}, 3) == {"t": 1}
    with pytest.raises(KappaConfigError, match="at least 1"):
        batch_limits(topics, 0)
