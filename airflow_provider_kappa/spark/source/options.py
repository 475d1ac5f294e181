"""One ``kappa_iceberg`` read, described once: :class:`IcebergReadSpec`.

The launcher writes it into the ``spark.kappa.*`` conf (:meth:`IcebergReadSpec.to_conf`),
:mod:`~airflow_provider_kappa.spark.settings` reads it back (:meth:`IcebergReadSpec.from_conf`, straight
into the spec, once),
``read_source`` turns it into reader options (:meth:`IcebergReadSpec.to_options`) and the reader
parses and validates them (:meth:`IcebergReadSpec.from_options`). Field, conf key and option::

    catalog, table, ingestion_column   source.<src>.<same>              <same>
    snapshot_id, plan_file             source.<src>.<same>              <same> (bounded)
    mode                               mode (live -> tail, backfill -> bounded)   mode
    read_start_micros, read_end_micros read.start, read.end (ISO-8601)  <same> (bounded)
    max_misalignment_threshold_micros  max_misalignment_threshold       max_misalignment_threshold (bounded)
    ledger                             ledger (+ the run's one sink)     ledger (bounded: replay live's batches)
    align_with                         every iceberg source of the run  align_with (JSON list, bounded)
    max_files_per_batch ... tail_non_append, options
                                       source.<src>.option.<k>          <k>

Mode, read range and threshold are the run's: the conf holds them once for every source
(the launcher writes them), so :meth:`~IcebergReadSpec.to_conf` writes the source's keys only.
Pure Python: the launcher imports this module.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from airflow_provider_kappa.exceptions import KappaConfigError
from airflow_provider_kappa.spark.conf_keys import BACKFILL, PREFIX
from airflow_provider_kappa.spark.ledger import sink_ledger
from airflow_provider_kappa.timeparse import format_duration, parse_duration, parse_timestamp, to_micros

BOUNDED = "bounded"
TAIL = "tail"
#: The one default of ``max_misalignment_threshold``: the backfill parameter's (the Params form,
#: ``kappa backfill``) when no source configures one, and a bounded read's without the option.
DEFAULT_MAX_MISALIGNMENT_THRESHOLD = timedelta(minutes=15)
DEFAULT_MIN_PARTITIONS = 2
DEFAULT_SPLIT_BYTES = 64 * 1024 * 1024
#: option names of :class:`IcebergReadSpec` fields: extra options (``option.<k>``) never override them
SPEC_OPTIONS = (
    "catalog",
    "table",
    "ingestion_column",
    "mode",
    "snapshot_id",
    "read_start_micros",
    "read_end_micros",
    "max_misalignment_threshold",
    "align_with",
    "plan_file",
    "ledger",
)
LIMIT_OPTIONS = ("max_files_per_batch", "max_rows_per_batch", "max_bytes_per_batch")
#: reader option ``available_now=true``: prepare for availableNow on the first ``latestOffset()``; set by
#: ``read_source`` where pyspark has no availableNow for Python sources (4.0, 4.1; reader.py)
AVAILABLE_NOW_OPTION = "available_now"
TUNING_OPTIONS = (*LIMIT_OPTIONS, "min_partitions", "split_bytes", "starting", "tail_non_append")
#: options that locate the catalog; ``read_source`` adds them (never credentials themselves)
CATALOG_OPTIONS = ("catalog_properties", "catalogs_file")
#: every option with a meaning here; the rest are kept in :attr:`IcebergReadSpec.options`, passed as they are
KNOWN_OPTIONS = frozenset({*SPEC_OPTIONS, *TUNING_OPTIONS, *CATALOG_OPTIONS, AVAILABLE_NOW_OPTION})


@dataclass(frozen=True)
class AlignedTable:
    """One iceberg source of the query that shares the admission grid (an ``align_with`` entry)."""

    catalog: str
    table: str
    ingestion_column: str
    snapshot_id: int | None = None
    catalog_properties: Mapping[str, str] | None = None
    plan_file: str | None = None

    def to_item(self) -> dict[str, Any]:
        """The entry as a JSON object of the ``align_with`` option."""
        item: dict[str, Any] = {
            "catalog": self.catalog,
            "table": self.table,
            "ingestion_column": self.ingestion_column,
            "snapshot_id": self.snapshot_id,
            "plan_file": self.plan_file,
        }
        if self.catalog_properties is not None:
            item["catalog_properties"] = dict(self.catalog_properties)
        return item


@dataclass(frozen=True)
class IcebergReadSpec:
    """A ``kappa_iceberg`` read: one table, bounded at a pinned snapshot or tailing (docs/source.md).

    :param catalog: catalog name.
    :param table: ``namespace.table``.
    :param ingestion_column: the timestamptz column set at ingestion.
    :param mode: ``bounded`` (backfill) or ``tail`` (live).
    :param snapshot_id: bounded: the pinned snapshot (``None``: current at query start).
    :param read_start_micros: bounded: inclusive start of the ingestion range.
    :param read_end_micros: bounded: exclusive end of it.
    :param max_misalignment_threshold_micros: bounded: ingestion time one micro-batch may advance, the
        admission grid's step (``None``: :data:`DEFAULT_MAX_MISALIGNMENT_THRESHOLD`).
    :param align_with: bounded: every iceberg source of the query (itself included).
    :param plan_file: bounded: the launcher's file list of the table (:mod:`.file_list`).
    :param ledger: bounded: the live ledger (:mod:`airflow_provider_kappa.spark.ledger`) whose
        micro-batches the read replays (:mod:`.replay`); ``None``: batches cut on the admission grid.
    :param options: other reader options, passed as they are.
    """

    catalog: str
    table: str
    ingestion_column: str
    mode: str = BOUNDED
    snapshot_id: int | None = None
    read_start_micros: int | None = None
    read_end_micros: int | None = None
    max_misalignment_threshold_micros: int | None = None
    align_with: tuple[AlignedTable, ...] = ()
    plan_file: str | None = None
    ledger: str | None = None
    max_files_per_batch: int | None = None
    max_rows_per_batch: int | None = None
    max_bytes_per_batch: int | None = None
    min_partitions: int = DEFAULT_MIN_PARTITIONS
    split_bytes: int = DEFAULT_SPLIT_BYTES
    starting: str = "earliest"
    tail_non_append: str = "fail"
    options: Mapping[str, str] = field(default_factory=dict)

    @property
    def max_misalignment_threshold_micros_or_default(self) -> int:
        """The admission grid's step: :attr:`max_misalignment_threshold_micros`, else the default."""
        if self.max_misalignment_threshold_micros is None:
            return duration_micros(DEFAULT_MAX_MISALIGNMENT_THRESHOLD)
        return self.max_misalignment_threshold_micros

    def aligned(self) -> AlignedTable:
        """This read as an ``align_with`` entry."""
        return AlignedTable(self.catalog, self.table, self.ingestion_column, self.snapshot_id, plan_file=self.plan_file)

    def _tuning(self) -> dict[str, str]:
        defaults = IcebergReadSpec("", "", "")
        return {
            k: str(getattr(self, k))
            for k in TUNING_OPTIONS
            if getattr(self, k) is not None and getattr(self, k) != getattr(defaults, k)
        }

    # ------------------------------------------------------------------------- reader options

    def to_options(self) -> dict[str, str]:
        """The reader options of this read (without the catalog's: ``read_source`` adds those)."""
        out = {k: v for k, v in self.options.items() if k not in SPEC_OPTIONS}
        out.update(self._tuning())
        out.update(
            {"catalog": self.catalog, "table": self.table, "ingestion_column": self.ingestion_column, "mode": self.mode}
        )
        if self.snapshot_id is not None:
            out["snapshot_id"] = str(self.snapshot_id)
        if self.read_start_micros is not None:
            out["read_start_micros"] = str(self.read_start_micros)
        if self.read_end_micros is not None:
            out["read_end_micros"] = str(self.read_end_micros)
        if self.max_misalignment_threshold_micros is not None:
            threshold = timedelta(microseconds=self.max_misalignment_threshold_micros)
            out["max_misalignment_threshold"] = format_duration(threshold)
        if self.align_with:
            out["align_with"] = json.dumps([a.to_item() for a in self.align_with])
        if self.plan_file is not None:
            out["plan_file"] = self.plan_file
        if self.ledger is not None:
            out["ledger"] = self.ledger
        return out

    @staticmethod
    def from_options(options: Mapping[str, str]) -> IcebergReadSpec:
        """Validate reader options (those given to ``spark.readStream.format("kappa_iceberg")``).

        :raises KappaConfigError: naming the option, the bad value and what is expected.
        """
        opts = {str(k): str(v) for k, v in options.items()}
        max_misalignment_threshold = opts.get("max_misalignment_threshold", "").strip()
        max_misalignment_threshold_micros = None
        if max_misalignment_threshold:
            max_misalignment_threshold_micros = duration_micros(
                parse_duration(max_misalignment_threshold, "kappa_iceberg option max_misalignment_threshold")
            )
        return IcebergReadSpec(
            catalog=_required(opts, "catalog"),
            table=_required(opts, "table"),
            ingestion_column=_required(opts, "ingestion_column"),
            mode=_choice(opts, "mode", (BOUNDED, TAIL), BOUNDED),
            snapshot_id=_integer(opts, "snapshot_id"),
            read_start_micros=_integer(opts, "read_start_micros"),
            read_end_micros=_integer(opts, "read_end_micros"),
            max_misalignment_threshold_micros=max_misalignment_threshold_micros,
            align_with=_parse_align_with(opts.get("align_with", "")),
            plan_file=opts.get("plan_file", "").strip() or None,
            ledger=opts.get("ledger", "").strip() or None,
            **_tuning_fields(opts),
            options={k: v for k, v in opts.items() if k not in KNOWN_OPTIONS},
        )._checked()

    def _checked(self) -> IcebergReadSpec:
        """This read, once its fields agree with each other (whether they came from options or the conf).

        :raises KappaConfigError: naming the options that disagree.
        """
        start, end = self.read_start_micros, self.read_end_micros
        if start is not None and end is not None and end <= start:
            raise KappaConfigError(
                f"kappa_iceberg: read_end_micros={end} must be greater than read_start_micros={start}"
            )
        limits = [k for k in LIMIT_OPTIONS if getattr(self, k) is not None]
        if len(limits) > 1:
            raise KappaConfigError(
                "kappa_iceberg: set at most one of max_files_per_batch, max_rows_per_batch, max_bytes_per_batch "
                f"(got {sorted(limits)})"
            )
        for key in ("plan_file", "ledger"):
            value = getattr(self, key)
            if value is not None and self.mode != BOUNDED:
                raise KappaConfigError(
                    f"kappa_iceberg: option {key}={value!r} is for mode 'bounded', not {self.mode!r}"
                )
        return self

    # ------------------------------------------------------------------------- spark.kappa.* conf

    def to_conf(self, name: str, candidate: str) -> dict[str, str]:
        """The ``spark.kappa.source.<name>.*`` keys of this read (the run's keys, mode, read range
        and threshold, are written once by the launcher for every source).

        :param name: the name the job passes to ``read_source``.
        :param candidate: the concrete source chosen for it.
        """
        key = f"{PREFIX}source.{name}."
        out = {
            key + "type": "iceberg",
            key + "candidate": candidate,
            key + "catalog": self.catalog,
            key + "table": self.table,
            key + "ingestion_column": self.ingestion_column,
        }
        if self.snapshot_id is not None:
            out[key + "snapshot_id"] = str(self.snapshot_id)
        if self.plan_file is not None:
            out[key + "plan_file"] = self.plan_file
        extra = {k: v for k, v in self.options.items() if k not in SPEC_OPTIONS}
        out.update({key + "option." + k: v for k, v in {**extra, **self._tuning()}.items()})
        return out

    @staticmethod
    def from_conf(name: str, conf: Mapping[str, str]) -> IcebergReadSpec:
        """The read of iceberg source ``name`` under a run's ``spark.kappa.*`` conf: its own keys,
        the run's mode, read range and threshold, every iceberg source of the run as ``align_with``;
        parsed once, straight into the spec.

        :param name: the source's name (``spark.kappa.source.<name>.*``).
        :param conf: the Spark conf (full keys).
        :raises KappaConfigError: for missing or malformed keys, naming the key.
        """
        own = _source_keys(conf, name)
        table = _aligned_of_conf(name, own)
        options = {k[len("option.") :]: v for k, v in own.items() if k.startswith("option.")}
        extra = {k: v for k, v in options.items() if k not in KNOWN_OPTIONS}
        spec = IcebergReadSpec(
            table.catalog, table.table, table.ingestion_column, mode=TAIL, **_tuning_fields(options), options=extra
        )
        if conf.get(PREFIX + "mode") != BACKFILL:
            return spec._checked()
        run: dict[str, Any] = {}
        for key, field_name in (("read.start", "read_start_micros"), ("read.end", "read_end_micros")):
            if conf.get(PREFIX + key):
                run[field_name] = to_micros(parse_timestamp(conf[PREFIX + key], PREFIX + key))
        threshold = conf.get(PREFIX + "max_misalignment_threshold")
        if threshold:
            run["max_misalignment_threshold_micros"] = duration_micros(
                parse_duration(threshold, PREFIX + "max_misalignment_threshold")
            )
        ledger = conf.get(PREFIX + "ledger")
        names = sorted(
            {k[len(PREFIX + "source.") :].partition(".")[0] for k in conf if k.startswith(PREFIX + "source.")}
        )
        return replace(
            spec,
            mode=BOUNDED,
            snapshot_id=table.snapshot_id,
            plan_file=table.plan_file,
            ledger=ledger_folder(ledger, conf) if ledger else None,
            align_with=tuple(
                _aligned_of_conf(n, keys) for n in names if (keys := _source_keys(conf, n)).get("type") == "iceberg"
            ),
            **run,
        )._checked()


