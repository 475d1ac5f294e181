"""The backfill's HTML report: numbers from a real validation, the incident's windows shaded,
axis labels that never overlap (estimated boxes; the browser measures real ones in
tests/deploy/test_report_browser.py), a self-contained page, the slice runs read back from a
real checkpoint store, the extra links' URLs; and the demo's page drawn by the same code."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from paths import EXAMPLES

from airflow_provider_kappa.backfill.compare import BUCKETS, MAX_DISTINCT
from airflow_provider_kappa.backfill.validate import build_report, validate_window
from airflow_provider_kappa.demo.report import DemoReport, HourCount, SliceStat
from airflow_provider_kappa.report import report as rp
from airflow_provider_kappa.report.axes import FONT_PX, Label, time_axis
from airflow_provider_kappa.report.page import CSS
from airflow_provider_kappa.timeaxis import DAY, HOUR, MINUTE, SECOND, count_ticks, round_step
from airflow_provider_kappa.timeparse import to_micros

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)


def summary_rows(minutes: range, plays: Any = lambda m: 3, shows: int = 2) -> list[dict[str, Any]]:
    """Rows of a 5-minute summary: one per (window, show)."""
    return [
        {"window_start": T0 + timedelta(minutes=m), "show_id": s, "attributed_plays": plays(m)}
        for m in minutes
        for s in range(shows)
    ]


def arrow(rows: list[dict[str, Any]]) -> Any:
    import pyarrow as pa

    schema = pa.schema(
        [("window_start", pa.timestamp("us", tz="UTC")), ("show_id", pa.int64()), ("attributed_plays", pa.int64())]
    )
    return pa.Table.from_pylist(rows, schema=schema)


def incident_report(hours: int = 6) -> Any:
    """Live lost one show's rows and corrupted the other's plays in [02:00, 03:00), and corrupted
    one row at 04:00 (same count of rows there); the backfill is right."""
    backfill = summary_rows(range(0, hours * 60, 5))

    def hit(r: dict[str, Any]) -> bool:
        return T0 + timedelta(hours=2) <= r["window_start"] < T0 + timedelta(hours=3)

    live = [r for r in backfill if not hit(r)] + [
        {**r, "attributed_plays": 99} for r in backfill if hit(r) and r["show_id"] == 1
    ]
    live = [
        {**r, "attributed_plays": 7} if r["window_start"] == T0 + timedelta(hours=4) and r["show_id"] == 0 else r
        for r in live
    ]
    return build_report(
        target_table="prod.summary",
        staging=["kappa_staging.s0"],
        time_column="window_start",
        start=T0,
        end=T0 + timedelta(hours=hours),
        staged=arrow(backfill),
        target=arrow(live),
    )


def svgs(page: str) -> list[ET.Element]:
    return [ET.fromstring(s) for s in re.findall(r"<svg .*?</svg>", page, flags=re.S)]


NS = "{http://www.w3.org/2000/svg}"


def tick_labels(svg: ET.Element) -> list[Label]:
    out = []
    for t in svg.iter(f"{NS}text"):
        if "tick" in (t.get("class") or "").split():
            out.append(Label(t.text or "", float(t.get("x", 0)), float(t.get("y", 0)), t.get("text-anchor") or "start"))
    return out


def overlaps(labels: list[Label]) -> list[tuple[str, str]]:
    """Pairs of labels on the same line whose estimated boxes overlap."""
    bad = []
    for i, a in enumerate(labels):
        for b in labels[i + 1 :]:
            if abs(a.y - b.y) < FONT_PX:
                (l1, r1), (l2, r2) = a.box(), b.box()
                if l1 < r2 and l2 < r1:
                    bad.append((a.text, b.text))
    return bad


def test_window_counts_find_the_jobs_grid_and_the_incident() -> None:
    report = incident_report()
    w = report.windows
    assert w is not None and w.grid and w.step_seconds == 300 and w.first == T0.isoformat()
    assert len(w.staged) == 72 and sum(w.staged) == report.staged_rows and sum(w.target) == report.target_rows
    assert w.differing() == [*range(24, 36), 48]  # [02:00, 03:00): 12 windows of 5 minutes, and 04:00
    assert all(
        w.staged[i] == 2 and w.target[i] == 1 and w.only_staged[i] == 2 and w.only_target[i] == 1 for i in range(24, 36)
    )
    assert (w.staged[48], w.target[48], w.only_staged[48], w.only_target[48]) == (
        2,
        2,
        1,
        1,
    )  # equal counts, a row differs
    assert "output windows of 5 min: 72, differing: 13" in report.to_text()


def test_values_on_no_grid_and_too_many_values_fall_back_to_round_buckets() -> None:
    import random

    rnd = random.Random(3)
    at = [T0 + timedelta(microseconds=rnd.randrange(2 * 3600 * SECOND)) for _ in range(500)]
    rows = [{"window_start": t, "show_id": 1, "attributed_plays": 1} for t in at]
    report = build_report(
        target_table="t",
        staging=[],
        time_column="window_start",
        start=T0,
        end=T0 + timedelta(hours=2),
        staged=arrow(rows),
        target=arrow(rows[:400]),
    )
    w = report.windows
    assert w is not None and not w.grid and w.step_seconds * SECOND == round_step(2 * HOUR / BUCKETS)
    assert sum(w.staged) == 500 and sum(w.target) == 400
    many = [
        {"window_start": T0 + timedelta(seconds=i), "show_id": 1, "attributed_plays": 1}
        for i in range(MAX_DISTINCT + 5)
    ]
    w = build_report(
        target_table="t",
        staging=[],
        time_column="window_start",
        start=T0,
        end=T0 + timedelta(days=1),
        staged=arrow(many),
        target=arrow(many),
    ).windows
    assert w is not None and not w.grid and len(w.staged) <= BUCKETS + 1 and sum(w.staged) == MAX_DISTINCT + 5


def test_streamed_validation_counts_the_same_windows_as_the_in_memory_one(catalog: Any) -> None:
    from lake import create_summary_table

    from airflow_provider_kappa.spark.staging import ensure_staging_table, staging_table_name

    backfill = [{**r, "window_end": r["window_start"] + timedelta(minutes=5)} for r in summary_rows(range(0, 180, 5))]
    live = [
        r
        for r in backfill
        if r["window_start"] < T0 + timedelta(minutes=60) or r["window_start"] >= T0 + timedelta(minutes=90)
    ]
    target = create_summary_table(catalog, "prod.summary")
    schema = target.schema().as_arrow()
    import pyarrow as pa

    target.append(pa.Table.from_pylist(live, schema=schema))
    staging = staging_table_name("prod.summary", "bf", "s0")
    ensure_staging_table(catalog, "prod.summary", staging).append(pa.Table.from_pylist(backfill, schema=schema))
    streamed = validate_window(
        catalog, "prod.summary", [staging], "window_start", T0, T0 + timedelta(hours=3), batch_rows=7
    )
    assert streamed.windows is not None and streamed.windows.grid and streamed.windows.step_seconds == 300
    assert streamed.windows.differing() == list(range(12, 18))
    assert [streamed.windows.staged[i] - streamed.windows.target[i] for i in range(12, 18)] == [2] * 6
    assert streamed.windows.only_staged[12:18] == [2] * 6 and sum(streamed.windows.only_target) == 0


def test_page_shows_the_numbers_and_shades_the_incident_windows() -> None:
    report = incident_report()
    slices = [
        rp.SliceRun(
            f"s000{i}",
            (T0 + timedelta(hours=2 * i)).isoformat(),
            (T0 + timedelta(hours=2 * i + 2)).isoformat(),
            T0.isoformat(),
            (T0 + timedelta(hours=6)).isoformat(),
            done=True,
            rows_read=1000 * (i + 1),
            batches=4,
            seconds=10.0,
            watermark=(T0 + timedelta(hours=2 * i + 1, minutes=50)).isoformat(),
            started=to_micros(T0) + i * 12 * SECOND,
            ended=to_micros(T0) + (i * 12 + 10) * SECOND,
        )
        for i in range(3)
    ]
    page = rp.BackfillReportPage(
        "rmi-abc",
        "rmi",
        T0.isoformat(),
        (T0 + timedelta(hours=6)).isoformat(),
        "sequential",
        "2h",
        99.9,
        True,
        sinks={"summary": report.to_dict()},
        slices=slices,
    ).render()
    assert f"{report.match_rate:.3f}%" in page and "13 / 72" in page and "3/3" in page
    assert f"{report.target_rows:,}" in page and f"{report.staged_rows:,}" in page
    assert "2026-11-01 02:00:00–03:00:00" in page  # the run of differing windows, listed
    charts = svgs(page)
    assert [c.get("class") for c in charts] == ["chart windows", "chart timeline", "chart bars"]
    bands = [r for r in charts[0].iter(f"{NS}rect") if r.get("class") == "diff-band"]
    assert [(b.get("data-start"), b.get("data-end")) for b in bands] == [
        ((T0 + timedelta(hours=2)).isoformat(), (T0 + timedelta(hours=3)).isoformat()),
        ((T0 + timedelta(hours=4)).isoformat(), (T0 + timedelta(hours=4, minutes=5)).isoformat()),
    ]
    assert sum(1 for r in charts[0].iter(f"{NS}rect") if r.get("class") == "hover") == 72
    bars = [r for r in charts[1].iter(f"{NS}rect") if "bar" in (r.get("class") or "")]
    assert len(bars) == 3 and all(float(b.get("width", 0)) > 100 for b in bars)
    notes = [t.text for t in charts[1].iter(f"{NS}text") if "note" in (t.get("class") or "")]
    assert notes == [f"10.0 s · watermark 2026-11-01 0{2 * i + 1}:50:00" for i in range(3)]
    throughput = [t.text for t in charts[2].iter(f"{NS}text") if "note" in (t.get("class") or "")]
    assert throughput == ["100", "200", "300"]  # rows read / 10 s
    for chart in charts:
        assert overlaps(tick_labels(chart)) == []
    # self-contained: nothing fetched from elsewhere, no script
    assert "<script" not in page and not re.search(r"(src|href)=['\"]?(https?:)?//", page)


@pytest.mark.parametrize("span", [10 * MINUTE, 2 * HOUR, 26 * HOUR, 7 * DAY, 90 * DAY])
@pytest.mark.parametrize("width", [400, 1080])
def test_time_axis_labels_never_overlap_and_stay_readable(span: int, width: int) -> None:
    lo = to_micros(T0) + 7 * MINUTE
    _, labels = time_axis(lo, lo + span, 60, width - 20, 100)
    main = [lb for lb in labels if lb.y == 116]
    assert overlaps(labels) == []
    assert 2 <= len(main) <= width // 40, [lb.text for lb in main]
    assert all(lb.box()[0] >= 60 - 20 and lb.box()[1] <= width for lb in labels)


def test_count_ticks_are_round_and_cover_the_top() -> None:
    assert count_ticks(0) == [0.0, 1.0]
    assert count_ticks(7) == [0, 2, 4, 6, 8]
    assert count_ticks(1234)[-1] >= 1234 and count_ticks(1234)[1] in (250, 500)


def test_slice_runs_are_read_back_from_the_checkpoint_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_kappa.backfill.plan import BackfillPlan, SlicePlan
    from airflow_provider_kappa.job.checkpoints import CheckpointStore

    store = CheckpointStore(str(tmp_path / "bf"))
    slices = tuple(
        SlicePlan(
            "bf",
            "parallel",
            i,
            2,
            f"s000{i}",
            T0 + i * timedelta(hours=1),
            T0 + (i + 1) * timedelta(hours=1),
            T0 + i * timedelta(hours=1),
            T0 + (i + 1) * timedelta(hours=1),
            {},
        )
        for i in range(2)
    )
    epoch = store.new_epoch("s0000")
    store.start_parallel("s0000", epoch)
    metrics = {"slice_id": "s0000", "rows_read": 500, "seconds": 5.0, "batches": 2, "watermark": "2026-11-01T00:50:00Z"}
    store.finish_parallel("s0000", metrics, epoch)
    store.record_progress(
        "s0000",
        [
            {"timestamp": "2026-11-26T10:00:01.000Z", "batchDuration": 1500},
            {"timestamp": "2026-11-26T10:00:03.000Z", "batchDuration": 2000},
        ],
    )
    runs = rp.slice_runs(store, BackfillPlan("bf", "parallel", slices))
    assert [r.done for r in runs] == [True, False]
    end = to_micros(datetime(2026, 11, 26, 10, 0, 5, tzinfo=timezone.utc))
    assert runs[0].ended == end and runs[0].started == end - 5 * SECOND and runs[0].rows_per_second == 100
    assert runs[1].started is None and runs[1].read_start == (T0 + timedelta(hours=1)).isoformat()
    end = (T0 + timedelta(hours=2)).isoformat()
    page = rp.BackfillReportPage("bf", "rmi", T0.isoformat(), end, "parallel", "1h", 0, True, slices=runs).render()
    assert "not run" in page and "1/2" in page


@pytest.mark.airflow
def test_report_link_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_kappa.backfill.backfill import Backfill
    from airflow_provider_kappa.exceptions import KappaConfigError
    from airflow_provider_kappa.job.config import load_config
    from airflow_provider_kappa.operators import links

    monkeypatch.setenv("KAPPA_LAKE", str(tmp_path))
    bf = Backfill.create(
        load_config(EXAMPLES / "rmi" / "kappa.yaml"), {"start": "2026-11-01T01:00:00Z", "end": "2026-11-01T02:00:00Z"}
    )
    path = tmp_path / "checkpoints" / "rmi" / "backfill" / bf.id / "report.html"
    assert bf.store().report_file() == str(path)
    assert links.report_url(bf) == path.as_uri()
    monkeypatch.setenv("AIRFLOW__KAPPA__REPORT_BASE_URL", "https://reports.example.com/ckpt/")
    assert links.report_url(bf) == f"https://reports.example.com/ckpt/rmi/backfill/{bf.id}/report.html"
    monkeypatch.setenv("AIRFLOW__KAPPA__SPARK_HISTORY_URL", "http://history:18080/?app={app_name}")
    assert links.spark_finished_url(bf, "s0001") == f"http://history:18080/?app=kappa-rmi-{bf.id}-s0001"
    monkeypatch.setenv("AIRFLOW__KAPPA__SPARK_UI_URL", "http://proxy/{nope}")
    with pytest.raises(
        KappaConfigError, match=r"\[kappa\] spark_ui_url: 'http://proxy/\{nope\}' has a bad placeholder"
    ):
        links.spark_ui_url(bf, "s0001")


def test_demo_report_text_and_html_use_the_shared_drawing(tmp_path: Path) -> None:
    report = DemoReport(
        title="Kappa backfill demo",
        facts=[("match rate", "100.000%"), ("wall time", "42.0 s")],
        slices=[SliceStat("20261101T0000", 1200, 4.0, 5, "2026-11-01T00:50:00"), SliceStat("20261101T0100", 0, 0.0, 0)],
        hours=[HourCount("2026-11-01T00:00:00+00:00", 10, 10), HourCount("2026-11-01T02:00:00+00:00", 7, 9)],
        notes=["2 rows differ: events the live run dropped as late"],
    )
    text = report.to_text()
    assert "match rate  100.000%" in text
    assert "20261101T0000" in text and "300" in text  # 1200 rows / 4 s
    assert "2 rows differ" in text
    page = report.write_html(tmp_path / "r" / "report.html").read_text()
    charts = svgs(page)
    assert [c.get("class") for c in charts] == ["chart windows", "chart bars"]
    bands = [
        (r.get("data-start"), r.get("data-end")) for r in charts[0].iter(f"{NS}rect") if r.get("class") == "diff-band"
    ]
    assert bands == [
        ("2026-11-01T02:00:00+00:00", "2026-11-01T03:00:00+00:00")
    ]  # the hour in between is empty on both sides
    assert CSS in page and "2026-11-01T00:50:00" in page and "2 rows differ" in page
    for chart in charts:
        assert overlaps(tick_labels(chart)) == []
    assert json.dumps(report.to_text())  # text stays plain


def test_an_empty_window_and_a_refused_backfill_still_render() -> None:
    empty = build_report(
        target_table="t",
        staging=[],
        time_column="window_start",
        start=T0,
        end=T0 + timedelta(days=3),
        staged=arrow([]),
        target=arrow(summary_rows(range(0, 60, 5))),
    )
    empty.warnings = ["a source has rows with a null ingestion time"]
    page = rp.BackfillReportPage(
        "bf",
        "rmi",
        T0.isoformat(),
        (T0 + timedelta(days=3)).isoformat(),
        "sequential",
        "1d",
        99.0,
        True,
        sinks={"summary": empty.to_dict()},
    ).render()
    assert "0.000%" in page and "no slice has run" in page and "a source has rows with a null ingestion time" in page
    charts = svgs(page)
    assert [c.get("class") for c in charts] == ["chart windows", "chart timeline"]
    assert overlaps(tick_labels(charts[0])) == []
