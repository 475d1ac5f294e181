"""Class data sharing (JDK AppCDS) for the driver JVM of every spark-submit kappa launches, and for
the local Spark Connect server's JVM (an archive of its own, :func:`archive_key`'s ``main_class``).

Each slice is a fresh JVM that loads some 22,000 classes from Spark's jars before its first
micro-batch. The JDK can keep the classes one run loaded in an archive and map it into
later JVMs (``-XX:ArchiveClassesAtExit`` writes it, ``-XX:SharedArchiveFile`` reads it):
later runs skip finding, parsing and verifying those classes. Measured on the demo's
one-slice ``playback_sessions`` backfill (2 cores, Java 17): the slice's spark-submit took
50.8 s without the archive and 41.3 s with it (CPU 66 s -> 51 s); writing the archive costs
the first run about 20 s more. See ``docs/deployment.md``.

The archive is keyed by the ``java`` binary and by Spark's jar folder (its path, the jars' names and
sizes), so a different JDK, Spark or venv gets its own. One run at a time writes it (a lock file, taken with
``O_EXCL``); the others run without it meanwhile. It is written under a temporary name and
renamed once the run succeeded, so a killed run never leaves half an archive. A JVM that
cannot map the archive runs without it (``-Xshare:auto``): the archive changes speed only,
never results.

Pure Python; no pyspark import (the Spark home is found without importing pyspark).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from airflow_provider_kappa.spark.warm_daemon import pid_alive

log = logging.getLogger(__name__)

CACHE_ENV = "KAPPA_CACHE_DIR"
"""Environment variable naming the folder the archive is kept in."""

JAVA_OPTIONS = "spark.driver.extraJavaOptions"
STALE_LOCK_SECONDS = 30 * 60
"""A lock older than this belongs to a run that died while writing the archive (sooner when its
process on this host is gone: :func:`_take`)."""
UNUSED_ARCHIVE_SECONDS = 30 * 24 * 3600
"""An archive of another JDK, Spark or class path no run has mapped for this long is removed
when a new archive is kept (each is ~170 MB); a run that maps an archive marks it used."""

_QUIET = "-Xlog:cds*=off"  # the JDK logs every class it cannot archive; nothing a user can act on
_USER_CHOICES = ("-Xshare", "SharedArchiveFile", "ArchiveClassesAtExit", "DumpLoadedClassList")


def cache_dir() -> Path:
    """Where archives are kept: ``$KAPPA_CACHE_DIR``, else ``$XDG_CACHE_HOME`` or ``~/.cache``
    under ``airflow-provider-kappa/cds``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "airflow-provider-kappa" / "cds"


def spark_home() -> Path | None:
    """``$SPARK_HOME``, else the installed pyspark package (what its ``spark-submit`` uses)."""
    if os.environ.get("SPARK_HOME"):
        return Path(os.environ["SPARK_HOME"])
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def java_binary() -> Path | None:
    """The ``java`` spark-submit starts: ``$JAVA_HOME/bin/java``, else ``java`` on ``PATH``."""
    if os.environ.get("JAVA_HOME"):
        candidate = Path(os.environ["JAVA_HOME"]) / "bin" / "java"
        return candidate if candidate.exists() else None
    found = shutil.which("java")
    return Path(found).resolve() if found else None


def archive_key(java: Path, home: Path, extra_classpath: str = "", main_class: str | None = None) -> str | None:
    """A short hash naming the archive for this JDK, this Spark, this extra classpath and this main
    class; None when Spark's jar folder is missing.

    :param java: the java binary.
    :param home: the Spark home (holding ``jars/``).
    :param extra_classpath: ``spark.driver.extraClassPath`` (part of the JVM's class path).
    :param main_class: a JVM that is not a job's driver (the local Spark Connect server): it loads
        other classes, so it gets an archive of its own.
    """
    jars = home / "jars"
    if not jars.is_dir():
        return None
    digest = hashlib.sha256()
    stat = java.stat()
    digest.update(f"{java}|{stat.st_size}|{stat.st_mtime_ns}|{extra_classpath}\n".encode())
    # the folder too: the JDK maps an archive only into a JVM whose class path names the same jar paths, so the
    # same Spark in another venv (same jar names and sizes) needs an archive of its own
    digest.update(f"jars {jars.resolve()}\n".encode())
    if main_class is not None:
        digest.update(f"main {main_class}\n".encode())
    for jar in sorted(jars.glob("*.jar")):
        digest.update(f"{jar.name}|{jar.stat().st_size}\n".encode())
    return digest.hexdigest()[:16]


@dataclass
class ClassDataSharing:
    """The archive a run maps, or the archive it writes (then :meth:`keep` or :meth:`abandon`).

    :param conf: the run's Spark conf with the JVM options added.
    :param archive: the archive's final path.
    :param writing: the temporary file this run writes, or None when it maps the archive.
    """

    conf: dict[str, str]
    archive: Path
    writing: Path | None = None

    @property
    def lock(self) -> Path:
        """The lock file held while this run writes the archive."""
        return self.archive.with_name(self.archive.name + ".lock")

    def keep(self) -> None:
        """The run succeeded: move the archive it wrote into place and release the lock."""
        if self.writing is None:
            return
        try:
            if self.writing.is_file() and self.writing.stat().st_size > 0:
                os.replace(self.writing, self.archive)
                prune(self.archive.parent, keep=self.archive)
        finally:
            self.abandon()

    def abandon(self) -> None:
        """The run failed: drop what it wrote and release the lock."""
        if self.writing is None:
            return
        self.writing.unlink(missing_ok=True)
        self.lock.unlink(missing_ok=True)
        self.writing = None


