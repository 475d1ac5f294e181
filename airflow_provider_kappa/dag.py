"""``kappa_backfill_dag``: one backfill DAG per job, built from its kappa.yaml.

At parse time this reads the YAML (pure Python) and builds Params and tasks: no catalog,
no Spark, no pyspark/pyiceberg import. Everything else happens in the tasks.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from airflow.sdk import DAG, Param

from airflow_provider_kappa.backfill.params import param_schemas
from airflow_provider_kappa.backfill.params_docs import params_table
from airflow_provider_kappa.compat.airflow import CronDataIntervalTimetable, DeltaDataIntervalTimetable
from airflow_provider_kappa.exceptions import KappaConfigError
from airflow_provider_kappa.job.config import CONNECT, JobConfig, load_config
from airflow_provider_kappa.operators.cleanup import KappaCleanupOperator
from airflow_provider_kappa.operators.connect_server import START, STOP, KappaConnectServerOperator
from airflow_provider_kappa.operators.landed import KappaLandedSensor
from airflow_provider_kappa.operators.plan import (
    PARALLEL_TASK,
    SEQUENTIAL_TASK,
    KappaModeBranchOperator,
    KappaPlanOperator,
)
from airflow_provider_kappa.operators.publish import KappaPublishOperator, sink_assets
from airflow_provider_kappa.operators.slice_run import KappaSliceRunOperator
from airflow_provider_kappa.operators.snapshot import KappaSnapshotOperator
from airflow_provider_kappa.operators.validate import KappaValidateOperator
from airflow_provider_kappa.operators.verify import (
    KappaDriftOperator,
    KappaVerifyGateOperator,
    KappaVerifyOperator,
    drift_asset,
)
from airflow_provider_kappa.timeparse import parse_duration

_DOC = """\
### Kappa backfill of job `{job}`

Reruns the job's unchanged streaming application over its Iceberg sources for a window
`[start, end)` and replaces that window of the output table(s) atomically.

`snapshot` checks the parameters and pins the sources' snapshots, `plan` cuts the range read
into aligned slices, `mode` follows `slice_sequential` or `slice_parallel` (the other is
skipped), which run the job once per slice (a Spark Connect session, or a spark-submit, per
`job.engine`), `validate` compares staged and current rows, `publish` replaces the window,
`cleanup` removes what the job's backfills last active longer ago than `job.retention` left
(staging tables, checkpoints, tags; never one holding a lock, nor this run's if it did not
publish). With
`engine: connect` and no `job.connect`, `connect_server_start` (a setup task) starts a local
Spark Connect server for the slices and `connect_server_stop` (its teardown) stops it.

Config: `{path}`. Per-field checks (formats, positive durations, known sources, mode) refuse a
bad trigger; checks across fields (end after start, threshold at most the slice, slice within
the range read) fail the `snapshot` task before any Spark run.

#### Params

{params}

The same backfill from a shell: `kappa backfill --config {path} --start T --end T [CLI flags]`.
{scheduled}"""

_SCHEDULED_DOC = """
#### Scheduled repair

This DAG has a schedule: a run whose `start` and `end` are empty backfills its data interval
`[data_interval_start, data_interval_end)`. Airflow's Backfill dialog and
`airflow backfill create --dag-id {dag_id} --from-date ... --to-date ...` so replace a stretch of
the output interval by interval, one run after the other (`max_active_runs=1`; the lock refuses
overlapping windows).
"""

_VERIFY_DOC = """\
### Kappa verification of job `{job}`

Each run replays its data interval (a daily schedule: yesterday) with the job's unchanged
streaming application over its Iceberg sources, **publishes nothing** (`publish` is false), and
compares the replay with the live output in the target table(s).

`wait_for_landing` (when present) waits for the landed data to pass `end + tail`; `snapshot`,
`plan`, `mode` and the slices run as in the backfill DAG; `verify` compares each sink's replayed
rows with its live rows over the window and writes the report (its **Backfill report** link); a sink whose match rate is below `min_match` (unset: 100) drifts. On drift, `drift`
records an asset event on `kappa://{job}/drift` whose extra lists the drifting output windows per
sink (start, end, live rows, replayed rows; at most 20 per sink) and `verify_gate` fails the run;
without drift `drift` is skipped (no event) and the run succeeds. `cleanup` applies
`job.retention` to the job's backfills.

