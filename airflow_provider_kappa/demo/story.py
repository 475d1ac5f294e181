"""``kappa demo``: the whole Kappa backfill story on one laptop, with real parts.

1. Generate the events (impressions, playbacks). With a Kafka broker (its jars fetched at
   install), produce them into Kafka topics (record timestamp = the generated ingestion time)
   and land the topics into a local sqlite-backed Iceberg catalog with ``kappa land``; without
   one (one line says why), land them straight into the catalog.
2. Run each example job live (the production output, and the reference): from Kafka, the
   unchanged job on its kafka candidates in uneven micro-batches, recording the live ledger
   (:mod:`~airflow_provider_kappa.demo.kafka_lake`); else over the lake in iceberg tail mode.
3. Simulate an incident: a buggy deploy corrupts one window of the output and loses part of it.
4. Backfill that window from Iceberg through the job's Airflow DAG (``dag.test()``: a real Airflow
   run of snapshot, plan, one task per slice, validate, publish) in each mode; after a Kafka-live
   run, with ``ledger`` (live's micro-batches replayed). Each job's story
   (incident, backfill, compare, per mode in order) runs in its own process with its own
   Airflow home (sqlite is not safe for two ``dag.test()`` at once), up to ``concurrency``
   jobs at once.
5. Compare the published window with the live reference and write a report (text + HTML).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from airflow_provider_kappa.backfill.params import MODES
from airflow_provider_kappa.demo.processes import StoryProcess, check_concurrency, copy_sqlite, encode_json, run_stories
from airflow_provider_kappa.demo.report import DemoReport, HourCount, SliceStat
from airflow_provider_kappa.examples import JOBS
from airflow_provider_kappa.exceptions import KappaConfigError, KappaError
from airflow_provider_kappa.timeparse import format_duration

EXAMPLES = Path(__file__).parents[1] / "examples"
MARKER = ".kappa-demo"
WARMUP = timedelta(minutes=30)
#: The incident window ends this long before the ``--hours`` of lake do; a sequential backfill's
#: tail (its last slice then reads to the lake's end, where live stopped too). With parallel
#: among the modes the lake goes on PARALLEL_TAIL - TAIL longer, and both modes read PARALLEL_TAIL
#: past the window: no backfill reads past the landed data (docs/bad_input.md).
TAIL = timedelta(minutes=15)
#: Tail of a parallel backfill: each slice but the last stops reading this long after the
#: cell it owns, and every row of that cell must be closed by then by a micro-batch with data,
#: as live closed it. rmi closes a 5-minute window once the watermark (10 minutes behind)
#: passes its end plus the join's 30-minute bound, a landing later; a session closes 5 minutes
#: after its last play, and sessions run up to ~45 minutes. One hour covers both.
PARALLEL_TAIL = timedelta(hours=1)
#: The column the simulated buggy deploy corrupts, per example job.
CORRUPTED_COLUMN = {"rmi": "attributed_plays", "playback_sessions": "plays"}
#: Per example job: the output row's time span (start and end columns) and how far before its
#: start an input event can still change it (rmi: a play joins impressions up to 30 minutes older).
ROW_SPAN = {"rmi": ("window_start", "window_end"), "playback_sessions": ("session_start", "session_end")}
REACH = {"rmi": timedelta(minutes=30), "playback_sessions": timedelta(0)}
#: Differing rows listed in full at most (report and report.json).
LIST_ROWS = 200


@dataclass(frozen=True)
class DemoOptions:
    """What the demo runs.

    :param workdir: folder for the lake, checkpoints, Airflow home and the report (wiped if it
        holds an earlier demo; refused if it holds anything else).
    :param hours: hours of ingestion time in the lake around the incident (a warmup before it, a
        tail after it); with ``parallel`` among the modes, the lake goes on for the parallel
        tail's extra length, so that no backfill reads past the landed data.
    :param rate: impressions per second (playbacks are a tenth).
    :param seed: seed of the lake generator.
    :param jobs: example jobs to run.
    :param modes: backfill modes to run (each repairs the same incident).
    :param threshold: ``max_misalignment_threshold`` of the backfill. The default, the lake's
        landing interval, cuts micro-batches where live did: output equal to live row for row.
    :param slice: slice length.
    :param landing: the lake's landing interval (ingestion time per landed file and snapshot).
    :param concurrency: jobs run at once, both for the live references (one spark-submit per
        job) and for the backfill stories (one process per job, its modes in order).
    :param kafka: run the Kafka story when a broker can start (False: the iceberg tail live path).
    """

    workdir: Path
    hours: float = 2.0
    rate: float = 10.0
    seed: int = 7
    jobs: tuple[str, ...] = JOBS
    modes: tuple[str, ...] = MODES
    threshold: str = "10min"
    slice: str = "1h"
    landing: str = "10min"
    concurrency: int = 2
    kafka: bool = True


@dataclass
class JobOutcome:
    """One job's backfill in one mode, compared with live."""

    job: str
    mode: str
    seconds: float
    slices: list[SliceStat]
    match_rate: float
    reference_rows: int
    published_rows: int
    only_live: list[dict[str, Any]] = field(default_factory=list)
    only_backfill: list[dict[str, Any]] = field(default_factory=list)
    hours: list[HourCount] = field(default_factory=list)
    state_rows: int = 0
    boundaries: list[dict[str, Any]] = field(default_factory=list)
    unexplained: int = 0
    #: Wall-clock (epoch seconds) start and end of this mode's backfill and comparison.
    started: float = 0.0
    ended: float = 0.0