def plan(
    conf: Mapping[str, str],
    *,
    driver_on_cluster: bool = False,
    home: Path | None = None,
    folder: Path | None = None,
    main_class: str | None = None,
    write: bool = True,
) -> ClassDataSharing | None:
    """Add class data sharing to a spark-submit's conf; None when it does not apply: the
    driver runs on a cluster (deploy mode ``cluster``: the archive is local), the user chose CDS
    options already, Spark's jars or ``java`` cannot be found, or another run is writing
    the archive right now.

    :param conf: the run's Spark conf (not modified).
    :param driver_on_cluster: the Spark connection's deploy mode is ``cluster``.
    :param home: the Spark home the connection names (default :func:`spark_home`).
    :param folder: where archives live (default :func:`cache_dir`).
    :param main_class: the JVM's main class when it is not a job's driver (:func:`archive_key`).
    :param write: write the archive when there is none (False: map one only; a JVM this process
        will not see end cannot :meth:`~ClassDataSharing.keep` what it wrote).
    """
    if driver_on_cluster or conf.get("spark.submit.deployMode", "client") == "cluster":
        return None
    user = conf.get(JAVA_OPTIONS, "")
    if any(choice in user for choice in _USER_CHOICES):
        return None
    java, home = java_binary(), home or spark_home()
    if java is None or home is None:
        return None
    key = archive_key(java, home, conf.get("spark.driver.extraClassPath", ""), main_class)
    if key is None:
        return None
    folder = folder or cache_dir()
    archive = folder / f"spark-{key}.jsa"
    out = dict(conf)
    if archive.is_file():
        _mark_used(archive)
        out[JAVA_OPTIONS] = " ".join(filter(None, [user, f"-XX:SharedArchiveFile={archive}", "-Xshare:auto", _QUIET]))
        return ClassDataSharing(conf=out, archive=archive)
    if not write:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    sharing = ClassDataSharing(conf=out, archive=archive)
    if not _take(sharing.lock):
        return None
    sharing.writing = folder / f"spark-{key}.{os.getpid()}.{time.monotonic_ns()}.jsa.tmp"
    out[JAVA_OPTIONS] = " ".join(filter(None, [user, f"-XX:ArchiveClassesAtExit={sharing.writing}", _QUIET]))
    return sharing


def prune(folder: Path, keep: Path, now: float | None = None) -> list[Path]:
    """Remove archives (``spark-*.jsa``) other than ``keep`` that no run has mapped for
    :data:`UNUSED_ARCHIVE_SECONDS`, and temporary files of runs killed while writing one
    (older than :data:`STALE_LOCK_SECONDS`). Returns what was removed.

    :param folder: the archive folder.
    :param keep: the archive just kept.
    :param now: the current time (default ``time.time()``).
    """
    now = time.time() if now is None else now
    removed = []
    for path, limit in [
        *((p, UNUSED_ARCHIVE_SECONDS) for p in folder.glob("spark-*.jsa")),
        *((p, STALE_LOCK_SECONDS) for p in folder.glob("spark-*.jsa.tmp")),
    ]:
        try:
            if path != keep and now - path.stat().st_mtime > limit:
                path.unlink()
                removed.append(path)
        except FileNotFoundError:
            continue  # another run removed or renamed it meanwhile
    for path in removed:
        log.info("removed class data sharing file %s (unused for over %d days)", path, UNUSED_ARCHIVE_SECONDS // 86400)
    return removed


def _mark_used(archive: Path) -> None:
    """Set the archive's modification time to now: :func:`prune` keeps archives in use."""
    try:
        os.utime(archive)
    except OSError as e:  # a read-only shared cache: the archive is still mapped, only not marked
        log.debug("cannot mark %s used: %s", archive, e)


def _take(lock: Path) -> bool:
    """Create ``lock`` exclusively (it names this process and host); a lock older than
    :data:`STALE_LOCK_SECONDS`, or one whose process on this host is gone (a SIGKILLed writer), is
    taken over."""
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            try:
                age = time.time() - lock.stat().st_mtime
                holder = lock.read_text()
            except FileNotFoundError:
                continue
            if age < STALE_LOCK_SECONDS and not _holder_gone(holder):
                return False
            log.info("taking over the class archive lock %s of a writer that is gone (%s)", lock, holder.strip())
            lock.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as fh:
            fh.write(f"{os.getpid()} {socket.gethostname()}\n")
        return True
    return False


def _holder_gone(holder: str) -> bool:
    """True when a lock's ``"<pid> <host>"`` names a process of this host that no longer runs. A lock of
    another host (a shared cache folder), or one unreadable, counts as held: only its age frees it."""
    pid, _, host = holder.strip().partition(" ")
    return pid.isdigit() and host == socket.gethostname() and not pid_alive(int(pid))
