"""Cleanup: apply the job's retention to its backfills (staging tables, checkpoints, plan files, tags)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_kappa.backfill.cleanup import age_text, cleanup
from airflow_provider_kappa.backfill.ledger_upkeep import ledger_upkeep
from airflow_provider_kappa.compat.airflow import AirflowFailException
from airflow_provider_kappa.job.config import load_config
from airflow_provider_kappa.operators import KappaBackfillBaseOperator, fail_fast
from airflow_provider_kappa.timeparse import human_duration, parse_duration

if TYPE_CHECKING:
    from airflow.sdk import Context


class KappaCleanupOperator(KappaBackfillBaseOperator):
    """Last task of a backfill DAG (after ``publish``, also when a dry run skipped it): remove
    what the job's backfills left behind (staging tables, checkpoint folders with their plan
    files, source tags) once they were last active at least ``older_than`` ago, the job's
    ``job.retention`` unless given (see :mod:`airflow_provider_kappa.backfill.cleanup`). A backfill
    holding a lock is never removed; data files a publish committed into a target stay.

    The backfill of this run's parameters is kept when it does not publish (dry run, publish
    off: its staged rows stay for inspection until a later cleanup); a published one is removed
    at once with a retention of ``0s``.

    XCom: one ``CleanupDecision.to_dict()`` per backfill found (ids, table names, paths).

    :param config_path: path of the job's kappa.yaml (templated).
    :param older_than: retention, a duration such as ``7d`` or ``0s`` (templated; default:
        ``job.retention``).
    :param keep_run_backfill: read this run's parameters to keep its unpublished backfill
        (``False`` for a maintenance DAG without backfill Params).
    :param backfill_params: parameters (templated; default: the run's Params).
    """

    template_fields: Sequence[str] = (*KappaBackfillBaseOperator.template_fields, "older_than")

    def __init__(self, *, older_than: str | None = None, keep_run_backfill: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.older_than = older_than
        self.keep_run_backfill = keep_run_backfill

    def execute(self, context: Context) -> list[dict[str, Any]]:

        if not isinstance(self.config_path, str) or not self.config_path:
            raise AirflowFailException(
                f"{self.task_id}: config_path must be the path of a kappa.yaml, got {self.config_path!r}"
            )
        keep: dict[str, str] = {}
        if self.keep_run_backfill:
            bf = self.load_backfill(context)
            cfg = bf.cfg
            if not bf.params.publishes:
                keep[bf.id] = "this run's backfill, not published: its staged rows stay for inspection"
        else:
            with fail_fast(f"{self.task_id}: config"):
                cfg = load_config(self.config_path)
        with fail_fast(f"{self.task_id}: older_than"):
            retention = (
                cfg.job.retention
                if self.older_than in (None, "")
                else parse_duration(self.older_than, "older_than", allow_zero=True)
            )
        self.log.info("job %s: removing backfills last active at least %s ago", cfg.job.name, human_duration(retention))
        decisions = cleanup(cfg, older_than=retention, keep=keep)
        for d in decisions:
            lo = d.leftovers
            self.log.info(
                "backfill %s (age %s, %d staging table(s), tags on %s, checkpoint %s): %s",
                lo.backfill_id,
                age_text(d.age),
                len(lo.staging),
                [t for _, t in lo.tags] or "-",
                lo.checkpoint or "-",
                f"removed ({d.reason})" if d.remove else f"kept: {d.reason}",
            )
        if not decisions:
            self.log.info("job %s: no backfill left anything behind", cfg.job.name)
        for upkeep in ledger_upkeep(cfg, decisions):  # compaction only: the ledger's retention is kappa cleanup's
            self.log.info("live ledger %s: %d entries, %d compacted", upkeep.uri, upkeep.entries, upkeep.compacted)
        return [d.to_dict() for d in decisions]
