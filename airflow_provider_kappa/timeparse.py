"""Parsing of the durations and timestamps used in kappa.yaml, CLI flags and DAG params.

Pure Python on purpose: it runs at DAG-parse time, in the CLI and inside Spark.
"""

from __future__ import annotations

import re
import sys
from datetime import datetime, timedelta, timezone

from airflow_provider_kappa.exceptions import KappaConfigError

_UNITS = {
    "ms": timedelta(milliseconds=1),
    "s": timedelta(seconds=1),
    "sec": timedelta(seconds=1),
    "min": timedelta(minutes=1),
    "h": timedelta(hours=1),
    "d": timedelta(days=1),
}
_SHORT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|min|h|d)\s*$")
_ISO = re.compile(
    r"^P(?:(?P<d>\d+(?:\.\d+)?)D)?"
    r"(?:T(?:(?P<h>\d+(?:\.\d+)?)H)?(?:(?P<m>\d+(?:\.\d+)?)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?$"
)
DURATION_FORMS = "a number with a unit (30s, 15min, 1h, 2d, 500ms) or ISO-8601 (PT15M)"


def parse_duration(value: object, key: str, *, allow_zero: bool = False) -> timedelta:
    """Parse a duration such as ``30s``, ``15min``, ``1h``, ``2d`` or ISO-8601 ``PT15M``.

    :param value: the raw value (a string; a ``timedelta`` is passed through).
    :param key: the config key or parameter name, used in error messages.
    :param allow_zero: accept ``0s`` (for ``warmup`` and ``tail``); negative is never allowed.
    :raises KappaConfigError: naming ``key``, the bad value and the accepted forms.
    """
    if isinstance(value, timedelta):
        result = value
    elif isinstance(value, str) and value.strip():
        text = value.strip()
        short = _SHORT.match(text)
        iso = _ISO.match(text.upper()) if text.upper().startswith("P") and text.upper() not in ("P", "PT") else None
        if short:
            result = float(short.group(1)) * _UNITS[short.group(2)]
        elif iso:
            parts = {k: float(v) for k, v in iso.groupdict().items() if v}
            result = timedelta(
                days=parts.get("d", 0), hours=parts.get("h", 0), minutes=parts.get("m", 0), seconds=parts.get("s", 0)
            )
        else:
            raise KappaConfigError(f"{key}: {value!r} is not a duration; expected {DURATION_FORMS}")
    else:
        raise KappaConfigError(f"{key}: {value!r} is not a duration; expected {DURATION_FORMS}")
    if result < timedelta(0) or (result == timedelta(0) and not allow_zero):
        allowed = "zero or positive" if allow_zero else "positive"
        raise KappaConfigError(f"{key}: {value!r} must be {allowed}")
    return result


#: the end of an ISO-8601 time: a fraction of a second, then an offset (``Z``, ``+02``, ``+0200``, ``+02:00``)
_TIME_TAIL = re.compile(r"(\.\d+)?(Z|[+-]\d\d(?::?\d\d)?)?$")


def fromisoformat(text: str) -> datetime:
    """``datetime.fromisoformat`` as Python 3.11 reads the common forms, on every supported Python.

    Python 3.10's refuses a ``Z`` offset, offsets without a colon or minutes and fractions of other than
    3 or 6 digits; those are rewritten to the form it reads (``+00:00``, ``+02:00``, 6 digits) first. A
    lower-case ``z`` (RFC 3339) is read as ``Z`` on every Python.

    :param text: an ISO-8601 date or date and time.
    :raises ValueError: not a timestamp either Python reads.
    """
    if text.endswith("z"):  # RFC 3339's lower-case z, which the Params form's pattern lets through
        text = text[:-1] + "Z"
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        if sys.version_info >= (3, 11) or len(text) <= 11:
            raise
    head, time = text[:11], text[11:]
    match = _TIME_TAIL.search(time)
    assert match is not None  # every group is optional: it always matches
    fraction, offset = match.group(1) or "", match.group(2) or ""
    if fraction:
        fraction = "." + (fraction[1:] + "000000")[:6]
    if offset == "Z":
        offset = "+00:00"
    elif offset:
        offset = offset[:3] + ":" + (offset[3:].lstrip(":") or "00")
    return datetime.fromisoformat(head + time[: match.start()] + fraction + offset)


def parse_timestamp(value: object, key: str) -> datetime:
    """Parse an ISO-8601 timestamp that carries an offset; return it in UTC.

    :param value: the raw value (a string, or an aware ``datetime``).
    :param key: the parameter name, used in error messages.
    :raises KappaConfigError: for unparsable or naive timestamps.
    """
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, str):
        try:
            parsed = fromisoformat(value.strip())
        except ValueError as e:
            raise KappaConfigError(
                f"{key}: {value!r} is not an ISO-8601 timestamp; expected e.g. 2026-11-25T10:00:00+00:00"
            ) from e
    else:
        raise KappaConfigError(f"{key}: {value!r} is not an ISO-8601 timestamp with an offset")
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise KappaConfigError(f"{key}: {value!r} is a naive timestamp; add an offset, e.g. {parsed.isoformat()}+00:00")
    return parsed.astimezone(timezone.utc)


def format_duration(value: timedelta) -> str:
    """Render a duration in the short form this module parses back (``900s``)."""
    micros = round(value.total_seconds() * 1_000_000)
    if micros % 1_000_000 == 0:
        return f"{micros // 1_000_000}s"
    return f"{micros / 1000:g}ms"


def human_duration(value: timedelta) -> str:
    """Render a duration in the largest whole unit (``1h``, ``15min``, ``90s``, ``0s``), parseable
    by :func:`parse_duration`."""
    micros = round(value.total_seconds() * 1_000_000)
    for unit, size in (("d", 86_400_000_000), ("h", 3_600_000_000), ("min", 60_000_000), ("s", 1_000_000)):
        if micros and micros % size == 0:
            return f"{micros // size}{unit}"
    return format_duration(value)


def to_micros(ts: datetime) -> int:
    """Microseconds since the Unix epoch of an aware datetime (Iceberg's timestamptz unit)."""
    delta = ts - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(micros: int) -> datetime:
    """The aware UTC datetime of microseconds since the Unix epoch."""
    return datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=micros)
