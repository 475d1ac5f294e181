"""What a slice run did, read from Spark's own event log (spark-submit) or the Connect runner's
listener (Spark Connect): the same ``StreamingQueryProgress`` JSON either way.

Each slice's spark-submit writes a Spark event log (the format the Spark History Server reads):
to the user's ``spark.eventLog.dir`` when the job's conf or the platform's spark-defaults set one
(so slices reach the user's history server), else, uncompressed and non-rolling, into a private
folder. Structured Streaming records one ``QueryProgressEvent`` per micro-batch there, holding each
source's ``numInputRows``, the sink's ``numOutputRows``, ``batchDuration`` and the event-time
``watermark``. Nothing is added to the job: this is Spark's standard progress reporting. From the
user's folder, :func:`collect_progress` finds the run's log by its ``spark.kappa.run.id`` and copies
its progress records into the private folder, where :func:`read_progress` reads them either way.
Pure Python (plain, rolling and zstd-compressed logs; a folder on a remote file system through pyarrow).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import zstandard

PROGRESS_EVENT = "org.apache.spark.sql.streaming.StreamingQueryListener$QueryProgressEvent"
RUN_ID = "spark.kappa.run.id"
_NO_WATERMARK = "1970-01-01T00:00:00.000Z"


PROGRESS_DIR = "spark.kappa.progress.dir"
"""Where a run's progress is read from (kappa's private folder): the event log goes there unless the
user sets ``spark.eventLog.dir`` (:func:`airflow_provider_kappa.engine.submit_args.submit_args`)."""


def event_log_conf(folder: str | Path) -> dict[str, str]:
    """Spark conf naming ``folder`` as the run's progress folder: the event log (plain JSON lines) is
    written there unless the job's conf or spark-defaults set ``spark.eventLog.dir``; then
    :func:`collect_progress` copies the run's progress records there after the run.

    :param folder: a local folder (created by the caller).
    """
    return {PROGRESS_DIR: Path(folder).resolve().as_uri()}


def _filesystem(uri: str) -> tuple[Any, str]:
    """A pyarrow file system and the path in it for an event-log folder URI (``file:``, a plain path,
    ``hdfs://``, ``s3a://``, ``gs://``, ``abfs://`` ...)."""
    from pyarrow import fs

    if "://" not in uri and not uri.startswith("file:"):
        return fs.LocalFileSystem(), str(Path(uri).resolve())
    if uri.startswith("file:"):
        return fs.LocalFileSystem(), "/" + uri.removeprefix("file:").lstrip("/")
    scheme, rest = uri.split("://", 1)
    scheme = {"s3a": "s3", "s3n": "s3"}.get(scheme, scheme)
    return fs.FileSystem.from_uri(f"{scheme}://{rest}")  # type: ignore[no-any-return]


_HEAD_BYTES = 8 << 20  # the environment event, with the run id, is among a log's first events


def _codec(path: str) -> str | None:
    ext = path.rsplit("/", 1)[-1].rsplit(".", 1)[-1] if "." in path.rsplit("/", 1)[-1] else ""
    if ext in ("lz4", "snappy", "lzf"):
        raise ValueError(f"{path}: event log compressed with {ext}; readable: plain or zstd")
    return "zstd" if ext == "zstd" else None


def _read(filesystem: Any, path: str, limit: int | None = None) -> str:
    """The text of one event-log file (plain, or zstd: Spark 4's default codec), or its first ``limit`` bytes."""
    codec = _codec(path)
    with filesystem.open_input_stream(path, compression=None) as raw:  # no guess from the extension
        if codec == "zstd":
            with zstandard.ZstdDecompressor().stream_reader(raw) as reader:
                data = reader.read(limit) if limit else reader.readall()
        else:
            data = raw.read(limit) if limit else raw.read()
    return bytes(data).decode("utf-8", errors="replace")


def collect_progress(event_log_dir: str, run_id: str, into: str | Path, since: float) -> int:
    """Copy the progress records of run ``run_id`` from the user's event-log folder into ``into``
    (where :func:`read_progress` reads them); the run's log is the one, modified after ``since``, whose
    Spark properties hold ``spark.kappa.run.id = run_id``. Rolling logs (``eventlog_v2_*`` folders) included.

    :param event_log_dir: the run's ``spark.eventLog.dir``.
    :param run_id: the run's ``spark.kappa.run.id``.
    :param into: the private progress folder (a path or ``file:`` URI).
    :param since: the run's start (epoch seconds): older logs are not read.
    :returns: how many progress records were copied.
    :raises OSError: the folder cannot be listed or a log cannot be read from here.
    :raises ValueError: the run's log is compressed with a codec other than zstd.
    """
    from pyarrow import fs

    filesystem, root = _filesystem(event_log_dir)
    target = Path(str(into).removeprefix("file://"))
    infos = filesystem.get_file_info(fs.FileSelector(root, recursive=True, allow_not_found=True))
    files = sorted(
        (
            i
            for i in infos
            if i.type == fs.FileType.File
            and not i.base_name.startswith(".")
            and (i.mtime is None or i.mtime.timestamp() >= since - 5)
        ),
        key=lambda i: i.path,
    )
    marker = f'"{RUN_ID}":"{run_id}"'
    logs: dict[str, list[tuple[int, str]]] = {}  # one log (a file, or a rolling log's folder) -> its parts
    for info in files:
        rolling = "/eventlog_v2_" in info.path
        run = info.path.rsplit("/", 2)[-2] if rolling else info.base_name.split(".")[0]
        index = (
            int(re.sub(r"^events_(\d+)_.*", r"\1", info.base_name))
            if rolling and info.base_name.startswith("events_")
            else 0
        )
        logs.setdefault(run, []).append((index, info.path))
    count, found, unreadable = 0, False, []
    for run, parts in logs.items():
        parts.sort()
        first = next((path for index, path in parts if index > 0 or len(parts) == 1), parts[0][1])
        try:
            head = _read(filesystem, first, _HEAD_BYTES)
        except ValueError as e:
            unreadable.append(str(e))  # maybe another application's log: an error only if ours is not found
            continue
        if marker not in head.replace(" ", ""):
            continue  # another application's log: only its head was read
        found = True
        progress = [
            line for _, path in parts for line in _read(filesystem, path).splitlines() if PROGRESS_EVENT in line
        ]
        target.mkdir(parents=True, exist_ok=True)
        (target / run).write_text("\n".join(progress) + ("\n" if progress else ""), encoding="utf-8")
        count += len(progress)
    if not found and unreadable:
        raise ValueError(f"run {run_id} not found in {event_log_dir}; unreadable: {'; '.join(unreadable)}")
    return count


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
    runner's listener, :mod:`airflow_provider_kappa.engine.connect_runner`; a truncated line is left out).

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
