"""The ``kappa_iceberg`` stream writer: exactly-once micro-batch appends to an Iceberg table.

Executors turn their Arrow batches into Parquet data files in the table's location with
pyiceberg's own writer (partitioned by the table's spec, with column metrics; a private API, through
:mod:`airflow_provider_kappa.compat.pyiceberg`) and send
the files' descriptions back. The driver commits one micro-batch as ONE Iceberg fast
append whose snapshot summary carries ``kappa.writer-id``, ``kappa.query-id`` (the
streaming query id from the checkpoint, when the checkpoint is on a local file system),
``kappa.batch-id`` and, in a backfill, ``kappa.slice`` and ``kappa.backfill-id``.

Exactly once: before committing batch ``b``, the driver finds the latest snapshot of the
table (in the main branch's ancestry) written by the same writer id. If it belongs to
the same query and its batch id is ``>= b``, batch ``b`` is already in the table: a
replay after a crash between the Iceberg commit and Spark's checkpoint commit. The
replay's freshly written files are deleted and nothing is committed. Empty batches
commit nothing. A failed batch (``abort``) deletes the files its tasks wrote, unless the
batch is in the table (Spark also aborts when ``commit`` raised after the Iceberg commit).

Fencing (backfill): a slice attempt's run carries its epoch (writer option ``epoch``, from
``spark.kappa.epoch``). When the query starts, the writer takes the staging table only if it was
created for that epoch (``staging.fenced_staging_table``) and remembers its Iceberg table UUID.
Every commit reloads the table and refuses (:class:`KappaSupersededError`, deleting the batch's
files) when the table is gone, holds another epoch or is another table of the same name (a newer
attempt purged and recreated it); pyiceberg asserts the table UUID in the commit itself, so a
recreation between that check and the commit makes the commit conflict, and the retry refuses.
Snapshots carry ``kappa.epoch``; :meth:`already_committed` counts only those of the run's epoch.

Output modes: ``append`` only. Spark refuses ``update`` for this sink before the first
batch ("does not support Update mode"); ``complete`` reaches the writer as
``overwrite=True`` and is refused here with a :class:`KappaSinkError`.

Schema: the query's output must have exactly the table's columns (any order), with
types the table accepts (equal, or a safe widening: int -> long, float -> double;
Spark ``timestamp`` -> ``timestamptz``; ``timestamp_ntz`` -> ``timestamp``). A mismatch
fails on the driver when the query starts, before anything is written, naming the
columns. In live mode a missing target table is created from the output schema
(all columns optional, partitioned by ``day(time_column)``); a backfill writes only to
its staging table, created like the target if absent.

Test-only option ``fail_after_commit_batch=<n>`` raises right after batch ``n``'s Iceberg
commit (before Spark's checkpoint commit): the crash the exactly-once check exists for.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import StructType

from airflow_provider_kappa.compat.pyiceberg import write_data_files
from airflow_provider_kappa.compat.pyspark import arrow_schema, stream_arrow_writer
from airflow_provider_kappa.exceptions import KappaConfigError, KappaSinkError, KappaSupersededError
from airflow_provider_kappa.faults import retry_transient
from airflow_provider_kappa.spark.catalog import catalog_from_options, ensure_namespace, load_table
from airflow_provider_kappa.spark.ledger import record_batch
from airflow_provider_kappa.spark.staging import ensure_staging_table, fenced_staging_table

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.catalog import Catalog
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table
    from pyiceberg.table.metadata import TableMetadata

log = logging.getLogger(__name__)

WRITER_ID = "kappa.writer-id"
QUERY_ID = "kappa.query-id"
BATCH_ID = "kappa.batch-id"
SLICE = "kappa.slice"
BACKFILL_ID = "kappa.backfill-id"
EPOCH = "kappa.epoch"
FAIL_AFTER_COMMIT_BATCH = "fail_after_commit_batch"
COMMIT_ATTEMPTS = 10


class InjectedCrash(RuntimeError):
    """Raised by the test-only ``fail_after_commit_batch`` option after an Iceberg commit."""


@dataclass(frozen=True)
class WireDataFile:
    """A pyiceberg ``DataFile`` in a picklable form (its record values, partition, spec id)."""

    values: tuple[Any, ...]
    partition: tuple[Any, ...]
    spec_id: int

    @classmethod
    def of(cls, data_file: DataFile, spec_id: int) -> WireDataFile:
        """Capture ``data_file``, written with partition spec ``spec_id``."""
        values = tuple(None if i == 3 else data_file[i] for i in range(len(data_file)))
        partition = tuple(data_file.partition[i] for i in range(len(data_file.partition)))
        return cls(values=values, partition=partition, spec_id=spec_id)

    def data_file(self) -> DataFile:
        """Rebuild the pyiceberg ``DataFile``."""
        from pyiceberg.manifest import DataFile
        from pyiceberg.typedef import Record

        values = list(self.values)
        values[3] = Record(*self.partition)
        rebuilt = DataFile(*values)
        rebuilt.spec_id = self.spec_id
        return rebuilt

    @property
    def file_path(self) -> str:
        """Where the Parquet file is."""
        return str(self.values[1])


@dataclass
class KappaCommitMessage(WriterCommitMessage):
    """What one write task produced: its data files and row count."""

    files: list[WireDataFile] = field(default_factory=list)
    rows: int = 0


@dataclass(frozen=True)
class SinkOptions:
    """The writer options built by ``spark/resolve.py:sink_writer_options`` (see docs/architecture.md)."""

    catalog: str
    table: str
    target_table: str
    time_column: str
    mode: str
    writer_id: str
    slice_id: str | None = None
    backfill_id: str | None = None
    checkpoint: str | None = None
    fail_after_commit_batch: int | None = None
    owns_start_micros: int | None = None
    owns_end_micros: int | None = None
    epoch: str | None = None
    ledger: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        """Validate and decode writer options (keys are case-insensitive in Spark)."""
        opts = {str(k).lower(): str(v) for k, v in options.items()}
        for key in ("catalog", "table", "time_column", "writer_id"):
            if not opts.get(key):
                raise KappaConfigError(f"kappa_iceberg writer: option {key!r} is required (got {sorted(opts)})")
        mode = opts.get("mode", "live")
        if mode not in ("live", "backfill"):
            raise KappaConfigError(f"kappa_iceberg writer: option 'mode' is {mode!r}; allowed: ['live', 'backfill']")
        fail = opts.get(FAIL_AFTER_COMMIT_BATCH)
        try:
            fail_batch = int(fail) if fail else None
        except ValueError as e:
            raise KappaConfigError(
                f"kappa_iceberg writer: option {FAIL_AFTER_COMMIT_BATCH!r} is {fail!r}; expected a batch id"
            ) from e
        return cls(
            catalog=opts["catalog"],
            table=opts["table"],
            target_table=opts.get("target_table") or opts["table"],
            time_column=opts["time_column"],
            mode=mode,
            writer_id=opts["writer_id"],
            slice_id=opts.get("slice") or None,
            backfill_id=opts.get("backfill_id") or None,
            checkpoint=opts.get("checkpointlocation") or None,
            fail_after_commit_batch=fail_batch,
            owns_start_micros=_micros_option(opts, "owns_start_micros"),
            owns_end_micros=_micros_option(opts, "owns_end_micros"),
            epoch=opts.get("epoch") or None,
            ledger=opts.get("ledger") or None,
        )


class KappaIcebergStreamWriter(stream_arrow_writer()):  # type: ignore[misc]
    """Idempotent micro-batch appends of a streaming query's output to an Iceberg table.

    Built on the driver (when the query starts, and again for every commit); pickled to
    executors with only the table metadata and FileIO properties (no catalog object).

    :param schema: the query's output schema.
    :param options: writer options (see :class:`SinkOptions`).
    :param overwrite: True in ``complete`` output mode, which is refused.
    """

    def __init__(self, schema: StructType, options: Mapping[str, str], overwrite: bool) -> None:
        self._opts = SinkOptions.parse(options)
        if overwrite:
            raise KappaSinkError(
                f"kappa_iceberg writer for {self._opts.table!r}: output mode 'complete' (overwrite) is not supported; "
                "use outputMode('append') (write_sink does)"
            )
        if self._opts.mode == "backfill" and self._opts.table == self._opts.target_table:
            raise KappaSinkError(
                f"kappa_iceberg writer: a backfill must write to a staging table, not to its target "
                f"{self._opts.target_table!r} (set spark.kappa.sink.<sink>.write_table)"
            )

        # what locates the catalog: its name, inline (non-secret) properties, the catalogs file's path
        self._catalog_options = {
            k: str(options[k]) for k in ("catalog", "catalog_properties", "catalogs_file") if k in options
        }
        catalog = catalog_from_options(self._catalog_options)
        self._superseded: KappaSupersededError | None = None
        try:
            table = _writable_table(catalog, self._opts, schema)
        except KappaSupersededError as e:
            # Spark builds a writer for each commit and abort too: the abort of a superseded run must
            # still delete the files its tasks wrote, so write() and commit() raise this, not __init__.
            self._superseded = e
            self._io_properties: dict[str, str] = dict(catalog.properties)
            return
        check_schema(schema, table, self._opts.table)
        self._table_uuid = str(table.metadata.table_uuid)
        self._metadata: TableMetadata = table.metadata
        self._io_properties = dict(table.io.properties)
        self._arrow_schema: pa.Schema = table.schema().as_arrow()
        self._query_id = read_query_id(self._opts.checkpoint)

    # ---- executors ---------------------------------------------------------------
    def write(self, iterator: Iterator[pa.RecordBatch]) -> KappaCommitMessage:
        """Write this task's rows as Parquet data files of the table; return their descriptions."""
        import pyarrow as pa
        from pyiceberg.io import load_file_io

        if self._superseded is not None:
            raise self._superseded
        batches = [b for b in iterator if b.num_rows]
        if not batches:
            return KappaCommitMessage()
        rows = pa.Table.from_batches(batches).select(self._arrow_schema.names).cast(self._arrow_schema)
        rows = self._owned(rows)
        if not rows.num_rows:
            return KappaCommitMessage()
        io = load_file_io(self._io_properties, self._metadata.location)
        written: list[WireDataFile] = []
        try:
            for data_file in write_data_files(self._metadata, rows, io):
                written.append(WireDataFile.of(data_file, self._metadata.default_spec_id))
        except BaseException:
            for wire in written:
                io.delete(wire.file_path)
            raise
        return KappaCommitMessage(files=written, rows=rows.num_rows)

    def _owned(self, rows: pa.Table) -> pa.Table:
        """Only the rows whose ``time_column`` lies in the range this run owns (backfill).

        Done here, on the query's output, rather than as a filter in the job's plan: Spark's
        optimizer pushes a filter on a grouping column below the aggregation, which for a
        session window drops input events and so changes the sessions themselves.
        """
        import pyarrow as pa
        import pyarrow.compute as pc

        lo, hi = self._opts.owns_start_micros, self._opts.owns_end_micros
        if lo is None and hi is None:
            return rows
        ts = pc.cast(rows[self._opts.time_column], pa.timestamp("us", tz="UTC"))
        keep = pc.is_valid(ts)
        if lo is not None:
            keep = pc.and_(keep, pc.greater_equal(ts, pa.scalar(lo, type=pa.timestamp("us", tz="UTC"))))
        if hi is not None:
            keep = pc.and_(keep, pc.less(ts, pa.scalar(hi, type=pa.timestamp("us", tz="UTC"))))
        return rows.filter(keep)

    # ---- driver --------------------------------------------------------------------
    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        """Commit micro-batch ``batchId`` as one Iceberg append, unless it already is in the table."""

        if self._opts.ledger and self._opts.checkpoint:
            # live: the batch's Kafka offsets into the live ledger before the batch is committed
            # anywhere, so every batch Spark commits has its entry (docs/landing.md, exact replay)
            record_batch(self._opts.checkpoint, self._opts.ledger, batchId)
        files = [f for m in messages if isinstance(m, KappaCommitMessage) for f in m.files]
        if self._superseded is not None:
            _delete_files(self._io_properties, files)
            raise self._superseded
        if not files:
            return
        # a catalog that cannot be reached for now (a locked sqlite file, a restarting server) is retried in
        # place, like publish: a commit that landed before the fault is found by already_committed
        what = f"kappa_iceberg writer: commit of batch {batchId} to {self._opts.table!r}"
        calls: list[int] = []

        def once() -> None:
            calls.append(1)
            self._commit_files(files, batchId, retried=len(calls) > 1)

        retry_transient(once, what)

    def _commit_files(self, files: Sequence[Any], batchId: int, *, retried: bool = False) -> None:
        """One Iceberg append of ``files`` as micro-batch ``batchId``, retried on commit conflicts; a
        batch already in the table is skipped (its new files deleted, unless ``retried``: after a
        fault, the batch found committed may be this very commit, which landed before the fault)."""
        from pyiceberg.exceptions import CommitFailedException

        catalog = catalog_from_options(self._catalog_options)
        props = self._summary(batchId)
        last: Exception | None = None
        for _ in range(COMMIT_ATTEMPTS):
            table = self._fenced(catalog, files, batchId) if self._opts.epoch else load_table(catalog, self._opts.table)
            stale = {f.spec_id for f in files} - {table.metadata.default_spec_id}
            if stale:
                _delete(table.io, files)
                raise KappaSinkError(
                    f"kappa_iceberg writer: the partition spec of {self._opts.table!r} changed while the query ran "
                    f"(files written with spec {sorted(stale)}, table now at {table.metadata.default_spec_id}); "
                    "restart the query"
                )
            if self.already_committed(table, batchId):
                log.warning(
                    "kappa_iceberg: batch %s of writer %s is already committed to %s; skipping the replay",
                    batchId,
                    self._opts.writer_id,
                    self._opts.table,
                )
                if not retried:
                    _delete(table.io, files)
                return
            try:
                with table.transaction() as tx:
                    with tx.update_snapshot(snapshot_properties=props).fast_append() as append:
                        for wire in files:
                            append.append_data_file(wire.data_file())
            except CommitFailedException as e:
                last = e
                continue
            if self._opts.fail_after_commit_batch == batchId:
                raise InjectedCrash(
                    f"fail_after_commit_batch={batchId}: crashing after the Iceberg commit (test option)"
                )
            return
        raise KappaSinkError(
            f"kappa_iceberg writer: batch {batchId} could not be committed to {self._opts.table!r} after "
            f"{COMMIT_ATTEMPTS} conflicting attempts"
        ) from last

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        """Delete the data files the tasks of a failed micro-batch wrote.

        Spark also aborts when ``commit`` itself raised, possibly after the Iceberg commit
        landed (the crash exactly-once is about): then the files belong to the table and stay.
        """

        files = [f for m in messages if isinstance(m, KappaCommitMessage) for f in m.files]
        if not files:
            return
        if self._superseded is not None:
            _delete_files(self._io_properties, files)
            return
        if self._opts.epoch:
            try:
                table = self._fenced(catalog_from_options(self._catalog_options), files, batchId)
            except KappaSupersededError:
                return  # superseded: _fenced deleted the files (no table of this run holds them)
        else:
            table = load_table(catalog_from_options(self._catalog_options), self._opts.table)
        if self.already_committed(table, batchId):
            log.warning(
                "kappa_iceberg: abort of batch %s of writer %s, which is committed to %s: keeping its files",
                batchId,
                self._opts.writer_id,
                self._opts.table,
            )
            return
        _delete(table.io, files)

    def already_committed(self, table: Table, batch_id: int) -> bool:
        """Whether ``batch_id`` of this writer (and query) is already in ``table``'s main branch.

        :param table: the freshly loaded table.
        :param batch_id: the micro-batch id.
        """
        snapshot = table.current_snapshot()
        while snapshot is not None:
            summary = snapshot.summary
            if (
                summary is not None
                and summary.get(WRITER_ID) == self._opts.writer_id
                and summary.get(EPOCH) == self._opts.epoch
            ):
                theirs = summary.get(QUERY_ID)
                if self._query_id and theirs and theirs != self._query_id:
                    return False  # an earlier incarnation of the checkpoint: nothing of this query yet
                return int(summary.get(BATCH_ID) or -1) >= batch_id
            parent = snapshot.parent_snapshot_id
            snapshot = None if parent is None else table.snapshot_by_id(parent)
        return False

    def _fenced(self, catalog: Catalog, files: Sequence[WireDataFile], batch_id: int) -> Table:
        """The staging table, freshly loaded, if this run's epoch still owns it; else delete
        ``files`` and raise :class:`KappaSupersededError`."""

        assert self._opts.epoch is not None
        try:
            table = fenced_staging_table(catalog, self._opts.table, self._opts.epoch)
            if str(table.metadata.table_uuid) != self._table_uuid:
                raise KappaSupersededError(
                    f"staging table {self._opts.table!r} was recreated (table UUID {table.metadata.table_uuid}, "
                    f"this run started on {self._table_uuid}): the run of epoch {self._opts.epoch!r} was superseded"
                )
        except KappaSupersededError as e:
            _delete_files(self._io_properties, files)
            log.error("kappa_iceberg: batch %s of writer %s not committed: %s", batch_id, self._opts.writer_id, e)
            raise
        return table

    def _summary(self, batch_id: int) -> dict[str, str]:
        props = {WRITER_ID: self._opts.writer_id, BATCH_ID: str(batch_id)}
        if self._opts.epoch:
            props[EPOCH] = self._opts.epoch
        if self._query_id:
            props[QUERY_ID] = self._query_id
        if self._opts.slice_id:
            props[SLICE] = self._opts.slice_id
        if self._opts.backfill_id:
            props[BACKFILL_ID] = self._opts.backfill_id
        return props


