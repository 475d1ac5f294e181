"""Backfill locks: at most one backfill at a time holds any stretch of a target table's time.

A lock is a property of the target Iceberg table, ``kappa.backfill.lock.<backfill_id>``, whose
value is a small JSON document: the job, the window ``[start, end)`` the backfill replaces, when
it was taken, when it goes stale, and the command that releases it. Locks whose windows do not
overlap coexist, so backfills of disjoint windows of one target run concurrently.

Taking a lock is one property commit, checked through the catalog's own serialisation: the
catalog applies the commit on its current table state and returns the metadata it stored, which
therefore holds every lock committed before ours. If that metadata holds another live lock
overlapping our window, the other backfill won the race: ours is removed again and the taker is
refused (:class:`~airflow_provider_kappa.exceptions.KappaConcurrencyError`). A taker that finds
a conflicting lock before committing writes nothing at all. No two overlapping live locks can
both be granted, whatever the timing.

The same backfill id taking its own lock again (a rerun, ``--resume``, an Airflow retry) is
allowed and refreshes it. A lock past its ``expires_at`` (the tag retention of its backfill,
7 days by default) is stale: a new overlapping backfill takes it over with a warning.

:func:`lock` and :func:`release` apply this to a backfill's sink targets (the snapshot step locks,
publish and ``kappa backfill --release-lock`` release).

pyiceberg only: no Spark, no Airflow.
"""

from __future__ import annotations

import json
import logging
import shlex
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from airflow_provider_kappa.backfill.params import to_argv
from airflow_provider_kappa.exceptions import KappaConcurrencyError, KappaSinkError
from airflow_provider_kappa.timeparse import parse_timestamp

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from airflow_provider_kappa.backfill.backfill import Backfill

log = logging.getLogger(__name__)

#: Table property prefix of backfill locks.
LOCK_PREFIX = "kappa.backfill.lock."
#: How long a backfill's lock stays live, and the retention of the tag pinning its source snapshots.
DEFAULT_TAG_RETENTION = timedelta(days=7)


def lock_property(backfill_id: str) -> str:
    """The table property holding ``backfill_id``'s lock.

    :param backfill_id: the backfill's id.
    """
    return LOCK_PREFIX + backfill_id


def _table_name(table: Table) -> str:
    return ".".join(table.name()[-2:])


@dataclass(frozen=True)
class BackfillLock:
    """One backfill's lock on a target table.

    :param backfill_id: the holder.
    :param job: the holder's job name.
    :param start: start of the window it replaces (aware).
    :param end: end of the window (aware, exclusive).
    :param taken_at: when it was (last) taken.
    :param expires_at: when it goes stale and may be taken over.
    :param release: the command that releases it (shown to refused backfills).
    """

    backfill_id: str
    job: str
    start: datetime
    end: datetime
    taken_at: datetime
    expires_at: datetime
    release: str = field(default="")

    @property
    def key(self) -> str:
        """Its table property."""
        return lock_property(self.backfill_id)

    def overlaps(self, start: datetime, end: datetime) -> bool:
        """Whether ``[start, end)`` shares any instant with this lock's window."""
        return self.start < end and start < self.end

    def stale(self, now: datetime) -> bool:
        """Whether the lock has expired at ``now``."""
        return now >= self.expires_at

    def describe(self) -> str:
        """``backfill <id> of job <job> over [start, end) (taken at …, stale after …)``."""
        return (
            f"backfill {self.backfill_id} of job {self.job} over [{self.start.isoformat()}, {self.end.isoformat()}) "
            f"(taken at {self.taken_at.isoformat()}, stale after {self.expires_at.isoformat()})"
        )

    def to_json(self) -> str:
        """The property value."""
        return json.dumps(
            {
                "job": self.job,
                "start": self.start.isoformat(),
                "end": self.end.isoformat(),
                "taken_at": self.taken_at.isoformat(),
                "expires_at": self.expires_at.isoformat(),
                "release": self.release,
            },
            sort_keys=True,
        )

    @classmethod
    def from_property(cls, table: str, key: str, value: str) -> BackfillLock:
        """Parse a lock property.

        :param table: the table holding it (for the error message).
        :param key: the property name (``kappa.backfill.lock.<id>``).
        :param value: its JSON value.
        :raises KappaSinkError: a malformed value, naming the table and property.
        """
        try:
            data: dict[str, Any] = json.loads(value)
            return cls(
                backfill_id=key[len(LOCK_PREFIX) :],
                job=str(data["job"]),
                start=parse_timestamp(data["start"], f"{key}.start"),
                end=parse_timestamp(data["end"], f"{key}.end"),
                taken_at=parse_timestamp(data["taken_at"], f"{key}.taken_at"),
                expires_at=parse_timestamp(data["expires_at"], f"{key}.expires_at"),
                release=str(data.get("release") or ""),
            )
        except (ValueError, KeyError, TypeError) as e:
            raise KappaSinkError(
                f"table {table}: property {key} = {value!r} is not a backfill lock "
                f"(expected JSON with job, start, end, taken_at, expires_at): {e}; remove the property"
            ) from e


