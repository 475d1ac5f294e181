"""The demo's Kafka story: the generated events go through a real broker.

1. :func:`kafka_unavailable` says why no broker can start here (then the demo falls back to the
   iceberg tail live path, :mod:`~airflow_provider_kappa.demo.live_reference`).
2. :func:`produce_lake`: lakegen's events produced into the jobs' topics, each record's timestamp
   the generated ingestion time, in ingestion order.
3. :func:`land_lake`: ``kappa land --available-now`` lands every topic into its iceberg candidate's
   table (the ingestion column = the record timestamp, plus ``kafka_topic/partition/offset``).
4. The jobs run live from Kafka (:func:`~airflow_provider_kappa.demo.live_reference.run_live_reference`
   with ``kafka=...``), recording the live ledger.
   The demo compresses hours of ingestion time into seconds of wall time, so live's trigger times
   (wall clock, today) say nothing about the lake's time axis; the ledger's entries are placed by
   the record times they hold (:meth:`~airflow_provider_kappa.spark.ledger.Ledger.placement`),
   like any backlog live catches up.

Nothing here imports pyspark; kafka-python and pyarrow are imported inside functions.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_provider_kappa.demo.kafka_broker import _java
from airflow_provider_kappa.demo.kafka_client import Ack, create_topic, produce
from airflow_provider_kappa.demo.lakegen import (
    IMPRESSIONS_TABLE,
    LATE_THRESHOLD,
    PLAYBACKS_TABLE,
    LakeSpec,
    LakeSummary,
    landed_events,
)
from airflow_provider_kappa.engine.connect_server import log_tail
from airflow_provider_kappa.engine.jvm import broker_classpath, connector_jars
from airflow_provider_kappa.engine.landing import landings
from airflow_provider_kappa.exceptions import KappaConfigError, KappaEngineError, KappaError
from airflow_provider_kappa.job.config import JobConfig

if TYPE_CHECKING:
    import pyarrow as pa


KAFKA_ENV = "KAPPA_KAFKA"
"""Environment variable the example kappa.yaml files use for ``bootstrap_servers`` (default ``kafka:9092``)."""


def kafka_unavailable() -> str | None:
    """Why the demo cannot run a Kafka broker here, in one line, or ``None`` when it can try
    (``java`` found, kafka-python installed, the broker's and the connector's packages resolved through
    Spark's Ivy: from its cache, else fetched once from Maven Central now)."""
    if importlib.util.find_spec("kafka") is None:
        return "kafka-python is not installed: pip install 'airflow-provider-kappa[demo]'"
    try:
        _java()
        broker_classpath()
        connector_jars()
    except KappaError as e:
        return str(e).splitlines()[0]
    return None


@dataclass(frozen=True)
class Topic:
    """One topic of the demo: the landed table it feeds and what was produced into it."""

    name: str
    table: str
    acks: list[Ack]

    def timestamp_ms(self, offset: int) -> int:
        """The record timestamp of ``offset`` (one partition; offsets from 0)."""
        return self.acks[offset][2]


def topics_of(configs: Iterable[JobConfig]) -> dict[str, str]:
    """Topic -> landed table (the kafka and iceberg candidates of every landable dynamic source).

    :raises KappaConfigError: a topic landed into two tables.
    """

    out: dict[str, str] = {}
    for cfg in configs:
        for item in landings(cfg):
            table = out.setdefault(item.kafka.topics, item.iceberg.table)
            if table != item.iceberg.table:
                raise KappaConfigError(
                    f"sources.{item.kafka.name}.topics: {item.kafka.topics!r} lands into {table!r} and {item.iceberg.table!r}; "
                    "the demo expects one landed table per topic"
                )
    return out


def _events(table: pa.Table) -> Iterable[tuple[int, datetime, dict[str, object]]]:
    """``(partition 0, ingestion time, JSON value)`` per landed event, in order."""
    for row in table.to_pylist():
        ingestion = row.pop("ingestion_ts")
        row["event_ts"] = row["event_ts"].astimezone(timezone.utc).isoformat()
        yield 0, ingestion, row


def produce_lake(bootstrap: str, spec: LakeSpec, topics: Mapping[str, str]) -> tuple[dict[str, Topic], LakeSummary]:
    """Produce lakegen's events of ``spec`` into ``topics`` (one partition each), record timestamp =
    the generated ingestion time, in ingestion order.

    :param bootstrap: the broker.
    :param spec: the lake.
    :param topics: topic -> landed table (``raw.impressions`` or ``raw.playbacks``).
    :returns: topic -> what was produced, and the lake's summary (landings: none yet; a table no topic
        feeds counts no event).
    """
    began = time.monotonic()
    impressions, playbacks = landed_events(spec)
    data = {IMPRESSIONS_TABLE: impressions, PLAYBACKS_TABLE: playbacks}
    out = {}
    for topic, table in topics.items():
        if table not in data:
            raise KappaConfigError(f"topic {topic!r} lands into {table!r}; the demo generates only {sorted(data)}")
        create_topic(bootstrap, topic)
        out[topic] = Topic(topic, table, produce(bootstrap, topic, _events(data[table])))

    landed = set(topics.values())
    produced = {name: t if name in landed else t.slice(0, 0) for name, t in data.items()}

    def late(t: pa.Table) -> int:
        lag = [(i - e).total_seconds() for i, e in zip(t["ingestion_ts"].to_pylist(), t["event_ts"].to_pylist())]
        return sum(1 for s in lag if s > LATE_THRESHOLD.total_seconds())

    summary = LakeSummary(
        impressions_table=IMPRESSIONS_TABLE,
        playbacks_table=PLAYBACKS_TABLE,
        start=spec.start,
        end=spec.end,
        landings=0,
        snapshots=0,
        impressions=produced[IMPRESSIONS_TABLE].num_rows,
        playbacks=produced[PLAYBACKS_TABLE].num_rows,
        late_impressions=late(produced[IMPRESSIONS_TABLE]),
        late_playbacks=late(produced[PLAYBACKS_TABLE]),
        seconds=time.monotonic() - began,
    )
    return out, summary


def land_lake(configs: Iterable[tuple[Path, JobConfig]], log: Path) -> int:
    """Run ``kappa land --available-now`` (the command, as a user runs it) for each job config, each
    landed table once (the first job landing it). Returns the landing runs made.

    :param configs: ``(kappa.yaml, its config)`` per job.
    :param log: the commands' output (appended).
    :raises KappaEngineError: a landing failed; the message holds the tail of ``log``.
    """
    kappa = Path(sys.executable).parent / "kappa"
    done: set[str] = set()
    runs = 0
    for path, cfg in configs:
        todo = [i.source for i in landings(cfg) if i.iceberg.table not in done]
        if not todo:
            continue
        argv = [str(kappa), "land", "--config", str(path), "--sources", ",".join(todo), "--available-now"]
        with log.open("a") as out:
            code = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
        if code != 0:
            raise KappaEngineError(f"{' '.join(argv)} failed (exit {code}); log {log}:\n{log_tail(log)}")
        done.update(i.iceberg.table for i in landings(cfg) if i.source in todo)
        runs += 1
    return runs


def batch_limits(topics: Mapping[str, Topic], batches: int) -> dict[str, int]:
    """Topic -> ``maxOffsetsPerTrigger`` that reads it in about ``batches`` micro-batches (every topic
    at the same pace through ingestion time; the cuts fall where the record counts do, not on any grid).

    :param topics: what was produced.
    :param batches: micro-batches wanted (at least 1).
    """
    if batches < 1:
        raise KappaConfigError(f"live micro-batches: {batches!r}; expected at least 1")
    return {name: max(1, -(-len(t.acks) // batches)) for name, t in topics.items()}