def _micros_option(opts: Mapping[str, str], key: str) -> int | None:
    value = opts.get(key)
    if not value:
        return None
    try:
        return int(value)
    except ValueError as e:
        raise KappaConfigError(f"kappa_iceberg writer: option {key!r} is {value!r}; expected epoch microseconds") from e


def _delete(io: Any, files: Sequence[WireDataFile]) -> None:
    """Delete uncommitted data files with FileIO ``io``; one already gone (deleted by an earlier
    call) is fine."""
    for wire in files:
        try:
            io.delete(wire.file_path)
        except FileNotFoundError:
            log.info("kappa_iceberg: uncommitted data file %s was already deleted", wire.file_path)


def _delete_files(io_properties: Mapping[str, str], files: Sequence[WireDataFile]) -> None:
    """Delete a refused batch's data files with a FileIO of ``io_properties`` (its table may be gone)."""
    from pyiceberg.io import load_file_io

    _delete(load_file_io(dict(io_properties), files[0].file_path if files else None), files)


def read_query_id(checkpoint: str | None) -> str | None:
    """The streaming query id Spark keeps in ``<checkpoint>/metadata`` (local or ``file:`` paths).

    A new checkpoint at the same path gets a new id, so batch ids restarting at 0 are not
    mistaken for replays. Checkpoints on other file systems return None (the writer id
    alone identifies the query).

    :param checkpoint: the query's ``checkpointLocation``.
    """

    if not checkpoint:
        return None
    parsed = urlparse(checkpoint)
    if parsed.scheme not in ("", "file"):
        return None
    meta = Path(parsed.path if parsed.scheme else checkpoint) / "metadata"
    if not meta.exists():
        return None
    try:
        return str(json.loads(meta.read_text().splitlines()[0])["id"])
    except (OSError, ValueError, KeyError, IndexError) as e:
        raise KappaSinkError(
            f"kappa_iceberg writer: checkpoint metadata {str(meta)!r} is not Spark's JSON {{'id': ...}}: {e}"
        ) from e


