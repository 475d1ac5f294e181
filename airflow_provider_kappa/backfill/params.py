"""Backfill parameters: one parser and one validator shared by ``kappa plan``/``kappa backfill``
and the Airflow DAG's Params form.

Pure Python (no Airflow, pyspark or pyiceberg): it runs at DAG-parse time (the form's JSON
schema), in the CLI and inside every task. Every error names the parameter, the bad value
and what is allowed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Mapping

from airflow_provider_kappa.backfill.config import IcebergSourceConfig, JobConfig
from airflow_provider_kappa.exceptions import KappaConfigError
from airflow_provider_kappa.timeparse import format_duration, parse_duration, parse_timestamp

SEQUENTIAL = "sequential"
PARALLEL = "parallel"
MODES = (SEQUENTIAL, PARALLEL)
DEFAULT_THRESHOLD = timedelta(minutes=15)

#: Every parameter name, in form order.
KEYS = (
    "start",
    "end",
    "sources",
    "slice",
    "max_misalignment_threshold",
    "warmup",
    "tail",
    "mode",
    "dry_run",
    "publish",
    "min_match",
)

# JSON-schema patterns mirroring timeparse: checked by Airflow when a run is triggered.
_NUM = r"\d+(\.\d+)?"
_ISO_DURATION = rf"(?![Pp][Tt]?\s*$)[Pp]({_NUM}[Dd])?([Tt]({_NUM}[Hh])?({_NUM}[Mm])?({_NUM}[Ss])?)?"
_SHORT_DURATION = rf"{_NUM}\s*(ms|s|sec|min|h|d)"
#: A duration ``timeparse.parse_duration`` accepts with ``allow_zero=True``.
DURATION_PATTERN = rf"^\s*({_SHORT_DURATION}|{_ISO_DURATION})\s*$"
#: The same, but some digit must be non-zero (a positive duration).
POSITIVE_DURATION_PATTERN = rf"^(?=[^1-9]*[1-9])\s*({_SHORT_DURATION}|{_ISO_DURATION})\s*$"
#: An ISO-8601 timestamp with a UTC offset (``Z`` or ``+hh:mm``); naive timestamps do not match.
TIMESTAMP_PATTERN = (
    r"^\s*\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?([Zz]|[+-]\d{2}:?\d{2})\s*$"
)


@dataclass(frozen=True)
class BackfillParams:
    """Validated parameters of one backfill (all times aware UTC).

    :param start: first instant of the window (sink ``time_column``), inclusive.
    :param end: end of the window, exclusive.
    :param sources: job source names to backfill.
    :param slice: slice length; slices are aligned to multiples of it from the epoch.
    :param max_misalignment_threshold: ingestion time one micro-batch may advance.
    :param warmup: ingestion time read before ``start`` to bootstrap state.
    :param tail: ingestion time read after ``end`` so late events and the watermark close windows.
    :param mode: ``sequential`` (one shared checkpoint) or ``parallel`` (independent slices).
    :param dry_run: write nothing outside staging (no publish).
    :param publish: publish after a passing validation.
    :param min_match: minimum match rate (percent) of staged vs current rows; gates publish.
    """

    start: datetime
    end: datetime
    sources: tuple[str, ...]
    slice: timedelta
    max_misalignment_threshold: timedelta
    warmup: timedelta
    tail: timedelta
    mode: str
    dry_run: bool
    publish: bool
    min_match: float

    @property
    def read_start(self) -> datetime:
        """First ingestion instant read: ``start - warmup``."""
        return self.start - self.warmup

    @property
    def read_end(self) -> datetime:
        """End of the ingestion range read (exclusive): ``end + tail``."""
        return self.end + self.tail

    @property
    def publishes(self) -> bool:
        """Whether this backfill ends with a publish (not a dry run, publish on)."""
        return self.publish and not self.dry_run

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form, accepted back by :func:`parse_params`."""
        return {
            "start": self.start.isoformat(),
            "end": self.end.isoformat(),
            "sources": list(self.sources),
            "slice": human_duration(self.slice),
            "max_misalignment_threshold": human_duration(self.max_misalignment_threshold),
            "warmup": human_duration(self.warmup),
            "tail": human_duration(self.tail),
            "mode": self.mode,
            "dry_run": self.dry_run,
            "publish": self.publish,
            "min_match": self.min_match,
        }


def human_duration(value: timedelta) -> str:
    """Render a duration in the largest whole unit (``1h``, ``15min``, ``90s``, ``0s``), parseable
    by :func:`~airflow_provider_kappa.timeparse.parse_duration`."""
    micros = round(value.total_seconds() * 1_000_000)
    for unit, size in (("d", 86_400_000_000), ("h", 3_600_000_000), ("min", 60_000_000), ("s", 1_000_000)):
        if micros and micros % size == 0:
            return f"{micros // size}{unit}"
    return format_duration(value)