def nodata_boundaries(
    progress: dict[str, list[dict[str, Any]]], mode: str, slice_ids: list[str]
) -> list[dict[str, Any]]:
    """Where a sequential backfill ran a micro-batch live never ran: a non-last slice whose
    run ended with a no-data micro-batch (Spark's ``availableNow`` runs one to apply the
    watermark its last landing advanced, from ``from`` to ``to``). The next slice's first
    micro-batch then drops as late the events with event time in ``(from, to]`` landed after
    the boundary; live, whose next micro-batch still had ``from`` as its lateness bound,
    accepted them.

    :param progress: slice id -> the slice run's Spark progress records.
    :param mode: the backfill mode (only ``sequential`` carries state across slices).
    :param slice_ids: the slices in order.
    :returns: ``{"slice", "from", "to"}`` per such boundary (ISO-8601 watermarks).
    """
    if mode != "sequential":
        return []

    def read_rows(sid: str) -> int:
        return sum(int(src.get("numInputRows") or 0) for r in progress.get(sid, []) for src in r.get("sources") or [])

    out = []
    for i, sid in enumerate(slice_ids[:-1]):
        if not any(read_rows(later) for later in slice_ids[i + 1 :]):
            break  # nothing read after it (slices past the lake's end): live ended the same way
        records = progress.get(sid, [])
        if len(records) < 2:
            continue
        last, before = records[-1], records[-2]
        if sum(int(src.get("numInputRows") or 0) for src in last.get("sources") or []) != 0:
            continue
        lo, hi = (before.get("eventTime") or {}).get("watermark"), (last.get("eventTime") or {}).get("watermark")
        if lo and hi and lo != hi:
            out.append({"slice": sid, "from": lo, "to": hi})
    return out


def explained_by(row: dict[str, Any], job: str, boundaries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The boundary of :func:`nodata_boundaries` whose dropped events could have changed
    ``row``: an event with event time in ``(from, to]`` feeds output rows whose span
    (:data:`ROW_SPAN`) reaches past ``from - REACH[job]`` and starts by ``to``.

    :param row: an output row of ``job`` (aware datetimes).
    :param job: the example job.
    :param boundaries: from :func:`nodata_boundaries`.
    """
    start_col, end_col = ROW_SPAN[job]
    for b in boundaries:
        lo = datetime.fromisoformat(b["from"].replace("Z", "+00:00"))
        hi = datetime.fromisoformat(b["to"].replace("Z", "+00:00"))
        if row[end_col] > lo - REACH[job] and row[start_col] <= hi:
            return b
    return None


def prepare_workdir(workdir: Path) -> Path:
    """Create ``workdir`` fresh: an earlier demo's folder is wiped, any other non-empty folder refused."""
    workdir = workdir.expanduser().resolve()
    if workdir.exists() and any(workdir.iterdir()):
        if not (workdir / MARKER).exists():
            raise KappaConfigError(
                f"--workdir: {str(workdir)!r} is not empty and was not made by kappa demo; choose an empty or new folder"
            )
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / MARKER).write_text("made by kappa demo; wiped by the next run\n")
    return workdir


def airflow_environment(home: Path) -> dict[str, str]:
    """Environment of a private, sqlite-backed Airflow home.

    :param home: the Airflow home (``<workdir>/airflow`` for the migrated DB, and
        ``<workdir>/airflow/<job>`` for each job's story); its ``dags`` folder is created.
    """
    (home / "dags").mkdir(parents=True, exist_ok=True)
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
    }


DAG_FILE = """\
# Written by kappa demo: one backfill DAG per example job, built from its kappa.yaml.
from airflow_provider_kappa.dag import kappa_backfill_dag

{lines}
"""


