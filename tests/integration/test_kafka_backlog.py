"""Kafka-live catching up a backlog (issue 25): ``kappa run`` reads part of a topic, is stopped, two
hours of events pile up in Kafka, and the restarted run reads them in a few large micro-batches at
one wall-clock instant. ``kappa land`` lands the topic; ``kappa backfill`` with the defaults
(``ledger: auto``) over the catch-up replays live's batches placed by their data (their records'
Kafka timestamps, the landed ingestion time), not by when live ran them, and stages exactly live's
output.

The two hours are of record time, not of the test's: every record's Kafka timestamp (and event
time) is set by the producer, in the past: the test waits for none of it. Its cost is two
``kappa run`` starts (spark-submit), one landing and a four-slice backfill on the shared Connect server.
"""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from servers.kafka import create_topic, produce, write_kafka_job_config
from test_kafka_live import JOB, SCHEMA, Live, caught_up, committed, offset_logged, rows_of, staged, wait_for

from airflow_provider_kappa.cli import main

# two `kappa run`s, a landing and a backfill: 24 min on a 2-core machine at load 17-23, over the suite's 900 s
pytestmark = pytest.mark.timeout(1800)

#: records per live micro-batch at most: the backlog is caught up in a few large batches
PER_BATCH = 24
#: how long a live run may take to read what it is given (its spark-submit start included, on a loaded machine)
LOADED = 600


def write_config(tmp_path: Path, catalog_props: dict[str, str], bootstrap: str, topic: str, connect_url: str) -> Path:
    """The job's kappa.yaml: live reads the topic from its beginning, ``PER_BATCH`` records a batch."""
    return write_kafka_job_config(
        tmp_path,
        catalog_props,
        bootstrap,
        topic,
        name="backlog",
        schema=SCHEMA,
        job=JOB,
        job_keys=f"live_trigger: 1s\nconnect: {{url: '{connect_url}'}}",
        kafka_keys=f"starting_offsets: earliest\noptions: {{maxOffsetsPerTrigger: '{PER_BATCH}'}}",
    )


def events(
    first: int, start: datetime, count: int, spacing: timedelta, *, late_every: int = 0
) -> list[tuple[int, datetime, dict[str, Any]]]:
    """``count`` events from record time ``start`` on, ``spacing`` apart, alternate partitions, event
    time up to 2 s before the record time; every ``late_every``-th one (0: none) 5 min late (its
    event time 5 min before its record time: dropped or counted by live depending on how its
    batches fell)."""
    out = []
    for i in range(count):
        n = first + i
        ts = start + i * spacing
        lag = (
            timedelta(minutes=5)
            if late_every and i % late_every == late_every - 1
            else timedelta(milliseconds=(n * 397) % 2000)
        )
        value = {"event_id": f"e{n}", "account_id": n % 3, "amount": n, "event_ts": (ts - lag).isoformat()}
        out.append((n % 2, ts, value))
    return out


def ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def test_a_backfill_over_a_live_backlog_catch_up_replays_its_batches_where_their_data_landed(
    kafka_broker: Any, tmp_path: Path, catalog_props: dict[str, str], catalog: Any, capsys: Any, connect_server: Any
) -> None:
    from airflow_provider_kappa.backfill.backfill import Backfill
    from airflow_provider_kappa.backfill.plan import plan
    from airflow_provider_kappa.backfill.snapshot import snapshot
    from airflow_provider_kappa.job.config import load_config
    from airflow_provider_kappa.spark.ledger import Ledger

    bootstrap = kafka_broker.bootstrap_servers
    topic = f"backlog-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, partitions=2)
    config = write_config(tmp_path, catalog_props, bootstrap, topic, connect_server.url)
    cfg = load_config(config)
    checkpoint = tmp_path / "checkpoints" / "backlog" / "live" / "summary"
    # the backfill's window: the two hours before the last half-hour boundary, in 30 min slices.
    # Every record time lies in it, before now: live's triggers (now and later) lie after it
    end = datetime.now(timezone.utc).replace(second=0, microsecond=0)
    end -= timedelta(minutes=end.minute % 30)
    start = end - timedelta(hours=2)

    # live's first run reads the first 8 minutes' events, then stops
    first = events(0, start + timedelta(minutes=1), 10, timedelta(seconds=45))
    acks = produce(bootstrap, topic, first)
    live = Live(config, tmp_path / "live.log")
    live.start()
    try:
        wait_for("live reading the first events", lambda: caught_up(checkpoint, acks, then_one_more=True), live, LOADED)
    finally:
        code, _ = live.stop()
    assert code == 0, live.tail()
    before_restart = committed(checkpoint)

    # live stopped for the rest of the two hours: their events pile up in Kafka, the last one (its
    # event time past the window) closing every window of the ones before
    backlog = events(10, start + timedelta(minutes=10), 104, timedelta(seconds=62), late_every=9)
    flush_ts = end - timedelta(seconds=30)
    backlog.append(
        (
            0,
            flush_ts,
            {"event_id": "flush", "account_id": 9, "amount": 0, "event_ts": (end + timedelta(minutes=1)).isoformat()},
        )
    )
    acks += produce(bootstrap, topic, backlog)
    assert all(ms(start) <= ts < ms(end) for _, _, ts in acks)
    live.start()  # from the checkpoint: the backlog, PER_BATCH records a batch, back to back
    try:
        wait_for("live catching up the backlog", lambda: caught_up(checkpoint, acks, then_one_more=True), live, LOADED)
    finally:
        code, _ = live.stop()
    assert code == 0, live.tail()
    live_rows = Counter(rows_of(catalog, "prod.summary"))
    print(f"live counted {sum(r[3] for r in live_rows)} of {len(acks) - 1} events (late ones dropped by its cuts)")
    assert live_rows, live.tail()

    # the catch-up: a few large batches live ran back to back (within seconds, unloaded), after the window
    catch_up = [b for b in committed(checkpoint) if b not in before_restart]
    ledger = Ledger(f"{cfg.job.ledger}/summary")
    entries = {e.batch_id: e for e in (ledger.entry(name) for _, _, name in ledger.keys)}
    data = [b for b in catch_up if entries[b].records]
    assert len(data) >= 4 and all(entries[b].records <= PER_BATCH for b in data), [entries[b] for b in catch_up]
    triggers = [entries[b].end_ms for b in catch_up]
    assert ms(end) <= min(triggers) and max(triggers) - min(triggers) < 30 * 60_000, triggers  # within one slice

    # where each live batch's data landed: its records' latest Kafka timestamp, from the broker's acks
    # (not from the ledger), a no-data batch where the batch before it is
    landed_at: dict[int, int] = {}
    previous: dict[int, int] = {}
    for batch in committed(checkpoint):
        ends = offset_logged(checkpoint, batch)
        read = [ts for p, o, ts in acks if previous.get(p, 0) <= o < ends.get(p, 0)]
        landed_at[batch] = max(read) if read else landed_at[batch - 1]
        previous = ends
    slices = [(start + timedelta(minutes=30 * i), start + timedelta(minutes=30 * (i + 1))) for i in range(4)]
    expected = [sum(1 for b in landed_at if ms(lo) <= landed_at[b] < ms(hi)) for lo, hi in slices]
    in_catch_up = [sum(1 for b in data if ms(lo) <= landed_at[b] < ms(hi)) for lo, hi in slices]
    assert sum(1 for n in in_catch_up if n) >= 3, (in_catch_up, landed_at)  # the catch-up spreads over 3 slices

    assert main(["land", "--config", str(config), "--available-now"]) == 0, capsys.readouterr()
    assert len(rows_of(catalog, "raw.events")) == len(acks)

    window = ["--start", start.isoformat(), "--end", end.isoformat(), "--slice", "30min", "--tail", "0s"]
    raw = {"start": start.isoformat(), "end": end.isoformat(), "slice": "30min", "tail": "0s"}
    bf = Backfill.create(cfg, raw)
    planned = plan(bf, snapshot(bf, tag=False))
    assert planned.replays_ledger, planned.exactness
    # each slice replays the batches whose records landed in it: placed by live's trigger time, every
    # batch would sit after the window (and the ledger would not be replayed at all)
    assert [s.ledger_batches for s in planned.slices] == expected, (
        [s.ledger_batches for s in planned.slices],
        landed_at,
    )

    assert main(["backfill", "--config", str(config), *window, "--dry-run"]) == 0, capsys.readouterr().out[-3000:]
    out = capsys.readouterr().out
    assert "exactness: exact: the live ledger covers" in out, out[-3000:]
    _, replayed = staged(catalog, set())
    owned = Counter({row: n for row, n in live_rows.items() if start <= row[0] < end})
    assert owned and replayed == owned, (replayed - owned, owned - replayed)
