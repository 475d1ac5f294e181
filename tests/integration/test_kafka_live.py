"""Kafka-live, for real: ``kappa run`` of an unchanged stateful job reading a real Kafka broker (KRaft,
from the jars fetched at install), ``kappa land`` landing the same topic into a real sqlite Iceberg
catalog, ``kappa backfill`` over the landed rows.

- Exact against Kafka-live (issue 15 item 5): live's micro-batches are uneven (bursts of different
  sizes between triggers) and drop late events; ``kappa backfill --ledger`` replays live's batches
  from the live ledger and stages exactly live's output (multiset equality), while the same backfill
  without the ledger stages something else. Live is then stopped as a service manager stops it
  (SIGTERM to ``kappa run`` alone): it stops its Spark tree and exits 0.
- Reliability (item 6): ``kappa run`` SIGKILLed mid-stream and restarted from its checkpoint, then the
  broker stopped and restarted under the running job: every event counted once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from servers.kafka import create_topic, produce, write_kafka_job_config
from servers.processes import naming

from airflow_provider_kappa.cli import main

JOB = """\
from pyspark.sql import SparkSession, functions as F
from airflow_provider_kappa.spark import read_source, write_sink

spark = SparkSession.builder.getOrCreate()
events = read_source(spark, "events")
counts = (
    events.withWatermark("event_ts", "10 seconds")
    .groupBy(F.window("event_ts", "5 seconds"), "account_id")
    .agg(F.count("*").alias("events"), F.sum("amount").alias("amount"))
    .select(F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"),
            "account_id", "events", "amount")
)
write_sink(counts, "summary").awaitTermination()
"""
SCHEMA = "event_id STRING, account_id BIGINT, amount BIGINT, event_ts TIMESTAMP"
KAPPA = str(Path(sys.executable).parent / "kappa")


def write_config(
    tmp_path: Path, catalog_props: dict[str, str], bootstrap: str, topic: str, connect_url: str | None = None
) -> Path:
    """The job's kappa.yaml; ``connect_url``: its backfills' slices run on that Spark Connect server."""
    connect = f"\nconnect: {{url: '{connect_url}'}}" if connect_url else ""
    return write_kafka_job_config(
        tmp_path,
        catalog_props,
        bootstrap,
        topic,
        name="kafkalive",
        schema=SCHEMA,
        job=JOB,
        job_keys="live_trigger: 2s" + connect,
        kafka_keys="starting_offsets: latest",
    )


class Live:
    """``kappa run`` as a child process in its own process group (stopped by that group's id)."""

    def __init__(self, config: Path, log: Path) -> None:
        self.config, self.log = config, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [KAPPA, "run", "--config", str(self.config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal every process of the run (the CLI, spark-submit's JVM, its Python workers) and reap it."""
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        deadline = time.monotonic() + 30  # SIGKILL is delivered asynchronously
        while _group(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        if _group(self.proc.pid):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def stop(self) -> tuple[int | None, list[str]]:
        """SIGTERM to ``kappa run`` alone (a service manager's stop; it stops its spark-submit's whole
        tree): its exit code and what still ran 10 s after (then killed): its process group, and any
        process naming the run's folder (spark-submit runs in a session of its own)."""
        assert self.proc is not None
        if self.alive():
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            code: int | None = self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            code = None
        deadline = time.monotonic() + 10
        folder = str(self.config.parent)
        while (_group(self.proc.pid) or naming(folder)) and time.monotonic() < deadline:
            time.sleep(0.5)
        leftovers = _group(self.proc.pid) + naming(folder)
        self.kill()
        return code, leftovers

    def tail(self) -> str:
        return self.log.read_text()[-4000:] if self.log.exists() else ""


def _group(pgid: int) -> list[str]:
    return subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True).stdout.split()


def wait_for(what: str, ready: Callable[[], bool], live: Live | None, timeout: float = 240) -> None:
    began = time.monotonic()
    deadline = began + timeout
    while not ready():
        assert live is None or live.alive(), f"kappa run ended while waiting for {what}:\n{live.tail() if live else ''}"
        assert time.monotonic() < deadline, f"no {what} after {timeout:.0f}s:\n{live.tail() if live else ''}"
        time.sleep(0.5)
    print(f"{what}: {time.monotonic() - began:.1f}s")


def committed(checkpoint: Path) -> list[int]:
    """Batch ids in the live query's commit log."""
    folder = checkpoint / "commits"
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []


def offset_logged(checkpoint: Path, batch: int) -> dict[int, int]:
    """partition -> end offset of the live query's batch ``batch`` (its offset log)."""
    lines = (checkpoint / "offsets" / str(batch)).read_text().splitlines()
    ((_, parts),) = json.loads(lines[2]).items()
    return {int(p): int(o) for p, o in parts.items()}


def caught_up(checkpoint: Path, acks: list[tuple[int, int, int]], *, then_one_more: bool = False) -> bool:
    """Whether live committed a batch reading past every acknowledged offset (``then_one_more``: and
    then one more batch, the no-data batch emitting the windows that batch's watermark closed)."""
    want: dict[int, int] = {}
    for partition, offset, _ in acks:
        want[partition] = max(want.get(partition, 0), offset + 1)
    done = committed(checkpoint)
    for batch in done:
        ends = offset_logged(checkpoint, batch)
        if all(ends.get(p, 0) >= o for p, o in want.items()):
            return not then_one_more or any(b > batch for b in done)
    return False


def now() -> datetime:
    return datetime.now(timezone.utc)


def seconds_into_minute() -> float:
    t = now()
    return t.second + t.microsecond / 1e6


def clear_of_minute_start(seconds: float) -> None:
    """Sleep past a minute's first ``seconds`` when now is inside them."""
    into = seconds_into_minute()
    if into < seconds:
        time.sleep(seconds - into)


def window_of(value: dict[str, Any]) -> tuple[datetime, int]:
    """(5 s window start, account) of an event."""
    ts = datetime.fromisoformat(value["event_ts"])
    return ts.replace(second=ts.second - ts.second % 5, microsecond=0), value["account_id"]


def into_next_minute_unless(left: float) -> None:
    """Sleep into the next minute (1 s in) when less than ``left`` seconds of this one are left."""
    remaining = 60 - seconds_into_minute()
    if remaining < left:
        time.sleep(remaining + 1)


def burst(count: int, first: int, *, late: int = 0) -> list[tuple[int, datetime, dict[str, Any]]]:
    """``count`` on-time events (event time 0-2 s before now) and ``late`` ones (event time 60 s
    before now: behind live's 10 s watermark once an earlier batch advanced it), alternate partitions,
    Kafka timestamp now."""
    t = now()
    out = []
    for i in range(count + late):
        n = first + i
        lag = timedelta(seconds=60) if i >= count else timedelta(milliseconds=(n * 397) % 2000)
        value = {"event_id": f"e{n}", "account_id": n % 3, "amount": n, "event_ts": (t - lag).isoformat()}
        out.append((n % 2, t, value))
    return out


def rows_of(catalog: Any, identifier: str) -> list[tuple[Any, ...]]:
    table = catalog.load_table(identifier)
    return [tuple(r.values()) for r in table.scan().to_arrow().to_pylist()]


def staged(catalog: Any, exclude: set[str]) -> tuple[set[str], Counter[tuple[Any, ...]]]:
    """The staging tables not in ``exclude`` and the multiset of their rows."""
    names = {".".join(t) for t in catalog.list_tables("kappa_staging")} - exclude
    rows: Counter[tuple[Any, ...]] = Counter()
    for name in names:
        rows.update(rows_of(catalog, name))
    return names, rows


def test_a_backfill_with_the_ledger_reproduces_kafka_live_row_for_row(
    kafka_broker: Any, tmp_path: Path, catalog_props: dict[str, str], catalog: Any, capsys: Any, connect_server: Any
) -> None:
    from airflow_provider_kappa.job.config import load_config
    from airflow_provider_kappa.spark.ledger import Ledger

    bootstrap = kafka_broker.bootstrap_servers
    topic = f"live-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, partitions=2)
    config = write_config(tmp_path, catalog_props, bootstrap, topic, connect_server.url)  # backfills: the shared server
    cfg = load_config(config)
    checkpoint = tmp_path / "checkpoints" / "kafkalive" / "live" / "summary"
    # before live starts (startingOffsets latest): landed, never read live, so not live's output. Not in a
    # minute's first 3 s: their event times (up to 2 s before now) must not fall before the window's start
    clear_of_minute_start(3)
    before_live = burst(6, 0)
    acks = produce(bootstrap, topic, before_live)

    live = Live(config, tmp_path / "live.log")
    live.start()
    try:
        wait_for("first live batch", lambda: bool(committed(checkpoint)), live)
        n = 100
        # uneven micro-batches: bursts of different sizes, each read by live before the next is produced
        # (so live's watermark has passed the late events of the next one), two of them back to back
        for count, late, wait in (
            (3, 0, True),
            (25, 2, True),
            (1, 1, False),
            (40, 0, True),
            (7, 3, True),
            (2, 2, True),
        ):
            acks += produce(bootstrap, topic, burst(count, n, late=late))
            n += count + late
            if wait:
                wait_for(f"live reading {n} events", lambda acks=acks: caught_up(checkpoint, acks), live)
        # an event far ahead closes every window above (its own stays open, live and backfill alike). The
        # rows it closes are emitted by the batch reading it and the no-data batch after it; a slice
        # replays the live batches live *started* in its range, so both must start before the window's
        # end (the flush's minute + 1; --tail 0s: the landed data ends there): not in a minute's last 20 s
        into_next_minute_unless(left=20)
        flush = [
            (
                0,
                now(),
                {
                    "event_id": "flush",
                    "account_id": 9,
                    "amount": 0,
                    "event_ts": (now() + timedelta(seconds=40)).isoformat(),
                },
            )
        ]
        acks += produce(bootstrap, topic, flush)
        wait_for("live catching up", lambda: caught_up(checkpoint, acks, then_one_more=True), live)
    finally:
        code, leftovers = live.stop()
    assert code == 0 and "kappa run: stopped; a restart runs from the checkpoint" in live.tail(), (code, live.tail())
    assert not leftovers, f"processes of kappa run still ran after its stop: {leftovers}"
    printed = live.log.read_text()
    assert "kappa run: kappa_kafkalive_summary batch " in printed, printed[-3000:]  # its own line per batch
    assert "INFO MicroBatchExecution" not in printed  # Spark logs at WARN (spark.log.level)
    live_rows = Counter(rows_of(catalog, "prod.summary"))
    assert live_rows, live.tail()
    counted = sum(r[3] for r in live_rows)
    produced_after_start = len(acks) - 6 - 1  # not the events before live started, not the flush
    assert 0 < counted < produced_after_start, "live should have dropped some late events"

    ledger = Ledger(f"{cfg.job.ledger}/summary")
    entries = [ledger.entry(name) for _, _, name in ledger.keys]
    sizes = [e.rows for e in entries]
    assert len(entries) >= 4 and len(set(sizes)) >= 3, f"live's micro-batches should be uneven: {sizes}"
    assert sum(s or 0 for s in sizes) == len(acks) - 6  # every record live read, once
    assert all(e.has_stats for e in entries), [e.name for e in entries if not e.has_stats]
    assert sum(e.records or 0 for e in entries) == len(acks) - 6  # counted per partition by live's listener
    assert all(e.first_record_ms <= e.last_record_ms for e in entries if e.records)

    assert main(["land", "--config", str(config), "--available-now"]) == 0, capsys.readouterr()
    assert len(rows_of(catalog, "raw.events")) == len(acks)

    first = datetime.fromtimestamp(min(ts for _, _, ts in acks) / 1000, timezone.utc)
    start = first.replace(second=0, microsecond=0)
    last = datetime.fromtimestamp(max(ts for _, _, ts in acks) / 1000, timezone.utc)
    end = last.replace(second=0, microsecond=0) + timedelta(minutes=1)  # the landed data's last 1-min cell
    last_trigger = datetime.fromtimestamp(max(e.end_ms for e in entries) / 1000, timezone.utc)
    assert last_trigger < end, (
        f"live's closing batch started at {last_trigger}, past the window's end {end}: live too slow"
    )
    window = [
        "--start",
        start.isoformat(),
        "--end",
        end.isoformat(),
        "--slice",
        "1min",
        "--max-misalignment",
        "1min",
        "--tail",
        "0s",
        "--dry-run",
    ]
    # ledger auto (the default) does not replay it over this window: the events before live are in the range
    # read but in no live batch, so kappa plan says why and aligns; from live's first minute on, it replays
    assert main(["plan", "--config", str(config), *window]) == 0
    out = capsys.readouterr().out
    assert "the live ledger is not replayed: live's first recorded batch starts at" in out, out
    first_trigger = datetime.fromtimestamp(min(e.end_ms for e in entries) / 1000, timezone.utc)
    later = first_trigger.replace(second=0, microsecond=0) + timedelta(minutes=1)
    if later < end:
        assert main(["plan", "--config", str(config), *window[:1], later.isoformat(), *window[2:]]) == 0
        out = capsys.readouterr().out
        assert f"exactness: exact: the live ledger covers [{later.isoformat()}, {end.isoformat()})" in out, out
    assert main(["backfill", "--config", str(config), *window, "--ledger"]) == 0, capsys.readouterr().out[-3000:]
    with_ledger_tables, with_ledger = staged(catalog, set())
    # What the backfill replaces is live's output inside its window. Live can emit a row before it: a late
    # event is judged by the previous batch's watermark (Spark's late-event watermark), so when a burst's
    # batch directly follows the batch that moved the watermark, its 60 s-late events are still counted,
    # into windows a minute before the first ingestion; the ledger replays that too, but such a row is
    # owned by a slice before the window and is not the backfill's to stage.
    owned = Counter({row: n for row, n in live_rows.items() if start <= row[0] < end})
    assert owned and sum(r[3] for r in owned) > counted // 2, (owned, live_rows)
    assert with_ledger == owned, (with_ledger - owned, owned - with_ledger)

    assert main(["backfill", "--config", str(config), *window]) == 0, capsys.readouterr().out[-3000:]
    _, without = staged(catalog, with_ledger_tables)
    assert without != owned  # cut on the ingestion grid: the events before live count, the late ones may differ
    # the events before live, in their 5 s windows: counted by the backfill without the ledger, never by live
    # (its first batch ran seconds later). How many late events live or the backfill counted depends on how
    # the batches fell, so totals are not compared; a late event of a later burst (60 s behind) can fall in one
    # of those windows and be counted there too, so each holds at least the events before live
    keys = Counter(window_of(value) for _, _, value in before_live)
    counted_before = {(r[0], r[2]): r[3] for r in without if (r[0], r[2]) in keys}
    assert set(counted_before) == set(keys) and all(counted_before[k] >= n for k, n in keys.items()), (keys, without)
    assert not [r for r in live_rows if (r[0], r[2]) in keys], (keys, live_rows)


def expected_windows(sent: list[tuple[int, datetime, dict[str, Any]]]) -> Counter[tuple[Any, ...]]:
    """(window start, account, events, amount) per 5 s window and account of on-time events."""
    events: Counter[tuple[datetime, int]] = Counter()
    amounts: Counter[tuple[datetime, int]] = Counter()
    for _, _, v in sent:
        if v["event_id"] == "flush":
            continue
        key = window_of(v)
        events[key] += 1
        amounts[key] += v["amount"]
    return Counter({(s, a, events[(s, a)], amounts[(s, a)]): 1 for s, a in events})


def test_kafka_live_survives_sigkill_and_a_broker_restart_with_every_event_once(
    tmp_path: Path, catalog_props: dict[str, str], catalog: Any
) -> None:
    from airflow_provider_kappa.demo.kafka_broker import KafkaBroker

    broker = KafkaBroker(tmp_path / "kafka")  # its own broker: this test stops and restarts it
    broker.start()
    live = Live(write_config(tmp_path, catalog_props, broker.bootstrap_servers, "plays"), tmp_path / "live.log")
    try:
        create_topic(broker.bootstrap_servers, "plays", partitions=2)
        checkpoint = tmp_path / "checkpoints" / "kafkalive" / "live" / "summary"
        live.start()
        wait_for("first live batch", lambda: bool(committed(checkpoint)), live)
        sent = burst(30, 0)
        acks = produce(broker.bootstrap_servers, "plays", sent)
        wait_for("live reading the first events", lambda: caught_up(checkpoint, acks), live)
        more = burst(25, 30)
        sent += more
        acks += produce(broker.bootstrap_servers, "plays", more)
        live.kill(signal.SIGKILL)  # mid-stream: the CLI, spark-submit's driver and its Python workers at once
        assert not caught_up(checkpoint, acks, then_one_more=True)

        live.start()  # from the checkpoint
        wait_for("the restarted run reading the events", lambda: caught_up(checkpoint, acks), live)
        pid = live.proc.pid if live.proc else None
        broker.stop()  # SIGTERM by pid under the running job
        time.sleep(5)
        broker.start()  # same ports, same log dirs
        last = burst(20, 55)
        flush = [
            (
                1,
                now(),
                {
                    "event_id": "flush",
                    "account_id": 9,
                    "amount": 0,
                    "event_ts": (now() + timedelta(seconds=40)).isoformat(),
                },
            )
        ]
        sent += last + flush
        acks += produce(broker.bootstrap_servers, "plays", last + flush)
        wait_for("live after the broker's restart", lambda: caught_up(checkpoint, acks, then_one_more=True), live)
        assert live.alive() and live.proc is not None and live.proc.pid == pid, live.tail()
    finally:
        if live.proc is not None:
            live.kill(signal.SIGTERM)
        broker.stop()
    rows = Counter(rows_of(catalog, "prod.summary"))
    got = Counter({(r[0], r[2], r[3], r[4]): n for r, n in rows.items()})
    assert max(rows.values()) == 1 and got == expected_windows(sent), (
        got - expected_windows(sent),
        expected_windows(sent) - got,
    )
