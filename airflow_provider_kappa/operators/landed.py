"""Wait for the landing: the sensor before ``snapshot`` of a scheduled run (a verification's by
default), done once every source's landed data passes the window's ``end + tail``.

A run scheduled at the end of its data interval starts before the data after the interval's end
(its ``tail``) is landed, and ``snapshot`` refuses a read range past the landed data
(:func:`airflow_provider_kappa.backfill.checks.check_landed`). This sensor waits for it instead
(``mode="reschedule"``: no worker slot held between pokes), reading only the sources' manifest
statistics at their current snapshots (:func:`~airflow_provider_kappa.backfill.checks.landed_end`);
with ``allow_open_end`` it is done at once (the run verifies the part the landed data closes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow.sdk import BaseSensorOperator

from airflow_provider_kappa.backfill.checks import falls_short, landed_end
from airflow_provider_kappa.operators import KappaBackfillBaseOperator, fail_fast

if TYPE_CHECKING:
    from airflow.sdk import Context


class KappaLandedSensor(KappaBackfillBaseOperator, BaseSensorOperator):
    """Done when every source's landed data reaches the run's ``end + tail`` (or at once with
    ``allow_open_end``, or when no source has ingestion statistics to tell).

    :param config_path: path of the job's kappa.yaml (templated).
    :param backfill_params: parameters (templated; default: the run's Params and data interval).
    :param kwargs: ``BaseSensorOperator`` arguments (``poke_interval``, ``timeout``, ``mode``, …).
    """

    ui_color = "#f4f1e4"

    def poke(self, context: Context) -> bool:
        """Whether the landed data passes the read range's end (``end + tail``)."""
        bf = self.load_backfill(context)
        p = bf.params
        if p.allow_open_end:
            self.log.info("allow_open_end: not waiting for data up to %s", p.read_end.isoformat())
            return True
        with fail_fast(f"{self.task_id}: landed data"):
            short = falls_short(bf, landed_end(bf))
        if short is None:
            self.log.info("the landed data passes end + tail = %s", p.read_end.isoformat())
            return True
        self.log.info(
            "waiting for the landing: end + tail = %s, source %s (%s) holds ingestion times up to %s, landed through %s",
            p.read_end.isoformat(),
            short.source,
            short.table,
            short.last.isoformat(),
            short.end.isoformat(),
        )
        return False
