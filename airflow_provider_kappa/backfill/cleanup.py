"""Cleanup: remove what a job's backfills left behind once they are older than the retention.

A backfill leaves, until it is cleaned up:

- one staging table per sink and per slice that read data (none for an empty slice), in the
  job's ``staging_namespace``;
- its checkpoint folder ``<checkpoint_root>/<job>/backfill/<backfill_id>/``: checkpoints, the
  boundary copies, the plan files (``plans/``), progress and done records, slice logs, the
  state file of a local Spark Connect server;
- the tag ``kappa-<backfill_id>`` on every source table it read;
- until it publishes (or ``kappa backfill --release-lock``), its lock on each target.

**Finding them** (reading only): the folders under ``<checkpoint_root>/<job>/backfill/``, the
staging tables of the job's sink targets (:func:`~airflow_provider_kappa.spark.staging.staging_backfills`)
and the locks of this job on its targets give the backfill ids; the tags of those ids are looked
up on the job's Iceberg source tables.

**Age**: the time since the backfill's last activity, the latest of its publish commit on a
target (snapshot summary ``kappa.backfill-id``), its lock, the newest file of its checkpoint
folder and the last update of its staging tables. A published backfill is so aged from its
publish; one that did not publish (failed, dry run, ``--no-publish``) from its last slice run.

**Kept**: a backfill holding a lock on a target (it may still publish: release the lock first),
one whose kappa-owned Spark Connect server still runs, one running (its heartbeat, touched by
every step, is younger than :data:`LIVENESS` and newer than its publish commit: on either
engine, in dry runs too), the ids the caller asks to keep, and any
backfill younger than the retention (``job.retention``, 7 days by default; ``0s`` removes every
other backfill at once).

**Removed**, in this order, each step idempotent, so a cleanup interrupted midway is finished by
the next one (the checkpoint folder, by which a backfill is found, goes last):

1. its staging tables, by :func:`~airflow_provider_kappa.spark.staging.drop_staging`: the data
   files a publish committed into the target by reference are never deleted (the staging table
   is marked published before the commit; only files no snapshot of the target references go);
2. its tags, by pyiceberg's ``ManageSnapshots.remove_tag`` (a tag another process removed first
   is fine; a commit conflict is retried on the refreshed table);
3. its checkpoint folder.

No Airflow import here; pyiceberg and pyarrow are imported inside functions.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from airflow_provider_kappa.backfill.backfill import tag_name
from airflow_provider_kappa.backfill.lock import lock_property, read_locks
from airflow_provider_kappa.backfill.snapshot import TAG_ATTEMPTS, remove_tag
from airflow_provider_kappa.engine.connect_server import read_state
from airflow_provider_kappa.exceptions import KappaSinkError
from airflow_provider_kappa.job.catalogs import CatalogFor, job_catalogs
from airflow_provider_kappa.job.checkpoints import (
    HEARTBEAT_EVERY,
    CheckpointStore,
    backfill_root,
    backfills_folder,
    connect_state_path,
)
from airflow_provider_kappa.job.config import IcebergSourceConfig, JobConfig
from airflow_provider_kappa.spark.staging import drop_staging, staging_backfills
from airflow_provider_kappa.spark.storage import filesystem
from airflow_provider_kappa.timeparse import human_duration

if TYPE_CHECKING:
    from pyiceberg.table import Table

log = logging.getLogger(__name__)

#: Snapshot summary key publish stamps with the backfill id (``backfill/finish.py``).
BACKFILL_ID_SUMMARY = "kappa.backfill-id"
#: a backfill whose heartbeat is younger than this is running and kept, whatever the retention
#: (its steps touch the heartbeat every :data:`~airflow_provider_kappa.job.checkpoints.HEARTBEAT_EVERY`
#: seconds at most while they run)
LIVENESS = timedelta(minutes=5)
assert LIVENESS.total_seconds() >= 4 * HEARTBEAT_EVERY


@dataclass(frozen=True)
class Leftovers:
    """What one backfill of the job left behind.

    :param backfill_id: the backfill.
    :param checkpoint: its checkpoint folder, if it exists.
    :param staging: ``(catalog, target table, staging table)`` of each staging table.
    :param tags: ``(catalog, source table)`` of each source table holding its tag.
    :param locks: the target tables it holds a lock on.
    :param release: the command releasing its lock (from the lock).
    :param published_at: its last publish commit, if a target still has that snapshot.
    :param last_activity: the latest time it did anything (see the module docstring).
    :param running: why it looks running (its Spark Connect server), or ``None``.
    :param heartbeat: when it last touched its heartbeat, if ever.
    """

    backfill_id: str
    checkpoint: str | None = None
    staging: tuple[tuple[str, str, str], ...] = ()
    tags: tuple[tuple[str, str], ...] = ()
    locks: tuple[str, ...] = ()
    release: str = ""
    published_at: datetime | None = None
    last_activity: datetime | None = None
    running: str | None = None
    heartbeat: datetime | None = None


@dataclass(frozen=True)
class CleanupDecision:
    """Whether one backfill's leftovers go, and why.

    :param leftovers: what it left.
    :param remove: whether it is (or, in a dry run, would be) removed.
    :param reason: why it is kept, or ``"older than the retention …"``.
    :param age: the time since its last activity (``None``: unknown).
    """

    leftovers: Leftovers
    remove: bool
    reason: str
    age: timedelta | None = field(default=None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary (ids, counts, table names and paths only: fit for XCom)."""
        lo = self.leftovers
        return {
            "backfill_id": lo.backfill_id,
            "removed": self.remove,
            "reason": self.reason,
            "published": lo.published_at is not None,
            "staging_tables": [t for _, _, t in lo.staging],
            "tags": [t for _, t in lo.tags],
            "checkpoint": lo.checkpoint,
        }