def write_dag_file(env: dict[str, str], jobs: tuple[str, ...]) -> Path:
    """Write the demo's DAG file into the Airflow home's dags folder (``dag.test()`` runs a DAG
    the DAG processor can find there)."""
    lines = "\n".join(f"dag_{job} = kappa_backfill_dag({str(EXAMPLES / job / 'kappa.yaml')!r})" for job in jobs)
    path = Path(env["AIRFLOW__CORE__DAGS_FOLDER"]) / "kappa_demo_dags.py"
    path.write_text(DAG_FILE.format(lines=lines))
    return path


def start_airflow_db(env: dict[str, str]) -> subprocess.Popen[str]:
    """Apply ``env`` to this process and start creating Airflow's metadata DB
    (``airflow db migrate``) in a child process; :func:`wait_airflow_db` waits for it. The
    demo generates its lake meanwhile.

    :param env: from :func:`airflow_environment`.
    """
    os.environ.update(env)
    airflow = Path(sys.executable).parent / "airflow"
    return subprocess.Popen(
        [str(airflow), "db", "migrate"],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_airflow_db(proc: subprocess.Popen[str], timeout: float = 600) -> None:
    """Wait for :func:`start_airflow_db`'s process; raise if it failed.

    :param proc: the ``airflow db migrate`` process.
    :param timeout: seconds to wait at most.
    """
    try:
        _, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as e:
        proc.kill()
        proc.communicate()
        raise KappaError(f"airflow db migrate did not finish within {timeout:.0f}s") from e
    if proc.returncode != 0:
        raise KappaError(f"airflow db migrate failed (exit {proc.returncode}): {stderr.strip()[-2000:]}")


def run_demo(opts: DemoOptions, say: Callable[[str], None] = print) -> DemoReport:
    """Run the story and return its report (also written as HTML into the workdir).

    :param opts: what to run.
    :param say: where progress lines go.
    """
    for job in opts.jobs:
        if job not in JOBS:
            raise KappaConfigError(f"--jobs: {job!r} is not an example job; allowed: {list(JOBS)}")
    for mode in opts.modes:
        if mode not in MODES:
            raise KappaConfigError(f"--modes: {mode!r} is not a mode; allowed: {list(MODES)}")
    if opts.hours < 2:
        raise KappaConfigError(f"--hours: {opts.hours!r} is too short; the demo needs at least 2 hours of lake")
    check_concurrency(opts.concurrency)
    began = time.monotonic()
    stages: dict[str, float] = {}
    workdir = prepare_workdir(opts.workdir)
    lake_dir = workdir / "lake"
    lake_dir.mkdir()
    os.environ["KAPPA_LAKE"] = str(lake_dir)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    say(f"[1/5] Airflow home and metadata DB in {workdir / 'airflow'} (created while the lake lands)")
    env = airflow_environment(workdir / "airflow")
    migrate = start_airflow_db(env)

    from airflow_provider_kappa.demo.lakegen import LakeSpec, generate_lake, local_catalog
    from airflow_provider_kappa.timeparse import parse_duration

    # a parallel backfill reads PARALLEL_TAIL past the window: the lake goes on that long after it
    # (a backfill refuses to read past the landed data, see docs/bad_input.md), and the sequential
    # backfill reads as far (both read to the lake's end, where live stopped too)
    extra = max(TAIL, PARALLEL_TAIL if "parallel" in opts.modes else TAIL) - TAIL
    spec = LakeSpec(
        hours=opts.hours + extra / timedelta(hours=1),
        rate=opts.rate,
        seed=opts.seed,
        landing_interval=parse_duration(opts.landing, "--landing"),
    )
    catalog = local_catalog(lake_dir)
    broker = None
    try:
        try:
            broker, why = _start_broker(opts, workdir)
            if broker is None:
                say(f"      live path: iceberg tail, no Kafka broker ({why})")
                lake = generate_lake(catalog, spec)
                topics: dict[str, Any] = {}
            else:
                topics, lake = _kafka_lake(broker, spec, opts.jobs, catalog, say)
        finally:
            wait_airflow_db(migrate)
        stages["lake + Airflow DB"] = time.monotonic() - began
        where = "produced into Kafka and landed by kappa land" if broker else "landed"
        say(
            f"[2/5] lake: {lake.impressions:,} impressions + {lake.playbacks:,} playbacks {where} in {lake.snapshots} "
            f"snapshots over [{lake.start:%H:%M}, {lake.end:%H:%M}) UTC ({lake.seconds:.1f}s)"
        )

        # the incident: from a warmup's length after the lake's start to a tail's length before its
        # end (the warmup and tail reads around the window then have data, as in production)
        window_start, window_end = incident_window(spec.start, spec.end - extra)
        at_once = min(opts.concurrency, len(opts.jobs))
        mark = time.monotonic()
        limits = _batch_limits(topics, spec) if broker else None
        refs = _live_references(opts.jobs, lake_dir, opts.concurrency, limits)
        if broker:
            _restamp(opts.jobs, topics)
    finally:
        if broker is not None:
            broker.stop()
    stages[f"live references (jobs at once: {at_once})"] = time.monotonic() - mark
    live_path = (
        f"Kafka: the jobs ran live from the broker's topics ({_limits_text(limits)} per micro-batch), "
        "recording the live ledger; the backfills replay it (ledger)"
        if broker and limits
        else f"iceberg tail (no Kafka broker: {why})"
    )
    live_seconds: dict[str, float] = {}
    for job in opts.jobs:
        ref = refs[job]
        live_seconds[job] = ref.seconds
        source = "from Kafka " if broker else ""
        say(
            f"[3/5] {job}: live run {source}wrote {sum(ref.rows.values()):,} rows in {sum(ref.batches.values())} "
            f"micro-batches ({ref.seconds:.0f}s)"
        )
    mark = time.monotonic()
    stories = [
        story_process(
            workdir,
            job,
            opts.modes,
            lake_dir,
            window_start,
            window_end,
            opts.slice,
            opts.threshold,
            ledger=broker is not None,
        )
        for job in opts.jobs
    ]
    results = run_stories(stories, opts.concurrency, say)
    outcomes = [outcome_from_json(o) for job in opts.jobs for o in results[job]]
    stages[f"backfills (jobs at once: {at_once})"] = time.monotonic() - mark

    report = _report(
        opts, lake, outcomes, live_seconds, window_start, window_end, stages, time.monotonic() - began, live_path
    )
    html_path = report.write_html(workdir / "report.html")
    (workdir / "report.txt").write_text(report.to_text() + "\n")
    (workdir / "report.json").write_text(json.dumps([_outcome_json(o) for o in outcomes], indent=2, default=str))
    say("[5/5] report")
    say(report.to_text())
    say(f"\nHTML report: {html_path}")
    return report


def incident_window(lake_start: datetime, lake_end: datetime) -> tuple[datetime, datetime]:
    """The window the simulated incident damages and the backfill repairs: from a warmup's
    length after the lake's start to a tail's length before its end, so the backfill's warmup
    and tail reads around it hold data (the live run read the same landings).

    :param lake_start: first ingestion time of the lake.
    :param lake_end: end of the lake's ingestion range.
    :raises KappaConfigError: the lake is too short to hold a window.
    """
    start, end = lake_start + WARMUP, lake_end - TAIL
    if end <= start:
        raise KappaConfigError(
            f"lake [{lake_start.isoformat()}, {lake_end.isoformat()}) is too short for a warmup of {WARMUP} "
            f"and a tail of {TAIL} around an incident window"
        )
    return start, end


#: The child's command: ``python -c STORY_CODE <spec.json>``.
STORY_CODE = "import sys; from airflow_provider_kappa.demo.story import story_main; sys.exit(story_main(sys.argv[1:]))"


def story_process(
    workdir: Path,
    job: str,
    modes: tuple[str, ...],
    lake_dir: Path,
    window_start: datetime,
    window_end: datetime,
    slice_: str,
    threshold: str,
    *,
    ledger: bool = False,
) -> StoryProcess:
    """Prepare ``job``'s story process: its own Airflow home ``<workdir>/airflow/<job>`` whose
    ``airflow.db`` is a copy of the migrated ``<workdir>/airflow/airflow.db`` and whose DAG
    file defines only that job's DAG, its spec file, log and result paths.

    :param workdir: the demo folder (the migrated Airflow DB must be in ``<workdir>/airflow``).
    :param job: the example job.
    :param modes: the modes to run, in order (they replace the same window, one after the other).
    :param lake_dir: the lake (``KAPPA_LAKE``).
    :param window_start: start of the incident window.
    :param window_end: end of the incident window.
    :param slice_: slice length of the backfill.
    :param threshold: ``max_misalignment_threshold`` of the backfill.
    :param ledger: backfill with ``ledger`` (replay the live ledger a Kafka-live run recorded).
    """
    base = workdir / "airflow"
    home = base / job
    env = airflow_environment(home)
    copy_sqlite(base / "airflow.db", home / "airflow.db")
    write_dag_file(env, (job,))
    spec = workdir / f"story-{job}.json"
    log = workdir / f"story-{job}.log"
    result = workdir / f"story-{job}.outcomes.json"
    spec.write_text(
        json.dumps(
            {
                "job": job,
                "modes": list(modes),
                "lake": str(lake_dir),
                "start": window_start.isoformat(),
                "end": window_end.isoformat(),
                "slice": slice_,
                "threshold": threshold,
                "ledger": ledger,
                "result": str(result),
            },
            indent=2,
        )
    )
    full_env = {
        **os.environ,
        **env,
        "KAPPA_LAKE": str(lake_dir),
        "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
        "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
        "PYTHONUNBUFFERED": "1",
    }
    return StoryProcess(
        name=job, argv=[sys.executable, "-c", STORY_CODE, str(spec)], env=full_env, log=log, result=result
    )


def outcome_from_json(data: dict[str, Any]) -> JobOutcome:
    """A :class:`JobOutcome` back from its JSON (written by :func:`story_main`).

    :param data: ``dataclasses.asdict`` of an outcome, decoded with its datetimes.
    """
    fields = dict(data)
    fields["slices"] = [SliceStat(**s) for s in data["slices"]]
    fields["hours"] = [HourCount(**h) for h in data["hours"]]
    return JobOutcome(**fields)


def run_story(spec: dict[str, Any], say: Callable[[str], None]) -> list[JobOutcome]:
    """One job's story, in this process (the child of :func:`run_stories`): pin the live output
    as the reference, then for each mode in order: incident, backfill through the job's Airflow
    DAG, compare with the reference.

    :param spec: the spec file written by :func:`story_process`.
    :param say: where progress lines go.
    """
    from airflow_provider_kappa.demo.lakegen import local_catalog

    job = spec["job"]
    window_start, window_end = datetime.fromisoformat(spec["start"]), datetime.fromisoformat(spec["end"])
    config = EXAMPLES / job / "kappa.yaml"
    catalog = local_catalog(Path(spec["lake"]))
    reference = _pin_reference(catalog, job)
    outcomes = []
    for mode in spec["modes"]:
        damaged = _incident(catalog, job, window_start, window_end)
        say(
            f"[4/5] {job}: incident: a buggy deploy corrupted/lost {damaged:,} rows of "
            f"[{window_start:%H:%M}, {window_end:%H:%M}); backfilling ({mode}) through Airflow"
        )
        started = time.time()
        # the lake goes on a parallel tail past the window when parallel runs (see run_demo): the
        # sequential backfill then reads to the lake's end as well, where live stopped too
        tail = PARALLEL_TAIL if "parallel" in spec["modes"] else TAIL
        outcome = _backfill_and_compare(
            job,
            mode,
            config,
            catalog,
            reference,
            window_start,
            window_end,
            spec["slice"],
            spec["threshold"],
            say,
            tail=tail,
            ledger=bool(spec.get("ledger")),
        )
        outcome.started, outcome.ended = started, time.time()
        outcomes.append(outcome)
    return outcomes


def story_main(argv: list[str]) -> int:
    """Entry of a story child process (:data:`STORY_CODE`): its stdout stays the progress
    channel; everything else this process and its children print (Airflow, Spark) goes to
    stderr, the story's log. Writes the outcomes to the spec's result file.

    :param argv: ``[spec.json]``.
    """
    if len(argv) != 1:
        raise KappaConfigError(f"story: arguments {argv!r}; expected one spec file")
    spec = json.loads(Path(argv[0]).read_text())
    progress = os.fdopen(os.dup(1), "w", buffering=1)  # not inherited by children (spark-submit)
    sys.stdout.flush()
    os.dup2(2, 1)  # from here on, stdout (ours and our children's) is the log
    print(f"kappa demo: {spec['job']}'s story (pid {os.getpid()}); its Airflow and Spark output follows", flush=True)

    def say(line: str) -> None:
        progress.write(line + "\n")
        progress.flush()

    outcomes = run_story(spec, say)
    Path(spec["result"]).write_text(json.dumps([asdict(o) for o in outcomes], default=encode_json, indent=1))
    progress.close()
    return 0


def _start_broker(opts: DemoOptions, workdir: Path) -> tuple[Any, str]:
    """A running :class:`~airflow_provider_kappa.demo.kafka_broker.KafkaBroker` in ``<workdir>/kafka``
    and ``""``, or ``None`` and why there is none (one line; a start that failed keeps its whole
    message in ``<workdir>/kafka/start-error.log``)."""
    from airflow_provider_kappa.demo.kafka_broker import KafkaBroker
    from airflow_provider_kappa.demo.kafka_lake import kafka_unavailable

    if not opts.kafka:
        return None, "--no-kafka"
    why = kafka_unavailable()
    if why is not None:
        return None, why
    broker = KafkaBroker(workdir / "kafka")
    try:
        broker.start()
    except KappaError as e:  # the fallback the issue asks for: the demo goes on without Kafka
        kept = workdir / "kafka" / "start-error.log"  # the whole message (a tool's usage, a log tail)
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text(f"{e}\n")
        return None, f"the broker did not start: {str(e).splitlines()[0]} (whole message: {kept})"
    return broker, ""


def _kafka_lake(
    broker: Any, spec: Any, jobs: tuple[str, ...], catalog: Any, say: Callable[[str], None]
) -> tuple[dict[str, Any], Any]:
    """Produce the lake's events into the jobs' topics and land them with ``kappa land``;
    topic -> :class:`~airflow_provider_kappa.demo.kafka_lake.Topic`, and the lake's summary."""
    from dataclasses import replace

    from airflow_provider_kappa.demo.kafka_lake import KAFKA_ENV, land_lake, produce_lake, topics_of
    from airflow_provider_kappa.job.config import load_config

    began = time.monotonic()
    os.environ[KAFKA_ENV] = broker.bootstrap_servers
    configs = [(EXAMPLES / job / "kappa.yaml", load_config(EXAMPLES / job / "kappa.yaml")) for job in jobs]
    topics, lake = produce_lake(broker.bootstrap_servers, spec, topics_of(c for _, c in configs))
    say(
        f"      live path: Kafka, broker {broker.bootstrap_servers} (pid {broker.pid}, started in {broker.seconds:.0f}s); "
        f"{sum(len(t.acks) for t in topics.values()):,} events produced into {sorted(topics)} in {lake.seconds:.0f}s; "
        f"landing them with kappa land (log {broker.work / 'land.log'})"
    )
    runs = land_lake(configs, broker.work / "land.log")
    snapshots = sum(len(catalog.load_table(t.table).snapshots()) for t in topics.values())
    return topics, replace(lake, landings=runs, snapshots=snapshots, seconds=time.monotonic() - began)


def _batch_limits(topics: dict[str, Any], spec: Any) -> dict[str, int]:
    """``maxOffsetsPerTrigger`` per topic: about one live micro-batch per landing interval of the
    lake, cut by record counts (not on the landing grid)."""
    from airflow_provider_kappa.demo.kafka_lake import batch_limits

    batches = max(1, round((spec.end - spec.start) / spec.landing_interval))
    return batch_limits(topics, batches)


def _limits_text(limits: dict[str, int] | None) -> str:
    return ", ".join(f"{topic} {n:,} records" for topic, n in sorted((limits or {}).items()))


def _restamp(jobs: tuple[str, ...], topics: dict[str, Any]) -> None:
    """Every job's live ledger onto the lake's time axis (:func:`~airflow_provider_kappa.demo.kafka_lake.restamp_ledger`)."""
    from airflow_provider_kappa.demo.kafka_lake import restamp_ledger
    from airflow_provider_kappa.job.config import load_config

    for job in jobs:
        cfg = load_config(EXAMPLES / job / "kappa.yaml")
        for sink in cfg.sinks:
            restamp_ledger(f"{cfg.job.ledger.rstrip('/')}/{sink}", topics)


def _live_references(
    jobs: tuple[str, ...], lake_dir: Path, concurrency: int, kafka: dict[str, int] | None = None
) -> dict[str, Any]:
    """Run every job live (one spark-submit each, ``concurrency`` at once): over the lake, or from
    Kafka with ``kafka`` (topic -> records per micro-batch at most);
    job -> :class:`~airflow_provider_kappa.demo.live_reference.LiveReference`."""
    from concurrent.futures import ThreadPoolExecutor

    from airflow_provider_kappa.demo.live_reference import run_live_reference

    check_concurrency(concurrency)

    def live(job: str) -> Any:
        return run_live_reference(EXAMPLES / job / "kappa.yaml", fresh=True, kafka=kafka)

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="kappa-live") as pool:
        futures = {job: pool.submit(live, job) for job in jobs}
        return {job: future.result() for job, future in futures.items()}


