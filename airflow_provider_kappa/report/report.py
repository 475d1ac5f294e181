"""The report of a backfill: one self-contained HTML page (inline CSS and SVG; no script, no
font or file from elsewhere), written beside the backfill's checkpoints by the validate step
that ``kappa backfill`` and the DAG's validate task both run.

Where: ``<checkpoint_root>/<job>/backfill/<backfill_id>/report.html``
(:meth:`~airflow_provider_kappa.job.checkpoints.CheckpointStore.report_file`), on any
filesystem the checkpoints live on. What:

- the match rate of each sink, staged (backfill) and target (live, the table as it is now)
  rows, the ``min_match`` gate;
- live vs backfill rows per output window across the whole window (``ValidationReport.windows``),
  the windows whose counts differ shaded, with a strip of the difference under it: the incident
  is what stands out;
- the slice timeline: one bar per slice run on the wall clock, its duration and the watermark
  it reached; throughput (rows read per second) per slice; a table with every number;
- samples of rows found on one side only.

This module reads the backfill (:func:`slice_runs`, :func:`report_page`), lays out its page
(:class:`BackfillReportPage`) and writes it (:func:`write_report`). The drawing is in
:mod:`~airflow_provider_kappa.report.charts` (the charts), :mod:`~airflow_provider_kappa.report.axes`
(axes whose labels never overlap, text widths) and :mod:`~airflow_provider_kappa.report.page`
(the HTML page, cards, tables), which the demo's report draws with too.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from airflow_provider_kappa.report.axes import esc, rate_label
from airflow_provider_kappa.report.charts import Bar, Windows, bar_rows_chart, span_label, timeline_chart, window_chart
from airflow_provider_kappa.report.page import cards, page, table
from airflow_provider_kappa.spark.storage import filesystem, write_text
from airflow_provider_kappa.timeaxis import SECOND, format_duration_us
from airflow_provider_kappa.timeparse import to_micros

if TYPE_CHECKING:
    from airflow_provider_kappa.backfill.backfill import Backfill
    from airflow_provider_kappa.backfill.plan import BackfillPlan
    from airflow_provider_kappa.backfill.validate import ValidationReport
    from airflow_provider_kappa.job.checkpoints import CheckpointStore

log = logging.getLogger(__name__)


@dataclass
class SliceRun:
    """A slice of the plan and what its last run did (from the checkpoint store)."""

    slice_id: str
    read_start: str
    read_end: str
    owns_start: str
    owns_end: str
    done: bool = False
    skipped: bool = False
    rows_read: int = 0
    rows_written: int = 0
    batches: int = 0
    seconds: float = 0.0
    watermark: str | None = None
    peak_state_rows: int = 0
    started: int | None = None  # epoch µs
    ended: int | None = None

    @property
    def rows_per_second(self) -> float:
        """Rows read per second of the run's wall-clock time."""
        return self.rows_read / self.seconds if self.seconds > 0 else 0.0


def slice_runs(store: CheckpointStore, plan: BackfillPlan) -> list[SliceRun]:
    """Every slice of ``plan`` with the metrics of its last successful run and when it ran:
    it ended at the end of its last micro-batch (the Spark progress records' ``timestamp`` and
    ``batchDuration``) and started ``seconds`` (its wall-clock duration) before.

    :param store: the backfill's checkpoint store.
    :param plan: its plan.
    """
    progress = store.progress()
    out = []
    for sp in plan.slices:
        run = SliceRun(
            sp.slice_id,
            sp.read_start.isoformat(),
            sp.read_end.isoformat(),
            sp.owns_start.isoformat(),
            sp.owns_end.isoformat(),
        )
        done = store.done(sp.slice_id)
        if done is not None:
            run.done, run.skipped = True, bool(done.get("skipped"))
            run.rows_read, run.rows_written = int(done.get("rows_read", 0)), int(done.get("rows_written", 0))
            run.batches, run.seconds = int(done.get("batches", 0)), float(done.get("seconds", 0.0))
            run.watermark, run.peak_state_rows = done.get("watermark"), int(done.get("peak_state_rows", 0))
            ends = [_batch_end(p) for p in progress.get(sp.slice_id, [])]
            ended = max((e for e in ends if e is not None), default=None)
            if ended is not None:
                run.ended, run.started = ended, ended - round(run.seconds * SECOND)
        out.append(run)
    return out


def _batch_end(progress: Mapping[str, Any]) -> int | None:
    stamp = progress.get("timestamp")
    if not isinstance(stamp, str):
        return None
    try:
        at = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    if at.tzinfo is None:
        at = at.replace(tzinfo=timezone.utc)
    return to_micros(at) + int(float(progress.get("batchDuration") or 0) * 1000)


