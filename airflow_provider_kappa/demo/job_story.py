"""One job's story in its own process (stage 4): its private Airflow home (a copy of the migrated
DB, a DAG file with its DAG only) and spec file prepared by the demo, and in the child: the live
output pinned as the reference, then per mode in order the incident, the backfill through Airflow
and the comparison, the outcomes written back as JSON."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

from airflow_provider_kappa.demo.airflow_home import airflow_environment, write_dag_file
from airflow_provider_kappa.demo.comparison import JobOutcome
from airflow_provider_kappa.demo.dag_backfill import backfill_and_compare
from airflow_provider_kappa.demo.incident import corrupt_window, pin_reference
from airflow_provider_kappa.demo.lakegen import local_catalog
from airflow_provider_kappa.demo.options import EXAMPLES, PARALLEL_TAIL, TAIL
from airflow_provider_kappa.demo.processes import StoryProcess, copy_sqlite, encode_json
from airflow_provider_kappa.exceptions import KappaConfigError

#: The child's command: ``python -c STORY_CODE <spec.json>``.
STORY_CODE = (
    "import sys; from airflow_provider_kappa.demo.job_story import story_main; sys.exit(story_main(sys.argv[1:]))"
)


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
    :param ledger: a Kafka-live run recorded the live ledger: the backfill (``ledger: auto``, the
        default) must replay it.
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


def run_story(spec: dict[str, Any], say: Callable[[str], None]) -> list[JobOutcome]:
    """One job's story, in this process (the child of
    :func:`~airflow_provider_kappa.demo.processes.run_stories`): pin the live output as the
    reference, then for each mode in order: incident, backfill through the job's Airflow DAG,
    compare with the reference.

    :param spec: the spec file written by :func:`story_process`.
    :param say: where progress lines go.
    """
    job = spec["job"]
    window_start, window_end = datetime.fromisoformat(spec["start"]), datetime.fromisoformat(spec["end"])
    config = EXAMPLES / job / "kappa.yaml"
    catalog = local_catalog(Path(spec["lake"]))
    reference = pin_reference(catalog, job)
    outcomes = []
    for mode in spec["modes"]:
        damaged = corrupt_window(catalog, job, window_start, window_end)
        say(
            f"[4/5] {job}: incident: a buggy deploy corrupted/lost {damaged:,} rows of "
            f"[{window_start:%H:%M}, {window_end:%H:%M}); backfilling ({mode}) through Airflow"
        )
        started = time.time()
        # the lake goes on a parallel tail past the window when parallel runs (see lake.lake_spec): the
        # sequential backfill then reads to the lake's end as well, where live stopped too
        tail = PARALLEL_TAIL if "parallel" in spec["modes"] else TAIL
        outcome = backfill_and_compare(
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
