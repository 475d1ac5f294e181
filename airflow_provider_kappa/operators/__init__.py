"""Airflow operators of a Kappa backfill: snapshot, plan, slice run, validate, publish.

Each is a thin shell over the backfill steps (:mod:`airflow_provider_kappa.backfill.checks`,
``.snapshot``, ``.steps``, ``.finish``: the code path ``kappa backfill`` runs too). Parameters come from the DAG run's Params unless ``backfill_params`` is given;
``template_fields`` are assigned verbatim in ``__init__`` and validated in ``execute``.
Bad input (parameters, config, a window outside the data, a failed validation) fails the task
without retries (``AirflowFailException``); other errors are raised as they are, so Airflow
retries them (``retries`` of the task): Spark runs, and transient catalog and storage faults
(:func:`airflow_provider_kappa.faults.transient_cause`: connection refused, timeouts, a REST
catalog's 5xx, a locked sqlite catalog, storage I/O, commit conflicts), even when a step wrapped
them into one of its own errors.

Start and end: the run's Params (or ``backfill_params``); when both are empty and the run has a
data interval (a scheduled run, an Airflow backfill), its ``data_interval_start`` and
``data_interval_end``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_provider_kappa.backfill.backfill import Backfill
from airflow_provider_kappa.backfill.exactness import Exactness
from airflow_provider_kappa.backfill.params import KEYS
from airflow_provider_kappa.backfill.plan import BackfillPlan, SlicePlan
from airflow_provider_kappa.compat.airflow import AirflowFailException
from airflow_provider_kappa.exceptions import (
    KappaConcurrencyError,
    KappaConfigError,
    KappaSinkError,
    KappaSourceError,
    KappaValidationError,
)
from airflow_provider_kappa.faults import transient_cause
from airflow_provider_kappa.job.config import load_config

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_kappa.backfill.backfill import Backfill
    from airflow_provider_kappa.backfill.plan import BackfillPlan

#: Errors a retry cannot fix (a refusal by another backfill's lock included: it lasts until
#: that backfill publishes, far longer than a retry delay).
PERMANENT: tuple[type[Exception], ...] = (
    KappaConfigError,
    KappaSourceError,
    KappaValidationError,
    KappaConcurrencyError,
)

#: Also permanent while checking the inputs, before anything is written (a missing target table
#: or ``time_column``); later, a sink error can be transient (publish conflicts beyond retries).
PERMANENT_INPUT = (*PERMANENT, KappaSinkError)


@contextmanager
def fail_fast(what: str, permanent: tuple[type[Exception], ...] = PERMANENT) -> Iterator[None]:
    """Turn bad-input errors into ``AirflowFailException`` (no retry), keeping the message.

    An error of a ``permanent`` type whose chain holds a transient fault (a ``KappaConfigError``
    raised ``from`` a refused connection, say) is raised as it is, for Airflow to retry.

    :param what: the step, for the message.
    :param permanent: the exception types a retry cannot fix.
    """
    try:
        yield
    except permanent as e:
        if transient_cause(e) is not None:
            raise
        raise AirflowFailException(f"{what}: {type(e).__name__}: {e}") from e


class KappaBackfillBaseOperator(BaseOperator):
    """Common parts of the backfill operators.

    :param config_path: path of the job's kappa.yaml (templated).
    :param backfill_params: backfill parameters (templated); default: the DAG run's Params
        (``start``, ``end``, ``sources``, ``slice``, …).
    """

    template_fields: Sequence[str] = ("config_path", "backfill_params")
    ui_color = "#e8f4ea"

    def __init__(self, *, config_path: str, backfill_params: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.config_path = config_path
        self.backfill_params = backfill_params

    def raw_params(self, context: Context) -> dict[str, Any]:
        """The parameters to validate: ``backfill_params`` if given, else the run's Params."""
        if self.backfill_params is not None:
            if not isinstance(self.backfill_params, Mapping):
                raise AirflowFailException(
                    f"{self.task_id}: backfill_params must be a mapping of parameters, got {self.backfill_params!r}"
                )
            return dict(self.backfill_params)
        params = context.get("params") or {}
        return {k: params[k] for k in KEYS if k in params}

    def window_params(self, context: Context) -> dict[str, Any]:
        """:meth:`raw_params`, with ``start`` and ``end`` taken from the run's data interval when
        both are empty and the interval is not (a run of a scheduled DAG, an Airflow backfill).
        A manual run of an unscheduled DAG has an empty interval: it must give start and end."""
        raw = self.raw_params(context)
        if _blank(raw.get("start")) and _blank(raw.get("end")):
            start, end = context.get("data_interval_start"), context.get("data_interval_end")
            if start is not None and end is not None and start < end:
                raw["start"], raw["end"] = start.isoformat(), end.isoformat()
                self.log.info("start and end from the run's data interval: [%s, %s)", raw["start"], raw["end"])
            else:
                raise AirflowFailException(
                    f"{self.task_id}: backfill parameters start and end are empty and this run has no data interval "
                    f"(data_interval_start {start}, data_interval_end {end}); trigger it with start and end, "
                    "ISO-8601 timestamps with an offset, e.g. 2026-11-01T00:00:00+00:00, or schedule the DAG "
                    "(kappa_backfill_dag(..., schedule=...)) so that its runs cover their data intervals"
                )
        return raw

    def load_backfill(self, context: Context) -> Backfill:
        """Load the config and validate the parameters (fails fast on bad input)."""

        if not isinstance(self.config_path, str) or not self.config_path:
            raise AirflowFailException(
                f"{self.task_id}: config_path must be the path of a kappa.yaml, got {self.config_path!r}"
            )
        with fail_fast(f"{self.task_id}: backfill parameters"):
            cfg = load_config(self.config_path)
            return Backfill.create(cfg, self.window_params(context))

    @staticmethod
    def load_plan(value: Any, bf: Backfill, what: str) -> BackfillPlan:
        """The slices pushed by the plan task, checked to belong to this backfill."""

        if not isinstance(value, (list, tuple)) or not value or not all(isinstance(s, Mapping) for s in value):
            raise AirflowFailException(f"{what}: plan must be the plan task's XCom (a list of slices), got {value!r}")
        with fail_fast(what):
            slices = tuple(SlicePlan.from_dict(s) for s in value)
            recorded = bf.store().exactness()  # the plan step's statement (its XCom holds the slices only)
            exactness = None if recorded is None else Exactness.from_dict(recorded)
            plan = BackfillPlan(slices[0].backfill_id, slices[0].mode, slices, exactness=exactness)
        if plan.backfill_id != bf.id:
            raise AirflowFailException(
                f"{what}: the plan is of backfill {plan.backfill_id!r} but the parameters give {bf.id!r}"
            )
        return plan


def _blank(value: object) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())
