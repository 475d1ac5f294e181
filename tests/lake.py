"""Small, deterministic landed-event tables for tests (real pyiceberg appends)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Iterable

T0 = datetime(2026, 11, 1, 0, 0, tzinfo=timezone.utc)


def events_schema() -> Any:
    """The landed-event schema of raw.impressions / raw.playbacks."""
    from airflow_provider_kappa.lake_schema import RAW_EVENTS_SCHEMA

    return RAW_EVENTS_SCHEMA


def create_events_table(catalog: Any, identifier: str) -> Any:
    """Create ``identifier`` (and its namespace) with the landed-event schema, partitioned by ingestion hour."""
    from airflow_provider_kappa.lake_schema import create_raw_table

    return create_raw_table(catalog, identifier)


def append_events(table: Any, rows: Iterable[dict[str, Any]]) -> None:
    """Append ``rows`` (dicts with the schema's fields) as one snapshot."""
    import pyarrow as pa

    from airflow_provider_kappa.lake_schema import RAW_EVENTS_ARROW

    rows = list(rows)
    table.append(pa.Table.from_pylist(rows, schema=RAW_EVENTS_ARROW))


def event(i: int, ingestion: datetime, *, account: int = 1, show: int = 1, delay: timedelta = timedelta(seconds=1)) -> dict[str, Any]:
    """One landed event: event time ``delay`` before its ingestion time."""
    return {
        "event_id": f"e{i}",
        "account_id": account,
        "show_id": show,
        "event_ts": ingestion - delay,
        "ingestion_ts": ingestion,
    }