def duration_micros(value: timedelta) -> int:
    """``value`` in whole microseconds."""
    return round(value.total_seconds() * 1_000_000)


def ledger_folder(root: str, conf: Mapping[str, str]) -> str:
    """The ledger of the run's query: ``<root>/<sink>`` for the run's one sink (a query writes one sink;
    the live ledger of a job is kept per sink, :mod:`airflow_provider_kappa.spark.ledger`).

    :param root: ``spark.kappa.ledger``.
    :param conf: the Spark conf (full keys).
    :raises KappaConfigError: the run has no sink or several.
    """
    sinks = sorted({k[len(PREFIX + "sink.") :].partition(".")[0] for k in conf if k.startswith(PREFIX + "sink.")})
    if len(sinks) != 1:
        raise KappaConfigError(
            f"{PREFIX}ledger: {root!r} is kept per sink (one query each), but the run has sinks {sinks}; "
            "replaying the live ledger needs a job with exactly one sink"
        )
    return sink_ledger(root, sinks[0])


def _tuning_fields(opts: Mapping[str, str]) -> dict[str, Any]:
    """The typed :data:`TUNING_OPTIONS` fields of reader options (or of a source's ``option.*`` keys)."""
    return {
        **{k: _integer(opts, k, 1) for k in LIMIT_OPTIONS},
        "min_partitions": _integer(opts, "min_partitions", 1) or DEFAULT_MIN_PARTITIONS,
        "split_bytes": _integer(opts, "split_bytes", 1) or DEFAULT_SPLIT_BYTES,
        "starting": _choice(opts, "starting", ("earliest", "latest"), "earliest"),
        "tail_non_append": _choice(opts, "tail_non_append", ("fail", "skip"), "fail"),
    }