def _target(job: str) -> tuple[str, str]:
    from airflow_provider_kappa.job.config import load_config

    cfg = load_config(EXAMPLES / job / "kappa.yaml")
    sink = next(iter(cfg.sinks.values()))
    return sink.table, sink.time_column


def _pin_reference(catalog: Any, job: str) -> int:
    """The live output's snapshot id: the reference the backfill is compared with."""
    table_name, _ = _target(job)
    snap = catalog.load_table(table_name).current_snapshot()
    if snap is None:
        raise KappaError(f"{job}: the live run wrote no output to {table_name}; the lake is too small (--hours/--rate)")
    return int(snap.snapshot_id)


def _incident(catalog: Any, job: str, start: datetime, end: datetime) -> int:
    """Corrupt the window like a buggy deploy: the first half's metric is off by one,
    the second half is lost. Returns the rows damaged."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from airflow_provider_kappa.backfill.publish import replace_window
    from airflow_provider_kappa.backfill.validate import read_window

    table_name, time_column = _target(job)
    table = catalog.load_table(table_name)
    rows = read_window(table, time_column, start, end)
    middle = start + (end - start) / 2
    keep = pc.less(rows[time_column], pa.scalar(middle, type=rows.schema.field(time_column).type))
    kept = rows.filter(keep)
    column = CORRUPTED_COLUMN[job]
    idx = kept.schema.get_field_index(column)
    corrupted = kept.set_column(idx, column, pc.add(kept[column], pa.scalar(1, type=kept.schema.field(column).type)))
    replace_window(table, corrupted, time_column, start, end)
    return int(rows.num_rows)


def _backfill_and_compare(
    job: str,
    mode: str,
    config: Path,
    catalog: Any,
    reference: int,
    start: datetime,
    end: datetime,
    slice_: str,
    threshold: str,
    say: Callable[[str], None],
    *,
    tail: timedelta = TAIL,
    ledger: bool = False,
) -> JobOutcome:
    from airflow_provider_kappa.dag import kappa_backfill_dag

    conf = {
        "start": start.isoformat(),
        "end": end.isoformat(),
        "mode": mode,
        "slice": slice_,
        "max_misalignment_threshold": threshold,
        "warmup": "30min",
        "tail": format_duration(tail),
        "min_match": 0,
    }
    if ledger:
        conf["ledger"] = True
    dag = kappa_backfill_dag(str(config))  # the same DAG the demo's DAG file defines
    began = time.monotonic()
    run = dag.test(run_conf=conf)
    seconds = time.monotonic() - began
    state = str(getattr(run, "state", ""))
    if not state.endswith("success"):
        raise KappaError(f"{job} ({mode}): the backfill DAG run ended {state!r}; see the task logs above")
    slices = _slice_stats(config, conf, f"{job}/{mode}/")
    table_name, time_column = _target(job)
    outcome = _compare(catalog, table_name, time_column, reference, start, end)
    progress = _slice_progress(config, conf)
    boundaries = nodata_boundaries(progress, mode, sorted(progress))
    differing = outcome["only_live"] + outcome["only_backfill"]
    unexplained = sum(1 for row in differing if explained_by(row, job, boundaries) is None)
    say(
        f"      {job} ({mode}): {len(slices)} slices, {sum(s.rows_read for s in slices):,} rows read, "
        f"{seconds:.0f}s; published window vs live: {outcome['match_rate']:.3f}% match"
        + (f" ({len(differing)} differing rows, {unexplained} not explained; see the report)" if differing else "")
    )
    return JobOutcome(
        job=job,
        mode=mode,
        seconds=seconds,
        slices=slices,
        match_rate=outcome["match_rate"],
        reference_rows=outcome["reference_rows"],
        published_rows=outcome["published_rows"],
        only_live=outcome["only_live"],
        only_backfill=outcome["only_backfill"],
        hours=outcome["hours"],
        state_rows=max((int(m.get("peak_state_rows", 0)) for m in _slice_metrics(config, conf)), default=0),
        boundaries=boundaries,
        unexplained=unexplained,
    )


def _slice_progress(config: Path, conf: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Slice id -> the Spark progress records the backfill kept for it."""
    from airflow_provider_kappa.backfill.backfill import Backfill
    from airflow_provider_kappa.job.config import load_config

    return Backfill.create(load_config(config), conf).store().progress()


