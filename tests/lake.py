"""Small, deterministic landed-event tables for tests (real pyiceberg appends)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta, timezone
from typing import Any

T0 = datetime(2026, 11, 1, 0, 0, tzinfo=timezone.utc)


def events_schema() -> Any:
    """The landed-event schema of raw.impressions / raw.playbacks."""
    from airflow_provider_kappa.demo.lake_schema import RAW_EVENTS_SCHEMA

    return RAW_EVENTS_SCHEMA


def create_events_table(catalog: Any, identifier: str) -> Any:
    """Create ``identifier`` (and its namespace) with the landed-event schema, partitioned by ingestion hour."""
    from airflow_provider_kappa.demo.lake_schema import create_raw_table

    return create_raw_table(catalog, identifier)


def append_events(table: Any, rows: Iterable[dict[str, Any]]) -> None:
    """Append ``rows`` (dicts with the schema's fields) as one snapshot."""
    import pyarrow as pa

    from airflow_provider_kappa.demo.lake_schema import RAW_EVENTS_ARROW

    rows = list(rows)
    table.append(pa.Table.from_pylist(rows, schema=RAW_EVENTS_ARROW))


def event(
    i: int, ingestion: datetime, *, account: int = 1, show: int = 1, delay: timedelta = timedelta(seconds=1)
) -> dict[str, Any]:
    """One landed event: event time ``delay`` before its ingestion time."""
    return {
        "event_id": f"e{i}",
        "account_id": account,
        "show_id": show,
        "event_ts": ingestion - delay,
        "ingestion_ts": ingestion,
    }


def summary_arrow() -> Any:
    """Arrow schema of the test sink table (an RMI-like summary per 5-minute window)."""
    import pyarrow as pa

    return pa.schema(
        [
            ("window_start", pa.timestamp("us", tz="UTC")),
            ("window_end", pa.timestamp("us", tz="UTC")),
            ("show_id", pa.int64()),
            ("attributed_plays", pa.int64()),
        ]
    )


def create_summary_table(catalog: Any, identifier: str, *, partitioned: bool = True) -> Any:
    """Create a sink target like prod.impression_play_summary, partitioned by ``hour(window_start)``."""
    from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import HourTransform
    from pyiceberg.types import LongType, NestedField, TimestamptzType

    schema = Schema(
        NestedField(1, "window_start", TimestamptzType(), required=False),
        NestedField(2, "window_end", TimestamptzType(), required=False),
        NestedField(3, "show_id", LongType(), required=False),
        NestedField(4, "attributed_plays", LongType(), required=False),
    )
    spec = (
        PartitionSpec(PartitionField(source_id=1, field_id=1000, transform=HourTransform(), name="window_hour"))
        if partitioned
        else UNPARTITIONED_PARTITION_SPEC
    )
    catalog.create_namespace_if_not_exists(identifier.rsplit(".", 1)[0])
    return catalog.create_table(identifier, schema=schema, partition_spec=spec)


def summary_row(minute: int, show: int, plays: int) -> dict[str, Any]:
    """One summary row whose 5-minute window starts ``minute`` minutes after T0."""
    start = T0 + timedelta(minutes=minute)
    return {
        "window_start": start,
        "window_end": start + timedelta(minutes=5),
        "show_id": show,
        "attributed_plays": plays,
    }


def summary_table(rows: Iterable[dict[str, Any]]) -> Any:
    """Rows as a pyarrow Table with :func:`summary_arrow`."""
    import pyarrow as pa

    return pa.Table.from_pylist(list(rows), schema=summary_arrow())


def sorted_rows(table: Any) -> list[tuple[Any, ...]]:
    """All rows of a pyarrow Table (or a pyiceberg table, read at its current snapshot), sorted."""
    arrow = table.scan().to_arrow() if hasattr(table, "scan") else table
    return sorted((tuple(r.values()) for r in arrow.to_pylist()), key=repr)


def create_sessions_table(catalog: Any, identifier: str) -> Any:
    """Create a sink target like prod.playback_sessions (the sessionizer's output), partitioned by
    ``hour(session_start)``; every column optional, as the sink creates live tables."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import HourTransform
    from pyiceberg.types import LongType, NestedField, TimestamptzType

    schema = Schema(
        NestedField(1, "account_id", LongType(), required=False),
        NestedField(2, "session_start", TimestamptzType(), required=False),
        NestedField(3, "session_end", TimestamptzType(), required=False),
        NestedField(4, "plays", LongType(), required=False),
        NestedField(5, "last_play_ts", TimestamptzType(), required=False),
    )
    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=HourTransform(), name="session_hour"))
    catalog.create_namespace_if_not_exists(identifier.rsplit(".", 1)[0])
    return catalog.create_table(identifier, schema=schema, partition_spec=spec)


def sessions_arrow() -> Any:
    """Arrow schema of :func:`create_sessions_table`."""
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")
    return pa.schema(
        [
            ("account_id", pa.int64()),
            ("session_start", ts),
            ("session_end", ts),
            ("plays", pa.int64()),
            ("last_play_ts", ts),
        ]
    )


def expected_sessions(events: Iterable[dict[str, Any]], gap: timedelta = timedelta(minutes=5)) -> list[dict[str, Any]]:
    """The sessions Spark's ``session_window(event_ts, gap)`` forms per account (an independent oracle):
    a session runs from its first event to its last event + ``gap``; an event before the
    current end joins it."""
    by_account: dict[int, list[datetime]] = {}
    for e in events:
        by_account.setdefault(e["account_id"], []).append(e["event_ts"])
    groups: list[tuple[int, list[datetime]]] = []
    for account, times in sorted(by_account.items()):
        current: list[datetime] = []
        for ts in sorted(times):
            if current and ts >= current[-1] + gap:
                groups.append((account, current))
                current = []
            current.append(ts)
        groups.append((account, current))
    return [
        {"account_id": a, "session_start": g[0], "session_end": g[-1] + gap, "plays": len(g), "last_play_ts": g[-1]}
        for a, g in groups
    ]


#: Window of :func:`seed_sessions_incident`: [01:00, 03:00) after T0.
INCIDENT_START = T0 + timedelta(hours=1)
INCIDENT_END = T0 + timedelta(hours=3)


def seed_sessions_incident(
    catalog: Any, source: str = "raw.playbacks", target: str = "prod.playback_sessions"
) -> list[dict[str, Any]]:
    """A tiny playback lake with an incident: ``source`` holds playbacks from 00:00 to 03:50; ``target``
    holds the sessionizer's correct rows outside [01:00, 03:00) and wrong ones inside (a session
    missing, one with a wrong count, one spurious). Sessions stay short (under 10 minutes); some
    cross 01:00, 02:00 and 03:00; playbacks go on until 03:50 so every session in the window is
    closed by the watermark within a 45-minute tail (a 30-minute warmup covers the one at 01:00).

    :returns: the rows the target must hold after a correct backfill of the window.
    """
    import pyarrow as pa

    # account 7 plays every 10 minutes; 3's session crosses 02:00 (a slice boundary), 5's cross 01:00
    # (begun in the warmup: not in the window) and 03:00 (begun in the window, ends after it)
    minutes = {
        7: list(range(0, 231, 10)),
        1: [70, 72, 74, 140, 141],
        2: [100, 104, 160, 162, 165],
        3: [117, 121],
        4: [50, 53],
        5: [58, 62, 178, 181],
    }
    events = [
        event(1000 * account + m, T0 + timedelta(minutes=m), account=account, show=account)
        for account, ms in minutes.items()
        for m in ms
    ]
    append_events(create_events_table(catalog, source), events)
    sessions = expected_sessions(events)
    inside = [s for s in sessions if INCIDENT_START <= s["session_start"] < INCIDENT_END]
    outside = [s for s in sessions if not INCIDENT_START <= s["session_start"] < INCIDENT_END]
    wrong = [dict(s, plays=99) if s["account_id"] == 2 else s for s in inside if s["account_id"] != 1]
    spurious = {
        "account_id": 6,
        "session_start": T0 + timedelta(minutes=90),
        "session_end": T0 + timedelta(minutes=95),
        "plays": 1,
        "last_play_ts": T0 + timedelta(minutes=90),
    }
    table = create_sessions_table(catalog, target)
    table.append(pa.Table.from_pylist(outside + wrong + [spurious], schema=sessions_arrow()))
    return outside + inside
