"""What the processes a deployment started look like from outside, read from ``/proc``.

:class:`ProcessWatch` samples, in a thread, the command line and environment of every process
descended from (or in the session of) the servers a test started, so that a test can check what
a task's ``spark-submit``, its JVM and the job's Python driver were given, while they ran.
Only reads ``/proc``; never signals anything.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class ProcInfo:
    """One process as ``/proc/<pid>/stat`` tells: state (``Z`` for a zombie), parent, group, session."""

    pid: int
    state: str
    ppid: int
    pgrp: int
    session: int


def process_table() -> dict[int, ProcInfo]:
    """Every process visible now (processes that end while being read are left out)."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        # After the command name: state, ppid, pgrp, session, ...
        out[int(entry.name)] = ProcInfo(int(entry.name), fields[0], int(fields[1]), int(fields[2]), int(fields[3]))
    return out


def group_pids(pgid: int) -> list[int]:
    """Pids of the live (non-zombie) members of process group ``pgid``.

    :param pgid: a process group id (a server's pid: each leads its own group).
    """
    return sorted(p for p, info in process_table().items() if info.pgrp == pgid and info.state != "Z")


def naming(text: str) -> list[str]:
    """``<pid> <command line>`` of every process but this one whose command line holds ``text`` (a
    run's folder: its spark-submit JVM and driver name their properties file and checkpoint there,
    whatever session they run in)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:  # ended meanwhile
                continue
            if text in cmdline:
                found.append(f"{entry.name} {cmdline[:200]}")
    return found


def listening_ports(pgids: Iterable[int]) -> dict[int, str]:
    """TCP ports the members of process groups ``pgids`` listen on -> bound address (``/proc/net/tcp*``).

    :param pgids: process group ids (a server's pid: each leads its own group).
    """
    import socket

    inodes: set[str] = set()
    for pgid in pgids:
        for pid in group_pids(pgid):
            fd_dir = Path(f"/proc/{pid}/fd")
            try:
                for fd in fd_dir.iterdir():
                    target = str(fd.readlink()) if fd.is_symlink() else ""
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
            except (FileNotFoundError, PermissionError):
                continue
    out: dict[int, str] = {}
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            parts = line.split()
            local, state, inode = parts[1], parts[3], parts[9]
            if state != "0A" or inode not in inodes:  # 0A = LISTEN
                continue
            hex_addr, hex_port = local.split(":")
            raw = bytes.fromhex(hex_addr)
            if family == socket.AF_INET:
                addr = socket.inet_ntop(family, raw[::-1])
            else:
                addr = socket.inet_ntop(family, b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))
            out[int(hex_port, 16)] = addr
    return out


def descendants(roots: Iterable[int], table: dict[int, ProcInfo] | None = None) -> set[int]:
    """Pids of ``roots``, their descendants, and every process in the session of a root (a
    process re-parented to init after its parent ended still counts).

    :param roots: pids of servers the test started (each leads its own session).
    :param table: a :func:`process_table` (default: read now).
    """
    table = table if table is not None else process_table()
    ours = {p for p in roots if p in table}
    sessions = {table[p].session for p in ours}
    ours |= {p for p, info in table.items() if info.session in sessions}
    children: dict[int, list[int]] = {}
    for info in table.values():
        children.setdefault(info.ppid, []).append(info.pid)
    todo = list(ours)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in ours:
                ours.add(child)
                todo.append(child)
    return ours


@dataclass(frozen=True)
class SeenFile:
    """A file read while a process that named it was running."""

    path: str
    mode: int
    content: bytes


@dataclass
class ProcessWatch:
    """Samples processes under ``roots`` every ``interval`` seconds until stopped.

    Records each distinct command line and environment, and the files named after
    ``--properties-file`` (plus ``catalogs.json`` beside them): spark-submit's private conf.

    :param roots: pids of the servers (e.g. ``[s.pid for s in deployment.servers]``).
    :param interval: seconds between samples.
    """

    roots: list[int]
    interval: float = 0.5
    cmdlines: dict[tuple[int, str], None] = field(default_factory=dict)
    environs: dict[tuple[int, bytes], None] = field(default_factory=dict)
    files: dict[str, SeenFile] = field(default_factory=dict)
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _error: BaseException | None = None

    def __enter__(self) -> ProcessWatch:
        self._thread = threading.Thread(target=self._run, name="process-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._error is not None:
            raise RuntimeError(f"process watch failed: {self._error!r}") from self._error

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.sample()
                self._stop.wait(self.interval)
        except BaseException as e:  # reported by __exit__ in the test's thread
            self._error = e

    def sample(self) -> None:
        """Read every process under the roots once."""
        for pid in sorted(descendants(self.roots)):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                environ = Path(f"/proc/{pid}/environ").read_bytes()
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
            args = [a.decode(errors="replace") for a in argv if a]
            self.cmdlines.setdefault((pid, " ".join(args)), None)
            self.environs.setdefault((pid, environ), None)
            if "--properties-file" in args[:-1]:
                props = Path(args[args.index("--properties-file") + 1])
                for path in (props, props.parent / "catalogs.json"):
                    self._read(path)
        self.samples += 1

    def _read(self, path: Path) -> None:
        try:
            mode = stat.S_IMODE(os.stat(path).st_mode)
            content = path.read_bytes()
        except FileNotFoundError:
            return
        self.files[str(path)] = SeenFile(str(path), mode, content)

    def command_lines(self) -> list[str]:
        """Every distinct command line seen."""
        return sorted({c for _, c in self.cmdlines})