def age_text(age: timedelta | None) -> str:
    """``3d 4h``, ``2h 5min``, ``40s``: an age for people (``?`` when unknown)."""
    if age is None:
        return "?"
    seconds = max(0, int(age.total_seconds()))
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}min"
    return f"{minutes}min" if minutes else f"{seconds}s"


# --------------------------------------------------------------------------- finding


def jobs_backfill_folder(cfg: JobConfig) -> str:
    """``<checkpoint_root>/<job>/backfill``: where the job's backfills keep their folders."""
    return backfills_folder(cfg.job.checkpoint_root, cfg.job.name)


def _checkpoint_folders(cfg: JobConfig) -> dict[str, tuple[str, datetime | None]]:
    """Backfill id -> (its checkpoint folder, the newest modification time in it)."""
    from pyarrow.fs import FileSelector, FileType

    base = jobs_backfill_folder(cfg)
    fs, path = filesystem(base, "checkpoint folder")
    out: dict[str, tuple[str, datetime | None]] = {}
    for info in fs.get_file_info(FileSelector(path, allow_not_found=True)):
        if info.type != FileType.Directory:
            continue
        inside = fs.get_file_info(FileSelector(info.path, recursive=True, allow_not_found=True))
        times = [i.mtime for i in [info, *inside] if i.mtime is not None]
        out[info.base_name] = (f"{base}/{info.base_name}", max(times) if times else None)
    return out


def _from_millis(millis: int) -> datetime:
    return datetime.fromtimestamp(millis / 1000, tz=timezone.utc)


def _load(catalog: Any, identifier: str) -> Table | None:
    """The table, or ``None`` when it does not exist (any more)."""
    from pyiceberg.exceptions import NoSuchTableError

    try:
        return catalog.load_table(identifier)  # type: ignore[no-any-return]
    except NoSuchTableError:
        return None


def _source_tables(cfg: JobConfig) -> list[tuple[str, str]]:
    """``(catalog, table)`` of every Iceberg source table of the job, each once."""
    return sorted({(s.catalog, s.table) for s in cfg.sources.values() if isinstance(s, IcebergSourceConfig)})


