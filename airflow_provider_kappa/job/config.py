"""The job config, ``kappa.yaml``: loading and validation.

Every error names the key (a dotted path into the file), the bad value and what is
allowed; unknown keys are errors, so typos never pass silently. Pure Python (no
pyspark, no pyiceberg, no Airflow): safe at DAG-parse time, in the CLI and in Spark.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml

from airflow_provider_kappa.exceptions import KappaConfigError, KappaSinkError
from airflow_provider_kappa.job.checkpoints import ledger_folder
from airflow_provider_kappa.job.spark_catalogs import spark_catalog_properties
from airflow_provider_kappa.job.variables import expand_env
from airflow_provider_kappa.spark.staging import DEFAULT_NAMESPACE, _check_namespace
from airflow_provider_kappa.timeparse import parse_duration

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_TABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")

#: ``job.engine`` values: a Spark Connect session per slice, or a spark-submit per slice.
CONNECT = "connect"
SUBMIT = "submit"
ENGINES = (CONNECT, SUBMIT)
#: ``job.retention`` default: ``kappa cleanup`` and the DAG's cleanup task remove the staging tables,
#: checkpoints, plan files and tags of a backfill this long after its last activity.
DEFAULT_RETENTION = timedelta(days=7)


@dataclass(frozen=True)
class CatalogConfig:
    """An Iceberg catalog: pyiceberg properties, or an Airflow connection id (IcebergHook)."""

    name: str
    properties: Mapping[str, str] | None = None
    conn_id: str | None = None


@dataclass(frozen=True)
class IcebergSourceConfig:
    """A table of landed Kafka events, each row stamped with its ingestion time."""

    name: str
    catalog: str
    table: str
    ingestion_column: str
    max_misalignment_threshold: timedelta | None = None
    type: str = "iceberg"


@dataclass(frozen=True)
class KafkaSourceConfig:
    """A Kafka topic read by Spark's built-in Kafka source."""

    name: str
    topics: str
    bootstrap_servers: str
    schema: str | None = None
    ingestion_column: str | None = None
    starting_offsets: str = "latest"
    options: Mapping[str, str] = field(default_factory=dict)
    type: str = "kafka"


@dataclass(frozen=True)
class DynamicSourceConfig:
    """A source the job reads by name, resolved to one of its candidates per run."""

    name: str
    selected: str
    candidates: tuple[str, ...]
    type: str = "dynamic"


SourceConfig = IcebergSourceConfig | KafkaSourceConfig | DynamicSourceConfig


@dataclass(frozen=True)
class IcebergSinkConfig:
    """An Iceberg output table; ``time_column`` decides which rows a window owns."""

    name: str
    catalog: str
    table: str
    time_column: str
    type: str = "iceberg"


@dataclass(frozen=True)
class BackfillDefaults:
    """Defaults for backfill options (overridden by CLI flags and DAG params)."""

    slice: timedelta = timedelta(hours=1)
    warmup: timedelta = timedelta(0)
    tail: timedelta | None = None
    mode: str = "sequential"
    min_match: float | None = None  # None: 100 for a ledger replay that does not publish, else 0


@dataclass(frozen=True)
class LandSection:
    """The ``land:`` section: how ``kappa land`` lands Kafka into Iceberg."""

    interval: timedelta = timedelta(minutes=5)  # one landing (micro-batch) per interval
    starting_offsets: str = "earliest"  # where a landing with no checkpoint yet starts in each topic


@dataclass(frozen=True)
class ConnectConfig:
    """``job.connect``: the Spark Connect server slices run on, by Airflow connection or URL
    (absent: a local server per backfill)."""

    conn_id: str | None = None
    url: str | None = None