def _slice_metrics(config: Path, conf: dict[str, Any]) -> list[dict[str, Any]]:
    from airflow_provider_kappa.backfill.backfill import Backfill
    from airflow_provider_kappa.job.config import load_config

    return Backfill.create(load_config(config), conf).store().done_all()


def _slice_stats(config: Path, conf: dict[str, Any], label: str) -> list[SliceStat]:
    return [
        SliceStat(
            slice_id=label + str(m.get("slice_id")),
            rows_read=int(m.get("rows_read", 0)),
            seconds=float(m.get("seconds", 0.0)),
            batches=int(m.get("batches", 0)),
            watermark=m.get("watermark"),
        )
        for m in _slice_metrics(config, conf)
    ]


def _compare(
    catalog: Any, table_name: str, time_column: str, reference: int, start: datetime, end: datetime
) -> dict[str, Any]:
    """Published window vs the live reference snapshot, as multisets of rows."""
    from airflow_provider_kappa.backfill.validate import compare_rows, hourly_counts, window_filter

    table = catalog.load_table(table_name)
    row_filter = window_filter(table.schema(), time_column, start, end)
    published = table.scan(row_filter=row_filter).to_arrow()
    live = table.scan(row_filter=row_filter, snapshot_id=reference).to_arrow()
    matched, only_backfill, only_live, _, _ = compare_rows(published, live, LIST_ROWS)
    denominator = max(published.num_rows, live.num_rows)
    hours = [
        HourCount(hour=str(h.hour), live=int(h.target), backfill=int(h.staged))
        for h in hourly_counts(published, live, time_column)
    ]
    return {
        "match_rate": 100.0 * matched / denominator if denominator else 100.0,
        "reference_rows": live.num_rows,
        "published_rows": published.num_rows,
        "only_live": only_live,
        "only_backfill": only_backfill,
        "hours": hours,
    }


