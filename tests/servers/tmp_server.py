"""Helpers of the servers started in a fresh temporary folder (module fixtures): wait until one
answers (else stop it), and keep it for the span of a ``with`` block."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol, TypeVar

from servers import ServerProcess, wait_until


class Stoppable(Protocol):
    def stop(self) -> None: ...


S = TypeVar("S", bound=Stoppable)


@contextmanager
def server_in_tmp(prefix: str, start: Callable[[Path], S], describe: Callable[[S], str]) -> Iterator[S]:
    """Start a server in a new temporary folder, yield it, then stop it (by its pid) and remove the folder.

    :param prefix: the folder's name prefix.
    :param start: starts the server in the folder.
    :param describe: one line naming the started server (printed with its start time).
    """
    work = Path(tempfile.mkdtemp(prefix=prefix))
    began = time.monotonic()
    try:
        server = start(work)
        print(f"{describe(server)} started in {time.monotonic() - began:.1f}s")
        try:
            yield server
        finally:
            server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def ready_or_stopped(server: S, check: Callable[[], object], *, what: str, process: ServerProcess, timeout: float) -> S:
    """``server`` once ``check`` returns a true value; stopped (by its pid) when it dies or times out.

    :param server: the started server.
    :param check: a readiness probe (an exception means not ready yet).
    :param what: what is awaited, for the error.
    :param process: the server's process (its death ends the wait; its log goes in the error).
    :param timeout: seconds.
    :raises DeploymentError: it died, or did not answer in time (with its log tail).
    """
    try:
        wait_until(check, timeout=timeout, what=what, servers=[process])
    except BaseException:
        server.stop()
        raise
    return server
