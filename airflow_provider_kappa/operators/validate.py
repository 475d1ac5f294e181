"""Validate: staged rows vs the target's current rows over the window; the min_match gate."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_kappa.backfill.validate import check_gate, validate
from airflow_provider_kappa.operators import KappaBackfillBaseOperator, fail_fast
from airflow_provider_kappa.operators.links import KappaReportLink, record_report_link
from airflow_provider_kappa.report.report import write_report

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_kappa.backfill.backfill import Backfill
    from airflow_provider_kappa.backfill.plan import BackfillPlan
    from airflow_provider_kappa.backfill.validate import ValidationReport


class KappaValidateOperator(KappaBackfillBaseOperator):
    """Compare each sink's staged rows (every slice of the plan) with the target's current rows
    for ``[start, end)`` and log the report (match rate, counts per hour, sample differences);
    the HTML report is written beside the backfill's checkpoints and opened by the task's
    **Backfill report** extra link (:mod:`airflow_provider_kappa.operators.links`).

    Fails (no retry) when a match rate is below ``min_match``, or when the backfill staged
    nothing for a window the target has rows in. XCom: sink -> ``ValidationReport.to_dict()``.

    :param config_path: path of the job's kappa.yaml (templated).
    :param plan: the plan task's XCom (templated; e.g. ``plan_task.output``).
    :param backfill_params: parameters (templated; default: the run's Params).
    """

    template_fields: Sequence[str] = (*KappaBackfillBaseOperator.template_fields, "plan")
    operator_extra_links = (KappaReportLink(),)

    def __init__(self, *, plan: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plan = plan

    def execute(self, context: Context) -> dict[str, Any]:

        bf, plan, reports, _ = self.compare(context)
        with fail_fast(f"{self.task_id}: validate"):
            check_gate(bf, plan, reports)
        return {name: report.to_dict() for name, report in reports.items()}

    def compare(self, context: Context) -> tuple[Backfill, BackfillPlan, dict[str, ValidationReport], str]:
        """Validate every sink, write the HTML report and keep its link; no gate.

        :param context: the task's context.
        :returns: the backfill, its plan, sink name -> report, and the report's URL ('' when none).
        """
        bf = self.load_backfill(context)
        plan = self.load_plan(self.plan, bf, self.task_id)
        with fail_fast(f"{self.task_id}: validate"):
            url = record_report_link(context, bf)  # config checked before the comparison
            reports = validate(bf, plan)
            write_report(bf, plan, reports)  # before the gate: a refused backfill has its report too
            self.log.info("report: %s", url or bf.store().report_file())
            for name, report in reports.items():
                self.log.info("sink %s:\n%s", name, report.to_text())
        return bf, plan, reports, url