def find_leftovers(cfg: JobConfig, catalog_for: CatalogFor | None = None) -> list[Leftovers]:
    """Every backfill of the job that left something behind, and what (reads only).

    :param cfg: the job config.
    :param catalog_for: opens a catalog of the job by name (default: the job's catalogs).
    :return: one entry per backfill id, sorted by id.
    """

    catalog_for = catalog_for or job_catalogs(cfg)
    found: dict[str, Leftovers] = {}
    activity: dict[str, list[datetime]] = {}

    def note(backfill_id: str, when: datetime | None, **changes: Any) -> None:
        found[backfill_id] = replace(found.get(backfill_id) or Leftovers(backfill_id), **changes)
        activity.setdefault(backfill_id, [])
        if when is not None:
            activity[backfill_id].append(when)

    for backfill_id, (folder, newest) in _checkpoint_folders(cfg).items():
        note(backfill_id, newest, checkpoint=folder)
    published: dict[str, datetime] = {}
    for catalog_name, target in sorted({(s.catalog, s.table) for s in cfg.sinks.values()}):
        catalog = catalog_for(catalog_name)
        for backfill_id, tables in staging_backfills(catalog, target, cfg.job.staging_namespace).items():
            for identifier in tables:
                table = _load(catalog, identifier)
                if table is None:  # dropped since the listing
                    continue
                staged = found.get(backfill_id, Leftovers(backfill_id)).staging
                note(
                    backfill_id,
                    _from_millis(table.metadata.last_updated_ms),
                    staging=(*staged, (catalog_name, target, identifier)),
                )
        table = _load(catalog, target)
        if table is None:
            continue
        for lk in read_locks(table):
            if lk.job == cfg.job.name:
                held = found.get(lk.backfill_id, Leftovers(lk.backfill_id)).locks
                note(lk.backfill_id, lk.taken_at, locks=(*held, target), release=lk.release)
        for snap in table.metadata.snapshots:
            owner = None if snap.summary is None else snap.summary.get(BACKFILL_ID_SUMMARY)
            if owner:
                when = _from_millis(snap.timestamp_ms)
                published[owner] = max(when, published.get(owner, when))
    for backfill_id, when in published.items():
        if backfill_id in found:
            note(backfill_id, when, published_at=when)
    for catalog_name, source in _source_tables(cfg):
        table = _load(catalog_for(catalog_name), source)
        if table is None:
            continue
        for backfill_id, lo in found.items():
            if tag_name(backfill_id) in table.metadata.refs:
                found[backfill_id] = replace(lo, tags=(*lo.tags, (catalog_name, source)))
    out = []
    for backfill_id, lo in sorted(found.items()):
        root = lo.checkpoint or backfill_root(cfg.job.checkpoint_root, cfg.job.name, backfill_id)
        state = read_state(connect_state_path(root, backfill_id))
        running = f"its Spark Connect server (pid {state.pid}) runs" if state is not None and state.running() else None
        times = activity.get(backfill_id) or []
        beat = CheckpointStore(lo.checkpoint).heartbeat() if lo.checkpoint is not None else None
        out.append(replace(lo, last_activity=max(times) if times else None, running=running, heartbeat=beat))
    return out


def alive(lo: Leftovers, now: datetime) -> str | None:
    """``running: heartbeat 12s ago`` when ``lo``'s heartbeat is younger than :data:`LIVENESS` and
    newer than its publish commit (publish touches it before committing: a heartbeat older than
    the commit is of a run that finished), else ``None``."""
    beat = lo.heartbeat
    if beat is None or (lo.published_at is not None and beat <= lo.published_at) or now - beat >= LIVENESS:
        return None
    seconds = max(0, int((now - beat).total_seconds()))
    return f"running: heartbeat {seconds}s ago (younger than {human_duration(LIVENESS)})"


# --------------------------------------------------------------------------- deciding


def decide(
    leftovers: list[Leftovers],
    older_than: timedelta,
    *,
    now: datetime | None = None,
    keep: Mapping[str, str] | None = None,
) -> list[CleanupDecision]:
    """Which backfills go (see the module docstring for what is kept).

    :param leftovers: from :func:`find_leftovers`.
    :param older_than: the retention: a backfill last active at least this long ago goes.
    :param now: the current time (default: now, UTC).
    :param keep: backfill id -> why it is kept whatever its age (the DAG keeps its own unpublished run).
    """
    moment = now or datetime.now(timezone.utc)
    out = []
    for lo in leftovers:
        age = None if lo.last_activity is None else moment - lo.last_activity
        if lo.locks:
            hint = f"release it with: {lo.release}" if lo.release else "publish or release it first"
            decision = CleanupDecision(lo, False, f"holds the lock on {', '.join(lo.locks)}; {hint}", age)
        elif lo.running:
            decision = CleanupDecision(lo, False, f"running: {lo.running}", age)
        elif (beating := alive(lo, moment)) is not None:
            decision = CleanupDecision(lo, False, beating, age)
        elif keep and lo.backfill_id in keep:
            decision = CleanupDecision(lo, False, keep[lo.backfill_id], age)
        elif age is None:
            decision = CleanupDecision(lo, False, "its last activity is unknown", age)
        elif age < older_than:
            decision = CleanupDecision(lo, False, f"younger than the retention {human_duration(older_than)}", age)
        else:
            decision = CleanupDecision(lo, True, f"older than the retention {human_duration(older_than)}", age)
        out.append(decision)
    return out


# --------------------------------------------------------------------------- removing


def _delete_folder(uri: str) -> None:
    """Delete a folder and everything in it; one that another process deleted first is fine."""
    from pyarrow.fs import FileType

    fs, path = filesystem(uri, "checkpoint folder")
    try:
        fs.delete_dir(path)
    except FileNotFoundError:
        if fs.get_file_info(path).type != FileType.NotFound:
            raise


