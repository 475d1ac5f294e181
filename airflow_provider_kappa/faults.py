"""Which errors are transient (a retry of the same step may succeed) and which are permanent.

A backfill step fails for one of two reasons: its input is wrong (a bad parameter, a missing
table, a misconfigured catalog), and a retry fails the same way; or something it depends on is
unavailable for now (a catalog server refusing connections or answering 5xx, a timeout, a
sqlite catalog file locked by another writer, storage I/O), and a retry may succeed.
:func:`transient_cause` tells them apart by the exception and its chain (``raise ... from e``
and the exception being handled when it was raised), so a permanent-looking wrapper such as
``KappaConfigError("job.checkpoint_root cannot be written (...)") from ConnectionResetError``
is still seen as transient.

Pure Python: third-party exception types (sqlalchemy, pyiceberg, requests, pyarrow) are
recognised by their qualified class names, so nothing heavy is imported to classify an error.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable
from typing import TypeVar

from airflow_provider_kappa.exceptions import KappaCatalogConflictError, KappaCatalogUnavailableError

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Exception classes (``module.qualname`` of the class or of a base class) that are transient.
TRANSIENT_CLASSES = frozenset(
    {
        # a REST catalog answering 5xx / 429 (pyiceberg maps the HTTP status to these)
        "pyiceberg.exceptions.ServerError",
        "pyiceberg.exceptions.ServiceUnavailableError",
        "pyiceberg.exceptions.TooManyRequestsError",
        # a SQL catalog's pool or connection gone (sqlalchemy)
        "sqlalchemy.exc.DisconnectionError",
        "sqlalchemy.exc.TimeoutError",
        # HTTP clients: connection refused, timeouts (requests' are OSErrors too; urllib3 / httpx are not)
        "requests.exceptions.ConnectionError",
        "requests.exceptions.Timeout",
        "urllib3.exceptions.TimeoutError",
        "urllib3.exceptions.ProtocolError",
        "httpx.TransportError",
    }
)

#: ``sqlalchemy.exc.OperationalError`` covers both a locked sqlite file or a database server
#: that cannot be reached (transient) and a wrong password or database name (permanent): these
#: fragments of its message mark the transient ones.
TRANSIENT_DB_MESSAGES = (
    "database is locked",
    "database table is locked",
    "database is busy",
    "connection refused",
    "could not connect",
    "can't connect",
    "connection reset",
    "connection timed out",
    "timeout expired",
    "server closed the connection",
    "terminating connection",
    "the database system is starting up",
    "the database system is shutting down",
    "too many connections",
    "lost connection",
    "gone away",
)

#: OSErrors that say the path or permission is wrong (configuration), not that storage is down.
PERMANENT_OS_ERRORS: tuple[type[OSError], ...] = (
    FileNotFoundError,
    FileExistsError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
)

#: errno values of an OSError that are configuration, whatever its class.
PERMANENT_ERRNOS = frozenset(
    {
        errno.ENOENT,
        errno.EEXIST,
        errno.EACCES,
        errno.EPERM,
        errno.EISDIR,
        errno.ENOTDIR,
        errno.EINVAL,
        errno.ENAMETOOLONG,
        errno.EROFS,
    }
)

#: OSError subclasses of libraries that are bad input, not unavailable storage (pyarrow's
#: ``ArrowInvalid`` is a ValueError; these two are not, but say the data or call is wrong).
PERMANENT_OS_CLASSES = frozenset({"pyarrow.lib.ArrowNotImplementedError", "pyarrow.lib.ArrowTypeError"})


def _class_names(exc: BaseException) -> set[str]:
    return {f"{c.__module__}.{c.__qualname__}" for c in type(exc).__mro__}


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` itself (not its chain) is a fault a retry may get past.

    Transient: :class:`~airflow_provider_kappa.exceptions.KappaCatalogConflictError`,
    :class:`~airflow_provider_kappa.exceptions.KappaCatalogUnavailableError`, connection errors and
    timeouts, HTTP 5xx/429 of a REST catalog, a SQL catalog's ``OperationalError`` saying the
    database is locked or cannot be reached, and storage ``OSError``\\ s other than a missing
    path or a denied permission.

    :param exc: the exception.
    """
    if isinstance(exc, (KappaCatalogConflictError, KappaCatalogUnavailableError, ConnectionError, TimeoutError)):
        return True
    names = _class_names(exc)
    if names & TRANSIENT_CLASSES:
        return True
    if "sqlalchemy.exc.OperationalError" in names:
        message = str(exc).lower()
        return any(fragment in message for fragment in TRANSIENT_DB_MESSAGES)
    if isinstance(exc, OSError):
        if isinstance(exc, PERMANENT_OS_ERRORS) or names & PERMANENT_OS_CLASSES:
            return False
        return exc.errno not in PERMANENT_ERRNOS
    return False


def transient_cause(exc: BaseException) -> BaseException | None:
    """The first transient exception in ``exc``'s chain (``exc`` itself, then its ``__cause__``,
    or the exception it was raised while handling), or ``None`` when every one is permanent.

    :param exc: the exception a step raised.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if is_transient(current):
            return current
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return None


def root_transient_cause(exc: BaseException) -> BaseException | None:
    """The last transient exception in ``exc``'s chain (the fault itself, under the wrappers that
    name the step: ``OperationalError: database is locked`` under a ``KappaCatalogUnavailableError``),
    or ``None`` when every one is permanent.

    :param exc: the exception a step raised.
    """
    found = None
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if is_transient(current):
            found = current
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return found


def one_line(exc: BaseException) -> str:
    """``Type: message`` of ``exc`` on one line, for a terminal: a SQL error's driver message
    without the statement and parameters SQLAlchemy appends (``OperationalError: database is
    locked``), other messages cut at their first line.

    :param exc: the exception.
    """
    cause = getattr(exc, "orig", None) if "sqlalchemy.exc.StatementError" in _class_names(exc) else None
    message = str(cause if cause is not None else exc).strip()
    first = message.splitlines()[0] if message else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


#: Attempts of a step retried in place on a transient fault (:func:`retry_transient`).
RETRY_ATTEMPTS = 3
#: Seconds before the first retry; doubled before each next one.
RETRY_DELAY = 2.0


def retry_transient(fn: Callable[[], T], what: str, *, attempts: int = RETRY_ATTEMPTS, delay: float = RETRY_DELAY) -> T:
    """Call ``fn``, again (after ``delay``, then twice as long, …) while it fails with a transient
    fault (:func:`transient_cause`), at most ``attempts`` times; a permanent error, or the last
    transient one, is raised as it is. Only for steps that are safe to repeat (idempotent).

    :param fn: the step.
    :param what: the step, for the log.
    :param attempts: calls at most (at least 1).
    :param delay: seconds before the first retry.
    """
    for attempt in range(1, max(1, attempts) + 1):
        try:
            return fn()
        except Exception as e:
            cause = transient_cause(e)
            if cause is None or attempt >= attempts:
                raise
            log.warning(
                "%s: transient fault (%s), attempt %d of %d; retrying", what, one_line(cause), attempt, attempts
            )
            time.sleep(delay * 2 ** (attempt - 1))
    raise AssertionError("unreachable")  # the loop returns or raises
