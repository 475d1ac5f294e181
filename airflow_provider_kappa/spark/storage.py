"""Small files on any filesystem pyarrow knows (local paths, ``file://``, ``s3://``, ``gs://``, ``hdfs://``).

Used inside Spark (the readers' scan plan files) and by the launcher (checkpoints, plan files).
"""

from __future__ import annotations

import errno
import os
from typing import TYPE_CHECKING

from airflow_provider_kappa.exceptions import KappaSinkError

if TYPE_CHECKING:
    from pyarrow.fs import FileSystem


def filesystem(uri: str, what: str, error: type[Exception] = KappaSinkError) -> tuple[FileSystem, str]:
    """The pyarrow filesystem and path of ``uri`` (a path without a scheme is local).

    :param uri: a local path or a URI pyarrow knows (``file://``, ``s3://``, ``gs://``, ``hdfs://``).
    :param what: names ``uri`` in the error (e.g. ``"checkpoint folder"``).
    :param error: the exception type raised when pyarrow cannot reach it.
    """
    from pyarrow.fs import FileSystem, LocalFileSystem

    if "://" not in uri:
        return LocalFileSystem(), uri
    try:
        return FileSystem.from_uri(uri)  # type: ignore[no-any-return]
    except Exception as e:  # pyarrow raises ArrowInvalid / OSError for unknown schemes
        raise error(f"{what} {uri!r} is not reachable by pyarrow.fs: {e}") from e


def write_text(fs: FileSystem, path: str, text: str) -> None:
    """Write ``text`` to ``path`` of ``fs``, creating its folder."""
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(path) as out:
        out.write(text.encode())


def first_missing(fs: FileSystem, path: str) -> str | None:
    """The topmost of ``path`` and its parents that does not exist on ``fs`` (the first folder a write
    to ``path`` would create); ``None`` when ``path`` exists."""
    from pyarrow.fs import FileType

    missing = None
    while path and fs.get_file_info(path).type == FileType.NotFound:
        # the parent is always shorter (rsplit drops the last "/" at least): the walk ends
        missing, path = path, path.rsplit("/", 1)[0] if "/" in path else ""
    return missing


def remove_empty_folders(fs: FileSystem, path: str, top: str) -> None:
    """Remove ``path`` and its parents up to ``top`` (both included), bottom-up, each only while it
    is empty: the walk stops at the first folder that holds anything, so what another process wrote
    there meanwhile stays. A folder already gone is passed over (its parent may still be empty).

    Local folders go with ``os.rmdir`` (atomic: it refuses a folder that is not empty). On other
    filesystems (object stores, HDFS) pyarrow's ``delete_dir`` is recursive, so a folder is deleted
    only when a listing shows it empty; a write landing between that listing and the delete would
    be lost, a window of one request there.

    :raises OSError: a folder that cannot be removed for another reason than holding something.
    """
    from pyarrow.fs import FileSelector, FileType, LocalFileSystem

    top = top.rstrip("/")
    while path == top or path.startswith(f"{top}/"):
        if isinstance(fs, LocalFileSystem):
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except OSError as e:
                if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
                    return
                raise
        elif fs.get_file_info(path).type != FileType.NotFound:
            if fs.get_file_info(FileSelector(path, allow_not_found=True)):
                return
            fs.delete_dir(path)
        parent = path.rsplit("/", 1)[0]
        if parent == path:  # a bucket or a relative name: nothing above it
            return
        path = parent


def read_text(fs: FileSystem, path: str) -> str:
    """The text at ``path`` of ``fs`` (``OSError`` when it cannot be read)."""
    with fs.open_input_stream(path) as fh:
        return bytes(fh.read()).decode()