def _explain(o: JobOutcome) -> list[str]:
    """One note per differing row: what live and the backfill hold, and why they differ."""
    notes = []
    for side, rows in (("only in live", o.only_live), ("only in the backfill", o.only_backfill)):
        for row in rows:
            shown = {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in row.items() if k != "_count"}
            b = explained_by(row, o.job, o.boundaries)
            why = (
                f"the no-data micro-batch ending sequential slice {b['slice']} moved the watermark {b['from']} -> "
                f"{b['to']}; the next slice dropped as late the events of that span landed after it, which live "
                "(still at the first watermark) counted"
                if b
                else "not explained"
            )
            notes.append(f"{o.job} {o.mode}: {side} (x{row.get('_count', 1)}): {shown}: {why}")
    return notes


def _outcome_json(o: JobOutcome) -> dict[str, Any]:
    return {
        "job": o.job,
        "mode": o.mode,
        "seconds": round(o.seconds, 1),
        "slices": len(o.slices),
        "rows_read": sum(s.rows_read for s in o.slices),
        "match_rate": o.match_rate,
        "reference_rows": o.reference_rows,
        "published_rows": o.published_rows,
        "only_live": o.only_live,
        "only_backfill": o.only_backfill,
        "nodata_boundaries": o.boundaries,
        "unexplained_rows": o.unexplained,
        "peak_state_rows": o.state_rows,
        "started": o.started,
        "ended": o.ended,
    }


