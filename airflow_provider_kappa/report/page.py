"""The report's HTML page: its stylesheet (:data:`CSS`), the page around a body (:func:`page`),
key figure cards (:func:`cards`) and tables (:func:`table`); also what the demo's report
draws with. Self-contained: inline CSS, no script, no font or file from elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from airflow_provider_kappa.report.axes import FONT_PX, esc
from airflow_provider_kappa.report.charts import BACKFILL, BAND, DIFF, LIVE, WIDTH

CSS = f"""
:root {{ --ink:#0f172a; --muted:#64748b; --line:#e2e8f0; --good:#15803d; --bad:{DIFF}; }}
* {{ box-sizing: border-box; }}
body {{ font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: var(--ink);
  margin: 0; background: #f8fafc; }}
main {{ max-width: {WIDTH + 74}px; margin: 0 auto; padding: 28px 24px 48px; }}
h1 {{ font-size: 22px; margin: 0 0 4px; }} h2 {{ font-size: 17px; margin: 32px 0 8px; }}
h3 {{ font-size: 14px; margin: 18px 0 6px; color: var(--muted); font-weight: 600; }}
.sub {{ color: var(--muted); margin: 0 0 18px; }}
.cards {{ display: flex; flex-wrap: wrap; gap: 12px; margin: 12px 0; }}
.card {{ background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 10px 14px; min-width: 150px; }}
.card .v {{ font-size: 22px; font-weight: 650; font-variant-numeric: tabular-nums; }}
.card .k {{ color: var(--muted); font-size: 12px; }}
.card.good .v {{ color: var(--good); }} .card.bad .v {{ color: var(--bad); }}
.panel {{ background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 12px; overflow-x: auto; }}
svg {{ display: block; font-family: inherit; max-width: 100%; height: auto; }}
svg text {{ font-size: {FONT_PX}px; fill: #334155; }}
svg .legend text {{ font-size: 12px; }}
svg .small {{ font-size: 10px; fill: var(--muted); }}
svg .grid {{ stroke: #eef2f7; }} svg .axis {{ stroke: #94a3b8; }} svg .tickmark {{ stroke: #94a3b8; }}
svg .zero {{ stroke-dasharray: 3 3; }}
svg .live {{ fill: {LIVE}; fill-opacity: .55; stroke: {LIVE}; }}
svg .backfill {{ fill: none; stroke: {BACKFILL}; stroke-width: 1.8; }}
svg .diff-band {{ fill: {BAND}; }} svg .only-backfill {{ fill: {BACKFILL}; }} svg .only-live {{ fill: {DIFF}; }}
svg .hover {{ fill: transparent; }} svg .hover:hover {{ fill: rgba(37,99,235,.08); }}
svg .stripe {{ fill: #f8fafc; }} svg .bar.run {{ fill: {BACKFILL}; }} svg .bar.skipped {{ fill: #cbd5e1; }}
svg .note {{ fill: #334155; }} svg .note.inbar {{ fill: #fff; }} svg .muted {{ fill: var(--muted); }}
table {{ border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; background: #fff; }}
th, td {{ text-align: left; padding: 4px 8px; border-bottom: 1px solid var(--line); white-space: nowrap; font-size: 13px; }}
td.n, th.n {{ text-align: right; }}
tr.diff td {{ background: #fff5f5; }}
.scroll {{ overflow-x: auto; border: 1px solid var(--line); border-radius: 8px; }}
.muted {{ color: var(--muted); }}
.warning {{ background: #fffbeb; border: 1px solid #fde68a; border-radius: 6px; padding: 6px 10px; }}
"""


def page(title: str, subtitle: str, body: Iterable[str]) -> str:
    """A whole HTML page around ``body`` (already-safe HTML parts).

    :param title: the page's title and heading (text).
    :param subtitle: one line under it (text).
    :param body: HTML parts.
    """
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body><main>"
        f"<h1>{esc(title)}</h1><p class='sub'>{esc(subtitle)}</p>" + "".join(body) + "</main></body></html>"
    )


def cards(items: Iterable[tuple[str, str, str]]) -> str:
    """Key figures: ``(value, caption, class)`` with class ``good``, ``bad`` or empty."""
    return (
        "<div class='cards'>"
        + "".join(
            f"<div class='card {esc(c)}'><div class='v'>{esc(v)}</div><div class='k'>{esc(k)}</div></div>"
            for v, k, c in items
        )
        + "</div>"
    )


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], numeric: Sequence[bool] | None = None) -> str:
    """An HTML table (escaped cells); ``numeric`` right-aligns columns."""
    numeric = numeric or [False] * len(headers)
    head = "".join(f"<th class='{'n' if n else ''}'>{esc(h)}</th>" for h, n in zip(headers, numeric))
    body = []
    for r in rows:
        cells = "".join(f"<td class='{'n' if n else ''}'>{esc(c)}</td>" for c, n in zip(r, numeric))
        body.append(f"<tr>{cells}</tr>")
    return f"<div class='scroll'><table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"