def read_locks(table: Table) -> list[BackfillLock]:
    """Every backfill lock on ``table`` (as loaded; refresh it first for the latest state).

    :param table: the target table.
    """
    name = _table_name(table)
    return [
        BackfillLock.from_property(name, key, value)
        for key, value in sorted(table.properties.items())
        if key.startswith(LOCK_PREFIX)
    ]


def _blocking(
    locks: list[BackfillLock], backfill_id: str, start: datetime, end: datetime, now: datetime
) -> list[BackfillLock]:
    return [lk for lk in locks if lk.backfill_id != backfill_id and lk.overlaps(start, end) and not lk.stale(now)]


def _refusal(
    table: Table, holder: BackfillLock, backfill_id: str, start: datetime, end: datetime
) -> KappaConcurrencyError:
    hint = f" release it with: {holder.release}" if holder.release else " remove its table property " + holder.key
    return KappaConcurrencyError(
        f"backfill {backfill_id} of [{start.isoformat()}, {end.isoformat()}) refused: target {_table_name(table)} is "
        f"locked by running {holder.describe()}, whose window overlaps; nothing was written. Wait for it to "
        f"publish (publish releases the lock), or if it was abandoned,{hint}"
    )


def check_lock(table: Table, backfill_id: str, start: datetime, end: datetime, *, now: datetime | None = None) -> None:
    """Refuse when another backfill holds a live lock overlapping ``[start, end)`` of ``table``.

    :param table: the target table (refreshed here).
    :param backfill_id: the backfill asking.
    :param start: its window start.
    :param end: its window end.
    :param now: the current time (default: now, UTC).
    :raises KappaConcurrencyError: naming the holder and its window.
    """
    table.refresh()
    blocking = _blocking(read_locks(table), backfill_id, start, end, now or datetime.now(timezone.utc))
    if blocking:
        raise _refusal(table, blocking[0], backfill_id, start, end)


def take_lock(
    table: Table,
    backfill_id: str,
    job: str,
    start: datetime,
    end: datetime,
    *,
    retention: timedelta,
    release: str = "",
    now: datetime | None = None,
    max_attempts: int = 5,
) -> tuple[BackfillLock, bool]:
    """Lock ``[start, end)`` of ``table`` for ``backfill_id`` (see the module docstring).

    :param table: the target table (refreshed, then updated to the committed state).
    :param backfill_id: the backfill taking the lock.
    :param job: its job name.
    :param start: its window start (aware).
    :param end: its window end (aware).
    :param retention: how long the lock stays live without being released.
    :param release: the command that releases it, shown to backfills it refuses.
    :param now: the current time (default: now, UTC).
    :param max_attempts: commits tried when other writers commit concurrently.
    :returns: the lock, and whether this backfill already held it before this call.
    :raises KappaConcurrencyError: another live lock overlaps (nothing of ours is left behind),
        or the commit kept conflicting.
    """
    from pyiceberg.exceptions import CommitFailedException

    lo, hi = parse_timestamp(start, "lock window start"), parse_timestamp(end, "lock window end")
    moment = now or datetime.now(timezone.utc)
    mine = BackfillLock(backfill_id, job, lo, hi, moment, moment + retention, release)
    last: Exception | None = None
    for _ in range(max(1, max_attempts)):
        table.refresh()
        locks = read_locks(table)
        held = any(lk.backfill_id == backfill_id for lk in locks)
        blocking = _blocking(locks, backfill_id, lo, hi, moment)
        if blocking:
            raise _refusal(table, blocking[0], backfill_id, lo, hi)
        stale = [lk for lk in locks if lk.backfill_id != backfill_id and lk.overlaps(lo, hi)]
        for lk in stale:
            log.warning("target %s: taking over the stale lock of %s", _table_name(table), lk.describe())
        try:
            with table.transaction() as tx:
                if stale:
                    tx.remove_properties(*(lk.key for lk in stale))
                tx.set_properties({mine.key: mine.to_json()})
        except CommitFailedException as e:
            last = e
            continue
        except KeyError as e:  # a stale lock was removed concurrently: look again
            if not stale:
                raise
            last = e
            continue
        # ``table`` now holds the metadata the catalog committed: every lock committed before ours
        lost = _blocking(read_locks(table), backfill_id, lo, hi, moment)
        if lost:
            if not held:
                release_lock(table, backfill_id)
            raise _refusal(table, lost[0], backfill_id, lo, hi)
        log.info(
            "target %s: locked [%s, %s) for backfill %s",
            _table_name(table),
            lo.isoformat(),
            hi.isoformat(),
            backfill_id,
        )
        return mine, held
    raise KappaConcurrencyError(
        f"backfill {backfill_id}: could not commit its lock on {_table_name(table)} in {max_attempts} attempt(s) "
        f"(other writers kept committing: {type(last).__name__}: {last}); retry"
    ) from last


