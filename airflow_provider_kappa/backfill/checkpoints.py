"""Backfill checkpoints: one folder per backfill, laid out as docs/architecture.md says.

``<checkpoint_root>/<job>/backfill/<backfill_id>/``

- ``shared/``: the one checkpoint of a sequential backfill (state flows slice to slice).
- ``boundaries/<slice_id>/``: a copy of ``shared/`` as it was when that slice started, written
  when the previous slice succeeded. Every run of a sequential slice (first run, retry after a
  killed driver, or a clear in Airflow) restores its boundary into ``shared/`` first, so it
  always starts from the checkpoint left by the last successful run of the slice before it.
  A boundary is complete when its ``_KAPPA_BOUNDARY`` marker exists (written last).
- ``slices/<slice_id>/``: the own checkpoint of a parallel slice, wiped before each run.
- ``done/<slice_id>.json``: the metrics of a slice's last successful run (removed when it reruns).
- ``progress/<slice_id>.jsonl``: the Spark ``StreamingQueryProgress`` records of its last run.
- ``plans/<slice_id>/<source>.json``: the file list of each source for the slice's read range,
  written by the launcher before each run and read by the slice's ``kappa_iceberg`` readers
  (``spark/source/file_list.py``).

Any filesystem pyarrow knows (local paths, ``file://``, ``s3://``, ``gs://``, ``hdfs://``) works.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from airflow_provider_kappa.exceptions import KappaSinkError
from airflow_provider_kappa.spark.storage import filesystem, read_text, write_text

if TYPE_CHECKING:
    from pyarrow.fs import FileSystem

MARKER = "_KAPPA_BOUNDARY"


def backfill_root(checkpoint_root: str, job: str, backfill_id: str) -> str:
    """``<checkpoint_root>/<job>/backfill/<backfill_id>``.

    :param checkpoint_root: ``job.checkpoint_root`` of the config.
    :param job: the job name.
    :param backfill_id: the backfill id.
    """
    return f"{checkpoint_root.rstrip('/')}/{job}/backfill/{backfill_id}"


class CheckpointStore:
    """The checkpoint folders of one backfill.

    :param root: the backfill's folder (see :func:`backfill_root`).
    """

    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/")

    def _fs(self) -> tuple[FileSystem, str]:
        return filesystem(self.root, "checkpoint folder")

    # paths --------------------------------------------------------------------------------

    @property
    def shared(self) -> str:
        """The shared checkpoint of a sequential backfill."""
        return f"{self.root}/shared"

    def boundary(self, slice_id: str) -> str:
        """The copy of ``shared`` taken at the start of slice ``slice_id``."""
        return f"{self.root}/boundaries/{slice_id}"

    def own(self, slice_id: str) -> str:
        """The own checkpoint of a parallel slice."""
        return f"{self.root}/slices/{slice_id}"

    def plan_file(self, slice_id: str, source: str) -> str:
        """Where the launcher keeps the scan plan of ``source`` for a run of ``slice_id``."""
        return f"{self.root}/plans/{slice_id}/{source}.json"

    def done_file(self, slice_id: str) -> str:
        """Where the metrics of a slice's last successful run are kept."""
        return f"{self.root}/done/{slice_id}.json"

    def progress_file(self, slice_id: str) -> str:
        """Where the Spark progress records of a slice's last run are kept."""
        return f"{self.root}/progress/{slice_id}.jsonl"

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

    def _list(self, folder: str, suffix: str) -> list[str]:
        """Names (without ``suffix``) of the files ending in ``suffix`` in ``folder``, sorted."""
        from pyarrow.fs import FileSelector, FileType

        fs, _ = self._fs()
        infos = fs.get_file_info(FileSelector(self._local(folder), allow_not_found=True))
        return sorted(i.base_name[: -len(suffix)] for i in infos if i.type == FileType.File and i.base_name.endswith(suffix))

    # sequential ---------------------------------------------------------------------------

    def boundary_ready(self, slice_id: str) -> bool:
        """Whether the checkpoint at the start of ``slice_id`` was completely kept."""
        return self._exists(f"{self.boundary(slice_id)}/{MARKER}")

    def start_sequential(self, slice_id: str, index: int, next_slice_id: str | None) -> str:
        """Prepare ``shared`` for a run of slice ``slice_id``: empty for the first slice, else
        restored from its boundary; the next slice's boundary and this slice's done record are
        invalidated (they are rewritten when this run succeeds).

        :param slice_id: the slice about to run.
        :param index: its position (0 = first slice).
        :param next_slice_id: the slice after it, ``None`` for the last one.
        :returns: the checkpoint folder the run uses (``shared``).
        :raises KappaSinkError: when the boundary of a later slice is missing (the slice before
            it has not succeeded).
        """
        if index > 0 and not self.boundary_ready(slice_id):
            raise KappaSinkError(
                f"sequential slice {slice_id}: no checkpoint kept at its start ({self.boundary(slice_id)}); "
                "the slice before it has not succeeded; run slices in order"
            )
        self._delete(self.done_file(slice_id))
        if next_slice_id is not None:
            self._delete(self.boundary(next_slice_id))
        if index == 0:
            self._delete(self.shared)
        else:
            self._copy_dir(self.boundary(slice_id), self.shared)
            self._delete(f"{self.shared}/{MARKER}")
        return self.shared

    def finish_sequential(self, slice_id: str, next_slice_id: str | None, metrics: dict[str, Any]) -> None:
        """Keep ``shared`` as the boundary of the next slice (marker last) and record ``slice_id`` done.

        :param slice_id: the slice that succeeded.
        :param next_slice_id: the slice after it, ``None`` for the last one.
        :param metrics: the run's metrics (JSON-able).
        """
        if next_slice_id is not None:
            target = self.boundary(next_slice_id)
            self._copy_dir(self.shared, target)
            self._write(f"{target}/{MARKER}", json.dumps({"after": slice_id}))
        self._write(self.done_file(slice_id), json.dumps(metrics, sort_keys=True))

    # parallel -----------------------------------------------------------------------------

    def start_parallel(self, slice_id: str) -> str:
        """Wipe the own checkpoint of a parallel slice; return its folder."""
        self._delete(self.own(slice_id))
        self._delete(self.done_file(slice_id))
        return self.own(slice_id)

    def finish_parallel(self, slice_id: str, metrics: dict[str, Any]) -> None:
        """Record a parallel slice done."""
        self._write(self.done_file(slice_id), json.dumps(metrics, sort_keys=True))

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
            slice_id: [json.loads(line) for line in self._read(self.progress_file(slice_id)).splitlines() if line.strip()]
            for slice_id in self._list(f"{self.root}/progress", ".jsonl")
        }

    def done_all(self) -> list[dict[str, Any]]:
        """The metrics of every slice recorded done (:meth:`done`), in slice order."""
        return [json.loads(self._read(self.done_file(slice_id))) for slice_id in self._list(f"{self.root}/done", ".json")]