def default_threshold(cfg: JobConfig, sources: list[str] | tuple[str, ...] | None = None) -> timedelta:
    """The smallest ``max_misalignment_threshold`` configured on the (resolved) sources, else 15min.

    :param cfg: the job config.
    :param sources: job source names (default: every job source).
    """
    configured = []
    for name in sources or cfg.job_sources():
        try:
            src = cfg.resolve(name, backfill=True)
        except KappaConfigError:
            continue
        if isinstance(src, IcebergSourceConfig) and src.max_misalignment_threshold is not None:
            configured.append(src.max_misalignment_threshold)
    return min(configured) if configured else DEFAULT_THRESHOLD


def _blank(value: object) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _bool(value: object, key: str, default: bool) -> bool:
    if _blank(value):
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.strip().lower() in ("true", "yes", "1")
    raise KappaConfigError(f"backfill parameter {key}: {value!r} is not a boolean; allowed: true, false")


def _sources(cfg: JobConfig, value: object) -> tuple[str, ...]:
    allowed = cfg.job_sources()
    if _blank(value):
        names = list(allowed)
    elif isinstance(value, str):
        names = [s.strip() for s in value.split(",") if s.strip()]
    elif isinstance(value, (list, tuple)) and all(isinstance(s, str) for s in value):
        names = [s.strip() for s in value]
    else:
        raise KappaConfigError(
            f"backfill parameter sources: {value!r} must be a list of source names (or 'a,b'); allowed: {allowed}"
        )
    if not names:
        raise KappaConfigError(f"backfill parameter sources: {value!r} names no source; allowed: {allowed}")
    unknown = [s for s in names if s not in allowed]
    if unknown:
        raise KappaConfigError(
            f"backfill parameter sources: unknown source(s) {unknown} for job {cfg.job.name!r}; allowed: {allowed}"
        )
    for name in names:
        try:
            cfg.resolve(name, backfill=True)
        except KappaConfigError as e:
            raise KappaConfigError(f"backfill parameter sources: {name!r} cannot be backfilled: {e}") from e
    return tuple(dict.fromkeys(names))


def parse_params(cfg: JobConfig, raw: Mapping[str, Any]) -> BackfillParams:
    """Validate raw backfill parameters (CLI flags, DAG params, JSON) against ``cfg``.

    Missing or blank values take the job's ``backfill:`` defaults; ``max_misalignment_threshold``
    defaults to the sources' configured threshold (else 15min) and ``tail`` to that threshold.

    :param cfg: the job config.
    :param raw: parameter name -> value (strings, or already typed values).
    :raises KappaConfigError: naming the parameter, the bad value and what is allowed.
    """
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise KappaConfigError(f"backfill parameters: unknown key(s) {unknown}; allowed: {list(KEYS)}")
    for key in ("start", "end"):
        if _blank(raw.get(key)):
            raise KappaConfigError(
                f"backfill parameter {key}: missing; give an ISO-8601 timestamp with an offset, "
                "e.g. 2026-11-01T00:00:00+00:00"
            )
    start = parse_timestamp(raw["start"], "backfill parameter start")
    end = parse_timestamp(raw["end"], "backfill parameter end")
    if end <= start:
        raise KappaConfigError(
            f"backfill parameter end: {raw['end']!r} is not after start {raw['start']!r}; "
            "the window [start, end) must not be empty"
        )
    sources = _sources(cfg, raw.get("sources"))
    defaults = cfg.backfill

    def duration(key: str, default: timedelta, *, allow_zero: bool) -> timedelta:
        value = raw.get(key)
        if _blank(value):
            return default
        return parse_duration(value, f"backfill parameter {key}", allow_zero=allow_zero)

    slice_len = duration("slice", defaults.slice, allow_zero=False)
    threshold = duration("max_misalignment_threshold", default_threshold(cfg, sources), allow_zero=False)
    warmup = duration("warmup", defaults.warmup, allow_zero=True)
    tail = duration("tail", defaults.tail if defaults.tail is not None else threshold, allow_zero=True)
    if threshold > slice_len:
        raise KappaConfigError(
            f"backfill parameter max_misalignment_threshold: {human_duration(threshold)} exceeds slice "
            f"{human_duration(slice_len)}; it must be at most the slice"
        )
    read_span = (end + tail) - (start - warmup)
    if slice_len > read_span:
        raise KappaConfigError(
            f"backfill parameter slice: {human_duration(slice_len)} is larger than the range read "
            f"[start - warmup, end + tail) = {human_duration(read_span)}; use a slice of at most "
            f"{human_duration(read_span)}"
        )
    mode = defaults.mode if _blank(raw.get("mode")) else str(raw.get("mode")).strip()
    if mode not in MODES:
        raise KappaConfigError(f"backfill parameter mode: {raw.get('mode')!r} is not a mode; allowed: {list(MODES)}")
    min_match_raw = raw.get("min_match")
    if _blank(min_match_raw):
        min_match = defaults.min_match
    else:
        try:
            if isinstance(min_match_raw, bool):
                raise ValueError("a boolean is not a percentage")
            min_match = float(min_match_raw)  # type: ignore[arg-type]
        except (TypeError, ValueError) as e:
            raise KappaConfigError(
                f"backfill parameter min_match: {min_match_raw!r} is not a number; expected a percentage 0-100"
            ) from e
        if not 0.0 <= min_match <= 100.0:
            raise KappaConfigError(f"backfill parameter min_match: {min_match_raw!r} must be between 0 and 100")
    return BackfillParams(
        start=start,
        end=end,
        sources=sources,
        slice=slice_len,
        max_misalignment_threshold=threshold,
        warmup=warmup,
        tail=tail,
        mode=mode,
        dry_run=_bool(raw.get("dry_run"), "dry_run", False),
        publish=_bool(raw.get("publish"), "publish", True),
        min_match=min_match,
    )


