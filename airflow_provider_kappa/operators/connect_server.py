"""The Spark Connect server a backfill owns (``job.engine: connect`` without ``job.connect``):
started by a setup task before the slices, stopped by a teardown task after them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_kappa.compat.airflow import AirflowFailException
from airflow_provider_kappa.engine.connect_server import ensure_server, redact_url, stop_owned
from airflow_provider_kappa.engine.shared_server import read_sessions, remove_sessions
from airflow_provider_kappa.operators import KappaBackfillBaseOperator, fail_fast

if TYPE_CHECKING:
    from airflow.sdk import Context

START = "start"
STOP = "stop"


class KappaConnectServerOperator(KappaBackfillBaseOperator):
    """Start (``action="start"``) or stop (``action="stop"``) the local Spark Connect server of a
    backfill, for a single-machine deployment whose job sets ``engine: connect`` and no
    ``job.connect``.

    The server runs on 127.0.0.1 in its own process group, recorded in a state file in the
    backfill's checkpoint folder (URL, pid, log). Every slice task reads it; a slice that finds the
    server gone (killed mid-slice) starts a new one there before its run, so a retry ends exact.
    The slice tasks recycle it every ``KAPPA_CONNECT_RECYCLE_EVERY`` sessions (default 50) when none
    runs (:mod:`airflow_provider_kappa.engine.shared_server`).
    Start reuses a live server of the same backfill (a rerun); stop is idempotent. In the DAG, the
    start task is a setup task and the stop task its teardown, so the server is stopped whether the
    slices succeed or fail.

    :param config_path: path of the job's kappa.yaml (templated).
    :param action: ``start`` or ``stop``.
    :param backfill_params: parameters (templated; default: the run's Params).
    """

    template_fields: Sequence[str] = (*KappaBackfillBaseOperator.template_fields, "action")
    ui_color = "#dbe9f6"

    def __init__(self, *, action: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.action = action

    def execute(self, context: Context) -> dict[str, Any] | None:

        if self.action not in (START, STOP):
            raise AirflowFailException(
                f"{self.task_id}: action {self.action!r} is not an action; allowed: {[START, STOP]}"
            )
        bf = self.load_backfill(context)
        state_file = bf.connect_state_file()
        if self.action == STOP:
            recycled = read_sessions(state_file)["recycled"]
            stop_owned(state_file)
            remove_sessions(state_file)
            self.log.info(
                "backfill %s: local Spark Connect server stopped (state file %s); the slice tasks recycled it %d time(s)",
                bf.id,
                state_file,
                recycled,
            )
            return None
        with fail_fast(f"{self.task_id}: Spark Connect server"):
            state = ensure_server(bf.cfg, state_file)
        self.log.info(
            "backfill %s: local Spark Connect server %s (pid %d), log %s",
            bf.id,
            redact_url(state.url),
            state.pid,
            state.log,
        )
        return {"url": redact_url(state.url), "pid": state.pid}