def release_lock(table: Table, backfill_id: str, *, max_attempts: int = 5) -> bool:
    """Remove ``backfill_id``'s lock from ``table``; idempotent.

    :param table: the target table.
    :param backfill_id: the holder.
    :param max_attempts: commits tried when other writers commit concurrently.
    :returns: whether a lock was removed.
    :raises KappaSinkError: when the commit kept conflicting.
    """
    from pyiceberg.exceptions import CommitFailedException

    key = lock_property(backfill_id)
    last: Exception | None = None
    for _ in range(max(1, max_attempts)):
        table.refresh()
        if key not in table.properties:
            return False
        try:
            with table.transaction() as tx:
                tx.remove_properties(key)
        except (CommitFailedException, KeyError) as e:  # KeyError: released concurrently
            last = e
            continue
        log.info("target %s: released the lock of backfill %s", _table_name(table), backfill_id)
        return True
    raise KappaSinkError(
        f"could not release the lock {key} of {_table_name(table)} in {max_attempts} attempt(s) "
        f"({type(last).__name__}: {last}); retry"
    ) from last


# --------------------------------------------------------------------------- a backfill's targets


def targets(bf: Backfill) -> list[tuple[str, str]]:
    """``(catalog, table)`` of every sink target, each once, in a fixed order (no lock-order deadlock)."""
    return sorted({(sink.catalog, sink.table) for sink in bf.cfg.sinks.values()})


def load_target(bf: Backfill, catalog: str, table: str) -> Table:
    """A sink's target table, or :class:`~airflow_provider_kappa.exceptions.KappaSinkError` naming it."""
    from pyiceberg.exceptions import NoSuchTableError

    try:
        return bf.catalog_for(catalog).load_table(table)
    except NoSuchTableError as e:
        raise KappaSinkError(
            f"backfill {bf.id}: target table {table!r} does not exist in catalog {catalog!r}; "
            "a backfill replaces a window of an existing table"
        ) from e


def lock(bf: Backfill, *, retention: timedelta = DEFAULT_TAG_RETENTION) -> list[tuple[str, str]]:
    """Lock the window ``[start, end)`` of every sink's target table for ``bf`` (see the module
    docstring): refused when another backfill holds an overlapping window of one of them;
    re-taking its own lock (rerun, resume, retry) is allowed.

    :param bf: the backfill.
    :param retention: how long the lock stays live without being released (then it is stale
        and may be taken over).
    :returns: ``(catalog, table)`` of the locks this call newly took.
    :raises KappaConcurrencyError: naming the holder and its window; locks this call took are
        given back, so a refused backfill leaves nothing behind.
    """

    taken: list[tuple[str, str]] = []
    try:
        for catalog, table in targets(bf):
            _, held = take_lock(
                load_target(bf, catalog, table),
                bf.id,
                bf.cfg.job.name,
                bf.params.start,
                bf.params.end,
                retention=retention,
                release=release_command(bf),
            )
            if not held:
                taken.append((catalog, table))
    except BaseException:
        for catalog, table in taken:
            release_target(bf, catalog, table)
        raise
    return taken


def release_target(bf: Backfill, catalog: str, table: str) -> bool:
    """Release ``bf``'s lock on one target; whether there was one."""
    return release_lock(load_target(bf, catalog, table), bf.id)


def release(bf: Backfill) -> list[str]:
    """Release ``bf``'s lock on every sink target (publish does it; ``kappa backfill --release-lock``
    does it for an abandoned backfill). Idempotent.

    :param bf: the backfill.
    :returns: the tables whose lock was removed.
    """
    return [table for catalog, table in targets(bf) if release_target(bf, catalog, table)]


def release_command(bf: Backfill) -> str:
    """The ``kappa backfill`` command that releases ``bf``'s lock (shown to backfills it refuses)."""

    argv = [
        "kappa",
        "backfill",
        "--config",
        str(bf.cfg.path),
        *to_argv(bf.params, identity_only=True),
        "--release-lock",
    ]
    return shlex.join(argv)
