"""Offsets and read limits of the ``kappa_iceberg`` reader, shared by its two modes.

Bounded offsets are ingestion positions ``{"pos": micros}``; tail offsets are
``{"snapshot_id", "sequence_number"}`` of the last snapshot read (``-1`` before the first).
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxBytes, ReadMaxFiles, ReadMaxRows

from airflow_provider_kappa.exceptions import KappaSourceError
from airflow_provider_kappa.spark.source.options import IcebergReadSpec

NO_SNAPSHOT = -1


def default_limit(spec: IcebergReadSpec) -> ReadLimit:
    """The :class:`ReadLimit` the options ask for (``ReadAllAvailable`` by default)."""
    if spec.max_files_per_batch is not None:
        return ReadMaxFiles(spec.max_files_per_batch)
    if spec.max_rows_per_batch is not None:
        return ReadMaxRows(spec.max_rows_per_batch)
    if spec.max_bytes_per_batch is not None:
        return ReadMaxBytes(spec.max_bytes_per_batch)
    return ReadAllAvailable()


def caps(limit: ReadLimit) -> dict[str, int | None]:
    """The caps of a read limit as ``max_files``/``max_rows``/``max_bytes`` (empty: no cap)."""
    if isinstance(limit, ReadMaxFiles):
        return {"max_files": limit.max_files}
    if isinstance(limit, ReadMaxRows):
        return {"max_rows": limit.max_rows}
    if isinstance(limit, ReadMaxBytes):
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
