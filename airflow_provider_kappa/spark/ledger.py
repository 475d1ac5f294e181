"""The live ledger: where a Kafka-live query cut its micro-batches, kept durably for backfills.

A live query's micro-batch boundaries are in its checkpoint's offset log (``offsets/<batch id>``:
a metadata line with the batch's trigger time and watermark, then one line per source; a Kafka
source's line is ``{"topic": {"partition": next offset}}``). Spark keeps only the last
``spark.sql.streaming.minBatchesToRetain`` (100) entries, so the kappa sink copies each batch's
boundaries into the ledger when it commits the batch (:func:`record_batch`, called by
:meth:`~airflow_provider_kappa.spark.sink.KappaIcebergStreamWriter.commit` before the Iceberg commit
and so before Spark's own commit of the batch): every batch the query commits has its entry, a
replayed batch rewrites the same entry. A batch that moved no Kafka offset (a no-data batch, run to
apply an advanced watermark) has its entry too, with empty ranges: Spark drops late events by the
watermark of the batch before, so a backfill replays live's no-data batches as well.

Once the batch is done, live's listener adds what the batch's records were
(:mod:`airflow_provider_kappa.spark.ledger_stats`): their smallest and largest record timestamp
(the landed table's ingestion time) and their count per topic partition (offsets are not counts:
transaction markers take offsets), with each source's row count; the watermark is the offset log's.

One JSON file per batch, ``<ledger>/<trigger time in ms, 13 digits>-<batch id>.json``
(:class:`LedgerEntry`, version 2; version 1 entries, without the record statistics, stay
readable): sorted by name, the ledger is in the order live ran its batches, across restarts and
checkpoint resets (each entry names its query id). Slices place the entries by their data, not by
when live ran them (:meth:`Ledger.placement`): a backlog live caught up in a few batches at one
wall-clock instant lands in the slices its records belong to. ``kappa cleanup`` compacts the
older entries (:func:`compact`): :data:`CHUNK_ENTRIES` consecutive entries become one JSON-lines
file ``<first trigger ms>-<first batch>_<last trigger ms>-<last batch>.jsonl``, written whole before
the single files go (a reader that lists both reads each entry once), and it trims what no backfill
may replay any more (:func:`trim`). A backfill with the ledger
(:mod:`airflow_provider_kappa.spark.source.replay`) replays these batches: batch k reads exactly the
landed rows whose ``(kafka_topic, kafka_partition, kafka_offset)`` fall in entry k's ranges; its
pre-flight checks they are all landed, count for count (:func:`~airflow_provider_kappa.backfill.landed_counts.check_landed`).

Pure Python with pyarrow's file systems (any URI ``pyarrow.fs`` knows); no pyspark import.
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

from airflow_provider_kappa.exceptions import KappaSinkError, KappaSourceError
from airflow_provider_kappa.spark.storage import filesystem, read_text, write_text

VERSION = 2
#: the versions read: 1 holds no record statistics (placed by trigger time, :meth:`Ledger.placement`)
READ_VERSIONS = (1, 2)
#: ``<trigger ms>-<batch id>.json``
_NAME = re.compile(r"^(\d{13})-(\d+)\.json$")
#: ``<first trigger ms>-<first batch id>_<last trigger ms>-<last batch id>.jsonl``: compacted entries
_CHUNK = re.compile(r"^(\d{13})-(\d+)_(\d{13})-(\d+)\.jsonl$")
#: entries per compacted file (a day of live at a 10 s trigger: 9 files)
CHUNK_ENTRIES = 1000
#: the newest entries compaction leaves as they are: a live restart replays (rewrites) its last batch
KEEP_NEWEST = 100

#: topic -> partition -> ``(start offset or None: from the partition's beginning, end offset)``
Ranges = dict[str, dict[int, tuple[int | None, int]]]


@dataclass(frozen=True)
class LedgerEntry:
    """One live micro-batch that read Kafka: what it read and when live started it.

    :param query_id: the streaming query's id (from the checkpoint's ``metadata``).
    :param batch_id: the micro-batch id.
    :param end_ms: the batch's trigger time (``batchTimestampMs``): live fetched the end offsets then.
    :param start_ms: the previous batch's trigger time (``None`` for a query's first batch): the
        records of this batch reached Kafka after it.
    :param watermark_ms: the event-time watermark the batch ran with.
    :param ranges: topic -> partition -> ``(start, end)`` offsets the batch read: ``start <= offset < end``.
    :param first_record_ms: the smallest record timestamp the batch read (Kafka's ``timestamp``: the
        landed table's ingestion column); ``None`` when it read no record or is not recorded.
    :param last_record_ms: the largest one, likewise.
    :param counts: topic -> partition -> records the batch read (offsets are not counts: transaction
        markers and aborted records take offsets); ``None``: not recorded (a version 1 entry, or
        live's listener did not get to it, :mod:`airflow_provider_kappa.spark.ledger_stats`).
    :param source_rows: rows per source of the query (Spark's source description -> rows), non-Kafka
        sources included; ``None``: not recorded.
    """

    query_id: str
    batch_id: int
    end_ms: int
    start_ms: int | None
    watermark_ms: int
    ranges: Mapping[str, Mapping[int, tuple[int | None, int]]]
    first_record_ms: int | None = None
    last_record_ms: int | None = None
    counts: Mapping[str, Mapping[int, int]] | None = None
    source_rows: Mapping[str, int] | None = None

    @property
    def has_stats(self) -> bool:
        """Whether live recorded the batch's record statistics (counts, record time range)."""
        return self.counts is not None

    @property
    def records(self) -> int | None:
        """How many Kafka records the batch read, by the recorded counts (``None``: not recorded)."""
        return None if self.counts is None else sum(n for parts in self.counts.values() for n in parts.values())

    @property
    def name(self) -> str:
        """The entry's file name."""
        return entry_name(self.end_ms, self.batch_id)

    @property
    def rows(self) -> int | None:
        """How many Kafka records the batch read (``None`` when a start is unknown)."""
        total = 0
        for parts in self.ranges.values():
            for start, end in parts.values():
                if start is None:
                    return None
                total += end - start
        return total

    def to_json(self) -> str:
        """The entry as JSON (ranges as ``{topic: {partition: [start, end]}}``)."""
        return json.dumps(
            {
                "version": VERSION,
                "query_id": self.query_id,
                "batch_id": self.batch_id,
                "end_ms": self.end_ms,
                "start_ms": self.start_ms,
                "watermark_ms": self.watermark_ms,
                "ranges": {
                    t: {str(p): [s, e] for p, (s, e) in sorted(parts.items())}
                    for t, parts in sorted(self.ranges.items())
                },
                "first_record_ms": self.first_record_ms,
                "last_record_ms": self.last_record_ms,
                "counts": None
                if self.counts is None
                else {t: {str(p): n for p, n in sorted(parts.items())} for t, parts in sorted(self.counts.items())},
                "source_rows": None if self.source_rows is None else dict(sorted(self.source_rows.items())),
            },
            separators=(",", ":"),
        )

    @staticmethod
    def from_json(text: str, where: str) -> LedgerEntry:
        """Parse :meth:`to_json`'s output.

        :raises KappaSourceError: naming ``where`` when it is not a ledger entry of this version.
        """
        try:
            data = json.loads(text)
            if data.get("version") not in READ_VERSIONS:
                raise ValueError(f"version {data.get('version')!r}, expected one of {list(READ_VERSIONS)}")
            ranges: Ranges = {
                str(t): {int(p): (None if s is None else int(s), int(e)) for p, (s, e) in parts.items()}
                for t, parts in data["ranges"].items()
            }
            start, counts, rows = data["start_ms"], data.get("counts"), data.get("source_rows")
            return LedgerEntry(
                query_id=str(data["query_id"]),
                batch_id=int(data["batch_id"]),
                end_ms=int(data["end_ms"]),
                start_ms=None if start is None else int(start),
                watermark_ms=int(data["watermark_ms"]),
                ranges=ranges,
                first_record_ms=_int_or_none(data.get("first_record_ms")),
                last_record_ms=_int_or_none(data.get("last_record_ms")),
                counts=None
                if counts is None
                else {str(t): {int(p): int(n) for p, n in parts.items()} for t, parts in counts.items()},
                source_rows=None if rows is None else {str(k): int(n) for k, n in rows.items()},
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise KappaSourceError(f"live ledger entry {where} is not a kappa ledger entry: {e}") from e


def _int_or_none(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]


def sink_ledger(root: str, sink: str) -> str:
    """``<root>/<sink>``: the ledger of the query writing ``sink`` (a job's live ledger, ``job.ledger``,
    keeps one per sink: one query each)."""
    return f"{root.rstrip('/')}/{sink}"


def entry_name(end_ms: int, batch_id: int) -> str:
    """``<end_ms, 13 digits>-<batch id>.json``: names sort in the order live ran the batches."""
    return f"{end_ms:013d}-{batch_id}.json"


# ------------------------------------------------------------------------------ the offset log


def _kafka_offsets(line: str) -> dict[str, dict[int, int]] | None:
    """A Kafka source's offsets ``{topic: {partition: offset}}`` from one offset-log line, else ``None``
    (another source's offset, or ``-``: a source without one)."""
    try:
        data = json.loads(line)
    except ValueError:
        return None
    if not isinstance(data, dict) or not data:
        return None
    out: dict[str, dict[int, int]] = {}
    for topic, parts in data.items():
        if not isinstance(parts, dict) or not parts:
            return None
        try:
            out[str(topic)] = {int(p): int(o) for p, o in parts.items() if not isinstance(o, bool)}
        except (TypeError, ValueError):
            return None
        if len(out[str(topic)]) != len(parts):
            return None
    return out


def _merge(found: list[dict[str, dict[int, int]]], where: str) -> dict[str, dict[int, int]]:
    """The offsets of every Kafka source, by topic; two sources of one topic must agree."""
    out: dict[str, dict[int, int]] = {}
    for offsets in found:
        for topic, parts in offsets.items():
            if topic in out and out[topic] != parts:
                raise KappaSinkError(
                    f"{where}: two Kafka sources of the query read topic {topic!r} to different offsets "
                    f"({out[topic]} and {parts}); a ledger keeps one range per topic partition"
                )
            out[topic] = parts
    return out


@dataclass(frozen=True)
class OffsetLogEntry:
    """One ``offsets/<batch id>`` file of a checkpoint: the trigger time, the watermark and the end
    offsets of its Kafka sources."""

    timestamp_ms: int
    watermark_ms: int
    kafka: dict[str, dict[int, int]]


def read_offset_log(checkpoint: str, batch_id: int) -> OffsetLogEntry | None:
    """``<checkpoint>/offsets/<batch_id>``, or ``None`` when the file does not exist.

    :param checkpoint: the query's checkpoint location.
    :param batch_id: the micro-batch id.
    :raises KappaSinkError: a file that is not Spark's offset log (names it).
    """
    fs, root = filesystem(checkpoint, "checkpoint", KappaSinkError)
    path = f"{root.rstrip('/')}/offsets/{batch_id}"
    try:
        text = read_text(fs, path)
    except FileNotFoundError:
        return None
    lines = text.split("\n")
    try:
        if lines[0].strip() != "v1":
            raise ValueError(f"version line {lines[0]!r}, expected 'v1'")
        meta = json.loads(lines[1])
        timestamp, watermark = int(meta["batchTimestampMs"]), int(meta.get("batchWatermarkMs", 0))
    except (IndexError, ValueError, KeyError, TypeError) as e:
        raise KappaSinkError(f"offset log {path!r} is not Spark's offset log (v1, metadata, offsets): {e}") from e
    found = [o for line in lines[2:] if line.strip() and (o := _kafka_offsets(line)) is not None]
    return OffsetLogEntry(timestamp, watermark, _merge(found, f"offset log {path!r}"))


def read_initial_offsets(checkpoint: str) -> dict[str, dict[int, int]]:
    """Where the query's Kafka sources started: ``<checkpoint>/sources/<i>/0`` (Spark's Kafka source
    writes its resolved starting offsets there before the first batch)."""
    from pyarrow.fs import FileSelector, FileType

    fs, root = filesystem(checkpoint, "checkpoint", KappaSinkError)
    sources = f"{root.rstrip('/')}/sources"
    found = []
    for info in fs.get_file_info(FileSelector(sources, allow_not_found=True)):
        if info.type != FileType.Directory:
            continue
        try:
            text = read_text(fs, f"{info.path}/0")
        except FileNotFoundError:
            continue
        lines = [line for line in text.replace("\x00", "").split("\n") if line.strip()]
        offsets = _kafka_offsets(lines[-1]) if lines else None
        if offsets is not None:
            found.append(offsets)
    return _merge(found, f"initial offsets under {sources!r}")


def read_query_id(checkpoint: str) -> str:
    """The query id in ``<checkpoint>/metadata`` (any file system pyarrow knows)."""
    fs, root = filesystem(checkpoint, "checkpoint", KappaSinkError)
    path = f"{root.rstrip('/')}/metadata"
    try:
        return str(json.loads(read_text(fs, path).splitlines()[0])["id"])
    except (OSError, ValueError, KeyError, IndexError) as e:
        raise KappaSinkError(f"checkpoint metadata {path!r} is not Spark's JSON {{'id': ...}}: {e}") from e


def batch_entry(checkpoint: str, batch_id: int) -> LedgerEntry | None:
    """The ledger entry of micro-batch ``batch_id`` from the checkpoint's offset log (a no-data batch
    has empty ranges), or ``None`` when the query reads no Kafka.

    The start of a partition is its end in the previous batch (``offsets/<batch_id - 1>``), for the
    first batch the source's starting offsets; a partition new in this batch starts at its beginning.

    :param checkpoint: the query's checkpoint location.
    :param batch_id: a batch whose offsets are in the log (the one being committed).
    :raises KappaSinkError: the batch's offsets are not in the log.
    """
    this = read_offset_log(checkpoint, batch_id)
    if this is None:
        raise KappaSinkError(
            f"live ledger: batch {batch_id} has no offsets in {checkpoint!r}/offsets; cannot record it"
        )
    if not this.kafka:
        return None
    before = read_offset_log(checkpoint, batch_id - 1) if batch_id > 0 else None
    start_offsets = before.kafka if before is not None else (read_initial_offsets(checkpoint) if batch_id == 0 else {})
    ranges: Ranges = {}
    for topic, parts in this.kafka.items():
        for partition, end in parts.items():
            ranges.setdefault(topic, {})[partition] = (start_offsets.get(topic, {}).get(partition), end)
    return LedgerEntry(
        query_id=read_query_id(checkpoint),
        batch_id=batch_id,
        end_ms=this.timestamp_ms,
        start_ms=before.timestamp_ms if before is not None else None,
        watermark_ms=this.watermark_ms,
        ranges=ranges,
    )


def record_batch(checkpoint: str, ledger: str, batch_id: int) -> LedgerEntry | None:
    """Write micro-batch ``batch_id``'s entry into ``ledger`` (see :func:`batch_entry`). Writing it
    again (a replayed batch) writes the same file.

    :param checkpoint: the query's checkpoint location.
    :param ledger: the ledger folder (local path or URI).
    :param batch_id: the batch being committed.
    :returns: the entry, ``None`` when the query reads no Kafka (nothing written).
    """
    entry = batch_entry(checkpoint, batch_id)
    if entry is None:
        return None
    fs, root = filesystem(ledger, "live ledger", KappaSinkError)
    write_text(fs, f"{root.rstrip('/')}/{entry.name}", entry.to_json())
    return entry


# ------------------------------------------------------------------------------ reading


class Ledger:
    """A ledger folder, read: its entries' names at once, their contents when asked.

    :param uri: the ledger folder (local path or URI).
    :raises KappaSourceError: the folder does not exist.
    """

    def __init__(self, uri: str) -> None:
        from pyarrow.fs import FileSelector, FileType

        self.uri = uri
        self._fs, self._root = filesystem(uri, "live ledger", KappaSourceError)
        info = self._fs.get_file_info(self._root)
        if info.type != FileType.Directory:
            raise KappaSourceError(
                f"live ledger {uri!r} does not exist: `kappa run` records it while the job runs live from Kafka "
                "(job.ledger of kappa.yaml); run the backfill without the ledger, or point job.ledger at it"
            )
        self._cache: dict[str, LedgerEntry] = {}
        self._placement: list[int] | None = None
        self._singles: set[str] = set()
        found: dict[tuple[int, int], str] = {}
        #: the compacted files, by name
        self.chunks: list[str] = []
        for item in self._fs.get_file_info(FileSelector(self._root)):
            if item.type != FileType.File:
                continue
            if (single := _NAME.match(item.base_name)) is not None:
                found[(int(single.group(1)), int(single.group(2)))] = item.base_name
                self._singles.add(item.base_name)
            elif _CHUNK.match(item.base_name):
                self.chunks.append(item.base_name)
        for chunk in sorted(self.chunks):
            for entry in self._read_chunk(chunk):
                self._cache.setdefault(entry.name, entry)  # a single file not yet deleted holds the same entry
                found.setdefault((entry.end_ms, entry.batch_id), entry.name)
        #: ``(end_ms, batch_id, entry name)`` of every entry, in the order live ran them
        self.keys: list[tuple[int, int, str]] = sorted((end, batch, name) for (end, batch), name in found.items())

    @classmethod
    def find(cls, uri: str) -> Ledger | None:
        """The ledger at ``uri``, or ``None`` when its folder does not exist."""
        from pyarrow.fs import FileType

        fs, root = filesystem(uri, "live ledger", KappaSourceError)
        return cls(uri) if fs.get_file_info(root).type == FileType.Directory else None

    def __len__(self) -> int:
        return len(self.keys)

    def placement(self) -> list[int]:
        """Where each entry (in :attr:`keys` order) sits on the ingestion axis, in microseconds: what
        slices place the live batches by (a slice reading ``[a, b)`` replays the entries placed in it).

        An entry is placed by its data, at its last record's timestamp (``last_record_ms``), so the
        batches of a backlog live caught up at one wall-clock instant spread over the hours their
        records landed in. An entry that read no record sits right after the one before it (a
        no-data batch closes what its predecessor's data opened; leading ones right before the first
        placed entry). An entry without record statistics (a version 1 entry, or one live's
        listener did not complete) is placed at its trigger time (``end_ms``), as before data
        placement. Placements never go back: each is at least the one before it plus one
        microsecond (live's order is the replay order), so a record timestamp older than an
        earlier batch's cannot reorder them.
        """
        if self._placement is None:
            anchors: list[int | None] = []
            for end_ms, _, name in self.keys:
                e = self.entry(name)
                if not e.has_stats:
                    anchors.append(end_ms * 1000)
                else:
                    anchors.append(None if e.last_record_ms is None else e.last_record_ms * 1000)
            known = next((a for a in anchors if a is not None), 0)
            out: list[int] = []
            for anchor in anchors:
                here = (out[-1] if out else known) if anchor is None else anchor
                out.append(max(here, out[-1] + 1) if out else here)
            self._placement = out
        return self._placement

    def count(self, start_ms: int, end_ms: int) -> int:
        """How many entries are placed in ``[start_ms, end_ms)`` (:meth:`placement`): the batches a
        read of that range replays."""
        at = self.placement()
        return bisect.bisect_left(at, end_ms * 1000) - bisect.bisect_left(at, start_ms * 1000)

    def records(self, start_ms: int, end_ms: int) -> int | None:
        """The Kafka records the entries placed in ``[start_ms, end_ms)`` read, by their recorded
        counts (``None``: one of them has none recorded)."""
        at = self.placement()
        total = 0
        for i in range(bisect.bisect_left(at, start_ms * 1000), bisect.bisect_left(at, end_ms * 1000)):
            n = self.entry(self.keys[i][2]).records
            if n is None:
                return None
            total += n
        return total

    def gap(self, start_ms: int, end_ms: int, data_last_ms: int | None, owned_end_ms: int | None = None) -> str | None:
        """Why replaying this ledger over the ingestion range ``[start_ms, end_ms)`` would not be
        exact, or ``None`` when live's recorded batches cover it: live's first batch read records
        from before the range began (or read every partition from its first offset), its last
        batch holds the last landed record of the range, and no batch placed after the range ends
        read records that landed before ``owned_end_ms`` (a batch straddling the window's end: a
        replay of the range would not have it, and the output windows it closed would be missing).
        Live's start is its first batch's trigger time (or its first record's time, when earlier);
        the other ends are compared by the entries' data (:meth:`placement`; first record times when
        recorded, else the previous trigger time).

        :param data_last_ms: the last landed ingestion time in the range (``None``: unknown, the
            range's end counts).
        :param owned_end_ms: the end of the backfill's window (``None``: not checked).
        """
        if not self.keys:
            return f"the live ledger {self.uri} holds no batch"
        at = self.placement()
        first = self.entry(self.keys[0][2])
        from_start = all(s in (None, 0) for parts in first.ranges.values() for s, _ in parts.values())
        # live read every record landed after its first trigger (and, when earlier, its first record)
        first_ms = min(first.end_ms, first.first_record_ms if first.first_record_ms is not None else first.end_ms)
        if first_ms > start_ms and not from_start:
            return (
                f"live's first recorded batch starts at {_iso(first_ms)}, after the range read begins "
                f"({_iso(start_ms)}): records before it were never read live"
            )
        last_ms, need = at[-1] // 1000, end_ms - 1 if data_last_ms is None else min(end_ms - 1, data_last_ms)
        if last_ms < need:
            return (
                f"live's last recorded batch ends at {_iso(last_ms)}, before the range read's landed data ends "
                f"({_iso(need)}): later records were not read live yet"
            )
        after = bisect.bisect_left(at, end_ms * 1000)
        if owned_end_ms is not None and after < len(self.keys):
            late = self.entry(self.keys[after][2])
            lo = late.first_record_ms if late.has_stats else late.start_ms
            read = late.records if late.has_stats else late.rows
            if read != 0 and (lo is None or lo < owned_end_ms):
                since = "its query's first batch" if lo is None else f"since {_iso(lo)}"
                return (
                    f"live's batch {late.batch_id}, placed at {_iso(at[after] // 1000)} after the range read ends "
                    f"({_iso(end_ms)}), read records landed {since}, before the window ends "
                    f"({_iso(owned_end_ms)}): a backlog live caught up after the range"
                )
        return None

    def _has_file(self, name: str) -> bool:
        """Whether entry ``name`` has its own (single-entry) file."""
        return name in self._singles

    def _read_chunk(self, name: str) -> list[LedgerEntry]:
        path = f"{self._root.rstrip('/')}/{name}"
        try:
            text = read_text(self._fs, path)
        except OSError as e:
            raise KappaSourceError(f"live ledger file {path!r} cannot be read: {e}") from e
        return [LedgerEntry.from_json(line, f"{path!r} line {n}") for n, line in enumerate(text.splitlines(), 1)]

    def entry(self, name: str) -> LedgerEntry:
        """The entry named ``name`` (its own file, or read with its compacted file)."""
        if name not in self._cache:
            path = f"{self._root.rstrip('/')}/{name}"
            try:
                text = read_text(self._fs, path)
            except OSError as e:
                raise KappaSourceError(f"live ledger entry {path!r} cannot be read: {e}") from e
            self._cache[name] = LedgerEntry.from_json(text, repr(path))
        return self._cache[name]


# ------------------------------------------------------------------------------ upkeep (kappa cleanup)


def compact(uri: str, *, chunk: int = CHUNK_ENTRIES, keep_newest: int = KEEP_NEWEST) -> int:
    """Compact the ledger's single-entry files, oldest first, ``chunk`` at a time, leaving the newest
    ``keep_newest`` as they are (and a last run shorter than ``chunk``). Each compacted file is
    written under a temporary name and moved into place before its single files are deleted: a
    compaction stopped at any point leaves every entry readable, at most twice (read once).

    :param uri: the ledger folder.
    :returns: how many single files were compacted.
    """
    book = Ledger(uri)
    singles = [key for key in book.keys if _NAME.match(key[2]) and book._has_file(key[2])]
    singles = singles[: max(0, len(singles) - keep_newest)]
    done = 0
    for first in range(0, len(singles) - chunk + 1, chunk):
        run = singles[first : first + chunk]
        entries = [book.entry(name) for _, _, name in run]
        (lo_ms, lo_batch, _), (hi_ms, hi_batch, _) = run[0], run[-1]
        name = f"{entry_name(lo_ms, lo_batch)[:-5]}_{entry_name(hi_ms, hi_batch)}l"
        final, temporary = f"{book._root.rstrip('/')}/{name}", f"{book._root.rstrip('/')}/.{name}.tmp"
        write_text(book._fs, temporary, "\n".join(e.to_json() for e in entries) + "\n")
        book._fs.move(temporary, final)
        for _, _, single in run:
            book._fs.delete_file(f"{book._root.rstrip('/')}/{single}")
        done += len(run)
    return done


def trim(uri: str, before_ms: int, *, dry_run: bool = False) -> int:
    """Delete the ledger's entries that live started before ``before_ms`` and that are placed
    before it (:meth:`Ledger.placement`: a backfill reading from ``before_ms`` on replays none of
    them): single files, and compacted files whose last entry is such (one that straddles the cut
    stays whole).

    :param dry_run: count only.
    :returns: how many entries were (``dry_run``: would be) deleted.
    """
    book = Ledger(uri)
    root = book._root.rstrip("/")
    # triggers and placements both grow in live's order: the entries before the cut are a prefix
    prefix = min(bisect.bisect_left(book.keys, (before_ms,)), bisect.bisect_left(book.placement(), before_ms * 1000))
    index = {name: i for i, (_, _, name) in enumerate(book.keys)}
    doomed = [name for _, _, name in book.keys[:prefix] if book._has_file(name)]
    gone = len(doomed)
    for name in book.chunks:
        entries = book._read_chunk(name)
        if index[entries[-1].name] < prefix:
            gone += sum(1 for e in entries if not book._has_file(e.name))
            doomed.append(name)
    if not dry_run:
        for name in doomed:
            book._fs.delete_file(f"{root}/{name}")
    return gone


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat()