def _drop_staging(catalog: Any, target: str, backfill_id: str, namespace: str) -> list[str]:
    """:func:`~airflow_provider_kappa.spark.staging.drop_staging`, listed again when another
    process dropped one of the tables between the listing and the drop."""
    from pyiceberg.exceptions import NoSuchTableError

    dropped: list[str] = []
    for attempt in range(1, TAG_ATTEMPTS + 1):
        try:
            return dropped + drop_staging(catalog, target, backfill_id, namespace)
        except NoSuchTableError as e:
            if attempt == TAG_ATTEMPTS:
                raise KappaSinkError(
                    f"staging tables of backfill {backfill_id} of {target!r} kept disappearing while being dropped ({e}); "
                    "run the cleanup again"
                ) from e
    raise AssertionError("unreachable")


def remove(
    cfg: JobConfig, leftovers: Leftovers, catalog_for: CatalogFor | None = None, *, now: datetime | None = None
) -> str | None:
    """Remove one backfill's leftovers: staging tables (keeping files a target references), tags,
    checkpoint folder. Checks its heartbeat and its lock again first (a rerun of it may have
    started or taken one since).

    :param cfg: the job config.
    :param leftovers: from :func:`find_leftovers`.
    :param catalog_for: opens a catalog of the job by name.
    :param now: the current time (default: now, UTC).
    :return: ``None`` when removed, else why it was kept after all.
    """

    catalog_for = catalog_for or job_catalogs(cfg)
    backfill_id = leftovers.backfill_id
    if leftovers.checkpoint is not None:
        beat = CheckpointStore(leftovers.checkpoint).heartbeat()
        beating = alive(replace(leftovers, heartbeat=beat), now or datetime.now(timezone.utc))
        if beating is not None:
            return f"{beating}, since the listing"
    for catalog_name, target in sorted({(s.catalog, s.table) for s in cfg.sinks.values()}):
        table = _load(catalog_for(catalog_name), target)
        if table is not None and lock_property(backfill_id) in table.properties:
            return f"took the lock on {target} during the cleanup"
    for catalog_name, target in sorted({(c, t) for c, t, _ in leftovers.staging}):
        dropped = _drop_staging(catalog_for(catalog_name), target, backfill_id, cfg.job.staging_namespace)
        log.info("backfill %s: dropped %d staging table(s) of %s", backfill_id, len(dropped), target)
    for catalog_name, source in leftovers.tags:
        table = _load(catalog_for(catalog_name), source)
        if table is not None and remove_tag(table, tag_name(backfill_id)):
            log.info("backfill %s: removed tag %s of %s", backfill_id, tag_name(backfill_id), source)
    if leftovers.checkpoint is not None:
        _delete_folder(leftovers.checkpoint)
        log.info("backfill %s: removed its checkpoint folder %s", backfill_id, leftovers.checkpoint)
    state_folder = connect_state_path(
        backfill_root(cfg.job.checkpoint_root, cfg.job.name, backfill_id), backfill_id
    ).parent
    if state_folder.is_dir():  # a remote checkpoint root keeps it in a temporary folder of this machine
        _delete_folder(str(state_folder))
    return None


def cleanup(
    cfg: JobConfig,
    *,
    older_than: timedelta | None = None,
    dry_run: bool = False,
    keep: Mapping[str, str] | None = None,
    catalog_for: CatalogFor | None = None,
    now: datetime | None = None,
) -> list[CleanupDecision]:
    """Find the job's backfills, decide, and remove those past the retention.

    :param cfg: the job config.
    :param older_than: the retention (default: ``job.retention``).
    :param dry_run: decide and report only; remove nothing.
    :param keep: backfill id -> why it is kept whatever its age.
    :param catalog_for: opens a catalog of the job by name (default: the job's catalogs).
    :param now: the current time (default: now, UTC).
    :return: one decision per backfill found, sorted by id; ``remove`` tells what was (or, in a
        dry run, would be) removed.
    """
    catalog_for = catalog_for or job_catalogs(cfg)
    retention = cfg.job.retention if older_than is None else older_than
    decisions = decide(find_leftovers(cfg, catalog_for), retention, now=now, keep=keep)
    if dry_run:
        return decisions
    out = []
    for decision in decisions:
        if decision.remove:
            kept = remove(cfg, decision.leftovers, catalog_for, now=now)
            if kept is not None:
                decision = replace(decision, remove=False, reason=kept)
        out.append(decision)
    return out
