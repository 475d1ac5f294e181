"""Every path under ``job.checkpoint_root``: this module is their one owner.

``<checkpoint_root>/<job>/``

- ``live/``: the live query's checkpoint (``kappa run``; :func:`live_checkpoint`).
- ``land/<source>/``: each landed source's checkpoint (``kappa land``; :func:`land_checkpoint`).
- ``ledger/``: the live ledger, each Kafka-live micro-batch's offsets (:func:`ledger_folder`;
  ``job.ledger`` may put it elsewhere).
- ``backfill/<backfill_id>/``: one folder per backfill (:func:`backfill_root`,
  :class:`CheckpointStore`), below.

``<checkpoint_root>/<job>/backfill/<backfill_id>/``

- ``epochs/<slice_id>.json``: the slice's current epoch ``{"epoch": "0003-1a2b3c4d"}``. Every
  attempt of a slice (first run, retry after a killed driver or parent, a clear in Airflow,
  ``--resume``) takes a new one (:meth:`CheckpointStore.new_epoch`: a number one above every
  earlier attempt's, and a random part so two attempts never share one) before it touches
  anything; the slice's staging tables are recreated for it (``spark.kappa.epoch``, see
  :mod:`airflow_provider_kappa.spark.staging`), so an older attempt still running commits nothing.
- ``attempts/<slice_id>/<epoch>/``: the checkpoint one attempt runs with. Sequential: a copy of
  the slice's boundary (empty for the first slice), so state flows slice to slice; parallel: empty.
  An older attempt still running writes only into its own folder, never into the one the current
  attempt reads or keeps. Folders of older attempts are removed when an attempt succeeds.
- ``boundaries/<slice_id>/<epoch>/``: the checkpoint at the start of sequential slice ``<slice_id>``:
  the attempt folder of the previous slice's successful attempt ``<epoch>``, copied when that
  attempt finished (and only if its epoch was still current). A boundary is complete when its
  ``_KAPPA_BOUNDARY`` marker exists (written last), and counts only while ``<epoch>`` is still the
  previous slice's current epoch (:meth:`CheckpointStore.kept_boundary`): a superseded attempt whose
  copy lands late writes only its own epoch's folder, never the one the next slice reads.
- ``done/<slice_id>.json``: the metrics of a slice's last successful run (removed when it reruns).
- ``progress/<slice_id>.jsonl``: the Spark ``StreamingQueryProgress`` records of its last run.
- ``report.html``: the backfill's HTML report (:meth:`CheckpointStore.report_file`).
- ``logs/<slice_id>.log``: ``kappa backfill``'s slice logs (:meth:`CheckpointStore.log_folder`).
- ``connect/server.json``: the state file of the Spark Connect server kappa owns for the backfill
  (:func:`connect_state_path`); beside it ``connect/sessions.json``, the sessions that server ran and
  runs now, and ``connect/server.lock``, the lock its slice tasks take to start, count and recycle it
  (:func:`connect_sessions_path`, :func:`connect_lock_path`).
- ``plans/<slice_id>/<source>.json``: the file list of each source for the slice's read range,
  written by the launcher before each run and read by the slice's ``kappa_iceberg`` readers
  (``spark/source/file_list.py``).
- ``pinned/<name>.json``: a choice the backfill's first run made and every rerun keeps (``ledger``:
  whether the slices replay the live ledger and from which batch; :meth:`CheckpointStore.pin`).
- ``exactness.json``: how exact the last plan step expected the backfill to be (the report of a
  DAG run reads it: its plan task's XCom holds the slices only; :meth:`CheckpointStore.record_exactness`).
- ``heartbeat``: touched by every step of a running backfill (snapshot, each slice at its start,
  every :data:`HEARTBEAT_EVERY` while it runs and at its end, validate, publish), on either engine
  and in dry runs: cleanup keeps a backfill whose heartbeat is recent (:meth:`CheckpointStore.heartbeat`).

Any filesystem pyarrow knows (local paths, ``file://``, ``s3://``, ``gs://``, ``hdfs://``) works.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_provider_kappa.exceptions import KappaSinkError, KappaSupersededError
from airflow_provider_kappa.spark.storage import filesystem, read_text, write_text

if TYPE_CHECKING:
    from pyarrow.fs import FileSystem

log = logging.getLogger(__name__)

MARKER = "_KAPPA_BOUNDARY"
#: the file a running backfill touches (:meth:`CheckpointStore.touch_heartbeat`)
HEARTBEAT = "heartbeat"
#: seconds between two touches of the heartbeat while a slice runs (:meth:`CheckpointStore.beating`)
HEARTBEAT_EVERY = 30.0
_EPOCH = re.compile(r"(\d+)-[0-9a-f]+")


def job_root(checkpoint_root: str, job: str) -> str:
    """``<checkpoint_root>/<job>``: every folder of the job.

    :param checkpoint_root: ``job.checkpoint_root`` of the config.
    :param job: the job name.
    """
    return f"{checkpoint_root.rstrip('/')}/{job}"


def live_checkpoint(checkpoint_root: str, job: str) -> str:
    """``<checkpoint_root>/<job>/live``: the live query's checkpoint (``kappa run``)."""
    return f"{job_root(checkpoint_root, job)}/live"


