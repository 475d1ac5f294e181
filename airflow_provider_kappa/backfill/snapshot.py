"""The snapshot step: pin the current snapshot of every source table a backfill reads, and tag it
so that snapshot expiry cannot remove it mid-backfill; a backfill that publishes first locks the
window of its targets (:func:`airflow_provider_kappa.backfill.lock.lock`). A refusal after the lock
or a tag was taken (a tag pointing elsewhere, a window outside the pinned data) gives back the
locks and the tags this call took: a refused backfill leaves nothing behind.

No Airflow import here; pyiceberg is imported inside functions.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from airflow_provider_kappa.backfill.checks import check_window_data
from airflow_provider_kappa.backfill.landed_counts import check_replay_landed
from airflow_provider_kappa.backfill.lock import DEFAULT_TAG_RETENTION, lock, release_target
from airflow_provider_kappa.exceptions import KappaCatalogConflictError, KappaSourceError
from airflow_provider_kappa.spark.catalog import load_table

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from airflow_provider_kappa.backfill.backfill import Backfill

log = logging.getLogger(__name__)
T = TypeVar("T")


def snapshot(bf: Backfill, *, tag: bool = True, retention: timedelta = DEFAULT_TAG_RETENTION) -> dict[str, int]:
    """Lock the window of every sink's target (a backfill that publishes; see
    :func:`airflow_provider_kappa.backfill.lock.lock`), then pin the current snapshot of every source table read, and tag it so that snapshot expiry
    cannot remove it during the backfill. A rerun with the same parameters finds its lock and
    its tag, and reuses the snapshot it pins (its input does not change).

    :param bf: the backfill.
    :param tag: lock and create/reuse the tag (``kappa plan`` passes ``False``: it writes nothing).
    :param retention: ``max-ref-age`` of a new tag, and how long the lock stays live.
    :returns: concrete source name -> snapshot id.
    :raises KappaConcurrencyError: another backfill holds an overlapping window of a target;
        nothing was written.
    :raises KappaSourceError: a missing table, or a table without any snapshot (no data), or a
        window outside the data of the pinned snapshots; the locks and tags this call took are
        given back. Also, before any lock, a ledger replay whose batches' records are not all landed
        (:func:`~airflow_provider_kappa.backfill.landed_counts.check_replay_landed`).
    """
    if not tag:
        return pin(bf, tag=False, retention=retention)
    current = pin(bf, tag=False, retention=retention)  # read only: refuse missing or empty sources before locking
    check_replay_landed(bf, current)  # a ledger replay's batches all landed, before locking
    taken = lock(bf, retention=retention) if bf.params.publishes else []
    created: list[tuple[str, str]] = []
    try:
        pinned = pin(bf, tag=True, retention=retention, created=created)
        check_window_data(bf, pinned)  # checked before the lock too; again on what was pinned
        bf.store().touch_heartbeat()  # running: cleanup keeps it
        return pinned
    except BaseException:
        give_back(bf, taken, created)
        raise


def give_back(bf: Backfill, locks: list[tuple[str, str]], tags: list[tuple[str, str]]) -> None:
    """Release the locks (``(catalog, target)``) and remove the tags (``(catalog, source)``) a
    refused snapshot step took, so that a refused backfill blocks nothing and pins nothing."""
    for catalog, table in locks:
        release_target(bf, catalog, table)
    for catalog, table in tags:
        if remove_tag(load_table(bf.catalog_for(catalog), table), bf.tag):
            log.info("backfill %s: removed tag %s of %s after a refusal", bf.id, bf.tag, table)


def pin(
    bf: Backfill,
    *,
    tag: bool,
    retention: timedelta = DEFAULT_TAG_RETENTION,
    created: list[tuple[str, str]] | None = None,
) -> dict[str, int]:
    """Pin the current snapshot of every source table read, without locking: with ``tag``, reuse
    the snapshot of the backfill's tag, or tag the current one (a new tag lives ``retention``).

    :param created: gets ``(catalog, table)`` of every tag this call created.
    :returns: concrete source name -> snapshot id.
    :raises KappaSourceError: a missing table, or a table without any snapshot (no data).
    """

    pinned: dict[str, int] = {}
    by_table: dict[tuple[str, str], int] = {}
    for src in bf.sources().values():
        key = (src.catalog, src.table)
        if key in by_table:
            pinned[src.name] = by_table[key]
            continue
        table = load_table(bf.catalog_for(src.catalog), src.table)
        ref = table.metadata.refs.get(bf.tag)
        if tag and ref is not None:
            snap_id = ref.snapshot_id
            log.info("source %s: reusing snapshot %s pinned by tag %s of %s", src.name, snap_id, bf.tag, src.table)
        else:
            current = table.current_snapshot()
            if current is None:
                raise KappaSourceError(
                    f"source {src.name}: table {src.table!r} has no snapshot (it holds no data); nothing to backfill"
                )
            snap_id = current.snapshot_id
            if tag and _create_tag(table, snap_id, bf.tag, retention) and created is not None:
                created.append(key)
            if tag:
                log.info("source %s: pinned snapshot %s of %s with tag %s", src.name, snap_id, src.table, bf.tag)
        by_table[key] = pinned[src.name] = int(snap_id)
    return pinned


#: attempts to create a tag when other writers (backfills tagging the same table) keep committing first
TAG_ATTEMPTS = 8


def retry_commit(what: str, step: Callable[[], T], table: Any, hint: str) -> T:
    """``step()``, run again on the refreshed ``table`` while the catalog refuses its commit because
    another writer committed first (another backfill, an ingestion, a cleanup), at most
    :data:`TAG_ATTEMPTS` times.

    :param what: the object committed, for the messages.
    :param step: reads ``table`` and commits; safe to repeat.
    :param table: the table ``step`` commits to.
    :param hint: what to do when every attempt lost, for the error.
    :raises KappaCatalogConflictError: every attempt lost its race.
    """

    from pyiceberg.exceptions import CommitFailedException

    for attempt in range(1, TAG_ATTEMPTS + 1):
        try:
            return step()
        except CommitFailedException as e:
            if attempt == TAG_ATTEMPTS:
                raise KappaCatalogConflictError(
                    f"{what}: the catalog refused {TAG_ATTEMPTS} commits because other writers committed first ({e}); {hint}"
                ) from e
            log.info("%s: commit lost a race (%s); retrying on the refreshed table", what, e)
            time.sleep(random.uniform(0.01, 0.05) * attempt)
            table.refresh()
    raise AssertionError("unreachable")  # the loop returns or raises


def _create_tag(table: Any, snapshot_id: int, name: str, retention: timedelta) -> bool:
    """Tag ``snapshot_id`` of ``table`` as ``name``; a commit that loses a race with another writer
    (another backfill tagging the same source table, an ingestion commit) is retried on the
    refreshed table (:func:`retry_commit`), and a tag another task of this backfill created first is reused.

    :returns: whether this call created the tag."""

    def step() -> bool:
        ref = table.metadata.refs.get(name)
        if ref is not None:
            if ref.snapshot_id != snapshot_id:
                raise KappaSourceError(
                    f"tag {name!r} of {'.'.join(table.name())!r} points at snapshot {ref.snapshot_id}, "
                    f"not the pinned snapshot {snapshot_id}; release it or rerun with the same parameters"
                )
            return False
        table.manage_snapshots().create_tag(
            snapshot_id, name, max_ref_age_ms=int(retention.total_seconds() * 1000)
        ).commit()
        return True

    return retry_commit(f"tag {name!r} of {'.'.join(table.name())!r}", step, table, "retry the step")


def remove_tag(table: Table, name: str) -> bool:
    """Remove the tag ``name`` of ``table`` (pyiceberg ``ManageSnapshots.remove_tag``); a tag
    removed concurrently by another process is not an error.

    :param table: the source table.
    :param name: the tag.
    :return: whether this call removed it.
    :raises KappaCatalogConflictError: the commit kept conflicting with other writers.
    """

    def step() -> bool:
        if name not in table.metadata.refs:
            return False
        table.manage_snapshots().remove_tag(name).commit()
        return True

    return retry_commit(f"tag {name!r} of {'.'.join(table.name())!r}", step, table, "run the cleanup again")
