"""Offsets and read limits of the ``kappa_iceberg`` reader, shared by its two modes.

Bounded offsets are ingestion positions ``{"pos": micros}``; tail offsets are
``{"snapshot_id", "sequence_number"}`` of the last snapshot read (``-1`` before the first).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_kappa.compat.pyspark import streaming_source_api
from airflow_provider_kappa.exceptions import KappaSourceError
from airflow_provider_kappa.spark.source.options import IcebergReadSpec

if TYPE_CHECKING:
    from pyspark.sql.streaming.datasource import ReadLimit

NO_SNAPSHOT = -1
#: the installed pyspark's read limits (pyspark 4.0 and 4.1: kappa's stand-ins, :mod:`airflow_provider_kappa.compat.pyspark`)
API = streaming_source_api()


def default_limit(spec: IcebergReadSpec) -> ReadLimit:
    """The :class:`ReadLimit` the options ask for (``ReadAllAvailable`` by default)."""
    if spec.max_files_per_batch is not None:
        return API.ReadMaxFiles(spec.max_files_per_batch)  # type: ignore[no-any-return]
    if spec.max_rows_per_batch is not None:
        return API.ReadMaxRows(spec.max_rows_per_batch)  # type: ignore[no-any-return]
    if spec.max_bytes_per_batch is not None:
        return API.ReadMaxBytes(spec.max_bytes_per_batch)  # type: ignore[no-any-return]
    return API.ReadAllAvailable()  # type: ignore[no-any-return]


def caps(limit: ReadLimit) -> dict[str, int | None]:
    """The caps of a read limit as ``max_files``/``max_rows``/``max_bytes`` (empty: no cap)."""
    if isinstance(limit, API.ReadMaxFiles):
        return {"max_files": limit.max_files}
    if isinstance(limit, API.ReadMaxRows):
        return {"max_rows": limit.max_rows}
    if isinstance(limit, API.ReadMaxBytes):
        return {"max_bytes": limit.max_bytes}
    return {}


def offset_field(offset: dict[str, Any], key: str, mode: str) -> int:
    """``offset[key]`` as an int, or a clear error for an offset written by another mode/source."""
    try:
        return int(offset[key])
    except (KeyError, TypeError, ValueError) as e:
        raise KappaSourceError(
            f"kappa_iceberg ({mode} mode): offset {offset!r} from the checkpoint has no integer {key!r}; "
            "it was written by another source or mode: use a fresh checkpoint"
        ) from e
