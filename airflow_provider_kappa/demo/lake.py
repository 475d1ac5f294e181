"""The story's lake (stages 1 and 2): its folder, its spec from the options, a Kafka broker or a one-line reason
there is none, and the generated events either produced into the jobs' topics and landed with
``kappa land``, or landed straight into the local Iceberg catalog."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow_provider_kappa.demo.kafka_broker import KafkaBroker
from airflow_provider_kappa.demo.kafka_lake import (
    KAFKA_ENV,
    Topic,
    kafka_unavailable,
    land_lake,
    produce_lake,
    topics_of,
)
from airflow_provider_kappa.demo.lakegen import LakeSpec, LakeSummary, generate_lake
from airflow_provider_kappa.demo.options import EXAMPLES, PARALLEL_TAIL, TAIL, DemoOptions
from airflow_provider_kappa.exceptions import KappaError
from airflow_provider_kappa.job.config import load_config
from airflow_provider_kappa.timeparse import parse_duration


def prepare_lake_dir(workdir: Path) -> Path:
    """Create ``<workdir>/lake`` and point this process and its children at it (``KAPPA_LAKE``;
    ``PYSPARK_PYTHON`` and ``SPARK_LOCAL_IP`` unless set)."""
    lake_dir = workdir / "lake"
    lake_dir.mkdir()
    os.environ["KAPPA_LAKE"] = str(lake_dir)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return lake_dir


def lake_spec(opts: DemoOptions) -> tuple[LakeSpec, timedelta]:
    """The lake to generate, and how much longer than ``--hours`` it goes on.

    A parallel backfill reads :data:`PARALLEL_TAIL` past the window: the lake goes on that long
    after it (a backfill refuses to read past the landed data, see docs/bad_input.md), and the
    sequential backfill reads as far (both read to the lake's end, where live stopped too).
    """
    extra = max(TAIL, PARALLEL_TAIL if "parallel" in opts.modes else TAIL) - TAIL
    spec = LakeSpec(
        hours=opts.hours + extra / timedelta(hours=1),
        rate=opts.rate,
        seed=opts.seed,
        landing_interval=parse_duration(opts.landing, "--landing"),
    )
    return spec, extra


def start_broker(opts: DemoOptions, workdir: Path) -> tuple[KafkaBroker | None, str]:
    """A running :class:`~airflow_provider_kappa.demo.kafka_broker.KafkaBroker` in ``<workdir>/kafka``
    and ``""``, or ``None`` and why there is none (one line; a start that failed keeps its whole
    message in ``<workdir>/kafka/start-error.log``)."""
    if not opts.kafka:
        return None, "--no-kafka"
    why = kafka_unavailable()
    if why is not None:
        return None, why
    broker = KafkaBroker(workdir / "kafka")
    try:
        broker.start()
    except KappaError as e:  # the fallback the issue asks for: the demo goes on without Kafka
        kept = workdir / "kafka" / "start-error.log"  # the whole message (a tool's usage, a log tail)
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text(f"{e}\n")
        return None, f"the broker did not start: {str(e).splitlines()[0]} (whole message: {kept})"
    return broker, ""


def land_events(
    broker: KafkaBroker | None,
    why: str,
    spec: LakeSpec,
    jobs: tuple[str, ...],
    catalog: Any,
    say: Callable[[str], None],
) -> tuple[dict[str, Topic], LakeSummary]:
    """The lake landed: through ``broker`` (:func:`produce_and_land`), or without one (saying
    ``why``) straight into ``catalog``; topic -> :class:`~airflow_provider_kappa.demo.kafka_lake.Topic`
    (none without a broker), and the lake's summary."""
    if broker is None:
        say(f"      live path: iceberg tail, no Kafka broker ({why})")
        return {}, generate_lake(catalog, spec)
    return produce_and_land(broker, spec, jobs, catalog, say)


def produce_and_land(
    broker: KafkaBroker, spec: LakeSpec, jobs: tuple[str, ...], catalog: Any, say: Callable[[str], None]
) -> tuple[dict[str, Topic], LakeSummary]:
    """Produce the lake's events into the jobs' topics and land them with ``kappa land``;
    topic -> :class:`~airflow_provider_kappa.demo.kafka_lake.Topic`, and the lake's summary."""
    began = time.monotonic()
    os.environ[KAFKA_ENV] = broker.bootstrap_servers
    configs = [(EXAMPLES / job / "kappa.yaml", load_config(EXAMPLES / job / "kappa.yaml")) for job in jobs]
    topics, lake = produce_lake(broker.bootstrap_servers, spec, topics_of(c for _, c in configs))
    say(
        f"      live path: Kafka, broker {broker.bootstrap_servers} (pid {broker.pid}, started in {broker.seconds:.0f}s); "
        f"{sum(len(t.acks) for t in topics.values()):,} events produced into {sorted(topics)} in {lake.seconds:.0f}s; "
        f"landing them with kappa land (log {broker.work / 'land.log'})"
    )
    runs = land_lake(configs, broker.work / "land.log")
    snapshots = sum(len(catalog.load_table(t.table).snapshots()) for t in topics.values())
    return topics, replace(lake, landings=runs, snapshots=snapshots, seconds=time.monotonic() - began)


def say_lake(lake: LakeSummary, kafka: bool, say: Callable[[str], None]) -> None:
    """The lake's progress line (stage 2).

    :param kafka: the events went through a Kafka broker.
    """
    where = "produced into Kafka and landed by kappa land" if kafka else "landed"
    say(
        f"[2/5] lake: {lake.impressions:,} impressions + {lake.playbacks:,} playbacks {where} in {lake.snapshots} "
        f"snapshots over [{lake.start:%H:%M}, {lake.end:%H:%M}) UTC ({lake.seconds:.1f}s)"
    )
