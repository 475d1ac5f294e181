"""The demo's job stories as child processes: run them N at once, relay their progress lines,
stop them all (process group) when one fails; plus the consistent copy of the migrated
sqlite Airflow DB each story's own Airflow home starts from.

Pure Python: no Airflow, pyspark or pyiceberg import.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import IO, Any

from airflow_provider_kappa.exceptions import KappaConfigError, KappaError


def check_concurrency(concurrency: int) -> None:
    if concurrency < 1:
        raise KappaConfigError(f"--concurrency: {concurrency!r} jobs at once; expected at least 1")


@dataclass(frozen=True)
class StoryProcess:
    """One job's story (or any command) run as a child process by :func:`run_stories`.

    :param name: the job (names the story in progress lines and errors).
    :param argv: the command.
    :param env: its whole environment.
    :param log: file that receives its stderr (its Airflow and Spark output); its stdout lines
        are progress, relayed to the user.
    :param result: JSON file it writes when it succeeds.
    """

    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    result: Path


def copy_sqlite(source: Path, target: Path) -> None:
    """Copy a sqlite database file (with anything still in its write-ahead log) through
    sqlite's online backup: a consistent copy, as cheap as a file copy for a small DB.

    :param source: an existing sqlite file (the migrated Airflow DB).
    :param target: the copy (replaced).
    :raises KappaError: the source is missing or not a sqlite database.
    """
    if not source.is_file():
        raise KappaError(f"Airflow DB {source}: missing; expected the DB that airflow db migrate created")
    try:
        src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
        try:
            dst = sqlite3.connect(target)
            try:
                src.backup(dst)
            finally:
                dst.close()
        finally:
            src.close()
    except sqlite3.Error as e:
        raise KappaError(f"Airflow DB {source}: cannot copy it to {target}: {e}") from e


def run_stories(
    stories: list[StoryProcess], concurrency: int, say: Callable[[str], None] = print, poll: float = 0.2
) -> dict[str, Any]:
    """Run ``stories`` as child processes, ``concurrency`` at once, relaying their stdout lines to
    ``say``; return name -> the JSON each wrote to its result file. When one fails, the others
    still running are terminated (their whole process group: the story and its spark-submit)
    and the error names the failed story and its log.

    :param stories: what to run (each from :func:`story_process`).
    :param concurrency: stories at once (at least 1).
    :param say: where progress lines go.
    :param poll: seconds between checks of the running stories.
    :raises KappaError: a story exited non-zero or wrote no result.
    """
    check_concurrency(concurrency)
    pending = list(stories)
    running: dict[str, tuple[StoryProcess, subprocess.Popen[str], threading.Thread]] = {}
    results: dict[str, Any] = {}
    lock = threading.Lock()

    def relay(stream: IO[str]) -> None:
        for line in stream:
            with lock:
                say(line.rstrip("\n"))

    try:
        while pending or running:
            while pending and len(running) < concurrency:
                story = pending.pop(0)
                with open(story.log, "w") as log:  # the child keeps its own descriptor
                    proc = subprocess.Popen(
                        story.argv,
                        env=story.env,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE,
                        stderr=log,
                        text=True,
                        start_new_session=True,  # its own process group: stoppable with its spark-submit
                    )
                assert proc.stdout is not None
                reader = threading.Thread(
                    target=relay, args=(proc.stdout,), name=f"kappa-story-{story.name}", daemon=True
                )
                reader.start()
                with lock:
                    say(f"[4/5] {story.name}: story running (pid {proc.pid}); Airflow and Spark output in {story.log}")
                running[story.name] = (story, proc, reader)
            for name, (story, proc, reader) in list(running.items()):
                code = proc.poll()
                if code is None:
                    continue
                reader.join(timeout=30)
                del running[name]
                if code != 0:
                    _stop_group(proc)  # anything it left behind (a spark-submit)
                    raise KappaError(
                        f"{name}: the backfill story failed (exit {code}); its Airflow and Spark output is in "
                        f"{story.log}; last lines:\n{_tail(story.log)}"
                    )
                try:
                    results[name] = json.loads(story.result.read_text(), object_hook=decode_json)
                except (OSError, ValueError) as e:
                    raise KappaError(
                        f"{name}: the backfill story exited 0 but its result {story.result} is unreadable ({e}); "
                        f"see {story.log}"
                    ) from e
            if running:
                time.sleep(poll)
    finally:
        for name, (story, proc, reader) in running.items():
            say(f"      {name}: stopping its story (pid {proc.pid}); its output is in {story.log}")
            _stop_group(proc)
            reader.join(timeout=30)
    return results


def _stop_group(proc: subprocess.Popen[str], grace: float = 20) -> None:
    """Terminate ``proc``'s process group (started with ``start_new_session``: its pid is the
    group id), then kill it if it has not exited within ``grace`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return  # the group is empty: nothing left to stop
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
        if sig == signal.SIGTERM:
            time.sleep(0.5)  # let the group's other members (a JVM) exit; SIGKILL what is left


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"(cannot read {path}: {e})"


def encode_json(value: Any) -> Any:
    if isinstance(value, datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, date):
        return {"$date": value.isoformat()}
    raise TypeError(
        f"story outcome: {value!r} ({type(value).__name__}) is not JSON serialisable; expected a datetime or date"
    )


def decode_json(obj: dict[str, Any]) -> Any:
    if set(obj) == {"$datetime"}:
        return datetime.fromisoformat(obj["$datetime"])
    if set(obj) == {"$date"}:
        return date.fromisoformat(obj["$date"])
    return obj
