"""Continuous verification: the last tasks of a verification DAG
(:func:`airflow_provider_kappa.dag.kappa_verify_dag`), a replay with ``publish: false`` compared with live.

- ``verify`` (:class:`KappaVerifyOperator`): validates like ``validate`` and writes the report
  (its **Backfill report** link), but does not fail on a low match: it returns the verification's
  summary (:func:`airflow_provider_kappa.backfill.verify.verification`).
- ``drift`` (:class:`KappaDriftOperator`): on drift, succeeds and records one asset event on the
  job's drift asset (:func:`drift_asset`, ``kappa://<job>/drift``) whose ``extra`` is that summary;
  without drift it is skipped, and records none. Airflow records a task's asset events only when
  it succeeds, hence a task of its own before the gate.
- ``verify_gate`` (:class:`KappaVerifyGateOperator`): fails the run on drift, naming the sinks
  and the drifting windows; succeeds otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset, BaseOperator

from airflow_provider_kappa.backfill.verify import drift_text, verification
from airflow_provider_kappa.compat.airflow import AirflowFailException, AirflowSkipException
from airflow_provider_kappa.operators.links import KappaReportLink, record_report_url
from airflow_provider_kappa.operators.validate import KappaValidateOperator

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_kappa.backfill.backfill import Backfill

#: Scheme of the asset a verification records drift on (``kappa://<job>/drift``).
DRIFT_SCHEME = "kappa"


def drift_asset(job: str) -> Asset:
    """The asset a verification of job ``job`` records an event on when live output drifts:
    ``kappa://<job>/drift`` (its name is its URI). Schedule an alerting or repair DAG on it; the
    event's ``extra`` is the verification's summary (the drifting windows per sink).

    :param job: the job's name (``job.name`` of kappa.yaml).
    """
    if not job:
        raise ValueError("drift asset: the job's name is empty")
    return Asset(f"{DRIFT_SCHEME}://{job}/drift")


class KappaVerifyOperator(KappaValidateOperator):
    """Compare the replay's staged rows with the targets' live rows for the window and return the
    verification's summary (:func:`~airflow_provider_kappa.backfill.verify.verification`): per sink,
    the match rate and the drifting output windows. A low match does not fail this task (the
    ``drift`` and ``verify_gate`` tasks after it record the event and fail the run); bad input and
    unreadable tables do. ``min_match`` unset is 100
    (:meth:`~airflow_provider_kappa.backfill.params.BackfillParams.min_match_for`), also in the HTML report.

    :param config_path: path of the job's kappa.yaml (templated).
    :param plan: the plan task's XCom (templated).
    :param backfill_params: parameters (templated; default: the run's Params).
    """

    ui_color = "#e8eef8"

    def load_backfill(self, context: Context) -> Backfill:
        """The backfill of the run's parameters, with the verification's ``min_match``."""
        bf = super().load_backfill(context)
        if bf.params.publishes:
            raise AirflowFailException(
                f"{self.task_id}: backfill parameter publish: {bf.params.publish!r}, but a verification never "
                "publishes; allowed: false (the verification DAG's default)"
            )
        return replace(bf, params=replace(bf.params, min_match=bf.params.min_match_for(verification=True)))

    def execute(self, context: Context) -> dict[str, Any]:

        bf, _, reports, url = self.compare(context)
        summary = verification(bf, reports, report_url=url)
        self.log.info("%s", drift_text(summary))
        return summary


class _VerificationTask(BaseOperator):
    """A task reading the verify task's summary (``verification``, templated), checked, with the
    report's **Backfill report** link."""

    template_fields: Sequence[str] = ("verification",)
    operator_extra_links = (KappaReportLink(),)
    ui_color = "#f8ece8"

    def __init__(self, *, verification: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.verification = verification

    def summary(self, context: Context) -> Mapping[str, Any]:
        """The verify task's summary, checked; its report's link kept for this task."""
        value = self.verification
        if not isinstance(value, Mapping) or not isinstance(value.get("drift"), bool):
            raise AirflowFailException(
                f"{self.task_id}: verification must be the verify task's XCom (a mapping with a boolean "
                f"'drift'), got {value!r}"
            )
        record_report_url(context, str(value.get("report") or ""))
        return value


class KappaDriftOperator(_VerificationTask):
    """Record the drift a verification found as an asset event: succeeds on drift, with the
    verification's summary as the ``extra`` of the event on each of its asset ``outlets`` (the
    DAG factory gives it :func:`drift_asset`); skipped without drift (no event).

    :param verification: the verify task's XCom (templated).
    """

    def execute(self, context: Context) -> None:

        summary = self.summary(context)
        if not summary["drift"]:
            raise AirflowSkipException(f"no drift: {drift_text(summary)}")
        extra = dict(summary)
        for asset in self.outlets:
            if isinstance(asset, Asset):
                context["outlet_events"][asset].extra = extra
                self.log.info("asset %s: drift event recorded", asset.uri)
        self.log.info("%s", drift_text(summary))


class KappaVerifyGateOperator(_VerificationTask):
    """Fail the verification's run when live output drifts (no retry), naming each drifting sink,
    its match rate and its drifting windows; succeed otherwise.

    :param verification: the verify task's XCom (templated).
    """

    def execute(self, context: Context) -> None:

        summary = self.summary(context)
        if summary["drift"]:
            raise AirflowFailException(drift_text(summary))
        self.log.info("%s", drift_text(summary))
