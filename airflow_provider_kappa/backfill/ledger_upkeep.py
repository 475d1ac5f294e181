"""The live ledger's upkeep, run by ``kappa cleanup`` after the backfills' cleanup: compaction of
its older entries and, when asked (``--ledger-older-than``), its retention.

- **Compaction** (:func:`~airflow_provider_kappa.spark.ledger.compact`): every
  :data:`~airflow_provider_kappa.spark.ledger.CHUNK_ENTRIES` consecutive single-entry files but the
  newest become one file. Always, unless a dry run.
- **Retention** (:func:`~airflow_provider_kappa.spark.ledger.trim`): entries live started before
  ``now - older_than`` go, except what a kept backfill may still replay: a backfill the cleanup keeps
  that pinned this ledger keeps it from the first batch it replays (``pinned/ledger.json``'s
  ``from_ms``); a kept backfill that has not chosen yet (no plan step) keeps the whole ledger. There is
  no default: the ledger is what makes a later backfill exact, so it is kept until a retention is
  asked for (compacted, a day of live at a 10 s trigger is 9 small files).

No Airflow import; pyarrow is imported by the ledger's functions.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone

from airflow_provider_kappa.backfill.cleanup import CleanupDecision
from airflow_provider_kappa.job.checkpoints import CheckpointStore
from airflow_provider_kappa.job.config import JobConfig
from airflow_provider_kappa.spark.ledger import Ledger, compact, sink_ledger, trim


@dataclass(frozen=True)
class LedgerUpkeep:
    """What the upkeep did to one sink's ledger.

    :param uri: the ledger folder.
    :param entries: its entries before the upkeep.
    :param compacted: single-entry files compacted (a dry run: would be).
    :param trimmed: entries deleted by the retention (a dry run: would be).
    :param kept_from: the retention's cut, when one applied.
    :param note: why the retention kept more than asked, or did not apply.
    """

    uri: str
    entries: int
    compacted: int = 0
    trimmed: int = 0
    kept_from: datetime | None = None
    note: str = ""


def ledger_cut(
    uri: str, decisions: list[CleanupDecision], older_than: timedelta, now: datetime
) -> tuple[int | None, str]:
    """The trigger time (ms) before which ``uri``'s entries may go, and why it is later than asked
    (``None``: none may go).

    :param decisions: the cleanup's decisions: the backfills it keeps protect what they may replay.
    """
    cut, note = int((now - older_than).timestamp() * 1000), ""
    for decision in decisions:
        lo = decision.leftovers
        if decision.remove or lo.checkpoint is None:
            continue
        pinned = CheckpointStore(lo.checkpoint).pinned("ledger")
        if pinned is None:
            return None, f"backfill {lo.backfill_id} is kept and has not chosen yet whether it replays the ledger"
        if pinned.get("ledger") == uri and int(pinned.get("from_ms", 0)) < cut:
            cut, note = int(pinned.get("from_ms", 0)), f"backfill {lo.backfill_id} is kept and replays it from there"
    return cut, note


def ledger_upkeep(
    cfg: JobConfig,
    decisions: list[CleanupDecision],
    *,
    older_than: timedelta | None = None,
    dry_run: bool = False,
    now: datetime | None = None,
) -> list[LedgerUpkeep]:
    """Compact each sink's live ledger and apply ``older_than`` to it (see the module docstring).

    :param cfg: the job config (``job.ledger``).
    :param decisions: the backfills' cleanup decisions (:func:`~airflow_provider_kappa.backfill.cleanup.cleanup`).
    :param older_than: the ledger's retention; ``None`` keeps every entry.
    :param dry_run: count only; change nothing.
    :param now: the current time (default: now, UTC).
    :returns: one record per ledger that exists, by sink name.
    """
    moment = now or datetime.now(timezone.utc)
    out = []
    for sink in sorted(cfg.sinks):
        uri = sink_ledger(cfg.job.ledger, sink)
        book = Ledger.find(uri)
        if book is None:
            continue
        record = LedgerUpkeep(uri, len(book))
        if older_than is not None:
            cut, note = ledger_cut(uri, decisions, older_than, moment)
            record = replace(record, note=note)
            if cut is not None:
                kept_from = datetime.fromtimestamp(cut / 1000, timezone.utc)
                record = replace(record, trimmed=trim(uri, cut, dry_run=dry_run), kept_from=kept_from)
        if not dry_run:
            record = replace(record, compacted=compact(uri))
        out.append(record)
    return out