def _writable_table(catalog: Catalog, opts: SinkOptions, schema: StructType) -> Table:
    from pyiceberg.exceptions import NoSuchTableError

    if opts.mode == "backfill":
        if opts.epoch:  # the launcher created the table for this epoch; a run it no longer owns stops here
            return fenced_staging_table(catalog, opts.table, opts.epoch)
        return ensure_staging_table(catalog, opts.target_table, opts.table)
    try:
        return catalog.load_table(opts.table)
    except NoSuchTableError:
        return create_target_table(catalog, opts.table, schema, opts.time_column)


def create_target_table(catalog: Catalog, identifier: str, schema: StructType, time_column: str) -> Table:
    """Create ``identifier`` from a query's output schema: every column optional,
    partitioned by ``day(time_column)`` when it is a timestamp.

    :param catalog: the pyiceberg catalog.
    :param identifier: ``namespace.table``.
    :param schema: the query's output schema.
    :param time_column: the sink's time column.
    """
    import pyarrow as pa
    from pyiceberg.exceptions import TableAlreadyExistsError
    from pyiceberg.transforms import DayTransform

    arrow = _spark_arrow_schema(schema)
    arrow = pa.schema([f.with_nullable(True) for f in arrow])
    ensure_namespace(catalog, identifier.rsplit(".", 1)[0])
    try:
        with catalog.create_table_transaction(identifier, schema=arrow) as tx:
            if time_column in arrow.names and pa.types.is_timestamp(arrow.field(time_column).type):
                with tx.update_spec() as spec:
                    spec.add_field(time_column, DayTransform(), f"{time_column}_day")
    except TableAlreadyExistsError:
        pass  # created meanwhile by another process of the same query: use it
    return catalog.load_table(identifier)


