"""The engine interface: what a backfill asks of the engine its slices run on.

A backfill holds one :class:`Engine` for its whole run (``kappa backfill``) or one per task (the
Airflow operators): :meth:`Engine.start` before the first slice (a local Spark Connect server
started and warmed; nothing for spark-submit), :meth:`Engine.run` once per slice
(:meth:`Engine.last_slice` before the last), :meth:`Engine.stop` at the end (also on failure),
:meth:`Engine.kill` from another thread or a signal handler (an Airflow task's ``on_kill``). The engines are
:class:`~airflow_provider_kappa.engine.submit.SubmitEngine` and
:class:`~airflow_provider_kappa.engine.connect.ConnectEngine`; :func:`engine_for` in
:mod:`~airflow_provider_kappa.engine.engines` picks the job's.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_provider_kappa.engine.processes import stop_running


@dataclass(frozen=True)
class SliceRunRequest:
    """One run of the job's unchanged application for one slice.

    :param application: the job's Python file.
    :param conf: the run's whole Spark conf (``spark.kappa.*`` included).
    :param private: a private (0700) folder of the run, removed after it.
    :param name: the run's name (logs, the Spark application name).
    :param slice_id: the slice.
    :param epoch: the attempt's epoch (:meth:`~airflow_provider_kappa.job.checkpoints.CheckpointStore.new_epoch`).
    """

    application: str
    conf: Mapping[str, str]
    private: Path
    name: str
    slice_id: str
    epoch: str


class Engine(ABC):
    """Where and how a slice's Spark run happens."""

    #: ``job.engine``'s value for this engine.
    name: str

    def start(self) -> None:  # noqa: B027 - a no-op by default on purpose
        """Get ready for the slices (idempotent). The default does nothing."""

    def last_slice(self) -> None:  # noqa: B027 - a no-op by default on purpose
        """The next :meth:`run` is the backfill's last: nothing need be made ready for a slice after it.
        The default does nothing."""

    def before_attempt(self, slice_id: str) -> None:  # noqa: B027
        """Before a new attempt of ``slice_id``: release what an earlier attempt left running. The
        default does nothing."""

    @abstractmethod
    def run(self, request: SliceRunRequest) -> list[dict[str, Any]]:
        """Run one slice; return its ``StreamingQueryProgress`` records, in order.

        :param request: the run.
        :raises KappaEngineError: the run failed (the tail of its output in the message).
        """

    def stop(self) -> None:  # noqa: B027
        """Stop what :meth:`start` started (idempotent). The default does nothing."""

    def discard(self) -> None:
        """Stop what :meth:`start` started and remove what it wrote: the backfill was refused while
        the engine started (``kappa backfill`` checks the tables beside the start). The default stops."""
        self.stop()

    def kill(self) -> list[str]:
        """Stop the runs in progress in this process (its spark-submit process group, its Spark
        Connect runner and session); what was stopped, for the log."""
        return stop_running()