def _source_keys(conf: Mapping[str, str], name: str) -> dict[str, str]:
    key = f"{PREFIX}source.{name}."
    return {k[len(key) :]: v for k, v in conf.items() if k.startswith(key)}


def _aligned_of_conf(name: str, keys: Mapping[str, str]) -> AlignedTable:
    """The table, snapshot and file list of iceberg source ``name`` (its keys, prefix removed)."""
    where = f"{PREFIX}source.{name}"
    snap = keys.get("snapshot_id")
    try:
        snapshot_id = int(snap) if snap else None
    except ValueError as e:
        raise KappaConfigError(f"{where}.snapshot_id: {snap!r} is not an integer snapshot id") from e
    for req in ("catalog", "table", "ingestion_column"):
        if not keys.get(req):
            raise KappaConfigError(f"{where}.{req}: missing from the Spark conf")
    return AlignedTable(
        keys["catalog"], keys["table"], keys["ingestion_column"], snapshot_id, plan_file=keys.get("plan_file") or None
    )


def _required(opts: Mapping[str, str], key: str) -> str:
    value = opts.get(key, "").strip()
    if not value:
        raise KappaConfigError(f"kappa_iceberg: option {key!r} is required")
    return value


def _integer(opts: Mapping[str, str], key: str, minimum: int | None = None) -> int | None:
    value = opts.get(key, "").strip()
    if not value:
        return None
    try:
        number = int(value)
    except ValueError as e:
        raise KappaConfigError(f"kappa_iceberg: option {key}={value!r} is not an integer") from e
    if minimum is not None and number < minimum:
        raise KappaConfigError(f"kappa_iceberg: option {key}={value!r} must be >= {minimum}")
    return number


def _choice(opts: Mapping[str, str], key: str, allowed: Sequence[str], default: str) -> str:
    value = opts.get(key, "").strip() or default
    if value not in allowed:
        raise KappaConfigError(f"kappa_iceberg: option {key}={value!r}; allowed: {list(allowed)}")
    return value


def _parse_align_with(text: str) -> tuple[AlignedTable, ...]:
    if not text.strip():
        return ()
    try:
        items = json.loads(text)
        if not isinstance(items, list):
            raise ValueError("not a JSON list")
        out = []
        for item in items:
            snap = item.get("snapshot_id")
            out.append(
                AlignedTable(
                    catalog=str(item["catalog"]),
                    table=str(item["table"]),
                    ingestion_column=str(item["ingestion_column"]),
                    snapshot_id=int(snap) if snap not in (None, "") else None,
                    catalog_properties=item.get("catalog_properties"),
                    plan_file=item.get("plan_file") or None,
                )
            )
        return tuple(out)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise KappaConfigError(
            f"kappa_iceberg: option align_with={text!r} must be a JSON list of "
            '{"catalog", "table", "ingestion_column", "snapshot_id"} objects'
        ) from e
