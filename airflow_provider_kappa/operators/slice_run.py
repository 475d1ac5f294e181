"""Slice run: one spark-submit of the job's unchanged application for one slice."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow_provider_kappa.backfill.plan import SlicePlan, slice_id
from airflow_provider_kappa.backfill.slices import run_slice, slice_ready
from airflow_provider_kappa.compat.airflow import AirflowFailException, AirflowRescheduleException
from airflow_provider_kappa.engine.processes import stop_running
from airflow_provider_kappa.operators import KappaBackfillBaseOperator, fail_fast
from airflow_provider_kappa.operators.lineage import (
    KappaLineageMixin,
    Lineage,
    parent_job_conf,
    source_tables,
    staging_tables,
)
from airflow_provider_kappa.operators.links import KappaSparkLink, record_slice_links

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_kappa.backfill.plan import SlicePlan

#: Task-instance states after which the previous sequential slice will not succeed by itself.
_GAVE_UP = {"failed", "upstream_failed", "skipped", "removed"}


class KappaSliceRunOperator(KappaLineageMixin, KappaBackfillBaseOperator):
    """Run one backfill slice: clear its staging tables, prepare its checkpoint, spark-submit
    the job with ``availableNow`` over the slice's read range at the pinned snapshots, and log
    rows read, micro-batches, watermark and duration (from Spark's event log).

    Meant to be mapped over the plan task's slices (``.expand(slice_plan=plan.output["sequential"])``).
    A sequential slice starts only after the slice before it succeeded: until then it waits
    (reschedule, freeing its worker slot), and it fails if that slice failed. Retrying or
    clearing a slice reruns it from the checkpoint kept at its start.

    OpenLineage: inputs, the source tables at their pinned snapshots; outputs, the slice's staging
    tables. With OpenLineage configured, the slice's Spark conf names this task's run as the
    parent job (``spark.openlineage.parentJobName``, ``parentRunId``, …): the Spark application
    of engine ``submit`` gets them; a Spark Connect session cannot set them (the server's own apply).

    Catalog properties (credentials) are written only to a 0600 file in a private temporary
    folder; the spark-submit command line carries only the application and a properties file.

    :param config_path: path of the job's kappa.yaml (templated).
    :param slice_plan: one slice of the plan (``SlicePlan.to_dict()``; templated).
    :param backfill_params: parameters (templated; default: the run's Params).
    :param spark_conn_id: Airflow Spark connection to submit through (templated; default: the
        job's ``master`` with a local spark-submit).
    :param wait_interval: the longest wait, in seconds, between checks while waiting for the
        previous slice; the next slice in line checks every ``min_wait_interval`` seconds, a slice
        ``k`` unfinished slices behind every ``k * min_wait_interval`` (capped at ``wait_interval``),
        so a slice starts within seconds of its predecessor's end without the slices further behind
        polling as often.
    :param min_wait_interval: the wait of the next slice in line, in seconds.
    """

    template_fields: Sequence[str] = (*KappaBackfillBaseOperator.template_fields, "slice_plan", "spark_conn_id")
    ui_color = "#fdf0d5"
    operator_extra_links = (KappaSparkLink(),)

    def __init__(
        self,
        *,
        slice_plan: Any,
        spark_conn_id: str | None = None,
        wait_interval: float = 30.0,
        min_wait_interval: float = 2.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.slice_plan = slice_plan
        self.spark_conn_id = spark_conn_id
        self.wait_interval = wait_interval
        self.min_wait_interval = min_wait_interval

    def execute(self, context: Context) -> dict[str, Any]:

        bf = self.load_backfill(context)
        if not isinstance(self.slice_plan, Mapping):
            raise AirflowFailException(
                f"{self.task_id}: slice_plan must be one slice of the plan, got {self.slice_plan!r}"
            )
        with fail_fast(f"{self.task_id}: slice"):
            sp = SlicePlan.from_dict(self.slice_plan)
        context["kappa_slice"] = sp.label  # type: ignore[typeddict-unknown-key]  # for map_index_template
        if not slice_ready(bf, sp):
            self._wait_for_previous(context, sp)
        with fail_fast(f"{self.task_id}: Spark UI link"):
            self.log.info(
                "slice %s: Spark UI %s", sp.slice_id, record_slice_links(context, bf, sp.slice_id) or "(none)"
            )
        for s in sp.stats:
            self.log.info(
                "slice %s plans %s: %d files, ~%d rows, ~%d bytes", sp.slice_id, s.source, s.files, s.rows, s.bytes
            )
        with fail_fast(f"{self.task_id}: slice {sp.slice_id}"):
            result = run_slice(
                bf, sp, spark_conn_id=self.spark_conn_id, extra_conf=parent_job_conf(context, bf.cfg.job.spark_conf)
            )
        self.kappa_lineage = Lineage(bf, source_tables(bf, sp.snapshot_ids), staging_tables(bf, sp.slice_id))
        self.log.info(
            "slice %s (%d/%d) done: rows read %s, rows to sink %s, micro-batches %s, watermark %s, duration %.1fs",
            sp.slice_id,
            sp.index + 1,
            sp.count,
            result["rows_read"],
            result["rows_written"],
            result["batches"],
            result["watermark"] or "-",
            result["seconds"],
        )
        return result

    def on_kill(self) -> None:
        """The task is killed (marked failed or cleared while running, its timeout, SIGTERM): stop the
        slice's Spark application, i.e. its spark-submit's process group, or its Spark Connect runner
        and session (the query stops inside the server). A run not stopped here (the task's process
        SIGKILLed) gets a parent-death signal; and the next attempt takes a new epoch that refuses
        its commits either way."""

        stopped = stop_running()
        self.log.info("on_kill: stopped %s", stopped or "nothing (no Spark run in progress)")

    def _wait_for_previous(self, context: Context, sp: SlicePlan) -> None:
        """Reschedule until the previous slice succeeds; fail if it gave up."""
        from airflow.sdk import timezone

        ti = context["ti"]
        previous = sp.index - 1
        states = ti.get_task_states(dag_id=ti.dag_id, task_ids=[ti.task_id], run_ids=[ti.run_id])
        state = (states.get(ti.run_id) or {}).get(f"{ti.task_id}_{previous}")
        if state in _GAVE_UP:
            raise AirflowFailException(
                f"sequential slice {sp.slice_id} cannot start: slice {slice_id(previous, sp.count)} "
                f"(map index {previous}) is {state}; clear it (and the slices after it) to resume"
            )
        of_run = states.get(ti.run_id) or {}
        behind = sum(1 for i in range(sp.index) if of_run.get(f"{ti.task_id}_{i}") != "success")
        delay = wait_delay(behind, self.min_wait_interval, self.wait_interval)
        self.log.info(
            "sequential slice %s waits for slice %s (state %s; %d unfinished slice(s) before it) to finish; "
            "checking again in %.0fs",
            sp.slice_id,
            slice_id(previous, sp.count),
            state,
            behind,
            delay,
        )
        raise AirflowRescheduleException(timezone.utcnow() + timedelta(seconds=delay))  # type: ignore[no-untyped-call]


def wait_delay(behind: int, shortest: float, longest: float) -> float:
    """Seconds a sequential slice with ``behind`` unfinished slices before it waits before checking
    again: ``behind * shortest``, at least ``shortest``, at most ``longest``."""
    return max(shortest, min(longest, behind * shortest))
