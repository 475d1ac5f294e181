"""The story's lake (stages 1 and 2): its folder, its spec from the options, a Kafka broker or a one-line reason
there is none, and the generated events either produced into the jobs' topics and landed with
``kappa land``, or landed straight into the local Iceberg catalog."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
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
) -> tuple[dict[str, Topic], Landing]:
    """The lake landing: through ``broker`` (:func:`produce_and_start_landing`: ``kappa land`` runs in a
    thread, beside the live runs), or without one (saying ``why``) straight into ``catalog``, done on
    return; topic -> :class:`~airflow_provider_kappa.demo.kafka_lake.Topic` (none without a broker), and
    the :class:`Landing`."""
    if broker is None:
        say(f"      live path: iceberg tail, no Kafka broker ({why})")
        return {}, Landing({}, generate_lake(catalog, spec))
    return produce_and_start_landing(broker, spec, jobs, say)


@dataclass
class Landing:
    """The lake's landing: done (``runs`` None), or ``kappa land`` of the produced topics running in a
    thread (:func:`produce_and_start_landing`), its future giving the landing runs and when they ended."""

    topics: dict[str, Topic]
    produced: LakeSummary
    began: float = 0.0
    runs: Future[tuple[int, float]] | None = None

    def wait(self) -> None:
        """Wait until the landing has ended, failed or not (its failure is raised by :meth:`landed`)."""
        if self.runs is not None:
            wait([self.runs])

    def landed(self, catalog: Any) -> tuple[LakeSummary, float]:
        """Wait for the landing; the lake's summary (its snapshots counted in ``catalog``), and the
        ``time.monotonic()`` at which it ended.

        :raises KappaEngineError: a landing failed.
        """
        if self.runs is None:
            return self.produced, time.monotonic()
        runs, ended = self.runs.result()
        snapshots = sum(len(catalog.load_table(t.table).snapshots()) for t in self.topics.values())
        return replace(self.produced, landings=runs, snapshots=snapshots, seconds=ended - self.began), ended


def produce_and_start_landing(
    broker: KafkaBroker, spec: LakeSpec, jobs: tuple[str, ...], say: Callable[[str], None]
) -> tuple[dict[str, Topic], Landing]:
    """Produce the lake's events into the jobs' topics and start landing them with ``kappa land`` in
    a thread, as a landing runs beside the live jobs in production; topic ->
    :class:`~airflow_provider_kappa.demo.kafka_lake.Topic`, and the running :class:`Landing`."""
    began = time.monotonic()
    os.environ[KAFKA_ENV] = broker.bootstrap_servers
    configs = [(EXAMPLES / job / "kappa.yaml", load_config(EXAMPLES / job / "kappa.yaml")) for job in jobs]
    topics, lake = produce_lake(broker.bootstrap_servers, spec, topics_of(c for _, c in configs))
    say(
        f"      live path: Kafka, broker {broker.bootstrap_servers} (pid {broker.pid}, started in {broker.seconds:.0f}s); "
        f"{sum(len(t.acks) for t in topics.values()):,} events produced into {sorted(topics)} in {lake.seconds:.0f}s; "
        f"landing them with kappa land beside the live runs (log {broker.work / 'land.log'})"
    )

    def land() -> tuple[int, float]:
        return land_lake(configs, broker.work / "land.log"), time.monotonic()

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kappa-land")
    runs = pool.submit(land)
    pool.shutdown(wait=False)  # the landing goes on; Landing.landed waits for it
    return topics, Landing(topics, lake, began, runs)


def say_lake(lake: LakeSummary, kafka: bool, say: Callable[[str], None]) -> None:
    """The lake's progress line (stage 2).

    :param kafka: the events went through a Kafka broker.
    """
    where = "produced into Kafka and landed by kappa land" if kafka else "landed"
    say(
        f"[2/5] lake: {lake.impressions:,} impressions + {lake.playbacks:,} playbacks {where} in {lake.snapshots} "
        f"snapshots over [{lake.start:%H:%M}, {lake.end:%H:%M}) UTC ({lake.seconds:.1f}s)"
    )
