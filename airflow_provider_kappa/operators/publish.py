"""Publish: one atomic Iceberg commit per sink replacing the window with the staged rows."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from airflow_provider_kappa.operators import KappaBackfillBaseOperator, fail_fast

if TYPE_CHECKING:
    from airflow.sdk import Context


class KappaPublishOperator(KappaBackfillBaseOperator):
    """Last task of a backfill: replace each sink's window ``[start, end)`` with the staged rows
    (one atomic commit per sink, retried on conflicts; rows outside the window and live
    appends are kept), then log the summary: slices, rows, throughput, match rate, published
    rows. With ``dry_run`` or ``publish`` off it logs the summary and is skipped.

    :param config_path: path of the job's kappa.yaml (templated).
    :param plan: the plan task's XCom (templated).
    :param report: the validate task's XCom (templated).
    :param backfill_params: parameters (templated; default: the run's Params).
    """

    template_fields: Sequence[str] = (*KappaBackfillBaseOperator.template_fields, "plan", "report")

    def __init__(self, *, plan: Any, report: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plan = plan
        self.report = report

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_provider_kappa.backfill.finish import publish, summary

        bf = self.load_backfill(context)
        plan = self.load_plan(self.plan, bf, self.task_id)
        if not isinstance(self.report, Mapping) or set(self.report) != set(bf.cfg.sinks):
            raise AirflowFailException(
                f"{self.task_id}: report must be the validate task's XCom (one report per sink "
                f"{sorted(bf.cfg.sinks)}), got {self.report!r}"
            )
        store = bf.store()
        slice_results = [r for r in (store.done(s.slice_id) for s in plan.slices) if r is not None]
        if not bf.params.publishes:
            self.log.info("%s", summary(bf, plan, slice_results, self.report))
            reason = "dry_run is on" if bf.params.dry_run else "publish is off"
            raise AirflowSkipException(f"nothing published: {reason}; staged rows are kept")
        if len(slice_results) != len(plan.slices):
            missing = [s.slice_id for s in plan.slices if store.done(s.slice_id) is None]
            raise AirflowFailException(f"{self.task_id}: slice(s) {missing} have not completed; refusing to publish")
        with fail_fast(f"{self.task_id}: publish"):
            results = {name: asdict(r) for name, r in publish(bf, plan).items()}
        self.log.info("%s", summary(bf, plan, slice_results, self.report, results))
        return results
