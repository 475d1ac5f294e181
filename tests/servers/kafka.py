"""A real Apache Kafka broker for the tests (KRaft, one node on 127.0.0.1, free ports), from the jars
``make install`` fetched (``jvm/fetch.sh``): kappa's own :class:`~airflow_provider_kappa.demo.kafka_broker.KafkaBroker`,
started once per test session and stopped by its process id. Topics are created and events produced
with kafka-python (the ``test`` extra)."""

from __future__ import annotations

import json
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Iterator

import pytest


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


def create_topic(bootstrap: str, name: str, partitions: int = 1, timeout: float = 60.0) -> None:
    """Create topic ``name`` and wait until every partition has a leader."""
    from kafka import KafkaConsumer
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="kappa-tests")
    try:
        admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        admin.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        deadline = time.monotonic() + timeout
        while len(consumer.partitions_for_topic(name) or ()) < partitions:
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {name} has no leader for every partition after {timeout}s")
            time.sleep(0.2)
    finally:
        consumer.close()


def produce(bootstrap: str, topic: str, events: Iterable[tuple[int, datetime, dict[str, Any]]]) -> list[tuple[int, int, int]]:
    """Produce JSON events ``(partition, record timestamp, value)``; return each one's
    ``(partition, offset, timestamp in ms)`` as the broker acknowledged it, in order."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    try:
        futures = [
            producer.send(topic, value=json.dumps(value, default=str).encode(), partition=p, timestamp_ms=int(ts.timestamp() * 1000))
            for p, ts, value in events
        ]
        producer.flush()
        meta = [f.get(timeout=60) for f in futures]
    finally:
        producer.close()
    return [(m.partition, m.offset, m.timestamp) for m in meta]
