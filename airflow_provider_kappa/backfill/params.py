"""Backfill parameters: ONE table (:data:`PARAMS`) from which everything about them is derived,
shared by ``kappa plan``/``kappa backfill`` and the Airflow DAG's Params form.

Each :class:`Param` row gives a parameter's name, CLI flag, kind, default and help. From the
table come :func:`parse_params` (validation, defaults), :meth:`BackfillParams.to_dict`,
:func:`backfill_id`'s inputs, :func:`to_argv` (the flags of the ``kappa backfill`` command a
lock names for its release), :func:`param_schemas` (the Params form), the CLI flags
(:func:`airflow_provider_kappa.cli.plan.add_backfill_arguments`) and the docs' option lists
(:mod:`~airflow_provider_kappa.backfill.params_docs`; a unit test checks README.md and
docs/airflow.md hold them).

Pure Python (no Airflow, pyspark or pyiceberg): it runs at DAG-parse time (the form's JSON
schema), in the CLI and inside every task. Every error names the parameter, the bad value
and what is allowed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from airflow_provider_kappa.exceptions import KappaConfigError
from airflow_provider_kappa.job.config import IcebergSourceConfig, JobConfig
from airflow_provider_kappa.spark.source.options import DEFAULT_MAX_MISALIGNMENT_THRESHOLD
from airflow_provider_kappa.timeparse import human_duration, parse_duration, parse_timestamp

SEQUENTIAL = "sequential"
PARALLEL = "parallel"
MODES = (SEQUENTIAL, PARALLEL)
#: ``ledger``: replay the live ledger when it covers the range read (the default), always, never
AUTO = "auto"
LEDGER_CHOICES = (AUTO, "true", "false")

# JSON-schema patterns mirroring timeparse: checked by Airflow when a run is triggered.
_NUM = r"\d+(\.\d+)?"
_ISO_DURATION = rf"(?![Pp][Tt]?\s*$)[Pp]({_NUM}[Dd])?([Tt]({_NUM}[Hh])?({_NUM}[Mm])?({_NUM}[Ss])?)?"
_SHORT_DURATION = rf"{_NUM}\s*(ms|s|sec|min|h|d)"
#: A duration ``timeparse.parse_duration`` accepts with ``allow_zero=True``.
DURATION_PATTERN = rf"^\s*({_SHORT_DURATION}|{_ISO_DURATION})\s*$"
#: The same, but some digit must be non-zero (a positive duration).
POSITIVE_DURATION_PATTERN = rf"^(?=[^1-9]*[1-9])\s*({_SHORT_DURATION}|{_ISO_DURATION})\s*$"
#: An ISO-8601 timestamp with a UTC offset (``Z`` or ``+hh:mm``); naive timestamps do not match.
TIMESTAMP_PATTERN = r"^\s*\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?([Zz]|[+-]\d{2}:?\d{2})\s*$"
_TIMESTAMP_FORM = "ISO-8601 timestamp with an offset, e.g. 2026-11-01T00:00:00+00:00"
_DURATION_FORMS = "duration: 30s, 15min, 1h, 2d or ISO-8601 (PT15M)"

#: The trigger form's section of each :attr:`Param.section` (Airflow Params' ``section``): the
#: basic fields stay in the form's first section, open when the form opens (Airflow names it
#: "Run Parameters"; a named section would start collapsed), the advanced ones in a collapsed one.
FORM_SECTIONS: dict[str, str | None] = {"basic": None, "advanced": "Advanced"}

Kind = Literal["timestamp", "duration", "sources", "enum", "bool", "number"]
#: A default from the job config and the values parsed so far (empty for the form's default).
Default = Callable[[JobConfig, Mapping[str, Any]], Any]


@dataclass(frozen=True)
class Param:
    """One backfill parameter (a row of :data:`PARAMS`).

    :param name: the Airflow Param, the :class:`BackfillParams` field and the raw dicts' key.
    :param flag: the ``kappa plan``/``kappa backfill`` flag; a boolean's ``--no-`` flag sets it false.
    :param kind: ``timestamp``, ``duration``, ``sources`` (job source names), ``enum``, ``bool``
        or ``number``.
    :param help: what it does (form description, CLI help, docs).
    :param default: the default value; ``None``: required.
    :param default_doc: the default in words (CLI help, docs).
    :param example: the value in the CLI synopsis (``--slice 1h``); enums show their choices.
    :param section: ``basic``, or ``advanced`` (a collapsed section of the trigger form).
    :param identity: its key in :func:`backfill_id`; ``None``: it does not change staged output.
    :param allow_zero: a duration that may be zero.
    :param nullable: the form accepts empty (the default is then another parameter's value).
    :param choices: an enum's values.
    :param bounds: a number's minimum and maximum.
    :param unit: what a number is, for messages (``percentage``).
    :param title: the field's label in the trigger form (default: the name in words).
    """

    name: str
    flag: str
    kind: Kind
    help: str
    default: Default | None
    default_doc: str
    example: str = ""
    section: Literal["basic", "advanced"] = "basic"
    identity: str | None = None
    allow_zero: bool = False
    nullable: bool = False
    choices: tuple[str, ...] = ()
    bounds: tuple[float, float] = (0, 0)
    unit: str = ""
    title: str = ""

    @property
    def label(self) -> str:
        """The field's label in the trigger form: :attr:`title`, else the name in words."""
        return self.title or self.name.replace("_", " ").capitalize()

    @property
    def required(self) -> bool:
        """No default: must be given."""
        return self.default is None

    @property
    def takes_value(self) -> bool:
        """The CLI flag takes a value (booleans are bare flags)."""
        return self.kind != "bool"

    def value_doc(self) -> str:
        """The values allowed, in words."""
        if self.kind == "timestamp":
            return _TIMESTAMP_FORM
        if self.kind == "duration":
            return f"{'zero or positive' if self.allow_zero else 'positive'} {_DURATION_FORMS}"
        if self.kind == "sources":
            return "names of the job's sources, comma-separated on the command line"
        if self.kind == "enum":
            return " or ".join(self.choices)
        if self.kind == "number":
            return f"{self.unit} {self.bounds[0]:g}-{self.bounds[1]:g}"
        return "true or false"

    def description(self) -> str:
        """The form's help text of the field (the form shows choices, booleans and sources itself;
        a timestamp has a date-time picker, whose value is sent as UTC)."""
        if self.kind == "timestamp":
            value = (
                "; pick a date and time (sent in UTC); in a run's conf (REST API, airflow dags trigger), "
                "an RFC 3339 timestamp with an offset, e.g. 2026-11-01T00:00:00+00:00"
            )
        else:
            value = f"; {self.value_doc()}" if self.kind in ("duration", "number") else ""
        empty = f" (empty: {self.default_doc})" if self.nullable else ""
        return f"{self.help}{value}{empty}. Run conf key: {self.name}."

    def cli_help(self) -> str:
        """The argparse help of the flag."""
        if not self.takes_value:
            negated = self.flag.startswith("--no-")
            return f"Do not {self.help[0].lower()}{self.help[1:]}" if negated else self.help
        value = "" if self.kind == "enum" else f"; {self.value_doc()}"
        default = "" if self.required else f" (default: {self.default_doc})"
        return f"{self.help}{value}{default}".replace("%", "%%")

    def parse(self, cfg: JobConfig, value: Any, values: Mapping[str, Any]) -> Any:
        """Validate one raw value; blank takes the default.

        :param cfg: the job config.
        :param value: the raw value (a string, or an already typed value).
        :param values: the parameters parsed before this one (defaults may depend on them).
        :raises KappaConfigError: naming the parameter, the value and what is allowed.
        """
        key = f"backfill parameter {self.name}"
        if self.kind == "sources":
            return _sources(cfg, value)
        if _blank(value):
            if self.default is None:
                raise KappaConfigError(f"{key}: missing; give an {_TIMESTAMP_FORM}")
            return self.default(cfg, values)
        if self.kind == "timestamp":
            return parse_timestamp(value, key)
        if self.kind == "duration":
            return parse_duration(value, key, allow_zero=self.allow_zero)
        if self.kind == "enum":
            value = str(value).lower() if isinstance(value, bool) else value  # ledger: true
            if str(value).strip() not in self.choices:
                raise KappaConfigError(f"{key}: {value!r} is not a {self.name}; allowed: {list(self.choices)}")
            return str(value).strip()
        if self.kind == "number":
            return _number(value, key, self.bounds, self.unit)
        return _bool(value, key)

    def dump(self, value: Any) -> Any:
        """The JSON-able form of a parsed value, accepted back by :meth:`parse`."""
        if value is None:
            return None
        if self.kind == "timestamp":
            return value.isoformat()
        if self.kind == "duration":
            return human_duration(value)
        if self.kind == "sources":
            return list(value)
        return value

    def argv(self, value: Any) -> list[str]:
        """The CLI flag (and value) that give ``value``; none for a boolean at its flag's default."""
        if self.kind == "bool":
            return [self.flag] if bool(value) != self.flag.startswith("--no-") else []
        if value is None:
            return []
        return [self.flag, ",".join(value) if self.kind == "sources" else str(self.dump(value))]

    def schema(self, cfg: JobConfig) -> dict[str, Any]:
        """The JSON schema of the Airflow Param, with its default, title and description."""
        out: dict[str, Any] = {} if self.default is None else {"default": self.dump(self.default(cfg, {}))}
        if self.kind == "timestamp":
            # format date-time: Airflow's form draws a date-time picker (it sends the picked
            # instant in UTC, e.g. 2026-11-01T00:00:00.000Z) and checks RFC 3339 at trigger time
            out.update(type="string", pattern=TIMESTAMP_PATTERN, format="date-time")
        elif self.kind == "duration":
            pattern = DURATION_PATTERN if self.allow_zero else POSITIVE_DURATION_PATTERN
            out.update(type=["null", "string"] if self.nullable else "string", pattern=pattern)
        elif self.kind == "sources":
            names = list(cfg.job_sources())
            out.update(type="array", items={"type": "string", "enum": names}, examples=names)
            out.update(minItems=1, uniqueItems=True)
        elif self.kind == "enum":
            out.update(type="string", enum=list(self.choices))
        elif self.kind == "number":
            out.update(type=["null", "number"] if self.nullable else "number")
            out.update(minimum=self.bounds[0], maximum=self.bounds[1])
        else:
            out.update(type="boolean")
        out.update(title=self.label, description=self.description())
        if FORM_SECTIONS[self.section] is not None:
            out["section"] = FORM_SECTIONS[self.section]
        return out


#: The backfill parameters, in form order (the CLI order of DESIGN.md is :data:`CLI_PARAMS`).
PARAMS: tuple[Param, ...] = (
    Param(
        "start",
        "--start",
        "timestamp",
        "First instant of the window to replace (inclusive)",
        None,
        "required",
        "T",
        identity="start",
        title="Window start",
    ),
    Param(
        "end",
        "--end",
        "timestamp",
        "End of the window to replace (exclusive, after start)",
        None,
        "required",
        "T",
        identity="end",
        title="Window end",
    ),
    Param(
        "sources",
        "--sources",
        "sources",
        "Job sources to read from their Iceberg candidates",
        lambda cfg, v: list(cfg.job_sources()),
        "all the job's sources",
        "a,b",
        identity="sources",
    ),
    Param(
        "slice",
        "--slice",
        "duration",
        "Slice length (one run of the unchanged job each), slices aligned to multiples of it from the epoch",
        lambda cfg, v: cfg.backfill.slice,
        "backfill.slice of kappa.yaml, else 1h",
        "1h",
        "advanced",
        "slice",
        title="Slice length",
    ),
    Param(
        "max_misalignment_threshold",
        "--max-misalignment",
        "duration",
        "Ingestion time one micro-batch may advance, at most the slice",
        lambda cfg, v: default_max_misalignment_threshold(cfg, v.get("sources")),
        "the smallest max_misalignment_threshold of the sources, else 15min",
        "15min",
        "advanced",
        "threshold",
    ),
    Param(
        "warmup",
        "--warmup",
        "duration",
        "Ingestion time read before start to bootstrap state",
        lambda cfg, v: cfg.backfill.warmup,
        "backfill.warmup, else 0s",
        "0s",
        "advanced",
        "warmup",
        allow_zero=True,
    ),
    Param(
        "tail",
        "--tail",
        "duration",
        "Ingestion time read after end, so late events and the watermark close windows",
        lambda cfg, v: cfg.backfill.tail if cfg.backfill.tail is not None else v.get("max_misalignment_threshold"),
        "backfill.tail, else the threshold",
        "15min",
        "advanced",
        "tail",
        allow_zero=True,
        nullable=True,
    ),
    Param(
        "mode",
        "--mode",
        "enum",
        "sequential: one shared checkpoint, slices in order (exact for any stateful job); "
        "parallel: independent slices (state spanning at most warmup), at once in the DAG; kappa backfill "
        "runs them one after the other",
        lambda cfg, v: cfg.backfill.mode,
        "backfill.mode, else sequential",
        identity="mode",
        choices=MODES,
    ),
    Param(
        "dry_run",
        "--dry-run",
        "bool",
        "Write nothing outside staging (validate, do not publish)",
        lambda cfg, v: False,
        "false",
    ),
    Param(
        "publish",
        "--no-publish",
        "bool",
        "Publish the staged window after a passing validation",
        lambda cfg, v: True,
        "true",
    ),
    Param(
        "min_match",
        "--min-match",
        "number",
        "Minimum match rate of staged vs current rows; below it, nothing is published",
        lambda cfg, v: cfg.backfill.min_match,
        "backfill.min_match, else 100 for a run that replays the ledger and does not publish, else 0",
        "99.9",
        nullable=True,
        bounds=(0, 100),
        unit="percentage",
        title="Minimum match rate (%)",
    ),
    Param(
        "allow_open_end",
        "--allow-open-end",
        "bool",
        "Run when end + tail lies past the landed data, publishing only the part of the window it closes",
        lambda cfg, v: False,
        "false",
        section="advanced",
    ),
    Param(
        "ledger",
        "--ledger",
        "enum",
        "Replay live's micro-batches from the live ledger kappa run recorded (job.ledger), exact against "
        "Kafka-live: auto when the ledger covers the range read (else aligned, saying why), true always, false never",
        lambda cfg, v: AUTO,
        AUTO,
        section="advanced",
        identity="ledger",
        choices=LEDGER_CHOICES,
        title="Replay live's micro-batches",
    ),
)
#: Every parameter name, in form order.
KEYS = tuple(p.name for p in PARAMS)
BY_NAME = {p.name: p for p in PARAMS}
#: The parameters in the order of the CLI flags (DESIGN.md "Command line").
_CLI_ORDER = "start end mode slice warmup tail max_misalignment_threshold sources dry_run publish min_match"
CLI_PARAMS = tuple(BY_NAME[k] for k in (*_CLI_ORDER.split(), "allow_open_end", "ledger"))


@dataclass(frozen=True)
class BackfillParams:
    """Validated parameters of one backfill (all times aware UTC), one field per row of
    :data:`PARAMS`, in its order."""

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
    min_match: float | None
    allow_open_end: bool = False
    ledger: str = AUTO

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
        return {p.name: p.dump(getattr(self, p.name)) for p in PARAMS}

    def min_match_for(self, replays_ledger: bool = False, *, verification: bool = False) -> float:
        """The match rate, in percent, a run must reach: ``min_match``; unset, 100 in a verification
        (``verification``: the verification DAG's tasks; any difference from live is drift, with the
        ledger replayed or not) and for a run that replays the live ledger and does not publish,
        else 0 (a publishing backfill exists to replace output that differs).

        :param replays_ledger: whether the run replays the live ledger (its plan says).
        :param verification: the verification's own threshold (its drift and gate).
        """
        if self.min_match is not None:
            return float(self.min_match)
        return 100.0 if verification or (replays_ledger and not self.publishes) else 0.0


BackfillParams.__doc__ = (
    (BackfillParams.__doc__ or "") + "\n" + "\n".join(f"    :param {p.name}: {p.help}." for p in PARAMS)
)


def default_max_misalignment_threshold(cfg: JobConfig, sources: list[str] | tuple[str, ...] | None = None) -> timedelta:
    """The sources' smallest ``max_misalignment_threshold``, else :data:`DEFAULT_MAX_MISALIGNMENT_THRESHOLD` (15min).

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
    return min(configured) if configured else DEFAULT_MAX_MISALIGNMENT_THRESHOLD


def _blank(value: object) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _bool(value: object, key: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.strip().lower() in ("true", "yes", "1")
    raise KappaConfigError(f"{key}: {value!r} is not a boolean; allowed: true, false")


def _number(value: object, key: str, bounds: tuple[float, float], unit: str) -> float:
    low, high = bounds
    try:
        if isinstance(value, bool):
            raise ValueError("a boolean is not a number")
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError) as e:
        raise KappaConfigError(f"{key}: {value!r} is not a number; expected a {unit} {low:g}-{high:g}") from e
    if not low <= number <= high:
        raise KappaConfigError(f"{key}: {value!r} must be between {low:g} and {high:g}")
    return number


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

    Each value is checked by its :data:`PARAMS` row, in table order; missing or blank values take
    the row's default (the job's ``backfill:`` defaults; ``max_misalignment_threshold`` the
    sources' configured threshold, else 15min; ``tail`` that threshold). Then the checks across
    parameters: end after start, threshold at most the slice, slice within the range read.

    :param cfg: the job config.
    :param raw: parameter name -> value (strings, or already typed values).
    :raises KappaConfigError: naming the parameter, the bad value and what is allowed.
    """
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise KappaConfigError(f"backfill parameters: unknown key(s) {unknown}; allowed: {list(KEYS)}")
    for p in PARAMS:
        if p.required and _blank(raw.get(p.name)):
            p.parse(cfg, None, {})  # a missing start or end is named before any other error
    values: dict[str, Any] = {}
    for p in PARAMS:
        values[p.name] = p.parse(cfg, raw.get(p.name), values)
    params = BackfillParams(**values)
    if params.end <= params.start:
        raise KappaConfigError(
            f"backfill parameter end: {raw['end']!r} is not after start {raw['start']!r}; "
            "the window [start, end) must not be empty"
        )
    if params.max_misalignment_threshold > params.slice:
        raise KappaConfigError(
            f"backfill parameter max_misalignment_threshold: {human_duration(params.max_misalignment_threshold)} "
            f"exceeds slice {human_duration(params.slice)}; it must be at most the slice"
        )
    read_span = params.read_end - params.read_start
    if params.slice > read_span:
        raise KappaConfigError(
            f"backfill parameter slice: {human_duration(params.slice)} is larger than the range read "
            f"[start - warmup, end + tail) = {human_duration(read_span)}; use a slice of at most "
            f"{human_duration(read_span)}"
        )
    if params.ledger == "true" and len(cfg.sinks) != 1:
        raise KappaConfigError(
            f"backfill parameter ledger: true replays the live ledger of the job's query, kept per sink; job "
            f"{cfg.job.name!r} has sinks {sorted(cfg.sinks)}: a job with exactly one sink is needed"
        )
    return params


def backfill_id(cfg: JobConfig, params: BackfillParams) -> str:
    """A deterministic id of what a backfill computes: same job and parameters -> same id,
    so a rerun reuses its tag, staging tables and checkpoints.

    Only the parameters with an ``identity`` in :data:`PARAMS` count (``dry_run``, ``publish``
    and ``min_match`` do not change staged output). The id uses only ``[a-z0-9_]`` (it becomes
    part of table, tag and folder names).

    :param cfg: the job config.
    :param params: validated parameters.
    """
    identity: dict[str, Any] = {"job": cfg.job.name}
    for p in PARAMS:
        if p.identity:
            value = getattr(params, p.name)
            if p.name == "ledger" and value == AUTO:
                continue  # the default keeps the ids backfills had before the option existed
            if p.kind == "duration":
                identity[p.identity] = value.total_seconds()
            else:
                identity[p.identity] = sorted(value) if p.kind == "sources" else p.dump(value)
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:10]
    return f"bf_{params.start:%Y%m%d%H%M}_{digest}"


def to_argv(params: BackfillParams, *, identity_only: bool = False) -> list[str]:
    """The ``kappa backfill`` flags giving ``params`` (without ``--config``), in CLI order.

    :param params: validated parameters.
    :param identity_only: only the flags that decide the backfill id (what a lock's release needs).
    """
    return [a for p in CLI_PARAMS if p.identity or not identity_only for a in p.argv(getattr(params, p.name))]


def param_schemas(cfg: JobConfig) -> dict[str, dict[str, Any]]:
    """JSON schema (with default, title, description and, for advanced fields, the form section)
    of every parameter, for Airflow Params.

    Each schema checks one value on its own (Airflow validates Params one by one when a run is
    triggered); checks across parameters (``end`` after ``start``, threshold at most the slice,
    slice within the range read) are made by :func:`parse_params` in the first task.

    :param cfg: the job config (its sources and ``backfill:`` defaults).
    """
    return {p.name: p.schema(cfg) for p in PARAMS}
