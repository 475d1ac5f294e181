"""The demo report renders every number it is given, as text and as HTML with charts."""

from __future__ import annotations

from pathlib import Path

from airflow_provider_kappa.demo.report import DemoReport, HourCount, SliceStat


def test_report_text_and_html(tmp_path: Path) -> None:
    report = DemoReport(
        title="Kappa backfill demo",
        facts=[("match rate", "100.000%"), ("wall time", "42.0 s")],
        slices=[SliceStat("20261101T0000", 1200, 4.0, 5, "2026-11-01T00:50:00"), SliceStat("20261101T0100", 0, 0.0, 0)],
        hours=[HourCount("2026-11-01T00:00:00+00:00", 10, 10), HourCount("2026-11-01T01:00:00+00:00", 7, 9)],
        notes=["2 rows differ: events the live run dropped as late"],
    )
    text = report.to_text()
    assert "match rate  100.000%" in text
    assert "20261101T0000" in text and "300" in text  # 1200 rows / 4 s
    assert "2 rows differ" in text
    page = report.write_html(tmp_path / "r" / "report.html").read_text()
    assert page.count("<svg") == 2
    assert "1,200" not in page or "rows/s" in page
    assert "live reference" in page and "backfill" in page and "2026-11-01T00:50:00" in page