def _report(
    opts: DemoOptions,
    lake: Any,
    outcomes: list[JobOutcome],
    live_seconds: dict[str, float],
    start: datetime,
    end: datetime,
    stages: dict[str, float],
    wall: float,
    live_path: str = "iceberg tail",
) -> DemoReport:
    facts = [
        ("live path", live_path),
        (
            "lake",
            f"{lake.rows:,} events ({lake.impressions:,} impressions, {lake.playbacks:,} playbacks), "
            f"{lake.snapshots} snapshots, {opts.hours:g} h",
        ),
        ("incident window", f"[{start.isoformat()}, {end.isoformat()})"),
        ("threshold / slice", f"{opts.threshold} / {opts.slice}"),
    ]
    for job, seconds in live_seconds.items():
        facts.append((f"{job} live run", f"{seconds:.0f} s"))
    notes = []
    for o in outcomes:
        rows = sum(s.rows_read for s in o.slices)
        spark = sum(s.seconds for s in o.slices)
        facts.append(
            (
                f"{o.job} {o.mode}",
                f"{len(o.slices)} slices, {rows:,} rows read, {rows / spark if spark else 0:,.0f} rows/s, "
                f"wall {o.seconds:.0f} s, match vs live {o.match_rate:.3f}% "
                f"({o.published_rows:,} published, {o.reference_rows:,} live), peak state rows {o.state_rows:,}",
            )
        )
        if o.only_live or o.only_backfill:
            notes.extend(_explain(o))
    own = ", ".join(f"{o.job} {o.mode} {o.ended - o.started:.0f} s" for o in outcomes)
    facts.append(
        (
            "time by stage",
            ", ".join(f"{k} {v:.0f} s" for k, v in stages.items())
            + (f"; each job and mode's own backfill + comparison (jobs overlap): {own}" if own else ""),
        )
    )
    facts.append(("demo wall time", f"{wall:.0f} s"))
    first = outcomes[0] if outcomes else None
    return DemoReport(
        title="Kappa backfill demo",
        facts=facts,
        slices=[s for o in outcomes for s in o.slices],
        hours=first.hours if first else [],
        notes=notes or ["Every published row equals the live reference (multiset of rows, 100% match)."],
    )


def default_workdir() -> Path:
    """``./kappa-demo``."""
    return Path.cwd() / "kappa-demo"
