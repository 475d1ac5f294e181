"""A realistic landed-event lake: Kafka-like ``impressions`` and ``playbacks`` landed in
Iceberg the way a Kafka->Iceberg router lands them.

The lake is a deterministic, endless stream defined by a :class:`LakeSpec` (seed, rate and
shapes); ``start``/``hours`` only choose which stretch of ingestion time is landed. Events
are generated in one-hour blocks of event time, each from its own seeded random generator,
so any ingestion window can be produced on its own and the same spec always yields the
same rows (also when the lake is landed in several calls, see :func:`append_landing`).

Shapes (see ``docs/lakegen.md``):

* volume: ``rate`` impressions per second, ``rate * playback_ratio`` playbacks (10:1);
* event time precedes ingestion time by a skewed delay: most events land within seconds,
  ``delayed_fraction`` after 1-8 minutes, ``late_fraction`` after 11-30 minutes (beyond the
  example jobs' 10-minute watermark);
* accounts and shows are Zipf-distributed (heavy hitters); the accounts that *play* are
  capped at ``max_sessions_per_account_hour`` so that sessions stay sessions;
* playbacks come in per-account bursts (sessions: a few plays of one show, seconds to four
  minutes apart) separated by longer gaps, and ``attributed_fraction`` of the sessions are
  preceded, within 25 minutes, by an impression of the same account and show.

Landing: one Iceberg append (snapshot) per ``landing_interval`` per table, in ingestion
order, into tables partitioned by ingestion hour (:func:`~airflow_provider_kappa.demo.lake_schema.create_raw_table`).
numpy, pyarrow and pyiceberg are imported inside the functions.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_provider_kappa.demo import lake_schema
from airflow_provider_kappa.exceptions import KappaConfigError, KappaSourceError
from airflow_provider_kappa.timeparse import from_micros, to_micros

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

IMPRESSIONS_TABLE = "raw.impressions"
PLAYBACKS_TABLE = "raw.playbacks"
LANDED_UNTIL = "kappa.lakegen.landed-until"
"""Snapshot summary property: the end (ISO-8601) of the ingestion range landed so far."""
LANDING_START = "kappa.lakegen.landing-start"
"""Snapshot summary property: the start (ISO-8601) of the ingestion range of this landing."""

_SECOND = 1_000_000
_MINUTE = 60 * _SECOND
_BLOCK = 3600 * _SECOND  # event-time block of generation, each with its own generator
_MAX_PLAYS = 12  # plays per session at most
_PLAY_GAP = (5 * _SECOND, 240 * _SECOND)  # gaps between the plays of a session (under 5 minutes)
_PLAY_GAP_MEAN = 50 * _SECOND
_ATTRIBUTION_LEAD = 25 * _MINUTE  # impression at most this long before the session it leads to
_BODY_MEDIAN_S, _BODY_SIGMA, _BODY_MAX_S = 1.5, 1.0, 50.0  # delays "within seconds"
_DELAYED = (1 * _MINUTE, 8 * _MINUTE)  # the tail of minutes (log-uniform)
_LATE = (11 * _MINUTE, 30 * _MINUTE)  # beyond a 10-minute watermark (uniform)
_LOOKBACK = (_MAX_PLAYS - 1) * _PLAY_GAP[1] + _LATE[1]  # how far before an ingestion time an event can be
LATE_THRESHOLD = timedelta(minutes=10)
"""Delay beyond which :class:`LakeSummary` counts an event as late (the examples' watermark)."""


def _utc(year: int, month: int, day: int) -> datetime:
    return datetime(year, month, day, tzinfo=timezone.utc)


@dataclass(frozen=True)
class LakeSpec:
    """What to land and how it looks. Same spec -> identical rows.

    :param hours: ingestion time to land, from ``start``.
    :param rate: impressions per second (event time); playbacks are ``rate * playback_ratio``.
    :param start: first ingestion time landed (aware).
    :param seed: seed of every random draw (non-negative).
    :param landing_interval: ingestion time covered by one landed file (one snapshot per table).
    :param playback_ratio: playbacks per impression (0.1: the 10:1 volume of the two sources).
    :param accounts: number of distinct accounts (ids ``1..accounts``, 1 the hottest).
    :param shows: number of distinct shows (ids ``1..shows``, 1 the most popular).
    :param account_skew: Zipf exponent of accounts in impressions.
    :param show_skew: Zipf exponent of shows (impressions and sessions).
    :param max_sessions_per_account_hour: cap on an account's expected playback sessions per hour.
    :param plays_per_session: mean plays of a session (geometric, at most 12).
    :param attributed_fraction: sessions preceded by an impression of their account and show
        (within 25 minutes, so the rmi example's 30-minute join finds it).
    :param delayed_fraction: events landed 1 to 8 minutes after their event time.
    :param late_fraction: events landed 11 to 30 minutes after their event time.
    """

    hours: float = 2.0
    rate: float = 20.0
    start: datetime = field(default_factory=lambda: _utc(2026, 11, 1))
    seed: int = 7
    landing_interval: timedelta = timedelta(minutes=2)
    playback_ratio: float = 0.1
    accounts: int = 5000
    shows: int = 300
    account_skew: float = 1.0
    show_skew: float = 1.1
    max_sessions_per_account_hour: float = 4.0
    plays_per_session: float = 4.0
    attributed_fraction: float = 0.7
    delayed_fraction: float = 0.03
    late_fraction: float = 0.005

    def __post_init__(self) -> None:
        def bad(name: str, expected: str) -> KappaConfigError:
            return KappaConfigError(f"LakeSpec.{name}: {getattr(self, name)!r}; expected {expected}")

        if self.start.tzinfo is None or self.start.utcoffset() is None:
            raise bad("start", "an aware datetime (with an offset), e.g. 2026-11-01T00:00:00+00:00")
        if self.start < _utc(1970, 1, 2):
            raise bad("start", "a time after 1970-01-02")
        if not self.hours > 0:
            raise bad("hours", "a positive number of hours")
        if not self.rate > 0:
            raise bad("rate", "a positive number of impressions per second")
        if self.seed < 0:
            raise bad("seed", "a non-negative integer")
        if self.landing_interval < timedelta(seconds=1):
            raise bad("landing_interval", "at least one second")
        if not 0 < self.playback_ratio <= 1:
            raise bad("playback_ratio", "a number in (0, 1]")
        for name in ("accounts", "shows"):
            if getattr(self, name) < 1:
                raise bad(name, "at least 1")
        for name in ("account_skew", "show_skew"):
            if getattr(self, name) < 0:
                raise bad(name, "a non-negative Zipf exponent")
        if not self.max_sessions_per_account_hour > 0:
            raise bad("max_sessions_per_account_hour", "a positive number")
        if not 1 <= self.plays_per_session <= _MAX_PLAYS:
            raise bad("plays_per_session", f"a number between 1 and {_MAX_PLAYS}")
        for name in ("attributed_fraction", "delayed_fraction", "late_fraction"):
            if not 0 <= getattr(self, name) <= 1:
                raise bad(name, "a fraction between 0 and 1")
        if self.delayed_fraction + self.late_fraction > 1:
            raise bad("late_fraction", f"at most 1 - delayed_fraction ({1 - self.delayed_fraction})")

    @property
    def end(self) -> datetime:
        """End (exclusive) of the landed ingestion time."""
        return self.start + timedelta(hours=self.hours)


@dataclass(frozen=True)
class LakeSummary:
    """What :func:`generate_lake` or :func:`append_landing` landed."""

    impressions_table: str
    playbacks_table: str
    start: datetime
    end: datetime
    landings: int
    snapshots: int
    impressions: int
    playbacks: int
    late_impressions: int
    late_playbacks: int
    seconds: float

    @property
    def rows(self) -> int:
        """Events landed in both tables."""
        return self.impressions + self.playbacks


# --------------------------------------------------------------------------- generation


def _zipf(n: int, skew: float) -> np.ndarray:
    import numpy as np

    w: np.ndarray = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** skew
    out: np.ndarray = w / w.sum()
    return out


def _capped(p: np.ndarray, cap: float) -> np.ndarray:
    """``p`` with no entry above ``cap``, the excess spread proportionally (water-filling)."""
    import numpy as np

    if cap * len(p) <= 1.0:
        return np.full(len(p), 1.0 / len(p))
    if p.max() <= cap:
        return p
    lo, hi = 1.0, cap / p.min()
    for _ in range(100):
        mid = (lo + hi) / 2
        if np.minimum(cap, mid * p).sum() < 1.0:
            lo = mid
        else:
            hi = mid
    q = np.minimum(cap, hi * p)
    out: np.ndarray = q / q.sum()
    return out


def _delays(rng: np.random.Generator, n: int, spec: LakeSpec) -> np.ndarray:
    """Ingestion minus event time (microseconds): seconds mostly, a tail of minutes, a few late."""
    import numpy as np

    u = rng.random(n)
    body = np.clip(np.exp(rng.normal(math.log(_BODY_MEDIAN_S), _BODY_SIGMA, n)), 0.05, _BODY_MAX_S) * _SECOND
    delayed = np.exp(rng.uniform(math.log(_DELAYED[0]), math.log(_DELAYED[1]), n))
    late = rng.uniform(_LATE[0], _LATE[1], n)
    out = np.where(
        u < spec.late_fraction, late, np.where(u < spec.late_fraction + spec.delayed_fraction, delayed, body)
    )
    return out.astype(np.int64)


@dataclass
class _Events:
    """Columns of generated events (numpy arrays, times in epoch microseconds)."""

    block: np.ndarray
    index: np.ndarray
    account: np.ndarray
    show: np.ndarray
    event: np.ndarray
    ingestion: np.ndarray


def _block(spec: LakeSpec, hour: int) -> tuple[_Events, _Events]:
    """Impressions and playbacks whose generation belongs to event-time hour ``hour`` (since epoch)."""
    import numpy as np

    rng = np.random.default_rng([spec.seed, hour])
    t0 = hour * _BLOCK
    n_imp = int(round(spec.rate * 3600))
    n_play = int(round(spec.rate * spec.playback_ratio * 3600))
    show_p = _zipf(spec.shows, spec.show_skew)

    # Playback sessions: geometric sizes (capped) adding up to exactly n_play plays.
    p = 1.0 / spec.plays_per_session
    sizes = np.minimum(rng.geometric(p, size=int(n_play * p * 1.5) + 16), _MAX_PLAYS)
    while sizes.sum() < n_play:
        sizes = np.concatenate([sizes, np.minimum(rng.geometric(p, size=len(sizes) + 16), _MAX_PLAYS)])
    csum = np.cumsum(sizes)
    n_sess = int(np.searchsorted(csum, n_play)) + 1 if n_play else 0
    sizes = sizes[:n_sess].copy()
    if n_sess:
        sizes[-1] -= int(csum[n_sess - 1]) - n_play
    sessions_per_hour = max(n_sess, 1)
    account_p = _capped(_zipf(spec.accounts, spec.account_skew), spec.max_sessions_per_account_hour / sessions_per_hour)
    s_start = rng.integers(t0, t0 + _BLOCK, n_sess)
    s_account = rng.choice(spec.accounts, n_sess, p=account_p) + 1
    s_show = rng.choice(spec.shows, n_sess, p=show_p) + 1
    play_session = np.repeat(np.arange(n_sess), sizes)
    gaps = np.clip(rng.exponential(_PLAY_GAP_MEAN, n_play), *_PLAY_GAP).astype(np.int64)
    first = np.concatenate([[0], csum[: n_sess - 1]]) if n_sess else np.zeros(0, dtype=np.int64)
    gaps[first] = 0
    offsets = np.cumsum(gaps) - np.repeat(np.cumsum(gaps)[first], sizes)
    play_event = s_start[play_session] + offsets
    plays = _Events(
        block=np.full(n_play, hour, dtype=np.int64),
        index=np.arange(n_play, dtype=np.int64),
        account=s_account[play_session],
        show=s_show[play_session],
        event=play_event,
        ingestion=play_event + _delays(rng, n_play, spec),
    )

    # Impressions: one leading each attributed session, the rest browsing (Zipf accounts and shows).
    attributed = np.flatnonzero(rng.random(n_sess) < spec.attributed_fraction)[:n_imp]
    lead = rng.integers(0, _ATTRIBUTION_LEAD, len(attributed))
    n_bg = n_imp - len(attributed)
    imp_event = np.concatenate([s_start[attributed] - lead, rng.integers(t0, t0 + _BLOCK, n_bg)])
    imp_account = np.concatenate(
        [s_account[attributed], rng.choice(spec.accounts, n_bg, p=_zipf(spec.accounts, spec.account_skew)) + 1]
    )
    imp_show = np.concatenate([s_show[attributed], rng.choice(spec.shows, n_bg, p=show_p) + 1])
    impressions = _Events(
        block=np.full(n_imp, hour, dtype=np.int64),
        index=np.arange(n_imp, dtype=np.int64),
        account=imp_account.astype(np.int64),
        show=imp_show.astype(np.int64),
        event=imp_event,
        ingestion=imp_event + _delays(rng, n_imp, spec),
    )
    return impressions, plays


def _window(parts: list[_Events], lo: int, hi: int) -> _Events:
    """Events of ``parts`` with ingestion time in ``[lo, hi)``, in ingestion order."""
    import numpy as np

    cols = {name: np.concatenate([getattr(p, name) for p in parts]) for name in _Events.__dataclass_fields__}
    keep = (cols["ingestion"] >= lo) & (cols["ingestion"] < hi)
    cols = {k: v[keep] for k, v in cols.items()}
    order = np.argsort(cols["ingestion"], kind="stable")
    return _Events(**{k: v[order] for k, v in cols.items()})


def _arrow(events: _Events, prefix: str) -> pa.Table:
    import pyarrow as pa
    import pyarrow.compute as pc

    ids = pc.binary_join_element_wise(
        pc.cast(pa.array(events.block), pa.string()), pc.cast(pa.array(events.index), pa.string()), "-"
    )
    ts = pa.timestamp("us", tz="UTC")
    return pa.Table.from_arrays(
        [
            pc.binary_join_element_wise(prefix, ids, ""),
            pa.array(events.account, pa.int64()),
            pa.array(events.show, pa.int64()),
            pa.array(events.event, pa.int64()).cast(ts),
            pa.array(events.ingestion, pa.int64()).cast(ts),
        ],
        schema=lake_schema.RAW_EVENTS_ARROW,
    )


def _generate(spec: LakeSpec, lo: int, hi: int) -> tuple[_Events, _Events]:
    first = (lo - _LOOKBACK) // _BLOCK
    last = (hi - 1 + _ATTRIBUTION_LEAD) // _BLOCK
    blocks = [_block(spec, h) for h in range(first, last + 1)]
    return _window([b[0] for b in blocks], lo, hi), _window([b[1] for b in blocks], lo, hi)


def landed_events(
    spec: LakeSpec, start: datetime | None = None, end: datetime | None = None
) -> tuple[pa.Table, pa.Table]:
    """The impressions and playbacks whose ingestion time is in ``[start, end)``, in ingestion
    order, as pyarrow tables with the landed-event schema. Touches no catalog.

    :param spec: the lake's spec.
    :param start: first ingestion time (default ``spec.start``).
    :param end: end of the ingestion range, exclusive (default ``spec.end``).
    """
    lo, hi = _bounds(spec, start, end)
    imp, play = _generate(spec, lo, hi)
    return _arrow(imp, "i"), _arrow(play, "p")


def _bounds(spec: LakeSpec, start: datetime | None, end: datetime | None) -> tuple[int, int]:
    for name, value in (("start", start), ("end", end)):
        if value is not None and (value.tzinfo is None or value.utcoffset() is None):
            raise KappaConfigError(f"lake {name}: {value!r} is naive; expected an aware datetime")
    lo, hi = to_micros(start or spec.start), to_micros(end or spec.end)
    if hi <= lo:
        raise KappaConfigError(
            f"lake range: end {from_micros(hi).isoformat()} must be after start {from_micros(lo).isoformat()}"
        )
    return lo, hi


# --------------------------------------------------------------------------- landing


def local_catalog(lake_dir: str | Path, name: str = "lake") -> Catalog:
    """The file-backed sqlite SqlCatalog the example kappa.yaml files point at
    (``${KAPPA_LAKE}/catalog.db`` and ``${KAPPA_LAKE}/warehouse``); folders are created.

    :param lake_dir: the lake folder (what ``KAPPA_LAKE`` names).
    :param name: catalog name (the key under ``catalogs:``).
    """
    from pyiceberg.catalog import load_catalog

    root = Path(lake_dir).expanduser().resolve()
    (root / "warehouse").mkdir(parents=True, exist_ok=True)
    return load_catalog(name, **local_catalog_properties(root))


def local_catalog_properties(lake_dir: str | Path) -> dict[str, str]:
    """pyiceberg properties of :func:`local_catalog` for ``lake_dir``.

    :param lake_dir: the lake folder.
    """
    root = Path(lake_dir).expanduser().resolve()
    return {"type": "sql", "uri": f"sqlite:///{root}/catalog.db", "warehouse": f"file://{root}/warehouse"}


def _table(catalog: Catalog, identifier: str, create: bool) -> Table:
    from pyiceberg.exceptions import NoSuchTableError

    try:
        return catalog.load_table(identifier)
    except NoSuchTableError as e:
        if not create:
            raise KappaSourceError(f"table {identifier!r} does not exist in catalog {catalog.name!r}") from e
        created: Table = lake_schema.create_raw_table(catalog, identifier)
        return created


def landed_until(table: Table) -> datetime | None:
    """End of the ingestion range lakegen landed in ``table`` so far, or None if it landed nothing.

    :param table: a pyiceberg table.
    """
    snap = table.current_snapshot()
    if snap is None or snap.summary is None:
        return None
    value = snap.summary.additional_properties.get(LANDED_UNTIL)
    return None if value is None else datetime.fromisoformat(value)


def generate_lake(
    catalog: Catalog,
    spec: LakeSpec | None = None,
    impressions_table: str = IMPRESSIONS_TABLE,
    playbacks_table: str = PLAYBACKS_TABLE,
) -> LakeSummary:
    """Create both tables if missing and land ``[spec.start, spec.end)`` of ingestion time,
    one snapshot per landing interval per table, in ingestion order.

    :param catalog: a pyiceberg catalog.
    :param spec: the lake (default :class:`LakeSpec()`).
    :param impressions_table: ``namespace.table`` of impressions.
    :param playbacks_table: ``namespace.table`` of playbacks.
    :raises KappaSourceError: a table already holds lakegen landings past ``spec.start``.
    """
    spec = spec or LakeSpec()
    tables = [_table(catalog, t, create=True) for t in (impressions_table, playbacks_table)]
    for ident, table in zip((impressions_table, playbacks_table), tables):
        until = landed_until(table)
        if until is not None and until > spec.start:
            raise KappaSourceError(
                f"table {ident!r} already holds lakegen landings up to {until.isoformat()}, after the spec's start "
                f"{spec.start.isoformat()}; land a later range with append_landing, or use a fresh catalog"
            )
    return _land(spec, tables, (impressions_table, playbacks_table), spec.start, spec.end)


def append_landing(
    catalog: Catalog,
    spec: LakeSpec,
    until: datetime,
    impressions_table: str = IMPRESSIONS_TABLE,
    playbacks_table: str = PLAYBACKS_TABLE,
) -> LakeSummary:
    """Keep ingesting: land the same stream from where the tables stop up to ``until``
    (as a router keeps doing while a backfill runs). Deterministic: landing ``[a, b)`` then
    ``[b, c)`` gives the rows of one landing of ``[a, c)``.

    :param catalog: a pyiceberg catalog.
    :param spec: the spec the tables were generated with.
    :param until: new end of the landed ingestion time (aware).
    :param impressions_table: ``namespace.table`` of impressions.
    :param playbacks_table: ``namespace.table`` of playbacks.
    :raises KappaSourceError: a table is missing, was not landed by lakegen, or the two disagree.
    """
    idents = (impressions_table, playbacks_table)
    tables = [_table(catalog, t, create=False) for t in idents]
    ends = [landed_until(t) for t in tables]
    for ident, end in zip(idents, ends):
        if end is None:
            raise KappaSourceError(
                f"table {ident!r}: no lakegen landing found ({LANDED_UNTIL} missing); use generate_lake"
            )
    if ends[0] != ends[1]:
        raise KappaSourceError(
            f"tables {impressions_table!r} and {playbacks_table!r} are landed up to different times "
            f"({ends[0]} and {ends[1]}); expected the same"
        )
    since = ends[0]
    assert since is not None
    if until <= since:
        raise KappaConfigError(
            f"append_landing until: {until.isoformat()} must be after the landed end {since.isoformat()}"
        )
    return _land(spec, tables, idents, since, until)


def _land(spec: LakeSpec, tables: list[Table], idents: tuple[str, str], start: datetime, end: datetime) -> LakeSummary:
    import numpy as np

    began = time.monotonic()
    lo, hi = _bounds(spec, start, end)
    imp, play = _generate(spec, lo, hi)
    step = int(spec.landing_interval.total_seconds() * _SECOND)
    origin = to_micros(spec.start)
    first = -((origin - lo) // step) if lo > origin else 0  # first grid point strictly after lo
    grid = [origin + k * step for k in range(first, first + (hi - lo) // step + 2)]
    edges = [lo] + [g for g in grid if lo < g < hi] + [hi]
    arrows = (_arrow(imp, "i"), _arrow(play, "p"))
    cuts = [np.searchsorted(ev.ingestion, edges) for ev in (imp, play)]
    snapshots = 0
    for k in range(len(edges) - 1):
        props = {LANDING_START: from_micros(edges[k]).isoformat(), LANDED_UNTIL: from_micros(edges[k + 1]).isoformat()}
        for table, data, cut in zip(tables, arrows, cuts):
            # An empty landing still commits (no files): it records how far ingestion got.
            table.append(data.slice(int(cut[k]), int(cut[k + 1] - cut[k])), snapshot_properties=props)
            snapshots += 1
    late = [int(((ev.ingestion - ev.event) > LATE_THRESHOLD.total_seconds() * _SECOND).sum()) for ev in (imp, play)]
    return LakeSummary(
        impressions_table=idents[0],
        playbacks_table=idents[1],
        start=start,
        end=end,
        landings=len(edges) - 1,
        snapshots=snapshots,
        impressions=len(imp.ingestion),
        playbacks=len(play.ingestion),
        late_impressions=late[0],
        late_playbacks=late[1],
        seconds=time.monotonic() - began,
    )
