"""How exact a backfill will be (:class:`Exactness`): live's own micro-batches replayed from the
live ledger, or micro-batches aligned to the ingestion grid.

``ledger: auto`` (the default) replays the job's live ledger (``<job.ledger>/<sink>``, recorded by
``kappa run`` from Kafka; :mod:`airflow_provider_kappa.spark.ledger`) when it covers the range read
(:meth:`~airflow_provider_kappa.spark.ledger.Ledger.gap`), and otherwise cuts micro-batches on the
grid, saying why in one line. ``true`` replays it whatever it covers (a missing ledger is refused
before any lock, :func:`check_ledger`), ``false`` never. The plan step decides once and pins the
choice in the backfill's folder, so a rerun replays what the first run did even when live has
recorded more since.

Pure Python with pyarrow's file systems; no Airflow, pyspark or pyiceberg import.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow_provider_kappa.exceptions import KappaConfigError, KappaSourceError
from airflow_provider_kappa.spark.ledger import Ledger, sink_ledger
from airflow_provider_kappa.timeparse import human_duration, to_micros

if TYPE_CHECKING:
    from airflow_provider_kappa.backfill.backfill import Backfill

#: Spark seconds one replayed live batch costs, for the plan's estimate: a day of live at a 10 s trigger
#: replayed in twelve 2-h slices on the project's 2-core machine took 0.49 s a batch for the whole
#: ``kappa backfill`` (8,641 micro-batches in 4,269.9 s; benchmarks/README.md, "A day, both sides in one
#: run"). It was 0.9 s from a 64-batch run, where the slices' fixed costs weighed on every batch.
REPLAY_SECONDS_PER_BATCH = 0.5


@dataclass(frozen=True)
class Exactness:
    """What a backfill's micro-batches are, and so how exact to expect its output.

    :param ledger: the sink's live ledger the slices replay; ``None``: aligned to the grid.
    :param statement: one line for the plan, the header, the report (with the ledger: the live
        batches replayed; each slice counts its own, :attr:`~airflow_provider_kappa.backfill.plan.SlicePlan.ledger_batches`).
    :param exact: the ledger covers the range read (the output is expected to equal live's).
    """

    ledger: str | None
    statement: str
    exact: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (part of the plan's XCom value)."""
        return {"ledger": self.ledger, "statement": self.statement, "exact": self.exact}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Exactness:
        """Inverse of :meth:`to_dict`."""
        return cls(data.get("ledger"), str(data["statement"]), bool(data.get("exact")))


#: How the statements of a ledger replay, and the header of a backfill with ``ledger: true``, say that
#: the threshold cuts no micro-batch of a replay (the batches are live's).
THRESHOLD_UNUSED = "max_misalignment_threshold unused"


def job_ledger(bf: Backfill) -> tuple[str | None, str | None]:
    """``(the ledger of the job's one sink, None)``, or ``(None, why there is none)``."""
    sinks = sorted(bf.cfg.sinks)
    if len(sinks) != 1:
        return None, f"the job has sinks {sinks}; the live ledger is kept per query, so only a one-sink job replays it"
    return sink_ledger(bf.cfg.job.ledger, sinks[0]), None


def check_ledger(bf: Backfill) -> None:
    """With ``ledger: true``, refuse a job without a live ledger to replay (before any lock).

    :raises KappaConfigError: naming the ledger folder and what records it.
    :raises KappaSourceError: its first or last entry cannot be read (naming it).
    """
    if bf.params.ledger != "true":
        return
    uri, why = job_ledger(bf)
    book = Ledger.find(uri) if uri is not None else None
    if uri is not None and book is None:
        why = f"no live ledger at {uri!r} (`kappa run` records it while the job runs live from Kafka)"
    elif book is not None and not book.keys:
        why = f"the live ledger {uri!r} holds no batch"
    elif book is not None:
        for _, _, name in (book.keys[0], book.keys[-1]):
            book.entry(name)  # an unreadable ledger is refused here, before any lock (KappaSourceError names it)
    if why:
        raise KappaConfigError(f"backfill parameter ledger: true, but {why}; use ledger auto or false")


def decide(bf: Backfill, data_last_micros: int | None, *, pin: bool) -> tuple[Exactness, Ledger | None]:
    """Whether the slices replay the live ledger, and the one line saying how exact to expect them.

    :param bf: the backfill.
    :param data_last_micros: the last landed ingestion time in the range read (``None``: unknown).
    :param pin: pin the choice in the backfill's folder (a rerun reuses it); ``kappa plan`` writes nothing.
    :returns: the exactness and the ledger replayed (``None``: aligned).
    """
    p = bf.params
    start_ms, end_ms = to_micros(p.read_start) // 1000, to_micros(p.read_end) // 1000
    aligned = (
        f"aligned to {human_duration(p.max_misalignment_threshold)}: micro-batches cut on the ingestion grid, "
        "not where live cut them; late-event drops can differ near window ends"
    )
    if p.ledger == "false":
        return Exactness(None, f"{aligned} (ledger: false)"), None
    uri, gap = job_ledger(bf)
    book = Ledger.find(uri) if uri is not None else None
    if uri is not None and book is None:
        gap = f"no live ledger at {uri} (`kappa run` records it from Kafka)"
    if book is not None:
        try:
            last_ms = None if data_last_micros is None else data_last_micros // 1000
            gap = book.gap(start_ms, end_ms, last_ms, to_micros(p.end) // 1000)
        except KappaSourceError as e:  # auto: said in the exactness line, and the backfill aligns
            if p.ledger == "true":
                raise
            book, gap = None, f"the live ledger cannot be read: {e}"
    chosen = uri if book is not None and (p.ledger == "true" or gap is None) else None
    if pin:
        # from_ms: the first live batch the slices may replay (kappa cleanup keeps the ledger from there)
        chosen = bf.store().pin("ledger", {"ledger": chosen, "from_ms": start_ms})["ledger"]
    if chosen is None:
        return Exactness(None, f"{aligned}; the live ledger is not replayed: {gap}"), None
    if book is None or chosen != uri:
        raise KappaSourceError(
            f"backfill {bf.id}: its first run replayed the live ledger {chosen!r}, which is now "
            f"{'gone' if book is None else 'elsewhere (job.ledger changed)'}; restore it, or rerun with ledger false"
        )
    batches = book.count(start_ms, end_ms)
    span = f"[{p.read_start.isoformat()}, {p.read_end.isoformat()})"
    # what the replay costs, and that the threshold the header printed (before this choice) cuts none of it
    replay = (
        f"{batches} live batch(es) replayed, ~{_about(batches * REPLAY_SECONDS_PER_BATCH)} of Spark time; "
        f"micro-batches as live cut them ({THRESHOLD_UNUSED})"
    )
    if gap is None:
        return Exactness(chosen, f"exact: the live ledger covers {span}; {replay}", True), book
    return Exactness(chosen, f"live ledger replayed as asked, but not exact: {gap}; {replay}"), book


def _about(seconds: float) -> str:
    """``45s``, ``3min``: whole seconds below two minutes, else whole minutes."""
    return human_duration(timedelta(seconds=max(1, round(seconds) if seconds < 120 else round(seconds / 60) * 60)))