@dataclass(frozen=True)
class JobSection:
    """The ``job:`` section."""

    name: str
    application: Path
    checkpoint_root: str
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    master: str = "local[*]"
    live_trigger: timedelta = timedelta(seconds=10)
    staging_namespace: str = DEFAULT_NAMESPACE
    class_data_sharing: bool = True
    engine: str = CONNECT
    connect: ConnectConfig | None = None
    retention: timedelta = DEFAULT_RETENTION  # what a backfill left is removed this long after its last activity
    #: spark-submit deploy mode (client | cluster); None: the Spark connection's, else client
    deploy_mode: str | None = None
    #: a packed virtualenv (venv-pack) executors run: spark.archives (docs/deployment.md)
    python_archive: str | None = None
    #: environment of the driver and executors, passed per deploy mode
    env: Mapping[str, str] = field(default_factory=dict)
    catalogs_file: str | None = None  # a catalogs file the cluster reads itself (not written, not shipped by kappa)
    ledger: str = ""  # the live ledger kappa run records and a backfill with --ledger replays (spark/ledger.py)


@dataclass(frozen=True)
class JobConfig:
    """A whole, validated kappa.yaml."""

    path: Path
    job: JobSection
    catalogs: Mapping[str, CatalogConfig]
    sources: Mapping[str, SourceConfig]
    sinks: Mapping[str, IcebergSinkConfig]
    backfill: BackfillDefaults = field(default_factory=BackfillDefaults)
    land: LandSection = field(default_factory=LandSection)

    def job_sources(self) -> list[str]:
        """Names the job reads: every source that is not only a candidate of a dynamic one."""
        candidates = {c for s in self.sources.values() if isinstance(s, DynamicSourceConfig) for c in s.candidates}
        return [n for n in self.sources if n not in candidates]

    def resolve(self, name: str, *, backfill: bool) -> IcebergSourceConfig | KafkaSourceConfig:
        """The concrete source a run reads for ``name``.

        Backfill takes a dynamic source's ``iceberg`` candidate; live takes ``selected``.

        :param name: a source name from ``sources:``.
        :param backfill: resolve for a backfill run (else live).
        :raises KappaConfigError: unknown source, or no iceberg candidate when backfilling.
        """
        if name not in self.sources:
            raise KappaConfigError(f"source {name!r} is not defined in {self.path}; defined: {sorted(self.sources)}")
        src = self.sources[name]
        if isinstance(src, DynamicSourceConfig):
            if backfill:
                iceberg = [c for c in src.candidates if isinstance(self.sources[c], IcebergSourceConfig)]
                if not iceberg:
                    raise KappaConfigError(
                        f"sources.{name}: a backfill needs a candidate of type 'iceberg'; "
                        f"candidates {list(src.candidates)} have none"
                    )
                return self.sources[iceberg[0]]  # type: ignore[return-value]
            return self.sources[src.selected]  # type: ignore[return-value]
        if backfill and not isinstance(src, IcebergSourceConfig):
            raise KappaConfigError(f"sources.{name}: type {src.type!r} cannot be backfilled; expected 'iceberg'")
        return src

    def catalog(self, name: str) -> CatalogConfig:
        """The catalog called ``name``."""
        try:
            return self.catalogs[name]
        except KeyError as e:
            raise KappaConfigError(f"catalog {name!r} is not defined; defined: {sorted(self.catalogs)}") from e

    def sink(self, name: str) -> IcebergSinkConfig:
        """The sink called ``name``."""
        try:
            return self.sinks[name]
        except KeyError as e:
            raise KappaConfigError(f"sink {name!r} is not defined in {self.path}; defined: {sorted(self.sinks)}") from e


