"""Pre-flight of a ledger replay: every replayed live batch's records are landed at the pinned
snapshot, count for count (:func:`check_landed_counts`), checked before any lock or tag.

A replayed batch reads the landed rows inside its Kafka offset ranges
(:mod:`airflow_provider_kappa.spark.source.replay`); a record live read but not landed yet (the
landing lags live) would be read as nothing, silently. Each ledger entry records how many records
the batch read per topic partition (:mod:`airflow_provider_kappa.spark.ledger_stats`; offsets are
not counts: transaction markers and aborted records take offsets and are never landed), so the
check compares those counts with the landed rows inside the same ranges: one pyiceberg scan per
source table at the snapshot the backfill will pin, of the three Kafka columns only, filtered to
the replayed topic partitions and offset ranges (files outside them are pruned by their column
statistics). An entry without counts (a version 1 entry) is not checked.

No Airflow or pyspark import; pyiceberg and numpy are imported by the functions that scan.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_provider_kappa.backfill.exactness import job_ledger
from airflow_provider_kappa.backfill.plan import plan
from airflow_provider_kappa.exceptions import KappaSourceError
from airflow_provider_kappa.spark.catalog import load_table
from airflow_provider_kappa.spark.conf_keys import KAFKA_COLUMNS
from airflow_provider_kappa.spark.ledger import Ledger, LedgerEntry
from airflow_provider_kappa.timeparse import to_micros

if TYPE_CHECKING:
    from airflow_provider_kappa.backfill.backfill import Backfill

#: a mismatch message names at most this many batches
SHOWN = 3


def replayed(book: Ledger, read_start_micros: int, read_end_micros: int) -> list[tuple[LedgerEntry, dict]]:
    """``(entry, {(topic, partition): (start, end)})`` of the entries placed in the range read, each
    start resolved as the replay resolves it (the previous entry's end, else ``None``: the beginning)."""
    at = book.placement()
    out = []
    for i in range(bisect.bisect_left(at, read_start_micros), bisect.bisect_left(at, read_end_micros)):
        entry = book.entry(book.keys[i][2])
        previous = book.entry(book.keys[i - 1][2]) if i > 0 else None
        ranges = {}
        for topic, parts in entry.ranges.items():
            for partition, (start, end) in parts.items():
                if start is None and previous is not None and partition in previous.ranges.get(topic, {}):
                    start = previous.ranges[topic][partition][1]
                ranges[(topic, partition)] = (start, end)
        out.append((entry, ranges))
    return out


def landed_offsets(
    bf: Backfill, snapshot_ids: Mapping[str, int], wanted: Mapping[tuple[str, int], tuple[int, int]]
) -> dict[tuple[str, int], Any]:
    """``(topic, partition)`` -> the sorted offsets landed in ``[lo, hi)`` of ``wanted`` (``lo``
    -1: from the beginning), over every source table at its snapshot (numpy arrays)."""
    import numpy as np
    from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, LessThan, Or

    topic_col, partition_col, offset_col = KAFKA_COLUMNS
    terms = [
        And(
            EqualTo(topic_col, t),
            EqualTo(partition_col, p),
            GreaterThanOrEqual(offset_col, max(lo, 0)),
            LessThan(offset_col, hi),
        )
        for (t, p), (lo, hi) in sorted(wanted.items())
    ]
    row_filter = terms[0] if len(terms) == 1 else Or(*terms)
    found: dict[tuple[str, int], list[Any]] = {}
    seen = set()
    for src in bf.sources().values():
        if (src.catalog, src.table) in seen:
            continue
        seen.add((src.catalog, src.table))
        table = load_table(bf.catalog_for(src.catalog), src.table)
        names = {f.name for f in table.schema().fields}
        if not set(KAFKA_COLUMNS) <= names:
            continue  # not a Kafka landing: the replay refuses it with its own message
        rows = table.scan(
            row_filter=row_filter, selected_fields=KAFKA_COLUMNS, snapshot_id=snapshot_ids.get(src.name)
        ).to_arrow()
        topics, partitions, offsets = (rows.column(c).to_numpy(zero_copy_only=False) for c in KAFKA_COLUMNS)
        for key in {(str(t), int(p)) for t, p in zip(topics, partitions)}:
            found.setdefault(key, []).append(offsets[(topics == key[0]) & (partitions == key[1])].astype("int64"))
    return {key: np.sort(np.concatenate(parts)) for key, parts in found.items()}


def check_landed_counts(bf: Backfill, snapshot_ids: Mapping[str, int], uri: str) -> int:
    """Refuse a replay of ledger ``uri`` whose batches' records are not all landed at ``snapshot_ids``.

    :returns: the batches checked (those with recorded counts).
    :raises KappaSourceError: naming the batches and partitions whose landed rows differ from the
        records live read, the counts, and the snapshot.
    """
    import numpy as np

    book = Ledger(uri)
    batches = [
        (e, r)
        for e, r in replayed(book, to_micros(bf.params.read_start), to_micros(bf.params.read_end))
        if e.counts is not None
    ]
    wanted: dict[tuple[str, int], tuple[int, int]] = {}
    for _, ranges in batches:
        for key, (start, end) in ranges.items():
            lo = -1 if start is None else start
            old = wanted.get(key)
            wanted[key] = (lo, end) if old is None else (min(old[0], lo), max(old[1], end))
    landed = landed_offsets(bf, snapshot_ids, wanted) if wanted else {}
    wrong = []
    for entry, ranges in batches:
        assert entry.counts is not None
        for (topic, partition), (start, end) in sorted(ranges.items()):
            expected = entry.counts.get(topic, {}).get(partition, 0)
            offsets = landed.get((topic, partition), np.empty(0, dtype="int64"))
            got = int(np.searchsorted(offsets, end) - np.searchsorted(offsets, -1 if start is None else start))
            if got != expected:
                wrong.append(
                    f"batch {entry.batch_id} (query {entry.query_id}, entry {entry.name}) partition {topic}/{partition} "
                    f"offsets [{'beginning' if start is None else start}, {end}): live read {expected} record(s), "
                    f"{got} landed"
                )
    if wrong:
        more = f" (and {len(wrong) - SHOWN} more)" if len(wrong) > SHOWN else ""
        raise KappaSourceError(
            f"live ledger {uri}: replayed batches' records are not landed at the pinned snapshot(s) "
            f"{dict(snapshot_ids)}: {'; '.join(wrong[:SHOWN])}{more}. Land them first (kappa land; the landing "
            "lags live), or run the backfill with ledger false"
        )
    return len(batches)


def check_replay_landed(bf: Backfill, current: Mapping[str, int]) -> int | None:
    """The pre-flight (before any lock or tag): when the backfill will replay the live ledger (its
    pinned choice on a rerun, else the plan's), check its batches are landed
    (:func:`check_landed_counts`) at the snapshots it will pin (its tag's on a rerun, else ``current``).

    :returns: the batches checked, ``None`` when the backfill does not replay the ledger.
    """
    pinned = bf.store().pinned("ledger")
    if pinned is None and (bf.params.ledger == "false" or _no_ledger(bf)):
        return None  # nothing to replay: no second plan
    ids = dict(current)
    for src in bf.sources().values():
        ref = load_table(bf.catalog_for(src.catalog), src.table).metadata.refs.get(bf.tag)
        if ref is not None:
            ids[src.name] = int(ref.snapshot_id)
    if pinned is not None:
        uri = pinned.get("ledger")
    else:
        exactness = plan(bf, ids, pin=False).exactness
        uri = exactness.ledger if exactness is not None else None
    return None if uri is None else check_landed_counts(bf, ids, uri)


def _no_ledger(bf: Backfill) -> bool:
    uri, _ = job_ledger(bf)
    return uri is None or Ledger.find(uri) is None
