"""The engine of a job: :func:`engine_for` picks the class for ``job.engine``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from airflow_provider_kappa.engine.base import Engine
from airflow_provider_kappa.engine.connect import ConnectEngine
from airflow_provider_kappa.engine.submit import SubmitEngine
from airflow_provider_kappa.job.checkpoints import CheckpointStore
from airflow_provider_kappa.job.config import SUBMIT, JobConfig


def engine_for(
    cfg: JobConfig,
    *,
    state_file: Path,
    store: CheckpointStore,
    spark_conn_id: str | None = None,
    submit_fn: Callable[..., None] | None = None,
    connect_url: str | None = None,
) -> Engine:
    """The engine of ``cfg`` (``job.engine``).

    :param cfg: the job config.
    :param state_file: engine connect: the state file of the server kappa owns for the backfill.
    :param store: the backfill's checkpoint folders.
    :param spark_conn_id: engine submit: an Airflow Spark connection (default: ``job.master``).
    :param submit_fn: replaces spark-submit (tests); given, the submit engine runs whatever
        ``job.engine`` says.
    :param connect_url: engine connect: the server to use (default: ``job.connect``, else the
        kappa-owned one).
    """
    if submit_fn is not None or cfg.job.engine == SUBMIT:
        return SubmitEngine(cfg, conn_id=spark_conn_id, submit_fn=submit_fn)
    return ConnectEngine(cfg, state_file=state_file, store=store, url=connect_url)
