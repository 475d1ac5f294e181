"""What a slice run did, read from Spark's own event log (spark-submit) or the Connect runner's
listener (Spark Connect): the same ``StreamingQueryProgress`` JSON either way.

Each slice's spark-submit writes an uncompressed, non-rolling Spark event log (the format
the Spark History Server reads) into a private folder. Structured Streaming records one
``QueryProgressEvent`` per micro-batch there, holding each source's ``numInputRows``, the
sink's ``numOutputRows``, ``batchDuration`` and the event-time ``watermark``. Nothing is added to the
job: this is Spark's standard progress reporting. Pure Python.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

PROGRESS_EVENT = "org.apache.spark.sql.streaming.StreamingQueryListener$QueryProgressEvent"
_NO_WATERMARK = "1970-01-01T00:00:00.000Z"


def event_log_conf(folder: str | Path) -> dict[str, str]:
    """Spark conf that writes a plain JSON-lines event log into ``folder``.

    :param folder: a local folder (created by the caller).
    """
    return {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": Path(folder).resolve().as_uri(),
        "spark.eventLog.compress": "false",
        "spark.eventLog.rolling.enabled": "false",
    }


@dataclass
class SliceMetrics:
    """Progress of one slice run (all queries of the application).

    :param rows_read: input rows over every micro-batch.
    :param rows_written: rows the sinks received (before the owned-window filter is applied
        in the writer, Spark counts what reached the sink).
    :param batches: micro-batches run.
    :param watermark: the event-time watermark after the last batch (ISO-8601), if any.
    :param batch_seconds: time spent in micro-batches.
    :param seconds: wall-clock time of the spark-submit, start-up included.
    :param queries: names of the streaming queries seen.
    :param peak_state_rows: the most rows held in state after any micro-batch (all stateful
        operators of a query; the largest over queries), a measure of alignment.
    """

    rows_read: int = 0
    rows_written: int = 0
    batches: int = 0
    watermark: str | None = None
    batch_seconds: float = 0.0
    seconds: float = 0.0
    queries: list[str] = field(default_factory=list)
    peak_state_rows: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return asdict(self)

    def to_text(self) -> str:
        """One line for task logs."""
        rate = self.rows_read / self.seconds if self.seconds else 0.0
        return (
            f"rows read {self.rows_read}, rows to sink {self.rows_written}, micro-batches {self.batches}, "
            f"watermark {self.watermark or '-'}, peak state rows {self.peak_state_rows}, duration {self.seconds:.1f}s "
            f"(batches {self.batch_seconds:.1f}s), {rate:.0f} rows/s"
        )


def _events(folder: Path) -> Iterator[dict[str, Any]]:
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")):
        with path.open(encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if PROGRESS_EVENT not in line:
                    continue
                try:
                    yield json.loads(line)
                except ValueError:
                    continue  # a truncated last line of a killed driver's log: not a progress record


def read_progress(folder: str | Path) -> list[dict[str, Any]]:
    """Every ``StreamingQueryProgress`` a run recorded: in the Spark event logs under ``folder``
    (a spark-submit), or, when ``folder`` is a file, one progress JSON per line (the Spark Connect
    runner's listener, :mod:`airflow_provider_kappa.spark.connect_runner`; a truncated line is left out).

    :param folder: the ``spark.eventLog.dir`` of the run, or the runner's progress file.
    """
    root = Path(folder)
    if root.is_file():
        return list(_lines(root))
    if not root.is_dir():
        return []
    return [e["progress"] for e in _events(root) if isinstance(e.get("progress"), dict)]


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8", errors="replace") as fh:
        for line in fh:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                yield record


def _input_rows(progress: dict[str, Any]) -> int:
    """Rows a batch read: the sum over its sources (the event log's progress JSON has no
    top-level ``numInputRows``; the live ``StreamingQueryProgress`` object computes it the same way)."""
    sources = progress.get("sources")
    if isinstance(sources, list) and sources:
        return sum(int(s.get("numInputRows") or 0) for s in sources if isinstance(s, dict))
    return int(progress.get("numInputRows") or 0)


def summarize(progress: list[dict[str, Any]], seconds: float) -> SliceMetrics:
    """Sum a run's progress records.

    :param progress: records from :func:`read_progress`.
    :param seconds: the run's wall-clock duration.
    """
    metrics = SliceMetrics(seconds=round(seconds, 3))
    last_watermark: dict[str, str] = {}
    for p in progress:
        name = str(p.get("name") or p.get("id") or "?")
        if name not in metrics.queries:
            metrics.queries.append(name)
        metrics.batches += 1
        metrics.rows_read += _input_rows(p)
        metrics.rows_written += max(0, int((p.get("sink") or {}).get("numOutputRows") or 0))  # -1: not reported
        metrics.batch_seconds += float(p.get("batchDuration") or 0) / 1000.0
        state = sum(int(op.get("numRowsTotal") or 0) for op in p.get("stateOperators") or [] if isinstance(op, dict))
        metrics.peak_state_rows = max(metrics.peak_state_rows, state)
        watermark = (p.get("eventTime") or {}).get("watermark")
        if watermark and watermark != _NO_WATERMARK:
            last_watermark[name] = watermark
    metrics.batch_seconds = round(metrics.batch_seconds, 3)
    if last_watermark:
        metrics.watermark = min(last_watermark.values())
    return metrics