def land_checkpoint(checkpoint_root: str, job: str) -> str:
    """``<checkpoint_root>/<job>/land``: one landing checkpoint per source below it (``kappa land``)."""
    return f"{job_root(checkpoint_root, job)}/land"


def ledger_folder(checkpoint_root: str, job: str) -> str:
    """``<checkpoint_root>/<job>/ledger``: the live ledger's default folder."""
    return f"{job_root(checkpoint_root, job)}/ledger"


def backfills_folder(checkpoint_root: str, job: str) -> str:
    """``<checkpoint_root>/<job>/backfill``: where the job's backfills keep their folders."""
    return f"{job_root(checkpoint_root, job)}/backfill"


def connect_state_path(root: str, backfill_id: str) -> Path:
    """The state file of the Spark Connect server kappa owns for the backfill ``backfill_id`` whose
    folder is ``root``: in that folder when it is local, else in a temporary folder of this machine."""
    if "://" in root and not root.startswith("file://"):
        return Path(tempfile.gettempdir()) / "kappa-connect" / backfill_id / "server.json"
    return Path(root.removeprefix("file://")) / "connect" / "server.json"


def connect_sessions_path(state_file: Path) -> Path:
    """``sessions.json`` beside the server state file ``state_file``: the sessions its server ran and
    the ones running now (:func:`airflow_provider_kappa.engine.connect_server.shared_session`)."""
    return state_file.with_name("sessions.json")


def connect_lock_path(state_file: Path) -> Path:
    """``server.lock`` beside the server state file ``state_file``: held while a slice task starts,
    counts or recycles that server."""
    return state_file.with_name("server.lock")


def backfill_root(checkpoint_root: str, job: str, backfill_id: str) -> str:
    """``<checkpoint_root>/<job>/backfill/<backfill_id>``.

    :param checkpoint_root: ``job.checkpoint_root`` of the config.
    :param job: the job name.
    :param backfill_id: the backfill id.
    """
    return f"{backfills_folder(checkpoint_root, job)}/{backfill_id}"


