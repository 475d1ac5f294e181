"""Input checks of a backfill, made before anything is written (no lock, no tag, no checkpoint,
no staging table): the job's application file (it exists and compiles), and the tables it reads
and writes (opening them also proves the catalogs can be reached; a window must cover whole
units of each sink's ``time_column``: a ``date`` column takes whole UTC days), whether the data
landed reaches ``end + tail`` (:func:`check_landed`; with ``allow_open_end``, :func:`closed_end`
is the end of the window published) and whether the window holds any source data
(:func:`check_window_data`), for engine ``submit`` that a Kubernetes ``job.master`` can be
submitted to, and for engine ``connect`` that a ``job.connect`` server accepts connections.
``kappa plan`` checks only the source tables.

No Airflow import at module level (only a Kubernetes master's check imports the Spark provider);
pyiceberg is imported inside functions.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_provider_kappa.backfill.exactness import check_ledger
from airflow_provider_kappa.backfill.plan import plan_backfill, slice_count, spans_loader
from airflow_provider_kappa.engine.connect_server import configured_url, port_open, redact_url
from airflow_provider_kappa.engine.iceberg_spark import job_spark_conf
from airflow_provider_kappa.engine.submit_args import check_kubernetes_provider
from airflow_provider_kappa.exceptions import KappaConfigError, KappaSinkError, KappaSourceError
from airflow_provider_kappa.job.catalogs import CatalogFor
from airflow_provider_kappa.job.checkpoints import job_root
from airflow_provider_kappa.job.config import CONNECT, SUBMIT, IcebergSinkConfig, IcebergSourceConfig, JobConfig
from airflow_provider_kappa.spark.catalog import load_table
from airflow_provider_kappa.spark.source.manifests import table_ingestion_range
from airflow_provider_kappa.spark.source.snapshots import ingestion_field
from airflow_provider_kappa.spark.storage import filesystem, first_missing, remove_empty_folders, write_text
from airflow_provider_kappa.timeparse import from_micros, human_duration

if TYPE_CHECKING:
    from airflow_provider_kappa.backfill.backfill import Backfill


#: most slices one backfill may have (Airflow's default ``core.max_map_length``): more means a
#: slice too short for the window, and a plan that would take long and hold much memory
MAX_SLICES = 1024
#: seconds a ``job.connect`` server has to accept a TCP connection before a backfill is refused
CONNECT_TIMEOUT = 3.0


def check_inputs(
    bf: Backfill, *, runs: bool = True, max_slices: int = MAX_SLICES, spark_conn_id: str | None = None
) -> None:
    """Refuse bad input before anything is written (no lock, no tag, no checkpoint): the source
    tables read must exist with a timestamp ingestion column (opening them proves the catalogs
    can be reached); a backfill that runs (``runs``) also needs the job's application file and
    every sink's target table with a time ``time_column``. ``kappa plan`` checks only sources.

    :param bf: the backfill.
    :param runs: the backfill will run the job (``kappa backfill``, the DAG's snapshot task).
    :param max_slices: the most slices allowed (the DAG passes Airflow's ``max_map_length``).
    :param spark_conn_id: the Spark connection slices submit through (engine ``submit``): its
        master, not ``job.master``, is then the one used, and is checked when a slice submits.
    :raises KappaConfigError: too many slices, a missing application, an unwritable
        ``checkpoint_root``, an unreachable catalog.
    :raises KappaSourceError: a missing source table or ingestion column.
    :raises KappaSinkError: a missing target table or ``time_column``.
    :raises KappaSourceError: also, for a backfill that runs, a window whose ``end + tail`` lies
        past the landed data without ``allow_open_end`` (:func:`check_landed`).
    :raises KappaConfigError: also, for a backfill that runs with engine ``submit`` and no
        ``spark_conn_id``, a Kubernetes ``job.master`` without Airflow's Kubernetes provider; an
        application that does not compile; a window that does not cover whole units of a sink's
        ``time_column``; for engine ``connect``, a ``job.connect`` server that does not answer;
        an Iceberg catalog in ``job.spark_conf`` on a Spark Iceberg has no Spark runtime for
        (:func:`~airflow_provider_kappa.engine.iceberg_spark.job_spark_conf`);
        ``ledger: true`` without a live ledger (:func:`~airflow_provider_kappa.backfill.exactness.check_ledger`).
    :raises KappaSourceError: also a window outside the sources' data (:func:`check_window_data`).
    """
    check_setup(bf, runs=runs, max_slices=max_slices, spark_conn_id=spark_conn_id)
    check_data(bf, runs=runs)


def check_setup(
    bf: Backfill, *, runs: bool = True, max_slices: int = MAX_SLICES, spark_conn_id: str | None = None
) -> None:
    """The part of :func:`check_inputs` that opens no table (fast): the slice count, the ledger, and
    for a backfill that runs the application, the engine's setup and ``checkpoint_root``.
    ``kappa backfill`` starts its engine once these pass, and checks the tables
    (:func:`check_data`) while the engine starts."""
    check_slice_count(bf, max_slices)
    check_ledger(bf)
    if runs:
        check_application(bf.cfg)
        if bf.cfg.job.engine == SUBMIT and spark_conn_id is None:  # a connection's master: checked when a slice submits
            check_kubernetes_provider(bf.cfg.job.master, f"job.master {bf.cfg.job.master!r}")
        check_connect_server(bf.cfg)
        job_spark_conf(bf.cfg)  # an Iceberg catalog of job.spark_conf on a Spark Iceberg has no build for
        check_checkpoint_root(bf.cfg)


def check_data(bf: Backfill, *, runs: bool = True) -> None:
    """The part of :func:`check_inputs` that reads the tables: the sources (and, for a backfill
    that runs, the targets), the landed end and the window's data."""
    window = (bf.params.start, bf.params.end) if runs else None
    check_tables(bf.cfg, bf.params.sources, bf.catalog_for, sinks=runs, window=window)
    if runs:
        check_landed(bf)
        check_window_data(bf)


def check_connect_server(cfg: JobConfig) -> None:
    """Refuse, before any lock or tag, a backfill on engine ``connect`` whose ``job.connect``
    server does not accept a TCP connection within :data:`CONNECT_TIMEOUT` seconds (without
    ``job.connect`` kappa starts a local server: nothing to check).

    :raises KappaConfigError: naming the server, the timeout and what to do.
    """
    if cfg.job.engine != CONNECT or cfg.job.connect is None:
        return
    url = configured_url(cfg)
    if url is not None and not port_open(url, timeout=CONNECT_TIMEOUT):
        key = "job.connect.url" if cfg.job.connect.url else f"job.connect.conn_id {cfg.job.connect.conn_id!r}"
        raise KappaConfigError(
            f"{key}: the Spark Connect server {redact_url(url)} accepts no connection (TCP, {CONNECT_TIMEOUT:g}s); "
            "expected a running Spark Connect server at that host:port; start it, fix the address, or remove "
            "job.connect to let kappa start a local server"
        )


def check_slice_count(bf: Backfill, max_slices: int = MAX_SLICES) -> int:
    """Refuse a backfill of more than ``max_slices`` slices, before any lock or plan.

    :returns: the slice count.
    :raises KappaConfigError: naming the count, the limit and the slice length that fits.
    """

    count = slice_count(bf.params)
    if count > max_slices:
        span = (
            bf.params.end - bf.params.start
            if bf.params.mode == "parallel"
            else bf.params.read_end - bf.params.read_start
        )
        fits = -(-span // max_slices)
        units = (timedelta(days=1), timedelta(hours=1), timedelta(minutes=1), timedelta(seconds=1))
        unit = next((u for u in units if fits >= u), units[-1])
        fits = -(-fits // unit) * unit  # rounded up to a whole day, hour, minute or second
        raise KappaConfigError(
            f"backfill parameter slice: {human_duration(bf.params.slice)} cuts the window "
            f"[{bf.params.start.isoformat()}, {bf.params.end.isoformat()}) into {count} slices; at most "
            f"{max_slices} are allowed; use a slice of at least {human_duration(fits)} or a shorter window"
        )
    return count


def check_checkpoint_root(cfg: JobConfig) -> None:
    """Refuse a ``job.checkpoint_root`` this process cannot write, before any lock or tag: a probe
    file is written into ``<checkpoint_root>/<job>/`` and removed, with the folders it created while
    they are empty (another backfill of the job starting at the same moment keeps what it wrote there).

    :raises KappaConfigError: naming the folder and the error.
    """

    root = job_root(cfg.job.checkpoint_root, cfg.job.name)
    fs, path = filesystem(root, "job.checkpoint_root", KappaConfigError)
    created = first_missing(fs, path)  # the topmost folder the probe creates
    probe = f"{path}/.kappa-write-probe-{uuid.uuid4().hex}"
    try:
        write_text(fs, probe, "probe")
        fs.delete_file(probe)
        if created is not None:
            remove_empty_folders(fs, path, created)
    except OSError as e:
        raise KappaConfigError(
            f"job.checkpoint_root: {cfg.job.checkpoint_root!r} cannot be written ({e}); "
            "expected a folder this process can create files in"
        ) from e


def check_application(cfg: JobConfig) -> Path:
    """The job's application file, checked to exist before a backfill writes anything.

    :param cfg: the job config.
    :raises KappaConfigError: ``job.application`` is not an existing file, or does not compile
        (naming the file, the line and the error).
    """
    app = cfg.job.application
    if not app.is_file():
        what = "is a folder" if app.is_dir() else "does not exist"
        raise KappaConfigError(
            f"job.application: {str(app)!r} {what}; expected the job's Python file "
            f"(a relative path is resolved against {str(cfg.path.parent)!r})"
        )
    try:
        compile(app.read_bytes(), str(app), "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as e:  # ValueError: null bytes (older Pythons)
        where = f"line {e.lineno}" if isinstance(e, SyntaxError) and e.lineno else "its source"
        what = e.msg if isinstance(e, SyntaxError) else str(e)
        raise KappaConfigError(
            f"job.application: {str(app)!r} does not compile: {what} at {where} of {str(app)!r}; "
            "expected the job's Python file, free of syntax errors"
        ) from e
    return app


def check_tables(
    cfg: JobConfig,
    sources: Sequence[str],
    catalog_for: CatalogFor,
    *,
    sinks: bool = True,
    window: tuple[datetime, datetime] | None = None,
) -> None:
    """Refuse a backfill whose tables are not there, before it writes anything (no tag, no
    checkpoint, no staging table): every source read must be an existing table whose ingestion
    column is a ``timestamptz`` (or ``timestamp``), and every sink's target an existing table
    whose ``time_column`` is a ``timestamptz``, ``timestamp`` or ``date``; ``window`` must cover
    whole units of each ``time_column`` (:func:`check_whole_units`).

    Opening the catalogs also proves they can be reached.

    :param cfg: the job config.
    :param sources: job source names the backfill reads (``BackfillParams.sources``).
    :param catalog_for: opens a catalog of the job by name (``Backfill.catalog_for``).
    :param sinks: check the sinks' target tables too (``kappa plan`` reads only the sources).
    :param window: the backfill's ``[start, end)``, checked against each sink's ``time_column``.
    :raises KappaConfigError: a catalog that cannot be loaded (from ``catalog_for``), a window of
        part of a unit of a ``time_column``.
    :raises KappaSourceError: a missing source table, or a missing/non-timestamp ingestion column.
    :raises KappaSinkError: a missing target table, or a missing/non-time ``time_column``.
    """
    from pyiceberg.types import DateType, TimestampType, TimestamptzType

    for name in sources:
        src = cfg.resolve(name, backfill=True)
        if not isinstance(src, IcebergSourceConfig):  # resolve() refuses this already; keeps mypy honest
            raise KappaSourceError(f"source {name}: {src.name!r} is not an iceberg source")
        try:
            table = load_table(catalog_for(src.catalog), src.table)
        except KappaSourceError as e:
            raise KappaSourceError(f"source {name} ({src.name}): {e}") from e
        ingestion_field(table.schema(), src.ingestion_column, src.table)
    for name, sink in cfg.sinks.items() if sinks else ():
        try:
            table = load_table(catalog_for(sink.catalog), sink.table)
        except KappaSourceError as e:
            raise KappaSinkError(f"sink {name}: target {e}; create it before backfilling into it") from e
        schema = table.schema()
        if sink.time_column not in schema.column_names:
            raise KappaSinkError(
                f"sink {name}: time_column {sink.time_column!r} is not a column of {sink.table!r}; "
                f"columns: {schema.column_names}"
            )
        ftype = schema.find_field(sink.time_column).field_type
        if not isinstance(ftype, (TimestamptzType, TimestampType, DateType)):
            raise KappaSinkError(
                f"sink {name}: time_column {sink.time_column!r} of {sink.table!r} has type {ftype}; "
                "expected timestamptz, timestamp or date"
            )
        if window is not None and isinstance(ftype, DateType):
            check_whole_units(name, sink, "date", timedelta(days=1), window)


def check_whole_units(
    name: str, sink: IcebergSinkConfig, type_name: str, unit: timedelta, window: tuple[datetime, datetime]
) -> None:
    """Refuse a window that does not cover whole units of a sink's ``time_column`` (a ``date``
    column: whole UTC days): publish would delete every row of each unit it touches (the window
    filter compares dates) but stage only the part of it in the window, losing the rest.

    :param name: the sink.
    :param sink: its config.
    :param type_name: the column's Iceberg type, for the message.
    :param unit: the column's unit (aligned on the Unix epoch, UTC).
    :param window: ``[start, end)``, aware.
    :raises KappaConfigError: naming the sink, the column, its unit, the window and the nearest
        window of whole units that covers it.
    """
    start, end = (t.astimezone(timezone.utc) for t in window)
    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
    lo = epoch + (start - epoch) // unit * unit
    hi = epoch - (epoch - end) // unit * unit
    if (lo, hi) == (start, end):
        return
    whole = "whole UTC days" if unit == timedelta(days=1) else f"whole units of {unit}"
    raise KappaConfigError(
        f"sink {name}: the backfill window [{start.isoformat()}, {end.isoformat()}) does not cover whole units of its "
        f"time_column {sink.time_column!r} ({sink.table!r}, type {type_name}: its unit is one UTC day); a publish "
        f"would replace every row of the days it touches with the rows of part of them. Expected a window of "
        f"{whole}: the nearest covering it is [{lo.isoformat()}, {hi.isoformat()}) "
        f"(--start {lo.isoformat()} --end {hi.isoformat()})"
    )


# --------------------------------------------------------------------------- the landed data


def check_window_data(bf: Backfill, snapshot_ids: Mapping[str, int] | None = None) -> None:
    """Refuse a window whose read range holds no source data at all (a window before or after the
    tables' data): nothing would be staged, and a publish would empty the window. Read-only, from
    manifests (the same rule as the plan's, :func:`~airflow_provider_kappa.backfill.plan.plan_backfill`).

    :param bf: the backfill.
    :param snapshot_ids: concrete source name -> pinned snapshot id; default (pre-flight, before
        the pin): the backfill's tag's snapshot when it exists (a rerun), else the current one. A
        source without any snapshot is left to the pin, which refuses it.
    :raises KappaSourceError: naming the window, the range read and each table's data extent.
    """
    ids = dict(snapshot_ids) if snapshot_ids is not None else preflight_snapshot_ids(bf)
    sources = {name: src.name for name, src in bf.sources().items()}
    if set(sources.values()) <= set(ids):
        plan_backfill(bf.params, bf.id, ids, sources, spans_loader(bf, ids))


def preflight_snapshot_ids(bf: Backfill) -> dict[str, int]:
    """Concrete source name -> the snapshot a backfill would pin: its tag's (a rerun), else the
    current one; a source table without any snapshot is left out. Reads only."""
    out: dict[str, int] = {}
    for src in {s.name: s for s in bf.sources().values()}.values():
        table = load_table(bf.catalog_for(src.catalog), src.table)
        ref = table.metadata.refs.get(bf.tag)
        current = table.current_snapshot()
        snapshot_id = ref.snapshot_id if ref is not None else (current.snapshot_id if current else None)
        if snapshot_id is not None:
            out[src.name] = int(snapshot_id)
    return out


@dataclass(frozen=True)
class LandedEnd:
    """Where the landed data of a backfill's sources ends (from manifest statistics).

    :param end: the earliest of the sources' landed ends: a source's last ingestion time rounded
        up to the end of its ``max_misalignment_threshold`` grid cell (the cell a micro-batch reads
        whole); the read range ``[start - warmup, end + tail)`` is landed when it ends by then.
    :param source: the source whose data ends first.
    :param table: its table.
    :param last: its last ingestion time (the largest upper bound of its data files).
    :param snapshot_id: the snapshot read.
    """

    end: datetime
    source: str
    table: str
    last: datetime
    snapshot_id: int


def landed_end(bf: Backfill, snapshot_ids: Mapping[str, int] | None = None) -> LandedEnd | None:
    """The end of the landed data of ``bf``'s sources, from manifests only (no data file opened):
    each source's largest ingestion upper bound, rounded up to the threshold grid; the earliest
    over the sources (a job reading several sources waits for the slowest: Spark's watermark is
    their minimum). ``None`` when no source has a data file with ingestion statistics.

    :param bf: the backfill.
    :param snapshot_ids: concrete source name -> pinned snapshot id; default (pre-flight, before
        the pin): the snapshot of the backfill's tag when it exists (a rerun), else the current one.
    """

    step = max(1, round(bf.params.max_misalignment_threshold.total_seconds() * 1_000_000))
    found: LandedEnd | None = None
    for src in {s.name: s for s in bf.sources().values()}.values():
        table = load_table(bf.catalog_for(src.catalog), src.table)
        if snapshot_ids is not None and src.name in snapshot_ids:
            snapshot_id: int | None = snapshot_ids[src.name]
        else:
            ref = table.metadata.refs.get(bf.tag)
            current = table.current_snapshot()
            snapshot_id = ref.snapshot_id if ref is not None else (current.snapshot_id if current else None)
        if snapshot_id is None:
            continue  # no data at all: the planner refuses a backfill no source can feed
        bounds = table_ingestion_range(table, snapshot_id, src.ingestion_column)
        if bounds is None:
            continue
        end = from_micros(-(-(bounds[1] + 1) // step) * step)
        if found is None or end < found.end:
            found = LandedEnd(end, src.name, src.table, from_micros(bounds[1]), int(snapshot_id))
    return found


def check_landed(bf: Backfill) -> LandedEnd | None:
    """Refuse, before any lock or tag, a backfill whose read range ends past the landed data
    (``end + tail`` after :func:`landed_end`): the job's windows near ``end`` would never close,
    and a publish would replace the target's correct rows there with fewer. With
    ``allow_open_end`` it may run, and publishes only the part of the window the landed data
    closes (:func:`closed_end`); refused even then when that part is empty.

    :param bf: the backfill.
    :returns: the landed end (``None`` when no source has ingestion statistics to tell).
    :raises KappaSourceError: naming the window, the tail, the landed data and what to do.
    """

    landed = landed_end(bf)
    p = bf.params
    short = falls_short(bf, landed)
    if short is None:
        return landed
    landed, closes = short, closed_by(bf, short)
    what = (
        f"backfill window [{p.start.isoformat()}, {p.end.isoformat()}) with tail {human_duration(p.tail)} reads "
        f"ingestion time up to end + tail = {p.read_end.isoformat()}, past the landed data: source {landed.source} "
        f"({landed.table}, snapshot {landed.snapshot_id}) holds ingestion times up to {landed.last.isoformat()}, "
        f"landed through {landed.end.isoformat()} (the end of its {human_duration(p.max_misalignment_threshold)} "
        "threshold cell)"
    )
    if closes <= p.start:
        after = "; the window is outside the tables' data (it starts after they end)" if p.start >= landed.end else ""
        raise KappaSourceError(
            f"{what}{after}; the landed data closes no part of the window (it would need data up to "
            f"{(p.start + p.tail).isoformat()}); choose an earlier window or wait for the data to land"
        )
    if not p.allow_open_end:
        raise KappaSourceError(
            f"{what}: the job's windows near the end would never close, and a publish would replace correct rows "
            f"with fewer. Use an end of at most {closes.isoformat()}, wait for data up to {p.read_end.isoformat()} "
            f"to land, or pass --allow-open-end (Params: allow_open_end) to publish only [{p.start.isoformat()}, "
            f"{closes.isoformat()}), the part the landed data closes"
        )
    return landed


def closed_end(bf: Backfill, snapshot_ids: Mapping[str, int]) -> datetime:
    """The end of the window a backfill publishes (and validates): ``end``, or with
    ``allow_open_end`` and a read range past the landed data at the pinned snapshots, the landed
    end minus ``tail`` (what the landed data closes, by the tail's contract). Rows the backfill
    staged from there to ``end`` are not published; the target keeps its rows there.

    :param bf: the backfill.
    :param snapshot_ids: concrete source name -> pinned snapshot id (a slice plan's).
    """
    p = bf.params
    if not p.allow_open_end:
        return p.end
    short = falls_short(bf, landed_end(bf, snapshot_ids))
    return p.end if short is None else closed_by(bf, short)


def falls_short(bf: Backfill, landed: LandedEnd | None) -> LandedEnd | None:
    """``landed`` when ``bf``'s read range (``end + tail``) ends past it, else ``None`` (also when
    there are no ingestion statistics to tell)."""
    return landed if landed is not None and bf.params.read_end > landed.end else None


def closed_by(bf: Backfill, landed: LandedEnd) -> datetime:
    """How far the landed data closes ``bf``'s window: the landed end minus ``tail`` (by the tail's
    contract), at least ``start`` (then it closes none of it)."""
    return max(bf.params.start, landed.end - bf.params.tail)
