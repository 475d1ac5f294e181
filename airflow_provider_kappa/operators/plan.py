"""Plan: cut the backfill into aligned slices and estimate each from manifests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_kappa.backfill.params import SEQUENTIAL
from airflow_provider_kappa.backfill.plan import plan as plan_slices
from airflow_provider_kappa.compat.airflow import AirflowFailException, BaseBranchOperator
from airflow_provider_kappa.operators import KappaBackfillBaseOperator, fail_fast

if TYPE_CHECKING:
    from airflow.sdk import Context

#: Task ids of the mapped slice tasks, one per mode; :class:`KappaModeBranchOperator` picks one.
SEQUENTIAL_TASK = "slice_sequential"
PARALLEL_TASK = "slice_parallel"


class KappaPlanOperator(KappaBackfillBaseOperator):
    """Plan the slices of a backfill from manifest statistics only (no data file is read).

    Logs the slice table and its warnings (empty or outsized slices); fails when the window
    is outside the source tables' data. Returns the slices (``[SlicePlan.to_dict(), ...]``,
    small and JSON-able) for dynamic task mapping.

    :param config_path: path of the job's kappa.yaml (templated).
    :param snapshot: the snapshot task's XCom (templated; e.g. ``snapshot_task.output``).
    :param backfill_params: parameters (templated; default: the run's Params).
    """

    template_fields: Sequence[str] = (*KappaBackfillBaseOperator.template_fields, "snapshot")

    def __init__(self, *, snapshot: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.snapshot = snapshot

    def execute(self, context: Context) -> list[dict[str, Any]]:

        bf = self.load_backfill(context)
        if not isinstance(self.snapshot, Mapping) or not isinstance(self.snapshot.get("snapshot_ids"), Mapping):
            raise AirflowFailException(
                f"{self.task_id}: snapshot must be the snapshot task's XCom (a dict with 'snapshot_ids'), "
                f"got {self.snapshot!r}"
            )
        if self.snapshot.get("backfill_id") != bf.id:
            raise AirflowFailException(
                f"{self.task_id}: the snapshot is of backfill {self.snapshot.get('backfill_id')!r} but the parameters "
                f"give {bf.id!r}"
            )
        with fail_fast(f"{self.task_id}: plan"):
            plan = plan_slices(bf, {str(k): int(v) for k, v in self.snapshot["snapshot_ids"].items()}, pin=True)
        self.log.info("%s", plan.to_text())
        for s in plan.slices:
            for w in s.warnings:
                self.log.warning("slice %s: %s", s.slice_id, w)
        for w in plan.warnings:
            self.log.warning("%s", w)
        return [s.to_dict() for s in plan.slices]


class KappaModeBranchOperator(BaseBranchOperator, KappaBackfillBaseOperator):
    """Follow the slice task of the backfill's ``mode`` and skip the other one.

    Sequential slices map with ``max_active_tis_per_dagrun=1``, parallel ones with a larger
    bound: both are built at parse time, the mode is chosen per run.

    :param config_path: path of the job's kappa.yaml (templated).
    :param sequential_task_id: the mapped task running sequential slices.
    :param parallel_task_id: the mapped task running parallel slices.
    :param backfill_params: parameters (templated; default: the run's Params).
    """

    def __init__(
        self, *, sequential_task_id: str = SEQUENTIAL_TASK, parallel_task_id: str = PARALLEL_TASK, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.sequential_task_id = sequential_task_id
        self.parallel_task_id = parallel_task_id

    def choose_branch(self, context: Context) -> str:

        bf = self.load_backfill(context)
        chosen = self.sequential_task_id if bf.params.mode == SEQUENTIAL else self.parallel_task_id
        self.log.info("mode %s: slices run in %s", bf.params.mode, chosen)
        return chosen
