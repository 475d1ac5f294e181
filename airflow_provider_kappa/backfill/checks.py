"""Input checks of a backfill, made before anything is written (no lock, no tag, no checkpoint,
no staging table): the job's application file, and the tables it reads and writes (opening them
also proves the catalogs can be reached). ``kappa plan`` checks only the source tables.

No Airflow import here; pyiceberg is imported inside functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from airflow_provider_kappa.backfill.catalogs import CatalogFor
from airflow_provider_kappa.backfill.config import IcebergSourceConfig, JobConfig
from airflow_provider_kappa.exceptions import KappaConfigError, KappaSinkError, KappaSourceError

if TYPE_CHECKING:
    from airflow_provider_kappa.backfill.steps import Backfill


def check_inputs(bf: Backfill, *, runs: bool = True) -> None:
    """Refuse bad input before anything is written (no lock, no tag, no checkpoint): the source
    tables read must exist with a timestamp ingestion column (opening them proves the catalogs
    can be reached); a backfill that runs (``runs``) also needs the job's application file and
    every sink's target table with a time ``time_column``. ``kappa plan`` checks only sources.

    :param bf: the backfill.
    :param runs: the backfill will run the job (``kappa backfill``, the DAG's snapshot task).
    :raises KappaConfigError: a missing application, an unreachable catalog.
    :raises KappaSourceError: a missing source table or ingestion column.
    :raises KappaSinkError: a missing target table or ``time_column``.
    """
    if runs:
        check_application(bf.cfg)
    check_tables(bf.cfg, bf.params.sources, bf.catalog_for, sinks=runs)


def check_application(cfg: JobConfig) -> Path:
    """The job's application file, checked to exist before a backfill writes anything.

    :param cfg: the job config.
    :raises KappaConfigError: ``job.application`` is not an existing file.
    """
    app = cfg.job.application
    if not app.is_file():
        what = "is a folder" if app.is_dir() else "does not exist"
        raise KappaConfigError(
            f"job.application: {str(app)!r} {what}; expected the job's Python file "
            f"(a relative path is resolved against {str(cfg.path.parent)!r})"
        )
    return app


def check_tables(
    cfg: JobConfig, sources: Sequence[str], catalog_for: CatalogFor, *, sinks: bool = True
) -> None:
    """Refuse a backfill whose tables are not there, before it writes anything (no tag, no
    checkpoint, no staging table): every source read must be an existing table whose ingestion
    column is a ``timestamptz`` (or ``timestamp``), and every sink's target an existing table
    whose ``time_column`` is a ``timestamptz``, ``timestamp`` or ``date``.

    Opening the catalogs also proves they can be reached.

    :param cfg: the job config.
    :param sources: job source names the backfill reads (``BackfillParams.sources``).
    :param catalog_for: opens a catalog of the job by name (``Backfill.catalog_for``).
    :param sinks: check the sinks' target tables too (``kappa plan`` reads only the sources).
    :raises KappaConfigError: a catalog that cannot be loaded (from ``catalog_for``).
    :raises KappaSourceError: a missing source table, or a missing/non-timestamp ingestion column.
    :raises KappaSinkError: a missing target table, or a missing/non-time ``time_column``.
    """
    from pyiceberg.types import DateType, TimestampType, TimestamptzType

    from airflow_provider_kappa.spark.catalog import load_table
    from airflow_provider_kappa.spark.source.snapshots import ingestion_field

    for name in sources:
        src = cfg.resolve(name, backfill=True)
        if not isinstance(src, IcebergSourceConfig):  # resolve() refuses this already; keeps mypy honest
            raise KappaSourceError(f"source {name}: {src.name!r} is not an iceberg source")
        try:
            table = load_table(catalog_for(src.catalog), src.table)
        except KappaSourceError as e:
            raise KappaSourceError(f"source {name} ({src.name}): {e}") from e
        ingestion_field(table.schema(), src.ingestion_column, src.table)
    for name, sink in cfg.sinks.items() if sinks else ():
        try:
            table = load_table(catalog_for(sink.catalog), sink.table)
        except KappaSourceError as e:
            raise KappaSinkError(f"sink {name}: target {e}; create it before backfilling into it") from e
        schema = table.schema()
        if sink.time_column not in schema.column_names:
            raise KappaSinkError(
                f"sink {name}: time_column {sink.time_column!r} is not a column of {sink.table!r}; "
                f"columns: {schema.column_names}"
            )
        ftype = schema.find_field(sink.time_column).field_type
        if not isinstance(ftype, (TimestamptzType, TimestampType, DateType)):
            raise KappaSinkError(
                f"sink {name}: time_column {sink.time_column!r} of {sink.table!r} has type {ftype}; "
                "expected timestamptz, timestamp or date"
            )