@dataclass
class BackfillReportPage:
    """What the page shows: the backfill, each sink's validation and the slice runs."""

    backfill_id: str
    job: str
    window_start: str
    window_end: str
    mode: str
    slice: str
    min_match: float
    publishes: bool
    exactness: str = ""
    sinks: dict[str, dict[str, Any]] = field(default_factory=dict)
    slices: list[SliceRun] = field(default_factory=list)
    generated: str = ""

    def render(self) -> str:
        """The HTML page."""
        body: list[str] = []
        ran = [s for s in self.slices if s.done and not s.skipped]
        rows = sum(s.rows_read for s in ran)
        spark = sum(s.seconds for s in ran)
        figures: list[tuple[str, str, str]] = []
        for name, rep in self.sinks.items():
            rate = float(rep["match_rate"])
            ok = rate >= self.min_match and not (rep["staged_rows"] == 0 and rep["target_rows"] > 0)
            figures.append(
                (f"{rate:.3f}%", f"match rate, sink {name}", "good" if rate >= 100.0 else ("" if ok else "bad"))
            )
            windows = Windows.from_report(rep)
            if windows is not None:
                n = sum(1 for i in range(len(windows.live)) if windows.differs(i))
                kind = "windows" if windows.grid else "buckets"
                figures.append((f"{n:,} / {len(windows.live):,}", f"{kind} differing, {name}", "bad" if n else "good"))
        figures.append((f"{sum(1 for s in self.slices if s.done)}/{len(self.slices)}", "slices done", ""))
        figures.append((f"{rows:,}", "rows read", ""))
        figures.append((rate_label(rows / spark) if spark else "-", "rows/s (all slices)", ""))
        figures.append((format_duration_us(spark * SECOND) if spark else "-", "Spark time", ""))
        body.append(cards(figures))
        gate = "publishes" if self.publishes else "does not publish (dry run or publish off)"
        body.append(
            f"<p class='muted'>min_match {self.min_match:g}%; this backfill {gate}. Live is the target table as it "
            "is now (what the backfill replaces); backfill is the staged output of the slices.</p>"
        )
        if self.exactness:
            body.append(f"<p class='exactness'>Exactness: {esc(self.exactness)}</p>")
        for name, rep in self.sinks.items():
            body.append(self._sink_section(name, rep))
        body.append(self._slices_section())
        sub = (
            f"job {self.job} · window [{self.window_start}, {self.window_end}) · mode {self.mode} · slice {self.slice}"
            + (f" · written {self.generated}" if self.generated else "")
        )
        return page(f"Backfill {self.backfill_id}", sub, body)

    def _sink_section(self, name: str, rep: Mapping[str, Any]) -> str:
        parts = [f"<section class='sink' data-sink='{esc(name)}'><h2>Sink {esc(name)}: {esc(rep['target_table'])}</h2>"]
        parts.append(
            cards(
                [
                    (f"{rep['target_rows']:,}", "live rows (target now)", ""),
                    (f"{rep['staged_rows']:,}", "backfill rows (staged)", ""),
                    (f"{rep['matched_rows']:,}", "rows equal on both sides", ""),
                    (f"{rep['only_target_rows']:,}", "rows only live", "bad" if rep["only_target_rows"] else ""),
                    (
                        f"{rep['only_staged_rows']:,}",
                        "rows only in the backfill",
                        "bad" if rep["only_staged_rows"] else "",
                    ),
                ]
            )
        )
        windows = Windows.from_report(rep)
        if windows is not None:
            parts.append(f"<h3>Rows per output window on {esc(rep['time_column'])}: live vs backfill</h3>")
            parts.append(f"<div class='panel'>{window_chart(windows, f'rows per window, sink {name}')}</div>")
            runs = windows.runs()
            if runs:
                listed = []
                for i, j in runs[:30]:
                    live, back = sum(windows.live[i:j]), sum(windows.backfill[i:j])
                    listed.append(
                        (
                            span_label(windows.first + i * windows.step, windows.first + j * windows.step),
                            j - i,
                            f"{live:,}",
                            f"{back:,}",
                            f"{sum(windows.only_live[i:j]):,}",
                            f"{sum(windows.only_backfill[i:j]):,}",
                        )
                    )
                shown = ", first 30" if len(runs) > 30 else ""
                parts.append(f"<h3>Windows that differ ({len(runs)} run(s) of consecutive windows{shown})</h3>")
                parts.append(
                    table(
                        ["windows (UTC)", "windows", "live rows", "backfill rows", "only live", "only backfill"],
                        listed,
                        [False] + [True] * 5,
                    )
                )
        for warning in rep.get("warnings") or []:
            parts.append(f"<p class='warning'>warning: {esc(warning)}</p>")
        if rep.get("staged_outside_window"):
            parts.append(
                f"<p><b>{rep['staged_outside_window']:,}</b> staged rows lie outside the window (publish refuses them).</p>"
            )
        sides = (
            ("only live (in the target, not in the backfill)", "only_target_sample"),
            ("only in the backfill", "only_staged_sample"),
        )
        for side, key in sides:
            sample = rep.get(key) or []
            if sample:
                columns = [c for c in sample[0] if c != "_count"] + ["_count"]
                parts.append(f"<h3>Sample of rows {side}</h3>")
                parts.append(table(columns, [[_cell(r.get(c)) for c in columns] for r in sample]))
        parts.append("</section>")
        return "".join(parts)

    def _slices_section(self) -> str:
        parts = ["<section class='slices'><h2>Slices</h2>"]
        bars = []
        for s in self.slices:
            if not s.done:
                bars.append(Bar(s.slice_id, None, None, "not run", cls="missing"))
                continue
            if s.skipped:
                bars.append(Bar(s.slice_id, None, None, "skipped: no input", cls="skipped"))
                continue
            wm = f" · watermark {_short_time(s.watermark)}" if s.watermark else ""
            bars.append(
                Bar(
                    s.slice_id,
                    s.started,
                    s.ended,
                    f"{s.seconds:.1f} s{wm}",
                    tip=f"{s.slice_id}: read [{s.read_start}, {s.read_end}), {s.rows_read:,} rows, {s.batches} micro-batches, "
                    f"{s.seconds:.1f} s, watermark {s.watermark or '-'}",
                )
            )
        parts.append("<h3>Timeline (wall clock, UTC): duration and the watermark each slice reached</h3>")
        parts.append(f"<div class='panel'>{timeline_chart(bars, 'slice timeline')}</div>")
        ran = [s for s in self.slices if s.done and not s.skipped]
        if ran:
            parts.append("<h3>Throughput per slice (rows read per second)</h3>")
            parts.append(
                "<div class='panel'>"
                + bar_rows_chart(
                    [s.slice_id for s in ran], [s.rows_per_second for s in ran], "rows/s", "throughput per slice"
                )
                + "</div>"
            )
        parts.append("<h3>Every slice</h3>")
        parts.append(
            table(
                [
                    "slice",
                    "reads (ingestion time)",
                    "owns",
                    "rows read",
                    "rows to sink",
                    "micro-batches",
                    "seconds",
                    "rows/s",
                    "watermark",
                    "peak state rows",
                ],
                [
                    [
                        s.slice_id,
                        _range(s.read_start, s.read_end),
                        _range(s.owns_start, s.owns_end),
                        f"{s.rows_read:,}",
                        f"{s.rows_written:,}",
                        s.batches,
                        f"{s.seconds:.1f}",
                        rate_label(s.rows_per_second),
                        _short_time(s.watermark) if s.watermark else _no_watermark(s),
                        f"{s.peak_state_rows:,}",
                    ]
                    for s in self.slices
                ],
                [False, False, False, True, True, True, True, True, False, True],
            )
        )
        parts.append("</section>")
        return "".join(parts)