def _spark_arrow_schema(schema: StructType) -> pa.Schema:
    return arrow_schema(schema)  # type: ignore[return-value]


def _normalize(t: pa.DataType) -> pa.DataType:
    import pyarrow as pa

    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz="UTC" if t.tz else None)
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _normalize(f.type)) for f in t])
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(_normalize(t.value_type))
    if pa.types.is_map(t):
        return pa.map_(_normalize(t.key_type), _normalize(t.item_type))
    return t


def _accepts(target: pa.DataType, given: pa.DataType) -> bool:
    import pyarrow as pa

    t, g = _normalize(target), _normalize(given)
    if t == g:
        return True
    widen = {
        (pa.int64(), pa.int32()),
        (pa.int64(), pa.int16()),
        (pa.int64(), pa.int8()),
        (pa.int32(), pa.int16()),
        (pa.int32(), pa.int8()),
        (pa.float64(), pa.float32()),
    }
    if (t, g) in widen:
        return True
    # Spark's TimestampType is an instant (-> timestamptz); a zone-less target takes timestamp_ntz only.
    return bool(pa.types.is_timestamp(t) and pa.types.is_timestamp(g) and t.tz and g.tz)


def check_schema(schema: StructType, table: Table, identifier: str) -> None:
    """Refuse a query output that does not match the table, naming every offending column.

    :param schema: the query's output schema.
    :param table: the table written.
    :param identifier: its name, for the message.
    :raises KappaSinkError: listing missing, extra, mistyped and nullable-into-required columns.
    """
    given = _spark_arrow_schema(schema)
    target = table.schema().as_arrow()
    required = {f.name for f in table.schema().fields if f.required}
    missing = [n for n in target.names if n not in given.names]
    extra = [n for n in given.names if n not in target.names]
    mistyped = [
        f"{n} ({given.field(n).type} given, {target.field(n).type} expected)"
        for n in target.names
        if n in given.names and not _accepts(target.field(n).type, given.field(n).type)
    ]
    nullable = [n for n in target.names if n in given.names and n in required and given.field(n).nullable]
    problems = []
    if missing:
        problems.append(f"missing columns {missing}")
    if extra:
        problems.append(f"columns not in the table {extra}")
    if mistyped:
        problems.append(f"mistyped columns {mistyped}")
    if nullable:
        problems.append(f"nullable columns {nullable} are required in the table")
    if problems:
        raise KappaSinkError(
            f"kappa_iceberg writer: the query output does not match the schema of {identifier!r}: "
            + "; ".join(problems)
            + f". Output schema: {schema.simpleString()}; table columns: {target.names}. Nothing was written."
        )
