"""Staging tables of a backfill: one Iceberg table per (target, backfill, slice).

A slice run writes its output to its own staging table, created with the target's
schema, partition spec and sort order. Clearing a slice drops (purges) and recreates
that table, so rerunning a slice any number of times leaves exactly what one clean run
leaves. Validate and publish read the union of a backfill's slice tables.

Publish commits a staging table's data files into the target by reference: from then on
the target owns them. Publish marks such a staging table first (property
``kappa.published-to``, :func:`mark_published`); purging a marked table (clear or drop)
deletes its metadata and only the data files that no snapshot of the target references
(files of an unpublished attempt), never a file the target still reads. Files the target
stops referencing are then the target's own garbage, removed by its snapshot expiry.

Fencing: each attempt of a slice takes a new epoch (``CheckpointStore.new_epoch``) and clears
the slice with it: the recreated table carries it as property ``kappa.epoch`` from its creation
(:func:`clear_slice`). A run's writer commits only to a table holding its own epoch, and only to
the table (its Iceberg table UUID) it checked when it started (:func:`fenced_staging_table`; every
pyiceberg commit asserts the table UUID), so a run superseded by a newer attempt can no longer
commit anything, even into the recreated table of the same name.

Names: ``<namespace>.<target>__<backfill>_<hash8>__<slice>``, each part lower-cased and
reduced to ``[a-z0-9_]`` (runs of ``_`` collapsed, so ``__`` only separates parts). The
8-hex hash is of the raw target and backfill id: two backfills whose sanitized names
collide still get different tables, and listing a backfill's tables is an exact prefix
match.

pyiceberg only: no Spark, no Airflow.
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING

from airflow_provider_kappa.exceptions import KappaConcurrencyError, KappaSinkError, KappaSupersededError
from airflow_provider_kappa.spark.catalog import ensure_namespace

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

DEFAULT_NAMESPACE = "kappa_staging"
TARGET_PROPERTY = "kappa.target-table"
PUBLISHED_PROPERTY = "kappa.published-to"
EPOCH_PROPERTY = "kappa.epoch"
_SEP = "__"


def _sanitize(value: str, what: str) -> str:
    text = re.sub(r"[^a-z0-9]+", "_", value.lower()).strip("_")
    if not text:
        raise KappaSinkError(
            f"staging: {what} {value!r} has no letters or digits; expected a name such as 'prod.summary'"
        )
    return text


def _prefix(target_table: str, backfill_id: str) -> str:
    digest = hashlib.sha1(f"{target_table}\0{backfill_id}".encode()).hexdigest()[:8]
    return f"{_sanitize(target_table, 'target table')}{_SEP}{_sanitize(backfill_id, 'backfill id')}_{digest}{_SEP}"


def _check_namespace(namespace: str) -> str:
    if not re.fullmatch(r"[a-z0-9_]+", namespace):
        raise KappaSinkError(f"staging namespace {namespace!r} must match [a-z0-9_]+ (e.g. 'kappa_staging')")
    return namespace


def staging_table_name(target_table: str, backfill_id: str, slice_id: str, namespace: str = DEFAULT_NAMESPACE) -> str:
    """The staging table identifier of one backfill slice.

    :param target_table: the sink's target table, ``namespace.table``.
    :param backfill_id: the backfill's id.
    :param slice_id: the slice's id (unique within the backfill).
    :param namespace: namespace holding staging tables (the job's ``staging_namespace``).
    :return: ``<namespace>.<target>__<backfill>_<hash8>__<slice>``, all in ``[a-z0-9_]``.
    """
    return f"{_check_namespace(namespace)}.{_prefix(target_table, backfill_id)}{_sanitize(slice_id, 'slice id')}"


def ensure_staging_table(catalog: Catalog, target_table: str, staging_table: str, epoch: str | None = None) -> Table:
    """Return the staging table, creating it (and its namespace) like the target if absent.

    :param catalog: the pyiceberg catalog holding both tables.
    :param target_table: the sink's target table; its schema, partition spec, sort order
        and format version are copied.
    :param staging_table: the staging identifier (see :func:`staging_table_name`).
    :param epoch: the slice attempt's epoch, recorded (property ``kappa.epoch``) on a table
        created here; a table that exists with another epoch is refused.
    :raises KappaSinkError: if the target does not exist, or the staging table exists with
        another schema or partition spec (clear the slice to recreate it).
    :raises KappaConcurrencyError: the table exists with another epoch (another attempt created it).
    """
    from pyiceberg.exceptions import NoSuchTableError

    try:
        target = catalog.load_table(target_table)
    except NoSuchTableError as e:
        raise KappaSinkError(
            f"staging: target table {target_table!r} does not exist in catalog {catalog.name!r}; "
            "a backfill stages output shaped like an existing target"
        ) from e
    namespace = staging_table.rsplit(".", 1)[0]
    ensure_namespace(catalog, namespace)
    try:
        staged = catalog.load_table(staging_table)
    except NoSuchTableError:
        properties = {"format-version": str(target.format_version), TARGET_PROPERTY: target_table}
        if epoch is not None:
            properties[EPOCH_PROPERTY] = epoch
        staged = catalog.create_table_if_not_exists(
            staging_table,
            schema=target.schema(),
            partition_spec=target.spec(),
            sort_order=target.sort_order(),
            properties=properties,
        )
    if epoch is not None and staged.properties.get(EPOCH_PROPERTY) != epoch:
        raise KappaConcurrencyError(
            f"staging table {staging_table!r} was created for epoch {staged.properties.get(EPOCH_PROPERTY)!r}, "
            f"not {epoch!r}: another attempt of the same slice cleared it at the same time; run one attempt at a time"
        )
    if not _same_shape(staged, target):
        raise KappaSinkError(
            f"staging table {staging_table!r} has schema {staged.schema()} / spec {staged.spec()}, "
            f"but target {target_table!r} has {target.schema()} / {target.spec()}; clear the slice to recreate it"
        )
    return staged


def _same_shape(staged: Table, target: Table) -> bool:
    def fields(t: Table) -> list[tuple[str, str, bool]]:
        return [(f.name, str(f.field_type), f.required) for f in t.schema().fields]

    def spec(t: Table) -> list[tuple[str, str, str]]:
        schema = t.schema()
        return [(schema.find_column_name(f.source_id) or "", str(f.transform), f.name) for f in t.spec().fields]

    return fields(staged) == fields(target) and spec(staged) == spec(target)


def clear_slice(catalog: Catalog, target_table: str, staging_table: str, epoch: str | None = None) -> None:
    """Remove whatever an earlier attempt of a slice staged: purge its table and recreate it empty.
    Data files a publish committed into the target by reference stay (the target owns them).

    Idempotent; works when the staging table does not exist yet.

    :param catalog: the pyiceberg catalog.
    :param target_table: the sink's target table (the shape to recreate).
    :param staging_table: the slice's staging table.
    :param epoch: the new attempt's epoch, recorded on the recreated table: from then on only a run
        of that epoch can commit to it (:func:`fenced_staging_table`).
    """
    _purge_if_exists(catalog, staging_table)
    ensure_staging_table(catalog, target_table, staging_table, epoch)


def fenced_staging_table(catalog: Catalog, staging_table: str, epoch: str) -> Table:
    """The staging table a run of epoch ``epoch`` may commit to, loaded fresh.

    :param catalog: the pyiceberg catalog.
    :param staging_table: the slice's staging table.
    :param epoch: the run's epoch (``spark.kappa.epoch``).
    :raises KappaSupersededError: the table is gone (a newer attempt is clearing it, or the backfill
        was cleaned up) or was created for another epoch: a newer attempt of the slice superseded this run.
    """
    from pyiceberg.exceptions import NoSuchTableError

    try:
        table = catalog.load_table(staging_table)
    except NoSuchTableError as e:
        raise KappaSupersededError(
            f"staging table {staging_table!r} is gone: the run of epoch {epoch!r} was superseded by a newer "
            "attempt of its slice (or the backfill was cleaned up); it commits nothing more"
        ) from e
    current = table.properties.get(EPOCH_PROPERTY)
    if current != epoch:
        raise KappaSupersededError(
            f"staging table {staging_table!r} belongs to epoch {current!r}: the run of epoch {epoch!r} was "
            "superseded by a newer attempt of its slice; it commits nothing more"
        )
    return table


def mark_published(staging: Table, target_table: str) -> None:
    """Record on a staging table that its data files are (about to be) committed into
    ``target_table`` by reference: purging it then keeps every file the target references.
    Call before the target's commit (a crash in between only keeps files that could have
    been deleted). No-op when already marked for that target.

    :param staging: the staging table.
    :param target_table: the target's identifier.
    """
    if staging.properties.get(PUBLISHED_PROPERTY) != target_table:
        with staging.transaction() as tx:
            tx.set_properties({PUBLISHED_PROPERTY: target_table})


def _purge_if_exists(catalog: Catalog, identifier: str) -> bool:
    """Drop ``identifier`` and delete its files: every data file for an unpublished table, only
    those no snapshot of the target references for one marked by :func:`mark_published`;
    its manifests, manifest lists and metadata files always (the target has its own)."""
    from pyiceberg.catalog import delete_files
    from pyiceberg.exceptions import NoSuchTableError

    try:
        table = catalog.load_table(identifier)
    except NoSuchTableError:
        return False
    published_to = table.properties.get(PUBLISHED_PROPERTY)
    if published_to is None:
        catalog.purge_table(identifier)
        return True
    metadata, io = table.metadata, table.io
    manifests = {m.manifest_path: m for snapshot in metadata.snapshots for m in snapshot.manifests(io)}
    data_files = {
        entry.data_file.file_path
        for manifest in manifests.values()
        for entry in manifest.fetch_manifest_entry(io, discard_deleted=False)
    }
    keep = _referenced_by(catalog, published_to, data_files)
    catalog.drop_table(identifier)
    delete_files(io, data_files - keep, "data")
    delete_files(io, set(manifests), "manifest")
    delete_files(io, {s.manifest_list for s in metadata.snapshots}, "manifest list")
    delete_files(io, {log.metadata_file for log in metadata.metadata_log} | {table.metadata_location}, "metadata")
    return True


def _referenced_by(catalog: Catalog, target_table: str, paths: set[str]) -> set[str]:
    """Those of ``paths`` that a snapshot of ``target_table`` references (empty if it is gone)."""
    from pyiceberg.exceptions import NoSuchTableError

    if not paths:
        return set()
    try:
        target = catalog.load_table(target_table)
    except NoSuchTableError:
        return set()
    io, seen, found = target.io, set(), set()
    for snapshot in target.metadata.snapshots:
        for manifest in snapshot.manifests(io):
            if manifest.manifest_path in seen:
                continue
            seen.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(io, discard_deleted=True):
                if entry.data_file.file_path in paths:
                    found.add(entry.data_file.file_path)
    return found


def staging_tables(
    catalog: Catalog, target_table: str, backfill_id: str, namespace: str = DEFAULT_NAMESPACE
) -> list[str]:
    """Every slice staging table of one backfill of ``target_table``, from the catalog listing.

    :param catalog: the pyiceberg catalog.
    :param target_table: the sink's target table.
    :param backfill_id: the backfill's id.
    :param namespace: the staging namespace.
    :return: identifiers ``namespace.table``, sorted; empty if the namespace does not exist.
    """
    from pyiceberg.exceptions import NoSuchNamespaceError

    prefix = _prefix(target_table, backfill_id)
    try:
        listed = catalog.list_tables(_check_namespace(namespace))
    except NoSuchNamespaceError:
        return []
    names = [ident[-1] for ident in listed]
    return sorted(f"{namespace}.{n}" for n in names if n.startswith(prefix) and _SEP not in n[len(prefix) :])


def drop_staging(
    catalog: Catalog, target_table: str, backfill_id: str, namespace: str = DEFAULT_NAMESPACE
) -> list[str]:
    """Purge every staging table of a backfill (after a successful publish), keeping the data
    files published into the target by reference.

    :param catalog: the pyiceberg catalog.
    :param target_table: the sink's target table.
    :param backfill_id: the backfill's id.
    :param namespace: the staging namespace.
    :return: the identifiers dropped.
    """
    dropped = []
    for identifier in staging_tables(catalog, target_table, backfill_id, namespace):
        if _purge_if_exists(catalog, identifier):
            dropped.append(identifier)
    return dropped


def staging_backfills(catalog: Catalog, target_table: str, namespace: str = DEFAULT_NAMESPACE) -> dict[str, list[str]]:
    """Every backfill of ``target_table`` that has a staging table, from the catalog listing
    (``kappa cleanup`` finds leftovers by it): the backfill id is read back from each name and
    checked against the name's hash, so a table of another target whose sanitized name collides
    is left out.

    :param catalog: the pyiceberg catalog.
    :param target_table: the sink's target table.
    :param namespace: the staging namespace.
    :return: backfill id -> its staging identifiers ``namespace.table``, sorted; empty if the
        namespace does not exist.
    """
    from pyiceberg.exceptions import NoSuchNamespaceError

    head = _sanitize(target_table, "target table") + _SEP
    try:
        listed = catalog.list_tables(_check_namespace(namespace))
    except NoSuchNamespaceError:
        return {}
    found: dict[str, list[str]] = {}
    for ident in listed:
        name = ident[-1]
        parts = name[len(head) :].split(_SEP) if name.startswith(head) else []
        if len(parts) != 2 or len(parts[0]) < 10:
            continue
        backfill_id = parts[0][:-9]  # "<backfill>_<hash8>"
        if (
            re.fullmatch(r"[a-z0-9]+(_[a-z0-9]+)*", backfill_id)
            and _prefix(target_table, backfill_id) == f"{head}{parts[0]}{_SEP}"
        ):
            found.setdefault(backfill_id, []).append(f"{namespace}.{name}")
    return {k: sorted(v) for k, v in sorted(found.items())}
