"""``kappa demo``: the whole Kappa backfill story on one laptop, with real parts (:func:`run_demo`
runs its stages in order).

1. Generate the events (impressions, playbacks). With a Kafka broker (its jars fetched at
   install), produce them into Kafka topics (record timestamp = the generated ingestion time)
   and land the topics into a local sqlite-backed Iceberg catalog with ``kappa land``, while the
   jobs run live from the same topics (stage 2); without
   one (one line says why), land them straight into the catalog (:mod:`.lake`; the Airflow
   home and metadata DB meanwhile: :mod:`.airflow_home`).
2. Run each example job live (the production output, and the reference): from Kafka, the
   unchanged job on its kafka candidates in uneven micro-batches, recording the live ledger
   (:mod:`~airflow_provider_kappa.demo.kafka_lake`); else over the lake in iceberg tail mode
   (:mod:`.live_runs`).
3. Simulate an incident: a buggy deploy corrupts one window of the output and loses part of it
   (:mod:`.incident`).
4. Backfill that window from Iceberg through the job's Airflow DAG (``dag.test()``: a real Airflow
   run of snapshot, plan, one task per slice, validate, publish) in each mode; after a Kafka-live
   run, with ``ledger`` (live's micro-batches replayed) (:mod:`.dag_backfill`). Each job's story
   (incident, backfill, compare, per mode in order) runs in its own process with its own
   Airflow home (sqlite is not safe for two ``dag.test()`` at once), up to ``concurrency``
   jobs at once (:mod:`.job_story`).
5. Compare the published window with the live reference (:mod:`.comparison`) and write a report
   (text + HTML) (:mod:`.summary`).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from airflow_provider_kappa.demo.airflow_home import (
    airflow_environment,
    prepare_workdir,
    start_airflow_db,
    wait_airflow_db,
)
from airflow_provider_kappa.demo.comparison import JobOutcome, outcome_from_json
from airflow_provider_kappa.demo.incident import incident_window
from airflow_provider_kappa.demo.job_story import story_process
from airflow_provider_kappa.demo.lake import lake_spec, land_events, prepare_lake_dir, say_lake, start_broker
from airflow_provider_kappa.demo.lakegen import LakeSummary, local_catalog
from airflow_provider_kappa.demo.live_reference import LiveReference
from airflow_provider_kappa.demo.live_runs import (
    check_ledgers,
    live_path_text,
    live_references,
    micro_batch_limits,
    say_live_runs,
)
from airflow_provider_kappa.demo.options import DemoOptions, check_options
from airflow_provider_kappa.demo.processes import run_stories
from airflow_provider_kappa.demo.report import DemoReport
from airflow_provider_kappa.demo.summary import build_report, write_report


@dataclass(frozen=True)
class LakeAndLive:
    """What stages 1-3 leave for the backfills and the report."""

    lake: LakeSummary
    #: a Kafka broker ran (the jobs ran live from it; the backfills replay their ledger)
    kafka: bool
    #: why no broker ran (``""`` when one did)
    why: str
    #: topic -> records per live micro-batch at most (``None`` without a broker)
    limits: dict[str, int] | None
    refs: dict[str, LiveReference]
    window_start: datetime
    window_end: datetime


def run_demo(opts: DemoOptions, say: Callable[[str], None] = print) -> DemoReport:
    """Run the story and return its report (also written as HTML into the workdir).

    :param opts: what to run.
    :param say: where progress lines go.
    """
    check_options(opts)
    began = time.monotonic()
    stages: dict[str, float] = {}
    workdir = prepare_workdir(opts.workdir)
    lake_dir = prepare_lake_dir(workdir)

    say(f"[1/5] Airflow home and metadata DB in {workdir / 'airflow'} (created while the lake lands)")
    migrate = start_airflow_db(airflow_environment(workdir / "airflow"))
    live = lake_and_live(opts, workdir, lake_dir, migrate, stages, began, say)
    live_seconds = say_live_runs(opts.jobs, live.refs, live.kafka, say)

    mark = time.monotonic()
    outcomes = backfill_stories(opts, workdir, lake_dir, live, say)
    stages[f"backfills (jobs at once: {min(opts.concurrency, len(opts.jobs))})"] = time.monotonic() - mark

    report = build_report(
        opts,
        live.lake,
        outcomes,
        live_seconds,
        live.window_start,
        live.window_end,
        stages,
        time.monotonic() - began,
        live_path_text(live.kafka, live.limits, live.why),
    )
    write_report(workdir, report, outcomes, say)
    return report


def lake_and_live(
    opts: DemoOptions,
    workdir: Path,
    lake_dir: Path,
    migrate: subprocess.Popen[str],
    stages: dict[str, float],
    began: float,
    say: Callable[[str], None],
) -> LakeAndLive:
    """Stages 1-3: the lake landed (through a Kafka broker when one starts) while ``migrate``
    creates the Airflow DB, the incident window chosen, and every job run live. With a broker,
    ``kappa land`` lands the topics while the jobs run live from them (as in production); without
    one, the jobs tail the lake once it has landed. The broker stops once both are done (or failed).

    :param stages: stage name -> seconds, completed with the lake's and the live runs'.
    :param began: ``time.monotonic()`` at the demo's start.
    """
    spec, extra = lake_spec(opts)
    catalog = local_catalog(lake_dir)
    broker = None
    try:
        broker, why = start_broker(opts, workdir)
        topics, landing = land_events(broker, why, spec, opts.jobs, catalog, say)
        if broker is None:  # live tails the lake: it runs once the lake has landed
            lake, landed = landing.landed(catalog)
            say_lake(lake, False, say)
        # the incident: from a warmup's length after the lake's start to a tail's length before its
        # end (the warmup and tail reads around the window then have data, as in production)
        window_start, window_end = incident_window(spec.start, spec.end - extra)
        mark = time.monotonic()
        limits = micro_batch_limits(topics, spec) if broker else None
        try:
            refs = live_references(opts.jobs, lake_dir, opts.concurrency, limits)
            if broker:
                check_ledgers(opts.jobs)  # placed by their record times, not live's wall clock
        except BaseException:
            landing.wait()  # it reads the broker stopped below: let it end first (its log keeps its output)
            raise
        live_seconds = time.monotonic() - mark
        if broker is not None:  # kappa land ran beside the live runs, from the same topics
            lake, landed = landing.landed(catalog)
            say_lake(lake, True, say)
    finally:
        try:
            wait_airflow_db(migrate)
        finally:
            if broker is not None:
                broker.stop()
    stages["lake (the Airflow DB created meanwhile)"] = landed - began
    beside = ", beside the landing" if broker is not None else ""
    stages[f"live references (jobs at once: {min(opts.concurrency, len(opts.jobs))}{beside})"] = live_seconds
    return LakeAndLive(lake, broker is not None, why, limits, refs, window_start, window_end)


def backfill_stories(
    opts: DemoOptions, workdir: Path, lake_dir: Path, live: LakeAndLive, say: Callable[[str], None]
) -> list[JobOutcome]:
    """Stage 4: every job's story (incident, backfill, comparison per mode) in its own process,
    ``concurrency`` at once; the outcomes by job, then mode, in order."""
    stories = [
        story_process(
            workdir,
            job,
            opts.modes,
            lake_dir,
            live.window_start,
            live.window_end,
            opts.slice,
            opts.threshold,
            ledger=live.kafka,
        )
        for job in opts.jobs
    ]
    results = run_stories(stories, opts.concurrency, say)
    return [outcome_from_json(o) for job in opts.jobs for o in results[job]]
