"""Exceptions raised by airflow-provider-kappa.

Every message names the object, the bad value and what was expected.
"""

from __future__ import annotations


class KappaError(Exception):
    """Base class of every error this package raises on purpose."""


class KappaConfigError(KappaError, ValueError):
    """A kappa.yaml, a backfill parameter or a ``spark.kappa.*`` conf value is invalid."""


class KappaSourceError(KappaError):
    """A source table, snapshot or column cannot be read as asked."""


class KappaSinkError(KappaError):
    """A sink, staging table or publish step cannot proceed."""


class KappaValidationError(KappaError):
    """Staged output failed validation (for example its match rate is below ``min_match``)."""


class KappaConcurrencyError(KappaError):
    """Another backfill already holds an overlapping window of the same target."""


class KappaCatalogConflictError(KappaError):
    """A catalog commit kept conflicting with other writers (another backfill tagging the same
    source table, say) after its retries; the step may be retried as it is."""


class KappaSupersededError(KappaSinkError):
    """A run of a backfill slice was superseded: a newer attempt of the same slice took a new
    epoch (its Airflow task was killed and retried, ``kappa backfill --resume`` ran again). The old
    run may neither commit to the slice's staging table nor keep its checkpoint."""


class KappaEngineError(KappaError):
    """A Spark run of a slice failed: its spark-submit, its Spark Connect session, or the
    Spark Connect server it runs on (not started, or gone)."""


class KappaCatalogUnavailableError(KappaError):
    """A catalog (or the storage behind it) could not be reached for now: connection refused,
    a timeout, a 5xx answer of a REST catalog, a locked sqlite file. Unlike a misconfigured
    catalog (:class:`KappaConfigError`), the step may succeed when retried as it is."""
