"""The live ledger's record statistics: each live batch's record time range and record count per
Kafka topic partition, added to its entry (:class:`~airflow_provider_kappa.spark.ledger.LedgerEntry`).

The sink records a batch's offsets when it commits (:func:`~airflow_provider_kappa.spark.ledger.record_batch`),
but sees only the job's output rows. The records themselves are measured where they enter the query:
:func:`observe_kafka` puts one observation on each Kafka source's DataFrame (live runs that record a
ledger: ``kappa run``), the smallest and largest record timestamp (Kafka's ``timestamp``, which
``kappa land`` writes as the landed table's ingestion column), and the records per topic partition.
Spark reports the observations of a batch once the batch is done; :class:`LedgerStats`, a query
listener on the driver, then adds them to the batch's entry (:func:`add_stats`), with each
source's row count from the batch's progress.

Per partition counts come from ``histogram_numeric`` over one number per partition (``crc32(topic) *
100000 + partition``): its bins are exact while the distinct values are at most its bin count
(:data:`MAX_PARTITIONS`), and the counts are checked against the batch's record count.

A batch whose statistics never arrive (the driver stopped between the commit and the listener, or a
Spark Connect session, whose listeners kappa does not use) keeps an entry without them, read and
placed by its trigger time like a version 1 entry (:meth:`~airflow_provider_kappa.spark.ledger.Ledger.placement`).
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQueryListener

from airflow_provider_kappa.exceptions import KappaSinkError
from airflow_provider_kappa.spark.ledger import LedgerEntry, read_offset_log
from airflow_provider_kappa.spark.storage import filesystem, read_text, write_text

log = logging.getLogger(__name__)

#: the observation's name prefix (one observation per Kafka source: ``kappa_ledger_<source>``)
PREFIX = "kappa_ledger_"
#: partitions per topic, and distinct topic partitions per source, whose counts are exact
MAX_PARTITIONS = 100_000
_BINS = 65_536
#: the Kafka sources read in this driver, in order (each observation gets its own name)
_READS: list[str] = []


def observe_kafka(df: DataFrame, source: str) -> DataFrame:
    """``df`` (Spark's Kafka source, before any parsing) with the ledger's observation on it, named
    ``kappa_ledger_<source>_<n>`` (each read its own name: Spark refuses two observations of one name)."""
    key = f"CAST(CAST(crc32(CAST(topic AS BINARY)) AS BIGINT) * {MAX_PARTITIONS} + partition AS DOUBLE)"
    _READS.append(source)
    return df.observe(
        f"{PREFIX}{source}_{len(_READS)}",
        F.expr("unix_millis(min(timestamp))").alias("first_ms"),
        F.expr("unix_millis(max(timestamp))").alias("last_ms"),
        F.count(F.lit(1)).alias("records"),
        F.expr(f"histogram_numeric({key}, {_BINS})").alias("partitions"),
    )


def merge_observations(observations: Iterable[Mapping[str, Any]]) -> tuple[int | None, int | None, dict[int, int]]:
    """``(first record ms, last record ms, key -> records)`` over one batch's observations (one per
    Kafka source read; sources reading the same topic read the same offsets, so a partition's count
    is the largest observed, not their sum).

    :raises KappaSinkError: the per-partition counts do not add up to the records observed.
    """
    first = last = None
    counts: dict[int, int] = {}
    for o in observations:
        if o.get("first_ms") is not None:
            first = o["first_ms"] if first is None else min(first, o["first_ms"])
            last = o["last_ms"] if last is None else max(last, o["last_ms"])
        seen = 0
        for bin_ in o.get("partitions") or []:
            n = int(bin_["y"])
            counts[int(bin_["x"])] = max(counts.get(int(bin_["x"]), 0), n)  # two sources of a topic: one read
            seen += n
        if seen != int(o.get("records") or 0):
            raise KappaSinkError(
                f"live ledger: per-partition counts {seen} != records {o.get('records')} (more than {_BINS} partitions?)"
            )
    return first, last, counts


def entry_with_stats(
    entry: LedgerEntry,
    first_ms: int | None,
    last_ms: int | None,
    by_key: Mapping[int, int],
    source_rows: Mapping[str, int],
) -> LedgerEntry:
    """``entry`` with its statistics; every partition of its ranges gets a count (0 when none read).

    :raises KappaSinkError: a count for a partition the entry's ranges do not hold.
    """
    keys = {}
    for topic, parts in entry.ranges.items():
        crc = zlib.crc32(topic.encode())
        for partition in parts:
            keys[crc * MAX_PARTITIONS + partition] = (topic, partition)
    counts: dict[str, dict[int, int]] = {t: dict.fromkeys(parts, 0) for t, parts in entry.ranges.items()}
    for key, n in by_key.items():
        if key not in keys:
            raise KappaSinkError(
                f"live ledger: batch {entry.batch_id} read {n} record(s) of a partition its offsets do not hold "
                f"(key {key}: crc32(topic) * {MAX_PARTITIONS} + partition)"
            )
        topic, partition = keys[key]
        counts[topic][partition] = n
    return replace(
        entry,
        first_record_ms=first_ms,
        last_record_ms=last_ms,
        counts=counts,
        source_rows=dict(source_rows),
    )


def add_stats(
    checkpoint: str,
    ledger: str,
    batch_id: int,
    observations: list[Mapping[str, Any]],
    rows: Mapping[str, int],
    *,
    missing_only: bool = False,
) -> LedgerEntry | None:
    """Add a committed batch's statistics to its ledger entry (rewritten whole).

    :param checkpoint: the query's checkpoint (the batch's trigger time names its entry).
    :param ledger: the sink's ledger folder.
    :param batch_id: the batch.
    :param observations: the batch's :func:`observe_kafka` observations.
    :param rows: source description -> rows read, from the batch's progress.
    :param missing_only: leave an entry that has its statistics already as it is.
    :returns: the entry written, ``None`` when the batch has no entry (the query reads no Kafka, or
        the entry is compacted already).
    """
    offsets = read_offset_log(checkpoint, batch_id)
    if offsets is None or not offsets.kafka:
        return None
    fs, root = filesystem(ledger, "live ledger", KappaSinkError)
    path = f"{root.rstrip('/')}/{offsets.timestamp_ms:013d}-{batch_id}.json"
    try:
        entry = LedgerEntry.from_json(read_text(fs, path), repr(path))
    except FileNotFoundError:
        return None
    if missing_only and entry.has_stats:
        return entry
    first, last, by_key = merge_observations(observations)
    entry = entry_with_stats(entry, first, last, by_key, rows)
    write_text(fs, path, entry.to_json())
    return entry


class LedgerStats(StreamingQueryListener):
    """Adds each finished batch's observations to its ledger entry (see the module docstring), for
    the live queries registered with :meth:`watch`."""

    def __init__(self) -> None:
        self.queries: dict[str, tuple[str, str]] = {}

    def watch(self, query_name: str, checkpoint: str, ledger: str) -> None:
        """Record the statistics of the query named ``query_name`` (its checkpoint, its sink's
        ledger), set before the query starts (its first batch may end before ``start`` returns)."""
        self.queries[query_name] = (checkpoint, ledger)

    def onQueryStarted(self, event: object) -> None:
        """Nothing: the query is watched once started (:meth:`watch`)."""

    def onQueryProgress(self, event: object) -> None:
        """Add the batch's statistics to its entry; a failure is logged (the entry stays readable)."""
        self.record(event.progress)  # type: ignore[attr-defined]

    def record(self, p: Any, *, missing_only: bool = False) -> None:
        """Add the statistics of the batch of progress ``p`` (a ``StreamingQueryProgress``) to its entry."""
        where = self.queries.get(str(p.name))
        if where is None:
            return
        observed = [
            row.asDict(recursive=True) for name, row in (p.observedMetrics or {}).items() if name.startswith(PREFIX)
        ]
        rows: dict[str, int] = {}
        for s in p.sources:
            rows[s.description] = rows.get(s.description, 0) + int(s.numInputRows)
        try:
            add_stats(where[0], where[1], int(p.batchId), observed, rows, missing_only=missing_only)
        except Exception as e:  # a listener must not raise; the entry without stats is placed by trigger time
            log.warning("live ledger: the statistics of batch %s were not recorded: %s", p.batchId, e)

    def flush(self, query: Any) -> None:
        """Record what the listener has not yet for ``query``'s recent batches (at the driver's exit:
        Spark delivers listener events asynchronously, and the last ones may still be queued)."""
        try:
            progresses = list(query.recentProgress)
        except Exception as e:  # the JVM is gone already: the listener's entries stay as they are
            log.warning("live ledger: the last batches' statistics could not be checked: %s", e)
            return
        for p in progresses:
            if getattr(p, "numInputRows", None) is not None:
                self.record(p, missing_only=True)

    def onQueryIdle(self, event: object) -> None:
        """Nothing: an idle trigger runs no batch."""

    def onQueryTerminated(self, event: object) -> None:
        """Nothing: the entries are written."""