class _Section:
    """Typed access to one mapping of the YAML, tracking unknown keys."""

    def __init__(self, data: object, where: str, allowed: set[str]) -> None:
        if not isinstance(data, dict):
            raise KappaConfigError(f"{where}: expected a mapping, got {type(data).__name__} {data!r}")
        unknown = sorted(set(map(str, data)) - allowed)
        if unknown:
            raise KappaConfigError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")
        self.data: dict[str, Any] = {str(k): v for k, v in data.items()}
        self.where = where

    def key(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def text(self, name: str, default: str | None = None, *, required: bool = True) -> str:
        if name not in self.data or self.data[name] is None:
            if default is not None or not required:
                return default  # type: ignore[return-value]
            raise KappaConfigError(f"{self.key(name)}: missing; it is required")
        value = self.data[name]
        if isinstance(value, bool) or not isinstance(value, (str, int, float)) or str(value).strip() == "":
            raise KappaConfigError(f"{self.key(name)}: {value!r} must be a non-empty string")
        return str(value)

    def flag(self, name: str, default: bool) -> bool:
        value = self.data.get(name, default)
        if not isinstance(value, bool):
            raise KappaConfigError(f"{self.key(name)}: {value!r} must be true or false")
        return value

    def mapping(self, name: str) -> dict[str, str]:
        value = self.data.get(name) or {}
        if not isinstance(value, dict):
            raise KappaConfigError(f"{self.key(name)}: {value!r} must be a mapping of strings")
        return _props(value, self.key(name))


def _name(value: str, where: str) -> str:
    if not _NAME.match(value):
        raise KappaConfigError(f"{where}: {value!r} is not a valid name; use letters, digits, '_', '-', '.'")
    return value


def _staging_namespace(value: str) -> str:
    """``job.staging_namespace``, by the rule of the staging tables' names (spark/staging.py)."""
    try:
        return _check_namespace(value)
    except KappaSinkError as e:
        raise KappaConfigError(f"job.staging_namespace: {str(e).removeprefix('staging namespace ')}") from e


def _table(sec: _Section) -> str:
    table = sec.text("table")
    if not _TABLE.match(table):
        raise KappaConfigError(f"{sec.key('table')}: {table!r} must be 'namespace.table'")
    return table


def load_config(path: str | Path) -> JobConfig:
    """Load and validate a kappa.yaml.

    :param path: path to the file; ``job.application`` is resolved relative to it.
    :raises KappaConfigError: for any invalid key, type, reference or value.
    """
    cfg_path = Path(path).expanduser().resolve()
    try:
        text = cfg_path.read_text()
    except OSError as e:
        raise KappaConfigError(f"config {str(path)!r} cannot be read: {e.strerror}") from e
    return parse_config(expand_env(_parse_yaml(text, path), "", cfg_path), cfg_path)


def _parse_yaml(text: str, path: str | Path) -> object:
    """``yaml.safe_load`` of ``text``, through libyaml when PyYAML has it (several times faster; the
    same safe constructor builds the values). A document libyaml refuses is parsed again in pure
    Python, so the error names the same line, column and problem with or without libyaml."""
    try:
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 (a safe loader)
    except yaml.YAMLError:
        pass
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise KappaConfigError(f"config {str(path)!r} is not valid YAML{_yaml_problem(e)}") from e


def _yaml_problem(e: yaml.YAMLError) -> str:
    """One line: `` at line L, column C: <problem> (<context>)``, else ``: <error>``."""
    mark = getattr(e, "problem_mark", None)
    if mark is None:
        return ": " + " ".join(str(e).split())
    problem, context = getattr(e, "problem", None), getattr(e, "context", None)
    what = f"{problem} ({context})" if context else str(problem)
    return f" at line {mark.line + 1}, column {mark.column + 1}: " + " ".join(what.split())


def parse_config(raw: object, path: Path) -> JobConfig:
    """Validate an already parsed kappa.yaml mapping (see :func:`load_config`).

    :param raw: the mapping read from YAML.
    :param path: where it came from (relative paths resolve against its folder).
    """
    top = _Section(raw, "", {"job", "catalogs", "sources", "sinks", "backfill", "land"})
    for required in ("job", "catalogs", "sources", "sinks"):
        if not top.data.get(required):
            raise KappaConfigError(f"{required}: missing or empty in {path}; it is required")

    job = _job(top.data["job"], path)
    catalogs = _catalogs(top.data["catalogs"], job.spark_conf)
    sources = _sources(top.data["sources"])
    sinks = _sinks(top.data["sinks"])
    backfill = _backfill_defaults(top.data.get("backfill"))
    cfg = JobConfig(
        path=path,
        job=job,
        catalogs=catalogs,
        sources=sources,
        sinks=sinks,
        backfill=backfill,
        land=_land(top.data.get("land")),
    )
    _check_references(cfg)
    return cfg


#: The keys of ``job:``.
_JOB_KEYS = (
    "name application checkpoint_root spark_conf master live_trigger staging_namespace class_data_sharing engine "
    "connect retention deploy_mode python_archive env catalogs_file ledger"
).split()


def _job(body: object, path: Path) -> JobSection:
    """The ``job:`` section; relative paths resolve against the folder of ``path`` (kappa.yaml)."""
    j = _Section(body, "job", set(_JOB_KEYS))
    application = Path(j.text("application"))
    if not application.is_absolute():
        application = (path.parent / application).resolve()
    checkpoint_root = j.text("checkpoint_root")
    if "://" not in checkpoint_root and not Path(checkpoint_root).is_absolute():
        checkpoint_root = str((path.parent / checkpoint_root).resolve())
    return JobSection(
        name=_name(j.text("name"), "job.name"),
        application=application,
        checkpoint_root=checkpoint_root,
        spark_conf=j.mapping("spark_conf"),
        master=j.text("master", "local[*]"),
        live_trigger=parse_duration(j.data.get("live_trigger", "10s"), "job.live_trigger"),
        staging_namespace=_staging_namespace(j.text("staging_namespace", DEFAULT_NAMESPACE)),
        class_data_sharing=j.flag("class_data_sharing", True),
        engine=_engine(j),
        connect=_connect(j.data.get("connect")),
        retention=parse_duration(j.data.get("retention", "7d"), "job.retention", allow_zero=True),
        deploy_mode=_deploy_mode(j),
        python_archive=_local_or_url(j.text("python_archive", required=False), path),
        env=j.mapping("env"),
        catalogs_file=_local_or_url(j.text("catalogs_file", required=False), path),
        ledger=_local_or_url(j.text("ledger", required=False), path) or ledger_folder(checkpoint_root, j.text("name")),
    )


def _named(raw: object, section: str, what: str) -> list[tuple[str, Any, str]]:
    """The entries of a ``catalogs:``/``sources:``/``sinks:`` mapping as ``(name, body, where)``,
    each name checked."""
    if not isinstance(raw, dict):
        raise KappaConfigError(f"{section}: expected a mapping of {what} names, got {raw!r}")
    out = []
    for name, body in raw.items():
        where = f"{section}.{name}"
        _name(str(name), where)
        out.append((str(name), body, where))
    return out


def _catalogs(raw: object, spark_conf: Mapping[str, str]) -> dict[str, CatalogConfig]:
    """``catalogs:``: each one pyiceberg properties, ``{conn_id: ...}``, or Spark's catalog conf
    (``{spark_conf: {...}}`` or ``{spark_catalog: <name in job.spark_conf>}``, job/spark_catalogs.py)."""
    catalogs: dict[str, CatalogConfig] = {}
    for cname, body, where in _named(raw, "catalogs", "catalog"):
        if not isinstance(body, dict) or not body:
            raise KappaConfigError(
                f"{where}: expected pyiceberg properties, {{conn_id: ...}}, {{spark_conf: {{...}}}} or "
                f"{{spark_catalog: ...}}, got {body!r}"
            )
        if "conn_id" in body:
            sec = _Section(body, where, {"conn_id"})
            catalogs[cname] = CatalogConfig(cname, conn_id=sec.text("conn_id"))
        else:
            spark = spark_catalog_properties(cname, body, where, spark_conf)  # None: pyiceberg properties
            catalogs[cname] = CatalogConfig(cname, properties=_props(body, where) if spark is None else spark)
    return catalogs


def _sources(raw: object) -> dict[str, SourceConfig]:
    """``sources:``, each checked by :func:`_source` (references are checked once all are read)."""
    sources: dict[str, SourceConfig] = {}
    for sname, body, where in _named(raw, "sources", "source"):
        sources[sname] = _source(sname, body, where)
    return sources


def _sinks(raw: object) -> dict[str, IcebergSinkConfig]:
    """``sinks:``: Iceberg tables, each with the ``time_column`` that decides which rows a window owns."""
    sinks: dict[str, IcebergSinkConfig] = {}
    for kname, body, where in _named(raw, "sinks", "sink"):
        sec = _Section(body, where, {"type", "catalog", "table", "time_column"})
        stype = sec.text("type", "iceberg")
        if stype != "iceberg":
            raise KappaConfigError(f"{where}.type: {stype!r} is not a sink type; allowed: ['iceberg']")
        sinks[kname] = IcebergSinkConfig(
            name=kname, catalog=sec.text("catalog"), table=_table(sec), time_column=sec.text("time_column")
        )
    return sinks


def _engine(j: _Section) -> str:
    """``job.engine``; unset: ``connect`` where it works out of the box (a ``job.connect`` server, or a
    local master, for which kappa starts its own server), else ``submit`` (a cluster master: YARN,
    Kubernetes, standalone)."""
    master = str(j.data.get("master", "local[*]"))
    default = CONNECT if "connect" in j.data or master == "local" or master.startswith("local[") else SUBMIT
    engine = j.data.get("engine", default)
    if engine not in ENGINES:
        raise KappaConfigError(f"job.engine: {engine!r} is not an engine; allowed: {list(ENGINES)}")
    return str(engine)


def _deploy_mode(j: _Section) -> str | None:
    """``job.deploy_mode``: ``client`` or ``cluster`` (unset: the Spark connection's, else client)."""
    mode = j.data.get("deploy_mode")
    if mode is not None and mode not in ("client", "cluster"):
        raise KappaConfigError(f"job.deploy_mode: {mode!r} is not a deploy mode; allowed: ['client', 'cluster']")
    return None if mode is None else str(mode)


def _local_or_url(value: str | None, path: Path) -> str | None:
    """A path relative to kappa.yaml made absolute; a URL (``hdfs://``, ``s3a://``, ``local://``) kept."""
    if value is None or "://" in value or Path(value).is_absolute():
        return value
    return str((path.parent / value).resolve())


def _connect(body: object) -> ConnectConfig | None:
    """``job.connect``: ``{conn_id: ...}`` or ``{url: "sc://host:port"}``, or absent."""
    if body is None:
        return None
    where = "job.connect"
    if not isinstance(body, dict) or len(body) != 1:
        raise KappaConfigError(
            f"{where}: {body!r} must be one of {{conn_id: <Airflow spark_connect connection>}} or "
            "{url: 'sc://host:port'}; leave it out for a local server per backfill"
        )
    sec = _Section(body, where, {"conn_id", "url"})
    if "conn_id" in sec.data:
        return ConnectConfig(conn_id=sec.text("conn_id"))
    url = sec.text("url")
    if not re.match(r"^sc://[^/:;]+(:\d+)?/?(;.*)?$", url):
        raise KappaConfigError(f"{where}.url: {url!r} is not a Spark Connect URL; expected 'sc://host:port'")
    return ConnectConfig(url=url)


def _props(body: dict[Any, Any], where: str) -> dict[str, str]:
    out = {}
    for k, v in body.items():
        if isinstance(v, (dict, list)) or v is None:
            raise KappaConfigError(f"{where}.{k}: {v!r} must be a string, number or boolean")
        out[str(k)] = str(v).lower() if isinstance(v, bool) else str(v)
    return out


def _source(name: str, body: object, where: str) -> SourceConfig:
    if not isinstance(body, dict):
        raise KappaConfigError(f"{where}: expected a mapping, got {body!r}")
    stype = body.get("type")
    if stype == "dynamic":
        sec = _Section(body, where, {"type", "selected", "candidates"})
        cands = sec.data.get("candidates")
        if not isinstance(cands, list) or not cands or not all(isinstance(c, str) for c in cands):
            raise KappaConfigError(f"{where}.candidates: {cands!r} must be a non-empty list of source names")
        return DynamicSourceConfig(name=name, selected=sec.text("selected"), candidates=tuple(cands))
    if stype == "iceberg":
        sec = _Section(body, where, {"type", "catalog", "table", "ingestion_column", "max_misalignment_threshold"})
        threshold = sec.data.get("max_misalignment_threshold")
        return IcebergSourceConfig(
            name=name,
            catalog=sec.text("catalog"),
            table=_table(sec),
            ingestion_column=sec.text("ingestion_column"),
            max_misalignment_threshold=None
            if threshold is None
            else parse_duration(threshold, f"{where}.max_misalignment_threshold"),
        )
    if stype == "kafka":
        sec = _Section(
            body,
            where,
            {"type", "topics", "bootstrap_servers", "schema", "ingestion_column", "starting_offsets", "options"},
        )
        topics = sec.data.get("topics")
        if isinstance(topics, list) and topics and all(isinstance(t, str) for t in topics):
            topics = ",".join(topics)
        sec.data["topics"] = topics
        return KafkaSourceConfig(
            name=name,
            topics=sec.text("topics"),
            bootstrap_servers=sec.text("bootstrap_servers"),
            schema=sec.text("schema", required=False),
            ingestion_column=sec.text("ingestion_column", required=False),
            starting_offsets=sec.text("starting_offsets", "latest"),
            options=sec.mapping("options"),
        )
    raise KappaConfigError(f"{where}.type: {stype!r} is not a source type; allowed: ['dynamic', 'iceberg', 'kafka']")


def _backfill_defaults(body: object) -> BackfillDefaults:
    if body is None:
        return BackfillDefaults()
    sec = _Section(body, "backfill", {"slice", "warmup", "tail", "mode", "min_match"})
    mode = sec.text("mode", "sequential")
    if mode not in ("sequential", "parallel"):
        raise KappaConfigError(f"backfill.mode: {mode!r} is not a mode; allowed: ['sequential', 'parallel']")
    min_match = sec.data.get("min_match")
    bad = isinstance(min_match, bool) or not isinstance(min_match, (int, float)) or not 0 <= min_match <= 100
    if min_match is not None and bad:
        raise KappaConfigError(f"backfill.min_match: {min_match!r} must be a percentage between 0 and 100")
    tail = sec.data.get("tail")
    return BackfillDefaults(
        slice=parse_duration(sec.data.get("slice", "1h"), "backfill.slice"),
        warmup=parse_duration(sec.data.get("warmup", "0s"), "backfill.warmup", allow_zero=True),
        tail=None if tail is None else parse_duration(tail, "backfill.tail", allow_zero=True),
        mode=mode,
        min_match=None if min_match is None else float(min_match),
    )


def _land(body: object) -> LandSection:
    """``land:``: ``interval`` (a positive duration, default 5min), ``starting_offsets`` (Spark's Kafka
    ``startingOffsets`` of a landing's first start: ``earliest``, ``latest`` or its JSON form)."""
    if body is None:
        return LandSection()
    sec = _Section(body, "land", {"interval", "starting_offsets"})
    starting = sec.text("starting_offsets", "earliest")
    if starting not in ("earliest", "latest") and not starting.lstrip().startswith("{"):
        raise KappaConfigError(
            f"land.starting_offsets: {starting!r} is not a starting position; allowed: 'earliest', 'latest' "
            'or JSON offsets per topic and partition ({"topic": {"0": 42}})'
        )
    return LandSection(
        interval=parse_duration(sec.data.get("interval", "5min"), "land.interval"), starting_offsets=starting
    )


def _check_references(cfg: JobConfig) -> None:
    for name, src in cfg.sources.items():
        where = f"sources.{name}"
        if isinstance(src, DynamicSourceConfig):
            for cand in src.candidates:
                if cand not in cfg.sources:
                    raise KappaConfigError(
                        f"{where}.candidates: {cand!r} is not a defined source; defined: {sorted(cfg.sources)}"
                    )
                if isinstance(cfg.sources[cand], DynamicSourceConfig):
                    raise KappaConfigError(
                        f"{where}.candidates: {cand!r} is itself dynamic; candidates must be concrete"
                    )
            if src.selected not in src.candidates:
                raise KappaConfigError(
                    f"{where}.selected: {src.selected!r} is not one of its candidates {list(src.candidates)}"
                )
        elif isinstance(src, IcebergSourceConfig) and src.catalog not in cfg.catalogs:
            raise KappaConfigError(
                f"{where}.catalog: {src.catalog!r} is not a defined catalog; defined: {sorted(cfg.catalogs)}"
            )
    for name, sink in cfg.sinks.items():
        if sink.catalog not in cfg.catalogs:
            raise KappaConfigError(
                f"sinks.{name}.catalog: {sink.catalog!r} is not a defined catalog; defined: {sorted(cfg.catalogs)}"
            )
