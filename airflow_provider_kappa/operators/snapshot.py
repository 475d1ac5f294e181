"""Snapshot: validate the parameters, pin and tag the current snapshot of every source table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_kappa.backfill.checks import check_inputs
from airflow_provider_kappa.backfill.snapshot import snapshot
from airflow_provider_kappa.operators import PERMANENT_INPUT, KappaBackfillBaseOperator, fail_fast
from airflow_provider_kappa.operators.lineage import KappaLineageMixin, Lineage, source_tables
from airflow_provider_kappa.timeparse import parse_duration

if TYPE_CHECKING:
    from airflow.sdk import Context


class KappaSnapshotOperator(KappaLineageMixin, KappaBackfillBaseOperator):
    """First task of a backfill: checks every parameter (the checks a Params schema cannot make,
    such as ``end`` after ``start``, fail here before any Spark run), checks the tables and the
    application (:func:`~airflow_provider_kappa.backfill.checks.check_inputs`), locks the targets' window, then pins the current
    snapshot of each source table with the Iceberg tag ``kappa-<backfill_id>`` so that expiry
    cannot remove it. A rerun with the same parameters reuses the tag's snapshot.

    XCom: ``{"backfill_id", "tag", "snapshot_ids": {source: id}, "params": {...}}`` (no credentials).

    OpenLineage: inputs, the source tables at their pinned snapshots (:mod:`~airflow_provider_kappa.operators.lineage`).

    :param config_path: path of the job's kappa.yaml (templated).
    :param backfill_params: parameters (templated; default: the run's Params).
    :param tag_retention: ``max-ref-age`` of the tag, a duration such as ``7d`` (templated).
    :param spark_conn_id: the Spark connection the slices submit through, as given to the slice
        tasks (templated; only which master the input checks look at depends on it).
    """

    template_fields: Sequence[str] = (*KappaBackfillBaseOperator.template_fields, "tag_retention", "spark_conn_id")

    def __init__(self, *, tag_retention: str = "7d", spark_conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tag_retention = tag_retention
        self.spark_conn_id = spark_conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow.configuration import conf

        bf = self.load_backfill(context)
        with fail_fast(f"{self.task_id}: inputs", PERMANENT_INPUT):
            # one mapped slice task per slice: more than max_map_length could never run
            max_slices = conf.getint("core", "max_map_length", fallback=1024)
            check_inputs(bf, max_slices=max_slices, spark_conn_id=self.spark_conn_id)
        with fail_fast(f"{self.task_id}: snapshot"):
            retention = parse_duration(self.tag_retention, "tag_retention")
            self.log.info("backfill %s: parameters %s", bf.id, bf.params.to_dict())
            snapshot_ids = snapshot(bf, retention=retention)
        for name, snap in snapshot_ids.items():
            self.log.info("source %s: snapshot %s pinned by tag %s", name, snap, bf.tag)
        self.kappa_lineage = Lineage(bf, inputs=source_tables(bf, snapshot_ids))
        return {"backfill_id": bf.id, "tag": bf.tag, "snapshot_ids": snapshot_ids, "params": bf.params.to_dict()}
