"""Publish: one atomic Iceberg commit per sink replacing the window with the staged rows, and
one Airflow asset event per target table, so DAGs scheduled on that table run after a backfill."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset

from airflow_provider_kappa.backfill.checks import closed_end
from airflow_provider_kappa.backfill.publish import publish
from airflow_provider_kappa.backfill.summary import summary
from airflow_provider_kappa.backfill.validate import pinned
from airflow_provider_kappa.compat.airflow import AirflowFailException, AirflowSkipException
from airflow_provider_kappa.operators import KappaBackfillBaseOperator, fail_fast
from airflow_provider_kappa.operators.lineage import KappaLineageMixin, Lineage, source_tables, target_tables
from airflow_provider_kappa.operators.links import KappaReportLink, record_report_link

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_kappa.job.config import JobConfig

#: Scheme of the asset URI of an Iceberg table (``iceberg://<catalog>/<namespace>/<table>``).
ASSET_SCHEME = "iceberg"


def target_asset_uri(catalog: str, table: str) -> str:
    """The asset URI of table ``table`` (``namespace.table``) of catalog ``catalog``:
    ``iceberg://<catalog>/<namespace>/<table>`` (a nested namespace keeps its dots: ``a.b``).

    :param catalog: the catalog's name under ``catalogs:`` of kappa.yaml.
    :param table: the table, ``namespace.table``.
    """
    namespace, _, name = table.rpartition(".")
    if not namespace or not name or not catalog:
        raise ValueError(f"asset of table {table!r} in catalog {catalog!r}: expected a catalog and a 'namespace.table'")
    return f"{ASSET_SCHEME}://{catalog}/{namespace}/{name}"


def target_asset(catalog: str, table: str) -> Asset:
    """The Airflow asset of an Iceberg table, the one a backfill's publish task updates (its name
    is its URI): schedule a downstream DAG on it, e.g.
    ``DAG(..., schedule=[target_asset("lake", "prod.playback_sessions")])``.

    :param catalog: the catalog's name under ``catalogs:`` of kappa.yaml.
    :param table: the table, ``namespace.table``.
    """
    return Asset(target_asset_uri(catalog, table))


def sink_assets(cfg: JobConfig) -> dict[str, Asset]:
    """Sink name -> the asset of its target table, for every sink of the job (no I/O).

    :param cfg: the job config.
    """
    return {name: target_asset(sink.catalog, sink.table) for name, sink in cfg.sinks.items()}


class KappaPublishOperator(KappaLineageMixin, KappaBackfillBaseOperator):
    """Last task of a backfill: replace each sink's window ``[start, end)`` with the staged rows
    (one atomic commit per sink, retried on conflicts; rows outside the window and live
    appends are kept), then log the summary: slices, rows, throughput, match rate, published
    rows. With ``dry_run`` or ``publish`` off it logs the summary and is skipped.

    Assets: give it the targets' assets as ``outlets`` (:func:`sink_assets`; the DAG factory
    does): when it succeeds, Airflow records one event per target table, whose extra holds
    ``backfill_id``, ``job``, ``sink``, ``table``, the window ``start`` and ``end`` (ISO-8601)
    and the published ``snapshot_id``. A skipped publish (dry run, publish off) records none.

    OpenLineage: inputs, the source tables at the snapshots the backfill pinned; outputs, the
    target tables at the snapshots this task committed (:mod:`~airflow_provider_kappa.operators.lineage`).

    :param config_path: path of the job's kappa.yaml (templated).
    :param plan: the plan task's XCom (templated).
    :param report: the validate task's XCom (templated).
    :param backfill_params: parameters (templated; default: the run's Params).
    """

    template_fields: Sequence[str] = (*KappaBackfillBaseOperator.template_fields, "plan", "report")
    operator_extra_links = (KappaReportLink(),)

    def __init__(self, *, plan: Any, report: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plan = plan
        self.report = report

    def execute(self, context: Context) -> dict[str, Any]:

        bf = self.load_backfill(context)
        plan = self.load_plan(self.plan, bf, self.task_id)
        with fail_fast(f"{self.task_id}: report link"):
            record_report_link(context, bf)  # the report the validate task wrote
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
        with fail_fast(f"{self.task_id}: published window"):
            end = closed_end(bf, pinned(plan))  # allow_open_end: the part the landed data closes
        with fail_fast(f"{self.task_id}: publish"):
            results = {name: asdict(r) for name, r in publish(bf, plan).items()}
        committed = {name: r.get("snapshot_id") for name, r in results.items()}
        self.kappa_lineage = Lineage(bf, source_tables(bf, plan.slices[0].snapshot_ids), target_tables(bf, committed))
        self.log.info("%s", summary(bf, plan, slice_results, self.report, results))
        self._record_asset_events(context, bf.cfg, bf.id, bf.params.start.isoformat(), end.isoformat(), results)
        return results

    def _record_asset_events(
        self, context: Context, cfg: JobConfig, backfill_id: str, start: str, end: str, results: Mapping[str, Any]
    ) -> None:
        """Put the window published (``end`` clipped by ``allow_open_end`` to what the landed data
        closes), the published snapshot and the backfill id on the asset event of each target table
        among this task's outlets (Airflow records the events when the task succeeds)."""
        outlets = {a.uri for a in self.outlets if isinstance(a, Asset)}
        for name, asset in sink_assets(cfg).items():
            if asset.uri not in outlets:
                continue
            extra = {
                "backfill_id": backfill_id,
                "job": cfg.job.name,
                "sink": name,
                "table": cfg.sinks[name].table,
                "start": start,
                "end": end,
                "snapshot_id": results[name].get("snapshot_id"),
            }
            context["outlet_events"][asset].extra = extra
            self.log.info("asset %s: event %s", asset.uri, extra)