Config: `{path}`. A run with `start` and `end` verifies that window instead of its interval.

#### Params

{params}
"""

#: Changes of a verification DAG's Params: name -> (schema changes, description prefix).
_VERIFY_PARAMS: dict[str, tuple[dict[str, Any], str]] = {
    "publish": ({"default": False, "enum": [False]}, "A verification never publishes: false, true is refused. "),
    "min_match": ({}, "A verification: below it a sink drifts (the run fails and records a drift event); unset 100. "),
}

#: Param description prefix of start and end in a scheduled DAG.
_FROM_INTERVAL = "Empty: the run's data interval {bound} (scheduled runs, Airflow backfills). "


def default_dag_id(job_name: str, kind: str = "backfill") -> str:
    """``kappa_<kind>_<job>`` (``kappa_backfill_<job>``, ``kappa_verify_<job>``) with characters
    Airflow does not allow replaced by ``_``."""
    return f"kappa_{kind}_" + re.sub(r"[^A-Za-z0-9_.-]", "_", job_name)


def kappa_backfill_dag(
    config_path: str,
    dag_id: str | None = None,
    *,
    spark_conn_id: str | None = None,
    max_parallel_slices: int = 4,
    pool: str | None = None,
    slice_retries: int = 2,
    tag_retention: str = "7d",
    step_retries: int = 2,
    verify: bool = False,
    wait_for_landing: str | timedelta | None = None,
    **dag_kwargs: Any,
) -> DAG:
    """Build the backfill DAG of the job described by ``config_path`` (with ``verify``, its
    continuous verification: see :func:`kappa_verify_dag`).

    Tasks: ``snapshot`` -> ``plan`` -> ``mode`` (branch) -> ``slice_sequential`` | ``slice_parallel``
    (one mapped task instance per slice) -> ``validate`` -> ``publish`` -> ``cleanup`` (``job.retention``
    applied to the job's backfills, after a publish or a dry run's skipped one); with ``engine: connect``
    and no ``job.connect``, the slices sit between ``connect_server_start`` (setup) and
    ``connect_server_stop`` (teardown) of a local Spark Connect server. Params (the trigger form): one per
    row of :data:`airflow_provider_kappa.backfill.params.PARAMS` (start, end, sources, slice, …), the
    advanced ones in a section of their own; its table is in the DAG's doc.

    :param config_path: path of the job's kappa.yaml (read now, and again by every task).
    :param dag_id: the DAG id (default ``kappa_backfill_<job>``, ``kappa_verify_<job>`` with ``verify``).
    :param spark_conn_id: Airflow Spark connection slices are submitted through (default: the
        job's ``master`` with the local spark-submit).
    :param max_parallel_slices: slices of one run running at once in ``parallel`` mode
        (``max_active_tis_per_dagrun``); sequential slices always run one at a time, in order.
    :param pool: Airflow pool of the slice tasks (bounds slices across runs and DAGs).
    :param slice_retries: retries of a slice task (a retry reruns the slice from its start).
    :param tag_retention: how long the tag pinning the source snapshots is kept (``7d``).
    :param step_retries: retries of ``snapshot``, ``plan``, ``validate``, ``publish`` and
        ``connect_server_start``: a transient fault (an unreachable or locked catalog, storage
        I/O, a commit conflict) is retried; bad input fails at once whatever this says.
    :param dag_kwargs: more ``DAG`` arguments (``schedule``, ``start_date``, ``tags``,
        ``default_args``, ``max_active_runs``, …). With a ``schedule`` (a cron expression or
        preset, a ``timedelta``, or a timetable with data intervals), ``start`` and ``end`` may
        be left empty: a run then backfills its data interval, so Airflow's backfills
        (``airflow backfill create``, the Backfill dialog) drive Kappa backfills interval by
        interval. A cron expression or ``timedelta`` is given data intervals
        (``CronDataIntervalTimetable`` in UTC, ``DeltaDataIntervalTimetable``), whatever
        ``[scheduler] create_cron_data_intervals`` says.
    :param verify: build the verification's last tasks (``verify``, ``drift``, ``verify_gate``)
        instead of ``validate`` and ``publish``, and its Params (``publish`` false).
    :param wait_for_landing: with a duration (``6h``, a ``timedelta``), a first task
        ``wait_for_landing`` waits at most that long (reschedule mode, a poke every 5 minutes) for
        the sources' landed data to pass ``end + tail`` before ``snapshot``
        (:class:`~airflow_provider_kappa.operators.landed.KappaLandedSensor`); ``None``: no wait.

    The publish task's outlets are the assets of the sinks' target tables
    (:func:`~airflow_provider_kappa.operators.publish.target_asset`,
    ``iceberg://<catalog>/<namespace>/<table>``): a DAG scheduled on one runs after each backfill
    that published it.
    """
    cfg = load_config(config_path)
    dag_id = dag_id or default_dag_id(cfg.job.name, kind="verify" if verify else "backfill")
    wait = _wait_for_landing(wait_for_landing)
    schedule = data_interval_schedule(dag_kwargs.get("schedule"))
    dag_kwargs["schedule"] = schedule
    scheduled = schedule is not None
    params = _params(cfg, scheduled=scheduled, verify=verify)
    _set_dag_defaults(dag_kwargs, cfg, dag_id=dag_id, scheduled=scheduled, verify=verify)
    with DAG(dag_id, params=params, **dag_kwargs) as dag:
        _add_tasks(
            cfg,
            spark_conn_id=spark_conn_id,
            max_parallel_slices=max_parallel_slices,
            pool=pool,
            slice_retries=slice_retries,
            tag_retention=tag_retention,
            step_retries=step_retries,
            verify=verify,
            wait_for_landing=wait,
        )
    return dag


def kappa_verify_dag(
    config_path: str,
    dag_id: str | None = None,
    *,
    schedule: Any = "@daily",
    wait_for_landing: str | timedelta | None = "6h",
    **kwargs: Any,
) -> DAG:
    """Build the continuous verification DAG of the job described by ``config_path``: each run
    replays its data interval (``@daily``: yesterday) with ``publish: false`` and compares the
    replay with the live output in the targets (:mod:`airflow_provider_kappa.backfill.verify`).

    Tasks: the backfill DAG's ``snapshot`` -> ``plan`` -> ``mode`` -> slices (and the local Connect
    server's setup and teardown), then ``verify`` (validation and report, its **Backfill report**
    link; returns the summary) -> ``drift`` (on drift: succeeds and records an asset event on
    :func:`~airflow_provider_kappa.operators.verify.drift_asset`, ``kappa://<job>/drift``, whose
    ``extra`` lists the drifting windows per sink; no drift: skipped, no event) -> ``verify_gate``
    (fails the run on drift), and ``cleanup`` after ``drift``. A sink drifts when its match rate is
    below ``min_match``; unset, 100 (ledger replayed or not). Params: the backfill DAG's, ``publish``
    false and refused true; ``start`` and ``end`` empty take the run's data interval.

    :param config_path: path of the job's kappa.yaml (read now, and again by every task).
    :param dag_id: the DAG id (default ``kappa_verify_<job>``).
    :param schedule: the runs' schedule (default ``@daily``: each run verifies the day before);
        data intervals as in :func:`kappa_backfill_dag`; ``None``: manual runs with start and end.
    :param wait_for_landing: how long the first task, ``wait_for_landing``, waits for the landed
        data to pass ``end + tail`` (a run starts when its interval ends, before its tail is landed);
        ``None``: no wait (``snapshot`` then refuses a run whose tail is not landed yet).
    :param kwargs: the other arguments of :func:`kappa_backfill_dag` (``spark_conn_id``,
        ``max_parallel_slices``, ``pool``, ``slice_retries``, ``tag_retention``, ``step_retries``)
        and more ``DAG`` arguments (``start_date``, ``tags``, ``default_args``, …).
    """
    return kappa_backfill_dag(
        config_path, dag_id, schedule=schedule, verify=True, wait_for_landing=wait_for_landing, **kwargs
    )


def _wait_for_landing(value: object) -> timedelta | None:
    """``kappa_backfill_dag``'s ``wait_for_landing``: a positive duration, or ``None`` (also '') for no wait."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str):
        return parse_duration(value, "wait_for_landing")
    if isinstance(value, timedelta) and value > timedelta(0):
        return value
    raise KappaConfigError(
        f"wait_for_landing: {value!r} is not a positive duration; expected e.g. '6h', '90min', a positive "
        "timedelta, or None (no wait)"
    )


def _params(cfg: JobConfig, *, scheduled: bool, verify: bool = False) -> dict[str, Param]:
    """The DAG's Params, one per :func:`~airflow_provider_kappa.backfill.params.param_schemas` entry; in a
    scheduled DAG ``start`` and ``end`` may be empty (the run's data interval); in a verification
    ``publish`` is false (true is refused) and ``min_match`` unset is 100."""
    params = {}
    for name, schema in param_schemas(cfg).items():
        schema = dict(schema)
        description = schema.pop("description")
        if scheduled and name in ("start", "end"):
            # a scheduled run (an Airflow backfill) leaves them empty and takes its data interval
            schema.update(type=["null", "string"], default=None)
            description = _FROM_INTERVAL.format(bound=f"data_interval_{name}") + description
        if verify and name in _VERIFY_PARAMS:
            change, prefix = _VERIFY_PARAMS[name]
            schema.update(change)
            description = prefix + description
        if "default" in schema:
            params[name] = Param(schema.pop("default"), description=description, **schema)
        else:
            params[name] = Param(description=description, **schema)
    return params


def _set_dag_defaults(
    dag_kwargs: dict[str, Any], cfg: JobConfig, *, dag_id: str, scheduled: bool, verify: bool = False
) -> None:
    """Fill in the ``DAG`` arguments the caller left out: no catchup, one run at a time, tags, doc and description."""
    dag_kwargs.setdefault("catchup", False)
    dag_kwargs.setdefault("max_active_runs", 1)
    dag_kwargs.setdefault("tags", ["kappa", "verify" if verify else "backfill", cfg.job.name])
    if verify:
        dag_kwargs.setdefault("doc_md", _VERIFY_DOC.format(job=cfg.job.name, path=str(cfg.path), params=params_table()))
        dag_kwargs.setdefault("description", f"Kappa verification of {cfg.job.name}: replay, compare with live")
    scheduled_doc = _SCHEDULED_DOC.format(dag_id=dag_id) if scheduled else ""
    dag_kwargs.setdefault(
        "doc_md", _DOC.format(job=cfg.job.name, path=str(cfg.path), params=params_table(), scheduled=scheduled_doc)
    )
    dag_kwargs.setdefault("description", f"Kappa backfill of {cfg.job.name}: replace a window of its output")


def _add_tasks(
    cfg: JobConfig,
    *,
    spark_conn_id: str | None,
    max_parallel_slices: int,
    pool: str | None,
    slice_retries: int,
    tag_retention: str,
    step_retries: int,
    verify: bool = False,
    wait_for_landing: timedelta | None = None,
) -> None:
    """Add the backfill's tasks to the DAG being defined (see :func:`kappa_backfill_dag`); with
    ``verify``, the verification's last tasks instead of validate and publish (see :func:`kappa_verify_dag`)."""
    path = str(cfg.path)
    retries = {"retries": step_retries}
    snapshot = KappaSnapshotOperator(
        task_id="snapshot", config_path=path, tag_retention=tag_retention, spark_conn_id=spark_conn_id, **retries
    )
    plan = KappaPlanOperator(task_id="plan", config_path=path, snapshot=snapshot.output, **retries)
    mode = KappaModeBranchOperator(task_id="mode", config_path=path)
    slices = _slice_tasks(
        plan, path=path, spark_conn_id=spark_conn_id, pool=pool, retries=slice_retries, max_parallel=max_parallel_slices
    )
    last = (_verify_tasks if verify else _publish_tasks)(cfg, plan, slices, retries=step_retries)
    cleanup = KappaCleanupOperator(
        task_id="cleanup", config_path=path, trigger_rule="none_failed", retries=step_retries
    )  # after a publish, or a dry run's skipped one: job.retention applied to the job's backfills
    plan >> mode >> slices
    last >> cleanup
    if wait_for_landing is not None:
        landed = KappaLandedSensor(
            task_id="wait_for_landing", config_path=path, mode="reschedule", poke_interval=300, timeout=wait_for_landing
        )
        landed >> snapshot
    if cfg.job.engine == CONNECT and cfg.job.connect is None:
        # single-machine deployment: the backfill owns a local Spark Connect server for its slices
        start = KappaConnectServerOperator(task_id="connect_server_start", config_path=path, action=START, **retries)
        stop = KappaConnectServerOperator(task_id="connect_server_stop", config_path=path, action=STOP).as_teardown(
            setups=start
        )
        plan >> start >> slices >> stop
        stop >> cleanup  # the server stopped first: a backfill whose server runs is not cleaned up


def _publish_tasks(cfg: JobConfig, plan: KappaPlanOperator, slices: list[Any], *, retries: int) -> Any:
    """``validate`` -> ``publish`` after the slices; returns the task ``cleanup`` follows."""
    path = str(cfg.path)
    validate = KappaValidateOperator(
        task_id="validate",
        config_path=path,
        plan=plan.output,
        trigger_rule="none_failed_min_one_success",
        retries=retries,
    )
    publish = KappaPublishOperator(
        task_id="publish",
        config_path=path,
        plan=plan.output,
        report=validate.output,
        outlets=list(sink_assets(cfg).values()),
        retries=retries,
    )
    slices >> validate >> publish
    return publish


def _verify_tasks(cfg: JobConfig, plan: KappaPlanOperator, slices: list[Any], *, retries: int) -> Any:
    """``verify`` -> ``drift`` (asset event on drift, else skipped) -> ``verify_gate`` (fails the run
    on drift) after the slices; returns the task ``cleanup`` follows (``drift``: cleanup runs with
    and without drift)."""
    verify = KappaVerifyOperator(
        task_id="verify",
        config_path=str(cfg.path),
        plan=plan.output,
        trigger_rule="none_failed_min_one_success",
        retries=retries,
    )
    drift = KappaDriftOperator(task_id="drift", verification=verify.output, outlets=[drift_asset(cfg.job.name)])
    gate = KappaVerifyGateOperator(task_id="verify_gate", verification=verify.output, trigger_rule="none_failed")
    slices >> verify >> drift >> gate
    return drift


def _slice_tasks(
    plan: KappaPlanOperator, *, path: str, spark_conn_id: str | None, pool: str | None, retries: int, max_parallel: int
) -> list[Any]:
    """The two mapped slice tasks, one task instance per slice of the plan: ``slice_sequential`` (one at a
    time, in order) and ``slice_parallel`` (``max_parallel`` at once); the ``mode`` branch runs one of them."""
    slice_args: dict[str, Any] = {
        "config_path": path,
        "spark_conn_id": spark_conn_id,
        "retries": retries,
        "map_index_template": "{{ kappa_slice }}",
    }
    if pool:
        slice_args["pool"] = pool
    sequential = KappaSliceRunOperator.partial(
        task_id=SEQUENTIAL_TASK, max_active_tis_per_dagrun=1, **slice_args
    ).expand(slice_plan=plan.output)
    parallel = KappaSliceRunOperator.partial(
        task_id=PARALLEL_TASK, max_active_tis_per_dagrun=max_parallel, **slice_args
    ).expand(slice_plan=plan.output)
    return [sequential, parallel]


def data_interval_schedule(schedule: Any) -> Any:
    """``schedule`` with data intervals: a cron expression or preset becomes a
    ``CronDataIntervalTimetable`` (UTC) and a ``timedelta`` a ``DeltaDataIntervalTimetable``, so
    every scheduled run covers ``[data_interval_start, data_interval_end)`` (Airflow 3 gives a
    plain cron schedule runs with an empty interval unless ``[scheduler]
    create_cron_data_intervals`` is on). ``None``, ``@once``, ``@continuous``, timetables and
    asset schedules are returned as they are.

    :param schedule: the ``schedule`` argument given to :func:`kappa_backfill_dag`.
    """
    if isinstance(schedule, str) and schedule not in ("@once", "@continuous"):
        return CronDataIntervalTimetable(schedule, timezone="UTC")
    if isinstance(schedule, timedelta):
        return DeltaDataIntervalTimetable(schedule)
    return schedule