class CheckpointStore:
    """The checkpoint folders of one backfill.

    :param root: the backfill's folder (see :func:`backfill_root`).
    """

    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/")

    def _fs(self) -> tuple[FileSystem, str]:
        return filesystem(self.root, "checkpoint folder")

    # paths --------------------------------------------------------------------------------

    def report_file(self) -> str:
        """``report.html``: the backfill's HTML report."""
        return f"{self.root}/report.html"

    def log_folder(self, backfill_id: str) -> Path:
        """Where ``kappa backfill`` writes its slice logs: ``logs/`` when the folder is local, else
        a temporary folder of this machine."""
        if "://" in self.root and not self.root.startswith("file://"):
            return Path(tempfile.gettempdir()) / "kappa-logs" / backfill_id
        return Path(self.root.removeprefix("file://")) / "logs"

    def attempt(self, slice_id: str, epoch: str) -> str:
        """The checkpoint of the attempt of ``slice_id`` that took ``epoch``."""
        return f"{self.root}/attempts/{slice_id}/{epoch}"

    def epoch_file(self, slice_id: str) -> str:
        """Where the current epoch of ``slice_id`` is recorded."""
        return f"{self.root}/epochs/{slice_id}.json"

    def boundary(self, slice_id: str) -> str:
        """The folder of the checkpoints kept at the start of sequential slice ``slice_id``, one per
        epoch of the slice before it (the one that counts: :meth:`kept_boundary`)."""
        return f"{self.root}/boundaries/{slice_id}"

    def plan_file(self, slice_id: str, source: str) -> str:
        """Where the launcher keeps the scan plan of ``source`` for a run of ``slice_id``."""
        return f"{self.root}/plans/{slice_id}/{source}.json"

    def done_file(self, slice_id: str) -> str:
        """Where the metrics of a slice's last successful run are kept."""
        return f"{self.root}/done/{slice_id}.json"

    def progress_file(self, slice_id: str) -> str:
        """Where the Spark progress records of a slice's last run are kept."""
        return f"{self.root}/progress/{slice_id}.jsonl"

    def heartbeat_file(self) -> str:
        """``heartbeat``: touched by every step of the backfill while it runs."""
        return f"{self.root}/{HEARTBEAT}"

    def pinned(self, name: str) -> dict[str, Any] | None:
        """The choice pinned as ``pinned/<name>.json`` by the backfill's first run, if any."""
        path = f"{self.root}/pinned/{name}.json"
        return dict(json.loads(self._read(path))) if self._exists(path) else None

    def pin(self, name: str, value: dict[str, Any]) -> dict[str, Any]:
        """The choice pinned as ``pinned/<name>.json``: the one an earlier run pinned, else
        ``value``, pinned now."""
        found = self.pinned(name)
        if found is not None:
            return found
        self._write(f"{self.root}/pinned/{name}.json", json.dumps(value))
        return value

    def record_exactness(self, value: dict[str, Any]) -> None:
        """Write ``exactness.json`` (the plan step's :class:`~airflow_provider_kappa.backfill.exactness.Exactness`)."""
        self._write(f"{self.root}/exactness.json", json.dumps(value))

    def exactness(self) -> dict[str, Any] | None:
        """What :meth:`record_exactness` wrote last, if anything."""
        path = f"{self.root}/exactness.json"
        return dict(json.loads(self._read(path))) if self._exists(path) else None

    # heartbeat ----------------------------------------------------------------------------

    def touch_heartbeat(self) -> None:
        """Say the backfill is running: (re)write :meth:`heartbeat_file` with the current time."""
        self._write(self.heartbeat_file(), datetime.now(timezone.utc).isoformat())

    def end_heartbeat(self) -> None:
        """Say the backfill no longer runs (its command ended): remove :meth:`heartbeat_file`."""
        self._delete(self.heartbeat_file())

    def heartbeat(self) -> datetime | None:
        """When the backfill last touched its heartbeat (the file's modification time), ``None`` if never."""
        fs, _ = self._fs()
        mtime = fs.get_file_info(self._local(self.heartbeat_file())).mtime
        return None if mtime is None else mtime.astimezone(timezone.utc)

    @contextmanager
    def beating(self, every: float = HEARTBEAT_EVERY) -> Iterator[None]:
        """Touch the heartbeat now, every ``every`` seconds from a daemon thread while the block
        runs (a slice may run long), and when it ends. A touch the thread cannot make is logged
        (the run goes on; the next touch tries again)."""
        self.touch_heartbeat()
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(every):
                try:
                    self.touch_heartbeat()
                except OSError as e:
                    log.warning("backfill folder %s: heartbeat not touched (%s); retrying in %ss", self.root, e, every)

        thread = threading.Thread(target=beat, name="kappa-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            self.touch_heartbeat()

    # primitives ---------------------------------------------------------------------------

    def _local(self, uri: str) -> str:
        fs, base = self._fs()
        return base + uri[len(self.root) :]

    def _exists(self, uri: str) -> bool:
        from pyarrow.fs import FileType

        fs, _ = self._fs()
        return bool(fs.get_file_info(self._local(uri)).type != FileType.NotFound)

    def _delete(self, uri: str) -> None:
        from pyarrow.fs import FileType

        fs, _ = self._fs()
        path = self._local(uri)
        kind = fs.get_file_info(path).type
        if kind == FileType.Directory:
            fs.delete_dir(path)
        elif kind != FileType.NotFound:
            fs.delete_file(path)

    def _copy_dir(self, src: str, dst: str) -> None:
        from pyarrow.fs import FileType, copy_files

        fs, _ = self._fs()
        self._delete(dst)
        fs.create_dir(self._local(dst), recursive=True)
        if fs.get_file_info(self._local(src)).type == FileType.Directory:
            copy_files(self._local(src), self._local(dst), source_filesystem=fs, destination_filesystem=fs)

    def _write(self, uri: str, text: str) -> None:
        fs, _ = self._fs()
        write_text(fs, self._local(uri), text)

    def _read(self, uri: str) -> str:
        fs, _ = self._fs()
        return read_text(fs, self._local(uri))

    def _subfolders(self, folder: str) -> list[str]:
        from pyarrow.fs import FileSelector, FileType

        fs, _ = self._fs()
        infos = fs.get_file_info(FileSelector(self._local(folder), allow_not_found=True))
        return sorted(i.base_name for i in infos if i.type == FileType.Directory)

    def _list(self, folder: str, suffix: str) -> list[str]:
        """Names (without ``suffix``) of the files ending in ``suffix`` in ``folder``, sorted."""
        from pyarrow.fs import FileSelector, FileType

        fs, _ = self._fs()
        infos = fs.get_file_info(FileSelector(self._local(folder), allow_not_found=True))
        return sorted(
            i.base_name[: -len(suffix)] for i in infos if i.type == FileType.File and i.base_name.endswith(suffix)
        )

    # epochs -------------------------------------------------------------------------------

    def current_epoch(self, slice_id: str) -> str | None:
        """The epoch of the latest attempt of ``slice_id`` (``None`` before its first)."""
        if not self._exists(self.epoch_file(slice_id)):
            return None
        return str(json.loads(self._read(self.epoch_file(slice_id)))["epoch"])

    def new_epoch(self, slice_id: str) -> str:
        """Start a new attempt of ``slice_id``: record and return its epoch ``<n>-<random>``, ``n``
        one above every earlier attempt's. From now on older attempts are superseded.

        :param slice_id: the slice about to run.
        """
        numbers = [
            int(m.group(1))
            for name in self._subfolders(f"{self.root}/attempts/{slice_id}")
            if (m := _EPOCH.fullmatch(name))
        ]
        current = self.current_epoch(slice_id)
        if current and (m := _EPOCH.fullmatch(current)):
            numbers.append(int(m.group(1)))
        epoch = f"{max(numbers, default=0) + 1:04d}-{secrets.token_hex(4)}"
        self._write(self.epoch_file(slice_id), json.dumps({"epoch": epoch}))
        return epoch

    def check_epoch(self, slice_id: str, epoch: str, cause: BaseException | None = None) -> None:
        """Raise unless ``epoch`` is still the current epoch of ``slice_id``.

        :param cause: the error the attempt's run failed with, chained to the one raised here.
        :raises KappaSupersededError: a newer attempt of the slice started.
        """
        current = self.current_epoch(slice_id)
        if current != epoch:
            raise KappaSupersededError(
                f"slice {slice_id}: this attempt (epoch {epoch!r}) was superseded by a newer attempt (epoch {current!r}); "
                "its commits to staging are refused, it keeps no checkpoint and records nothing done"
                + (f" (its Spark run ended with {type(cause).__name__})" if cause is not None else "")
            ) from cause

    def record_session(self, slice_id: str, epoch: str, session: dict[str, str] | None) -> None:
        """Record the Spark Connect session (``{"server": redacted URL, "session_id"}``) the attempt
        ``epoch`` runs in, so that the next attempt can stop it (``steps._stop_previous_session``);
        ``None`` once the session ended with its run.

        :raises KappaSupersededError: a newer attempt of the slice started.
        """
        self.check_epoch(slice_id, epoch)
        record: dict[str, Any] = {"epoch": epoch}
        if session is not None:
            record["session"] = session
        self._write(self.epoch_file(slice_id), json.dumps(record))

    def session(self, slice_id: str) -> dict[str, str] | None:
        """The Spark Connect session the latest attempt of ``slice_id`` recorded, if any."""
        if not self._exists(self.epoch_file(slice_id)):
            return None
        session = json.loads(self._read(self.epoch_file(slice_id))).get("session")
        return dict(session) if isinstance(session, dict) else None

    def _drop_other_attempts(self, slice_id: str, epoch: str) -> None:
        """Remove the checkpoint folders of the attempts of ``slice_id`` other than ``epoch``'s."""
        for name in self._subfolders(f"{self.root}/attempts/{slice_id}"):
            if name != epoch:
                self._delete(self.attempt(slice_id, name))

    # sequential ---------------------------------------------------------------------------

    def kept_boundary(self, slice_id: str) -> str | None:
        """The checkpoint kept at the start of sequential slice ``slice_id``: the copy
        ``boundaries/<slice_id>/<epoch>/`` made by the current attempt of the slice before it, complete
        (its marker, written last, names that slice), else ``None``. A copy made by a superseded
        attempt never counts, whenever it lands: each attempt copies into its own epoch's folder."""
        for epoch in self._subfolders(self.boundary(slice_id)):
            marker = f"{self.boundary(slice_id)}/{epoch}/{MARKER}"
            if self._exists(marker):
                after = json.loads(self._read(marker)).get("after")
                if after is not None and self.current_epoch(str(after)) == epoch:
                    return f"{self.boundary(slice_id)}/{epoch}"
        return None

    def boundary_ready(self, slice_id: str) -> bool:
        """Whether the checkpoint at the start of ``slice_id`` was completely kept (:meth:`kept_boundary`)."""
        return self.kept_boundary(slice_id) is not None

    def start_sequential(self, slice_id: str, index: int, next_slice_id: str | None, epoch: str) -> str:
        """Prepare the checkpoint of attempt ``epoch`` of slice ``slice_id``: empty for the first
        slice, else a copy of its boundary; the next slice's boundary and this slice's done record
        are invalidated (they are rewritten when this attempt succeeds).

        :param slice_id: the slice about to run.
        :param index: its position (0 = first slice).
        :param next_slice_id: the slice after it, ``None`` for the last one.
        :param epoch: the attempt's epoch (:meth:`new_epoch`).
        :returns: the checkpoint folder the run uses (:meth:`attempt`).
        :raises KappaSinkError: when the boundary of a later slice is missing (the slice before
            it has not succeeded).
        """
        kept = self.kept_boundary(slice_id) if index > 0 else None
        if index > 0 and kept is None:
            raise KappaSinkError(
                f"sequential slice {slice_id}: no checkpoint kept at its start ({self.boundary(slice_id)}); "
                "the slice before it has not succeeded; run slices in order"
            )
        self.check_epoch(slice_id, epoch)
        self._delete(self.done_file(slice_id))
        if next_slice_id is not None:
            self._delete(self.boundary(next_slice_id))
        folder = self.attempt(slice_id, epoch)
        if index == 0:
            self._delete(folder)
        else:
            self._copy_dir(str(kept), folder)
            self._delete(f"{folder}/{MARKER}")
        return folder

    def finish_sequential(self, slice_id: str, next_slice_id: str | None, metrics: dict[str, Any], epoch: str) -> None:
        """Keep the checkpoint of attempt ``epoch`` as the boundary of the next slice (marker last)
        and record ``slice_id`` done, if ``epoch`` is still current; drop older attempts' folders.

        :param slice_id: the slice that succeeded.
        :param next_slice_id: the slice after it, ``None`` for the last one.
        :param metrics: the run's metrics (JSON-able).
        :param epoch: the attempt's epoch.
        :raises KappaSupersededError: a newer attempt of the slice started meanwhile.
        """
        self.check_epoch(slice_id, epoch)
        if next_slice_id is not None:
            target = f"{self.boundary(next_slice_id)}/{epoch}"  # its own: a stale attempt's copy lands beside it
            self._copy_dir(self.attempt(slice_id, epoch), target)
            self._write(f"{target}/{MARKER}", json.dumps({"after": slice_id, "epoch": epoch}))
        self.check_epoch(slice_id, epoch)
        self._write(self.done_file(slice_id), json.dumps(metrics, sort_keys=True))
        self._drop_other_attempts(slice_id, epoch)
        if next_slice_id is not None:
            for other in self._subfolders(self.boundary(next_slice_id)):
                if other != epoch:
                    self._delete(f"{self.boundary(next_slice_id)}/{other}")

    # parallel -----------------------------------------------------------------------------

    def start_parallel(self, slice_id: str, epoch: str) -> str:
        """Prepare the (empty) checkpoint of attempt ``epoch`` of a parallel slice; return its folder."""
        self.check_epoch(slice_id, epoch)
        self._delete(self.done_file(slice_id))
        self._delete(self.attempt(slice_id, epoch))
        return self.attempt(slice_id, epoch)

    def finish_parallel(self, slice_id: str, metrics: dict[str, Any], epoch: str) -> None:
        """Record a parallel slice done if ``epoch`` is still current; drop older attempts' folders."""
        self.check_epoch(slice_id, epoch)
        self._write(self.done_file(slice_id), json.dumps(metrics, sort_keys=True))
        self._drop_other_attempts(slice_id, epoch)

    # both ---------------------------------------------------------------------------------

    def record_progress(self, slice_id: str, records: list[dict[str, Any]]) -> str:
        """Keep the Spark progress records of a slice's run (one JSON per line); return where."""
        path = self.progress_file(slice_id)
        self._write(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
        return path

    def done(self, slice_id: str) -> dict[str, Any] | None:
        """The metrics of the slice's last successful run, ``None`` if it has not succeeded since it last started."""
        if not self._exists(self.done_file(slice_id)):
            return None
        return json.loads(self._read(self.done_file(slice_id)))  # type: ignore[no-any-return]

    def progress(self) -> dict[str, list[dict[str, Any]]]:
        """Slice id -> the Spark progress records kept of its last run, for every slice that ran."""
        return {
            slice_id: [
                json.loads(line) for line in self._read(self.progress_file(slice_id)).splitlines() if line.strip()
            ]
            for slice_id in self._list(f"{self.root}/progress", ".jsonl")
        }

    def done_all(self) -> list[dict[str, Any]]:
        """The metrics of every slice recorded done (:meth:`done`), in slice order."""
        return [
            json.loads(self._read(self.done_file(slice_id))) for slice_id in self._list(f"{self.root}/done", ".json")
        ]
