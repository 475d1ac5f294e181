"""The story's live run (stage 3): every example job run live, ``concurrency`` at once, over the
lake in iceberg tail mode or from Kafka in uneven micro-batches (its ledger then put back on the
lake's time axis); the live path's description and the live runs' progress lines."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from airflow_provider_kappa.demo.kafka_lake import Topic, batch_limits
from airflow_provider_kappa.demo.lakegen import LakeSpec
from airflow_provider_kappa.demo.live_reference import LiveReference, run_live_reference
from airflow_provider_kappa.demo.options import EXAMPLES
from airflow_provider_kappa.demo.processes import check_concurrency
from airflow_provider_kappa.exceptions import KappaError
from airflow_provider_kappa.job.config import load_config
from airflow_provider_kappa.spark.ledger import Ledger, sink_ledger


def micro_batch_limits(topics: dict[str, Topic], spec: LakeSpec) -> dict[str, int]:
    """``maxOffsetsPerTrigger`` per topic: about one live micro-batch per landing interval of the
    lake, cut by record counts (not on the landing grid)."""
    batches = max(1, round((spec.end - spec.start) / spec.landing_interval))
    return batch_limits(topics, batches)


def limits_text(limits: dict[str, int] | None) -> str:
    """``<topic> <n> records`` per topic, comma separated."""
    return ", ".join(f"{topic} {n:,} records" for topic, n in sorted((limits or {}).items()))


def check_ledgers(jobs: tuple[str, ...]) -> int:
    """Every job's live ledger holds its batches' record statistics, so the backfills place them by
    the lake's time (:meth:`~airflow_provider_kappa.spark.ledger.Ledger.placement`), not by the wall
    clock the demo ran live at; returns the entries checked.

    :raises KappaError: an entry without them (naming it): live's listener did not record it.
    """
    checked = 0
    for job in jobs:
        cfg = load_config(EXAMPLES / job / "kappa.yaml")
        for sink in cfg.sinks:
            book = Ledger(sink_ledger(cfg.job.ledger, sink))
            for _, _, name in book.keys:
                if not book.entry(name).has_stats:
                    raise KappaError(
                        f"live ledger {book.uri}: entry {name} has no record statistics (live's listener did not "
                        "record them); the backfill would place it at its wall-clock trigger time"
                    )
                checked += 1
    return checked


def live_references(
    jobs: tuple[str, ...], lake_dir: Path, concurrency: int, kafka: dict[str, int] | None = None
) -> dict[str, LiveReference]:
    """Run every job live (one spark-submit each, ``concurrency`` at once): over the lake, or from
    Kafka with ``kafka`` (topic -> records per micro-batch at most);
    job -> :class:`~airflow_provider_kappa.demo.live_reference.LiveReference`."""
    check_concurrency(concurrency)

    def live(job: str) -> LiveReference:
        return run_live_reference(EXAMPLES / job / "kappa.yaml", fresh=True, kafka=kafka)

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="kappa-live") as pool:
        futures = {job: pool.submit(live, job) for job in jobs}
        return {job: future.result() for job, future in futures.items()}


def live_path_text(kafka: bool, limits: dict[str, int] | None, why: str) -> str:
    """The report's ``live path`` fact.

    :param kafka: a broker ran.
    :param limits: from :func:`micro_batch_limits` (``None`` without a broker).
    :param why: why there was no broker.
    """
    if kafka and limits:
        return (
            f"Kafka: the jobs ran live from the broker's topics ({limits_text(limits)} per micro-batch), "
            "recording the live ledger; the backfills replay it (ledger)"
        )
    return f"iceberg tail (no Kafka broker: {why})"


def say_live_runs(
    jobs: tuple[str, ...], refs: dict[str, LiveReference], kafka: bool, say: Callable[[str], None]
) -> dict[str, float]:
    """One progress line per job's live run (stage 3); job -> seconds of its live run."""
    live_seconds: dict[str, float] = {}
    for job in jobs:
        ref = refs[job]
        live_seconds[job] = ref.seconds
        source = "from Kafka " if kafka else ""
        say(
            f"[3/5] {job}: live run {source}wrote {sum(ref.rows.values()):,} rows in {sum(ref.batches.values())} "
            f"micro-batches ({ref.seconds:.0f}s)"
        )
    return live_seconds
