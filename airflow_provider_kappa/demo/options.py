"""What ``kappa demo`` runs: :class:`DemoOptions` and their checks, the default workdir, the example
jobs' folder and output tables, and the lake's time frame around the incident (warmup and tails)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from airflow_provider_kappa.backfill.params import MODES
from airflow_provider_kappa.demo.processes import check_concurrency
from airflow_provider_kappa.examples import JOBS
from airflow_provider_kappa.exceptions import KappaConfigError
from airflow_provider_kappa.job.config import load_config

EXAMPLES = Path(__file__).parents[1] / "examples"
WARMUP = timedelta(minutes=30)
#: The incident window ends this long before the ``--hours`` of lake do; a sequential backfill's
#: tail (its last slice then reads to the lake's end, where live stopped too). With parallel
#: among the modes the lake goes on PARALLEL_TAIL - TAIL longer, and both modes read PARALLEL_TAIL
#: past the window: no backfill reads past the landed data (docs/bad_input.md).
TAIL = timedelta(minutes=15)
#: Tail of a parallel backfill: each slice but the last stops reading this long after the
#: cell it owns, and every row of that cell must be closed by then by a micro-batch with data,
#: as live closed it. rmi closes a 5-minute window once the watermark (10 minutes behind)
#: passes its end plus the join's 30-minute bound, a landing later; a session closes 5 minutes
#: after its last play, and sessions run up to ~45 minutes. One hour covers both.
PARALLEL_TAIL = timedelta(hours=1)


@dataclass(frozen=True)
class DemoOptions:
    """What the demo runs.

    :param workdir: folder for the lake, checkpoints, Airflow home and the report (wiped if it
        holds an earlier demo; refused if it holds anything else).
    :param hours: hours of ingestion time in the lake around the incident (a warmup before it, a
        tail after it); with ``parallel`` among the modes, the lake goes on for the parallel
        tail's extra length, so that no backfill reads past the landed data.
    :param rate: impressions per second (playbacks are a tenth).
    :param seed: seed of the lake generator.
    :param jobs: example jobs to run.
    :param modes: backfill modes to run (each repairs the same incident).
    :param threshold: ``max_misalignment_threshold`` of the backfill. The default, the lake's
        landing interval, cuts micro-batches where live did: output equal to live row for row.
    :param slice: slice length.
    :param landing: the lake's landing interval (ingestion time per landed file and snapshot).
    :param concurrency: jobs run at once, both for the live references (one spark-submit per
        job) and for the backfill stories (one process per job, its modes in order).
    :param kafka: run the Kafka story when a broker can start (False: the iceberg tail live path).
    """

    workdir: Path
    hours: float = 2.0
    rate: float = 10.0
    seed: int = 7
    jobs: tuple[str, ...] = JOBS
    modes: tuple[str, ...] = MODES
    threshold: str = "10min"
    slice: str = "1h"
    landing: str = "10min"
    concurrency: int = 2
    kafka: bool = True


def check_options(opts: DemoOptions) -> None:
    """Refuse options the demo cannot run: an unknown job or mode, less than 2 hours of lake, a
    concurrency below 1.

    :raises KappaConfigError: naming the flag.
    """
    for job in opts.jobs:
        if job not in JOBS:
            raise KappaConfigError(f"--jobs: {job!r} is not an example job; allowed: {list(JOBS)}")
    for mode in opts.modes:
        if mode not in MODES:
            raise KappaConfigError(f"--modes: {mode!r} is not a mode; allowed: {list(MODES)}")
    if opts.hours < 2:
        raise KappaConfigError(f"--hours: {opts.hours!r} is too short; the demo needs at least 2 hours of lake")
    check_concurrency(opts.concurrency)


def default_workdir() -> Path:
    """``./kappa-demo``."""
    return Path.cwd() / "kappa-demo"


def target(job: str) -> tuple[str, str]:
    """The example job's output table and its time column (its first sink's)."""
    cfg = load_config(EXAMPLES / job / "kappa.yaml")
    sink = next(iter(cfg.sinks.values()))
    return sink.table, sink.time_column
