"""The live reference: the unchanged playback_sessions job, spark-submitted live (tail mode,
availableNow) over a generated lake, against a plain pandas sessionization of the same events.

What is compared, and why it must be exact. The job keeps a 10-minute event-time watermark:
at micro-batch k it is (largest event time of batches before k) - 10 minutes. A micro-batch
reads one landing, so every event of batch k was ingested after every event of earlier batches;
an event whose delay (ingestion - event time) is under 10 minutes is therefore never behind the
watermark, and cannot be dropped. The generator's delays are either under 8 minutes or between
11 and 30 minutes ("late" events, L), so only L events may be dropped, depending on timing.

Expected sessions: the sessions (gap 5 minutes, per account) of ALL events that are also
sessions, identical, of the events WITHOUT L (no late event within 5 minutes of them, so
whatever Spark did with L they come out the same), and that closed: their end (last play + 5
minutes) is before the watermark of the run's last micro-batch, when Spark emits and evicts
them. Each of them must be in the output, with the same start, end, plays and last play; every
other output row must have a late event of its account within 5 minutes of it.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pandas as pd
from paths import EXAMPLES

from airflow_provider_kappa.demo.lakegen import LakeSpec, generate_lake, landed_events, local_catalog
from airflow_provider_kappa.demo.live_reference import reference_conf, run_live_reference
from airflow_provider_kappa.engine.progress import event_log_conf, read_progress

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
GAP = pd.Timedelta(minutes=5)


def sessionize(plays: pd.DataFrame) -> pd.DataFrame:
    """Sessions of ``plays`` per account: a new one when 5 minutes pass without a play."""
    p = plays.sort_values(["account_id", "event_ts"])
    new = (p.groupby("account_id").event_ts.diff() >= GAP) | (p.groupby("account_id").cumcount() == 0)
    s = p.groupby(new.cumsum()).agg(
        account_id=("account_id", "first"),
        session_start=("event_ts", "min"),
        last_play_ts=("event_ts", "max"),
        plays=("event_id", "size"),
    )
    s["session_end"] = s.last_play_ts + GAP
    return s.reset_index(drop=True)[["account_id", "session_start", "session_end", "plays", "last_play_ts"]]


def keyed(df: pd.DataFrame) -> set[tuple[Any, ...]]:
    return {
        (int(r.account_id), r.session_start.value, r.session_end.value, int(r.plays), r.last_play_ts.value)
        for r in df.itertuples()
    }


def test_reference_conf_reads_every_source_by_tail_one_landing_per_batch(lake_dir: Path) -> None:
    from airflow_provider_kappa.demo.live_reference import lake_env
    from airflow_provider_kappa.job.config import load_config

    with lake_env(lake_dir):
        cfg = load_config(EXAMPLES / "rmi" / "kappa.yaml")
    conf = reference_conf(cfg, lake_dir / "catalogs.json", str(lake_dir / "ckpt"))
    assert conf["spark.kappa.mode"] == "live" and conf["spark.kappa.trigger"] == "availableNow"
    for src, table in (("impressions", "raw.impressions"), ("playbacks", "raw.playbacks")):
        assert conf[f"spark.kappa.source.{src}.type"] == "iceberg"
        assert conf[f"spark.kappa.source.{src}.table"] == table
        assert conf[f"spark.kappa.source.{src}.option.max_files_per_batch"] == "1"
    assert conf["spark.kappa.sink.summary.write_table"] == "prod.impression_play_summary"
    assert conf["spark.kappa.catalogs.file"] == str(lake_dir / "catalogs.json")
    assert not any(str(lake_dir / "catalog.db") in v for v in conf.values())  # properties stay in the file

    from airflow_provider_kappa.spark.resolve import iceberg_source_options
    from airflow_provider_kappa.spark.settings import load_settings

    settings = load_settings(conf)
    opts = iceberg_source_options(settings, settings.aligned_sources()[0])  # type: ignore[arg-type]
    assert opts["mode"] == "tail" and opts["max_files_per_batch"] == "1"


def test_live_reference_sessions_match_a_plain_sessionization(lake_dir: Path) -> None:
    spec = LakeSpec(hours=0.4, rate=8.0, start=T0, seed=5, landing_interval=timedelta(minutes=4))
    landed = generate_lake(local_catalog(lake_dir), spec)
    assert landed.landings == 6 and landed.late_playbacks > 0

    events = lake_dir / "eventlog"
    events.mkdir()
    ref = run_live_reference(
        EXAMPLES / "playback_sessions" / "kappa.yaml", lake_dir=lake_dir, extra_conf=event_log_conf(events)
    )

    assert ref.tables == {"sessions": "prod.playback_sessions"}
    assert ref.batches["sessions"] >= landed.landings  # landing by landing, not all at once
    assert len(read_progress(events)) == ref.batches["sessions"]  # extra_conf reached the run
    watermark = pd.Timestamp(ref.watermarks["sessions"], unit="ms", tz="UTC")
    assert watermark > pd.Timestamp(spec.end) - spec.landing_interval - pd.Timedelta(minutes=11)

    out = local_catalog(lake_dir).load_table("prod.playback_sessions").scan().to_arrow().to_pandas()
    assert len(out) == ref.rows["sessions"]
    plays = landed_events(spec)[1].to_pandas()
    late = plays[(plays.ingestion_ts - plays.event_ts) > pd.Timedelta(minutes=10)]
    everything, without_late = sessionize(plays), sessionize(plays.drop(late.index))
    closed = everything[everything.session_end < watermark]
    expected = keyed(closed) & keyed(without_late)
    assert len(expected) > 50 and len(expected) > 0.9 * len(closed)

    got = keyed(out)
    assert len(got) == len(out)  # no session emitted twice
    assert expected <= got
    for account, start, end, _, _ in got - expected:  # touched by a late event of its account
        s, e = pd.Timestamp(start, tz="UTC"), pd.Timestamp(end, tz="UTC")
        touching = late[(late.account_id == account) & (late.event_ts >= s - GAP) & (late.event_ts <= e)]
        assert len(touching) > 0, (account, s, e)
    assert (out.session_end <= watermark).all()