def _cell(value: object) -> object:
    return json.dumps(value) if isinstance(value, (dict, list)) else value


def _no_watermark(s: SliceRun) -> str:
    return "skipped" if s.skipped else ("-" if s.done else "not run")


def _range(start: str, end: str) -> str:
    """``2026-11-01 00:00 → 01:00`` (the end's date only when it differs)."""
    a, b = _short_time(start)[:16], _short_time(end)[:16]
    return f"{a} → {b[11:] if a[:10] == b[:10] else b}"


def _short_time(value: str | None) -> str:
    if not value:
        return "-"
    try:
        at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return value
    if at.tzinfo is not None:
        at = at.astimezone(timezone.utc)
    return at.strftime("%Y-%m-%d %H:%M:%S")


def report_page(
    bf: Backfill, plan: BackfillPlan, reports: Mapping[str, ValidationReport | Mapping[str, Any]]
) -> BackfillReportPage:
    """The page of ``bf``: its validation reports and the slice runs kept in its checkpoint store.

    :param bf: the backfill.
    :param plan: its plan.
    :param reports: sink name -> validation report (object or ``to_dict()``).
    """
    p = bf.params
    return BackfillReportPage(
        backfill_id=bf.id,
        job=bf.cfg.job.name,
        window_start=p.start.isoformat(),
        window_end=p.end.isoformat(),
        mode=p.mode,
        slice=str(p.to_dict()["slice"]),
        min_match=p.min_match_for(plan.replays_ledger),
        publishes=bool(p.publishes),
        exactness=plan.exactness_line,
        sinks={name: (dict(r) if isinstance(r, Mapping) else r.to_dict()) for name, r in reports.items()},
        slices=slice_runs(bf.store(), plan),
        generated=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
    )


def write_report(bf: Backfill, plan: BackfillPlan, reports: Mapping[str, ValidationReport | Mapping[str, Any]]) -> str:
    """Write the report of ``bf`` to its checkpoint folder (:meth:`~airflow_provider_kappa.job.checkpoints.CheckpointStore.report_file`; replacing an earlier one); return where.

    :param bf: the backfill.
    :param plan: its plan.
    :param reports: sink name -> validation report.
    """
    uri = bf.store().report_file()
    fs, path = filesystem(uri, "backfill report")
    write_text(fs, path, report_page(bf, plan, reports).render())
    log.info("backfill %s: report written to %s", bf.id, uri)
    return uri
