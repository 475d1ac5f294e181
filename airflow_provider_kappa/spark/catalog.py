"""pyiceberg catalogs inside Spark (driver and executors): built from plain properties.

The one loader of a pyiceberg catalog from its name and properties (:func:`load_catalog`, cached
per process; the launcher's side, :mod:`airflow_provider_kappa.job.catalogs`, uses it too) and the
one merge of a ``kappa_iceberg`` reader's or writer's options into catalog properties
(:func:`catalog_properties`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from functools import lru_cache
from typing import TYPE_CHECKING

from airflow_provider_kappa.exceptions import KappaCatalogUnavailableError, KappaConfigError, KappaSourceError
from airflow_provider_kappa.faults import transient_cause
from airflow_provider_kappa.redact import redact_text
from airflow_provider_kappa.spark.settings import read_catalogs_file

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table


def catalog_from_options(options: Mapping[str, str]) -> Catalog:
    """The catalog a ``kappa_iceberg`` reader or writer was pointed at by its options:
    ``catalog`` (name), ``catalog_properties`` (inline JSON) and ``catalogs_file`` (path).
    Called on the driver; executors get only what they need, pickled with their task."""
    return load_catalog(options["catalog"], catalog_properties(options))


def catalog_properties(
    options: Mapping[str, str], catalog: str | None = None, inline: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Properties of a catalog, as a reader's/writer's options locate it, the catalogs file's entry
    winning over inline properties.

    :param options: the reader's/writer's options: ``catalog`` (its own catalog's name),
        ``catalog_properties`` (that catalog's inline properties, JSON) and ``catalogs_file`` (path).
    :param catalog: the catalog wanted (default: the options' own); another one (an aligned
        table's) takes its inline properties from ``inline``, not from the options.
    :param inline: the inline properties of that other catalog (an ``align_with`` entry's).
    :raises KappaConfigError: no catalog is named.
    """
    own = options.get("catalog")
    name = catalog or own
    if not name:
        raise KappaConfigError("kappa_iceberg: option 'catalog' is required (the catalog name)")
    if name == own:
        inline = json.loads(options.get("catalog_properties") or "{}")
    props = dict(inline or {})
    if options.get("catalogs_file"):
        props.update(read_catalogs_file(options["catalogs_file"]).get(name, {}))
    return props


def load_catalog(name: str, properties: Mapping[str, str]) -> Catalog:
    """A pyiceberg catalog called ``name`` (the name keys its tables in a SqlCatalog).

    :param name: the catalog name from kappa.yaml's ``catalogs:``.
    :param properties: pyiceberg catalog properties.
    :raises KappaCatalogUnavailableError: the catalog cannot be reached for now (connection
        refused, a timeout, a 5xx answer, a locked sqlite file): a retry may succeed.
    :raises KappaConfigError: the catalog is misconfigured (an unknown type, a missing or bad
        property, credentials refused), or a ``sqlite:///path`` catalog whose file does not exist
        (pyiceberg would create an empty one there: no verb creates a catalog).
    """
    _check_sqlite_file(name, properties)
    return _cached(name, tuple(sorted(properties.items())))


def sqlite_file(uri: str) -> str | None:
    """The database file of a ``sqlite[+driver]:///path`` URI (relative to the working folder unless
    ``sqlite:////absolute``); ``None`` for another URI or an in-memory database.

    :param uri: a catalog's ``uri`` property.
    """
    scheme, sep, rest = uri.partition(":///")
    if not sep or scheme.lower().split("+", 1)[0] != "sqlite":
        return None
    path, _, query = rest.partition("?")
    if path.startswith("file:") and "uri=true" in query.lower():
        path = path.removeprefix("file:")
    return None if path in ("", ":memory:") or "mode=memory" in query.lower() else path


def _check_sqlite_file(name: str, properties: Mapping[str, str]) -> None:
    """Refuse a sqlite SqlCatalog whose file does not exist (``type: sql``, or no type and a
    ``sqlite`` URI, which pyiceberg takes for a SqlCatalog)."""
    if properties.get("type", "sql").lower() != "sql":
        return
    path = sqlite_file(str(properties.get("uri") or ""))
    if path is not None and not os.path.isfile(path):
        raise KappaConfigError(
            f"catalog {name!r}: sqlite file {path!r} does not exist (uri of a type: sql catalog); expected the "
            "file of an existing catalog: no kappa verb creates a catalog (create it with pyiceberg's SqlCatalog)"
        )


@lru_cache(maxsize=16)
def _cached(name: str, items: tuple[tuple[str, str], ...]) -> Catalog:
    from pyiceberg.catalog import load_catalog as _load

    if not items:
        raise KappaConfigError(
            f"catalog {name!r}: no properties given (spark.kappa.catalog.{name}.* or the catalogs file)"
        )
    try:
        return _load(name, **dict(items))
    except Exception as e:  # pyiceberg raises many types; re-raise with the catalog named, secrets masked
        # not chained: the original message (a database URL with its password, a token) would
        # be printed with the traceback into task logs
        message = redact_text(f"{type(e).__name__}: {e}", dict(items))
        cause = transient_cause(e)
        if cause is not None:
            reason = (
                message
                if cause is e
                else f"{message} (from {redact_text(f'{type(cause).__name__}: {cause}', dict(items))})"
            )
            raise KappaCatalogUnavailableError(
                f"catalog {name!r} cannot be reached for now: {reason}; retry the step"
            ) from None
        raise KappaConfigError(f"catalog {name!r} cannot be loaded: {message}") from None


def load_table(catalog: Catalog, identifier: str) -> Table:
    """Load ``identifier`` or raise a clear error naming the table and catalog."""
    from pyiceberg.exceptions import NoSuchTableError

    try:
        return catalog.load_table(identifier)
    except NoSuchTableError as e:
        raise KappaSourceError(f"table {identifier!r} does not exist in catalog {catalog.name!r}") from e


def ensure_namespace(catalog: Catalog, namespace: str) -> None:
    """Create ``namespace`` unless it exists, tolerating a concurrent creator.

    pyiceberg's ``create_namespace_if_not_exists`` checks, then inserts: two backfills creating
    the staging namespace of a fresh catalog at once can both pass the check, and the loser's
    insert fails (sqlite/PostgreSQL ``IntegrityError`` in a SqlCatalog). When the namespace exists
    after such a failure, another creator won the race and there is nothing to do; otherwise the
    failure is raised as it is.

    :param catalog: the pyiceberg catalog.
    :param namespace: the namespace, dotted.
    """
    try:
        catalog.create_namespace_if_not_exists(namespace)
    except Exception:
        if not catalog.namespace_exists(namespace):
            raise
