"""Topics and producing events with kafka-python (the ``demo`` extra), for the demo and the tests.

Records are JSON values with a settable record timestamp (``CreateTime``): the demo produces each
generated event with its generated ingestion time, so what ``kappa land`` stamps into the ingestion
column (the record timestamp) is the ingestion time the generator chose. kafka-python is imported
inside the functions.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from airflow_provider_kappa.exceptions import KappaEngineError

#: ``(partition, offset, record timestamp in ms)`` of an acknowledged record
Ack = tuple[int, int, int]


def create_topic(bootstrap: str, name: str, partitions: int = 1, timeout: float = 60.0) -> None:
    """Create topic ``name`` and wait until every partition has a leader.

    :param bootstrap: ``host:port`` of the broker.
    :param name: the topic.
    :param partitions: its partition count.
    :param timeout: seconds to wait for the leaders.
    :raises KappaEngineError: a partition has no leader after ``timeout``.
    """
    from kafka import KafkaConsumer  # type: ignore[import-untyped]
    from kafka.admin import KafkaAdminClient, NewTopic  # type: ignore[import-untyped]

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="kappa")
    try:
        admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        admin.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        deadline = time.monotonic() + timeout
        while len(consumer.partitions_for_topic(name) or ()) < partitions:
            if time.monotonic() > deadline:
                raise KappaEngineError(
                    f"Kafka topic {name!r} on {bootstrap}: no leader for every partition after {timeout:.0f}s"
                )
            time.sleep(0.2)
    finally:
        consumer.close()


def produce(bootstrap: str, topic: str, events: Iterable[tuple[int, datetime, dict[str, Any]]]) -> list[Ack]:
    """Produce JSON events ``(partition, record timestamp, value)`` (``acks=all``).

    :param bootstrap: ``host:port`` of the broker.
    :param topic: the topic.
    :param events: the events, in the order they are produced.
    :returns: each event's ``(partition, offset, timestamp in ms)`` as the broker acknowledged it, in order.
    """
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, batch_size=256 * 1024)
    try:
        futures = [
            producer.send(
                topic,
                value=json.dumps(value, default=str).encode(),
                partition=p,
                timestamp_ms=int(ts.timestamp() * 1000),
            )
            for p, ts, value in events
        ]
        producer.flush()
        meta = [f.get(timeout=60) for f in futures]
    finally:
        producer.close()
    return [(m.partition, m.offset, m.timestamp) for m in meta]
