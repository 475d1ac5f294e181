"""A backfill: one run of a job over a window, as every step takes it (:class:`Backfill`).

The steps have their own modules: :mod:`~airflow_provider_kappa.backfill.checks` (input checks,
before anything is written), :mod:`~airflow_provider_kappa.backfill.snapshot` (pin and tag the
sources' snapshots, lock the targets' window through :mod:`~airflow_provider_kappa.backfill.lock`),
:mod:`~airflow_provider_kappa.backfill.plan`, :mod:`~airflow_provider_kappa.backfill.slices`,
:mod:`~airflow_provider_kappa.backfill.validate`, :mod:`~airflow_provider_kappa.backfill.publish`,
:mod:`~airflow_provider_kappa.backfill.summary` and :mod:`~airflow_provider_kappa.backfill.cleanup`.
The Airflow operators and ``kappa backfill`` both call them (one code path). No Airflow import.

Credentials: catalog properties (:mod:`~airflow_provider_kappa.job.catalogs`) are read only to
open catalogs in this process and to write the 0600 catalogs file of a slice run
(:func:`airflow_provider_kappa.engine.launch.write_catalogs_file`), in a private temporary folder
removed after the run. Return values (XCom) hold ids, times, counts and table names only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_provider_kappa.backfill.params import BackfillParams, backfill_id, parse_params
from airflow_provider_kappa.job.catalogs import CatalogFor, job_catalogs
from airflow_provider_kappa.job.checkpoints import CheckpointStore, backfill_root, connect_state_path
from airflow_provider_kappa.job.config import IcebergSinkConfig, IcebergSourceConfig, JobConfig
from airflow_provider_kappa.spark.staging import staging_table_name


def tag_name(backfill_id: str) -> str:
    """``kappa-<backfill_id>``: the Iceberg tag pinning a backfill's source snapshots."""
    return f"kappa-{backfill_id}"


@dataclass(frozen=True)
class Backfill:
    """One backfill of a job: its config, validated parameters and id.

    :param cfg: the job config.
    :param params: validated parameters.
    :param id: the deterministic backfill id.
    :param catalog_for: opens a catalog of the job by name.
    :param plans: the plans made so far, by their snapshot ids (the pre-flight's plan handed on to
        the plan step: :func:`~airflow_provider_kappa.backfill.plan.plan`).
    """

    cfg: JobConfig
    params: BackfillParams
    id: str
    catalog_for: CatalogFor
    plans: dict[tuple[tuple[str, int], ...], Any] = field(default_factory=dict, compare=False, hash=False, repr=False)

    @classmethod
    def create(cls, cfg: JobConfig, raw_params: Mapping[str, Any], catalog_for: CatalogFor | None = None) -> Backfill:
        """Validate ``raw_params`` for ``cfg`` and derive the backfill id.

        :param cfg: the job config.
        :param raw_params: parameters (CLI flags, DAG params).
        :param catalog_for: catalog loader (default
            :func:`~airflow_provider_kappa.job.catalogs.job_catalogs`).
        :raises KappaConfigError: for any bad parameter.
        """
        params = parse_params(cfg, raw_params)
        return cls(cfg, params, backfill_id(cfg, params), catalog_for or job_catalogs(cfg))

    @property
    def tag(self) -> str:
        """Name of the Iceberg tag pinning the source snapshots."""
        return tag_name(self.id)

    def sources(self) -> dict[str, IcebergSourceConfig]:
        """Job source name -> the iceberg candidate the backfill reads."""
        out = {}
        for name in self.params.sources:
            src = self.cfg.resolve(name, backfill=True)
            assert isinstance(src, IcebergSourceConfig)
            out[name] = src
        return out

    def store(self) -> CheckpointStore:
        """The backfill's checkpoint folders."""
        return CheckpointStore(backfill_root(self.cfg.job.checkpoint_root, self.cfg.job.name, self.id))

    def staging_table(self, sink: IcebergSinkConfig, slice_id: str) -> str:
        """Staging table of ``sink`` for one slice."""
        return staging_table_name(sink.table, self.id, slice_id, self.cfg.job.staging_namespace)

    def connect_state_file(self) -> Path:
        """The state file of the Spark Connect server kappa owns for this backfill (see
        :class:`~airflow_provider_kappa.engine.connect_server.LocalConnectServer`)."""
        return connect_state_path(self.store().root, self.id)