def backfill_id(cfg: JobConfig, params: BackfillParams) -> str:
    """A deterministic id of what a backfill computes: same job and parameters -> same id,
    so a rerun reuses its tag, staging tables and checkpoints.

    ``dry_run``, ``publish`` and ``min_match`` do not change staged output and are left out.
    The id uses only ``[a-z0-9_]`` (it becomes part of table, tag and folder names).

    :param cfg: the job config.
    :param params: validated parameters.
    """
    identity = {
        "job": cfg.job.name,
        "start": params.start.isoformat(),
        "end": params.end.isoformat(),
        "mode": params.mode,
        "slice": params.slice.total_seconds(),
        "threshold": params.max_misalignment_threshold.total_seconds(),
        "warmup": params.warmup.total_seconds(),
        "tail": params.tail.total_seconds(),
        "sources": sorted(params.sources),
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:10]
    return f"bf_{params.start:%Y%m%d%H%M}_{digest}"


def param_schemas(cfg: JobConfig) -> dict[str, dict[str, Any]]:
    """JSON schema (with default, title and description) of every parameter, for Airflow Params.

    Each schema checks one value on its own (Airflow validates Params one by one when a run is
    triggered); checks across parameters (``end`` after ``start``, threshold at most the slice,
    slice within the range read) are made by :func:`parse_params` in the first task.

    :param cfg: the job config (its sources and ``backfill:`` defaults).
    """
    sources = cfg.job_sources()
    threshold = default_threshold(cfg)
    d = cfg.backfill
    ts = "ISO-8601 timestamp with an offset, e.g. 2026-11-01T00:00:00+00:00"
    dur = "duration: 30s, 15min, 1h, 2d or ISO-8601 (PT15M)"
    return {
        "start": {
            "type": "string",
            "pattern": TIMESTAMP_PATTERN,
            "title": "start",
            "description": f"First instant of the window to replace (inclusive); {ts}.",
        },
        "end": {
            "type": "string",
            "pattern": TIMESTAMP_PATTERN,
            "title": "end",
            "description": f"End of the window to replace (exclusive, after start); {ts}.",
        },
        "sources": {
            "default": list(sources),
            "type": "array",
            "items": {"type": "string", "enum": list(sources)},
            "examples": list(sources),
            "minItems": 1,
            "uniqueItems": True,
            "title": "sources",
            "description": "Job sources to read from their Iceberg candidates.",
        },
        "slice": {
            "default": human_duration(d.slice),
            "type": "string",
            "pattern": POSITIVE_DURATION_PATTERN,
            "title": "slice",
            "description": f"Slice length (one spark-submit each), aligned to multiples from the epoch; positive {dur}.",
        },
        "max_misalignment_threshold": {
            "default": human_duration(threshold),
            "type": "string",
            "pattern": POSITIVE_DURATION_PATTERN,
            "title": "max_misalignment_threshold",
            "description": f"Ingestion time one micro-batch may advance, at most the slice; positive {dur}.",
        },
        "warmup": {
            "default": human_duration(d.warmup),
            "type": "string",
            "pattern": DURATION_PATTERN,
            "title": "warmup",
            "description": f"Ingestion time read before start to bootstrap state; zero or positive {dur}.",
        },
        "tail": {
            "default": None if d.tail is None else human_duration(d.tail),
            "type": ["null", "string"],
            "pattern": DURATION_PATTERN,
            "title": "tail",
            "description": f"Ingestion time read after end (empty: the threshold); zero or positive {dur}.",
        },
        "mode": {
            "default": d.mode,
            "type": "string",
            "enum": list(MODES),
            "title": "mode",
            "description": "sequential: one shared checkpoint, slices in order (exact for any stateful job); "
            "parallel: independent slices (state spanning at most warmup).",
        },
        "dry_run": {
            "default": False,
            "type": "boolean",
            "title": "dry_run",
            "description": "Write nothing outside staging (validate, do not publish).",
        },
        "publish": {
            "default": True,
            "type": "boolean",
            "title": "publish",
            "description": "Publish the staged window after a passing validation.",
        },
        "min_match": {
            "default": d.min_match,
            "type": "number",
            "minimum": 0,
            "maximum": 100,
            "title": "min_match",
            "description": "Minimum match rate (percent) of staged vs current rows; below it, nothing is published.",
        },
    }
