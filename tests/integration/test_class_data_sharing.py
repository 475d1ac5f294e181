"""Class data sharing for the driver JVM of kappa's spark-submits: the archive is written once
(one writer at a time, never half a file), mapped by later runs, and left out where it
cannot apply. The last test runs two real spark-submits and reads the JVM's own class-load
log to see Spark's classes come from the archive."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from airflow_provider_kappa.engine import class_data_sharing as cds
from airflow_provider_kappa.engine.submit import submit


@pytest.fixture()
def home(tmp_path: Path) -> Path:
    """A Spark home with two jars (the archive key reads their folder, names and sizes only)."""
    jars = tmp_path / "spark" / "jars"
    jars.mkdir(parents=True)
    (jars / "spark-core.jar").write_bytes(b"x" * 10)
    (jars / "spark-sql.jar").write_bytes(b"y" * 20)
    return tmp_path / "spark"


def options(sharing: cds.ClassDataSharing) -> str:
    return sharing.conf[cds.JAVA_OPTIONS]


def test_the_first_run_writes_the_archive_and_later_runs_map_it(tmp_path: Path, home: Path) -> None:
    folder = tmp_path / "cache"
    user = {cds.JAVA_OPTIONS: "-Dmy.flag=1", "spark.app.name": "x"}
    first = cds.plan(user, home=home, folder=folder)
    assert first is not None and first.writing is not None
    assert options(first).startswith("-Dmy.flag=1 ")  # the user's options kept, first
    assert f"-XX:ArchiveClassesAtExit={first.writing}" in options(first)
    assert first.writing.parent == folder and first.lock.exists()
    assert user[cds.JAVA_OPTIONS] == "-Dmy.flag=1"  # the caller's conf is not modified

    # while the first run writes, another run neither writes nor maps
    assert cds.plan(user, home=home, folder=folder) is None

    first.writing.write_bytes(b"archive")  # what the JVM does at exit
    first.keep()
    assert first.archive.read_bytes() == b"archive"
    assert not first.lock.exists() and not list(folder.glob("*.tmp"))

    later = cds.plan(user, home=home, folder=folder)
    assert later is not None and later.writing is None
    assert f"-XX:SharedArchiveFile={first.archive}" in options(later) and "-Xshare:auto" in options(later)
    assert "-Xlog:cds*=off" in options(later)
    later.keep()  # mapping runs leave the archive alone
    assert first.archive.exists()


def test_a_failed_or_killed_run_leaves_no_archive_and_releases_the_lock(tmp_path: Path, home: Path) -> None:
    folder = tmp_path / "cache"
    failed = cds.plan({}, home=home, folder=folder)
    assert failed is not None and failed.writing is not None
    failed.writing.write_bytes(b"half")
    failed.abandon()
    assert not failed.archive.exists() and not failed.lock.exists() and not list(folder.glob("*.tmp"))

    killed = cds.plan({}, home=home, folder=folder)  # a JVM killed before exit writes nothing
    assert killed is not None
    killed.keep()
    assert not killed.archive.exists() and not killed.lock.exists()


def test_a_stale_lock_is_taken_over(tmp_path: Path, home: Path) -> None:
    folder = tmp_path / "cache"
    dead = cds.plan({}, home=home, folder=folder)
    assert dead is not None
    old = time.time() - cds.STALE_LOCK_SECONDS - 60
    os.utime(dead.lock, (old, old))
    again = cds.plan({}, home=home, folder=folder)
    assert again is not None and again.writing is not None


def test_the_lock_of_a_writer_that_is_gone_is_taken_over_at_once(tmp_path: Path, home: Path) -> None:
    folder = tmp_path / "cache"
    held = cds.plan({}, home=home, folder=folder)
    assert held is not None and held.writing is not None
    assert held.lock.read_text() == f"{os.getpid()} {socket.gethostname()}\n"
    # a live writer on this host holds it; so does one of another host (a shared cache), whatever its pid
    assert cds.plan({}, home=home, folder=folder) is None
    gone = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True, check=True).stdout.strip()
    held.lock.write_text(f"{gone} elsewhere.example\n")
    assert cds.plan({}, home=home, folder=folder) is None
    # a SIGKILLed writer of this host: its pid runs no more, so the lock is free long before its age frees it
    held.lock.write_text(f"{gone} {socket.gethostname()}\n")
    again = cds.plan({}, home=home, folder=folder)
    assert again is not None and again.writing is not None
    assert again.lock.read_text() == f"{os.getpid()} {socket.gethostname()}\n"


@pytest.mark.parametrize(
    ("conf", "on_cluster"),
    [
        ({}, True),
        ({"spark.submit.deployMode": "cluster"}, False),
        ({cds.JAVA_OPTIONS: "-Xshare:off"}, False),
        ({cds.JAVA_OPTIONS: "-XX:SharedArchiveFile=/mine.jsa"}, False),
    ],
    ids=["connection-cluster-mode", "conf-cluster-mode", "user-xshare-off", "user-archive"],
)
def test_not_applied_where_it_cannot_or_should_not(
    tmp_path: Path, home: Path, conf: dict[str, str], on_cluster: bool
) -> None:
    assert cds.plan(conf, driver_on_cluster=on_cluster, home=home, folder=tmp_path / "cache") is None
    assert not (tmp_path / "cache").exists()


def test_no_spark_jars_no_archive(tmp_path: Path) -> None:
    assert cds.plan({}, home=tmp_path, folder=tmp_path / "cache") is None


def test_the_archive_key_follows_spark_java_and_class_path(home: Path) -> None:
    java = cds.java_binary()
    assert java is not None
    key = cds.archive_key(java, home)
    assert key == cds.archive_key(java, home)
    assert key != cds.archive_key(java, home, "/opt/extra.jar")
    (home / "jars" / "kafka.jar").write_bytes(b"z")
    assert key != cds.archive_key(java, home)
    # a JVM that is not a job's driver (the local Connect server) gets an archive of its own
    assert cds.archive_key(java, home, main_class="org.example.Server") not in (key, cds.archive_key(java, home))
    # the same jars in another folder (another venv's Spark): the JDK would refuse to map this one there
    other = home.parent / "other-venv-spark"
    shutil.copytree(home, other)
    assert cds.archive_key(java, other) != cds.archive_key(java, home)


def test_a_jvm_that_may_only_map_writes_no_archive(tmp_path: Path, home: Path) -> None:
    folder = tmp_path / "cache"
    assert cds.plan({}, home=home, folder=folder, write=False) is None
    assert not folder.exists()
    first = cds.plan({}, home=home, folder=folder)
    assert first is not None and first.writing is not None
    first.writing.write_bytes(b"archive")
    first.keep()
    mapped = cds.plan({}, home=home, folder=folder, write=False)
    assert mapped is not None and mapped.writing is None and f"SharedArchiveFile={first.archive}" in options(mapped)


APP = """
from pyspark.sql import SparkSession
spark = SparkSession.builder.getOrCreate()
assert spark.range(10).count() == 10
spark.stop()
"""


def test_real_spark_submits_write_then_map_the_archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """First spark-submit writes the archive; the second loads Spark's classes from it
    (the JVM's class-load log says "shared objects file (top)": the dynamic archive)."""
    monkeypatch.setenv(cds.CACHE_ENV, str(tmp_path / "cache"))
    app = tmp_path / "app.py"
    app.write_text(APP)
    conf = {"spark.ui.enabled": "false", "spark.driver.host": "127.0.0.1"}
    submit(app, conf, properties_file=tmp_path / "one.properties", name="kappa-cds-one", master="local[1]")
    archives = list((tmp_path / "cache").glob("spark-*.jsa"))
    assert len(archives) == 1 and archives[0].stat().st_size > 1_000_000
    assert not list((tmp_path / "cache").glob("*.lock")) and not list((tmp_path / "cache").glob("*.tmp"))

    loads = tmp_path / "class-load.log"
    conf[cds.JAVA_OPTIONS] = f"-Xlog:class+load=info:file={loads}"
    submit(app, conf, properties_file=tmp_path / "two.properties", name="kappa-cds-two", master="local[1]")
    context = [line for line in loads.read_text().splitlines() if " org.apache.spark.SparkContext " in line]
    assert context and "shared objects file (top)" in context[0], context
    assert "SharedArchiveFile" in (tmp_path / "two.properties").read_text()


def test_a_local_connect_server_writes_its_own_archive_when_stopped_and_the_next_one_maps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kappa's local Spark Connect server: the first on the machine writes an archive of its own (not
    a driver's) as its JVM ends on the stop's SIGTERM; the next server's JVM maps it (seen in its
    memory maps); a server another process will stop (``write_archive=False``) only maps."""
    from airflow_provider_kappa.engine.connect_server import SERVER_CLASS, LocalConnectServer

    cache = tmp_path / "cache"
    monkeypatch.setenv(cds.CACHE_ENV, str(cache))
    conf = {"spark.ui.enabled": "false"}
    unwritten = LocalConnectServer(None, tmp_path / "none", master="local[1]", conf=conf, write_archive=False)
    unwritten.command(15002)
    assert unwritten.sharing is None and not cache.exists()

    with LocalConnectServer(None, tmp_path / "first", master="local[1]", conf=conf) as first:
        assert first.sharing is not None and first.sharing.writing is not None
        archive = first.sharing.archive
    assert archive.is_file() and archive.stat().st_size > 1_000_000
    assert not list(cache.glob("*.lock")) and not list(cache.glob("*.tmp"))
    java, home = cds.java_binary(), cds.spark_home()
    assert java is not None and home is not None
    assert archive.name == f"spark-{cds.archive_key(java, home, main_class=SERVER_CLASS)}.jsa"

    with LocalConnectServer(None, tmp_path / "next", master="local[1]", conf=conf, write_archive=False) as server:
        assert server.sharing is not None and server.sharing.writing is None
        assert server.proc is not None
        assert str(archive) in Path(f"/proc/{server.proc.pid}/maps").read_text()
    assert archive.is_file()


def test_job_class_data_sharing_false_leaves_the_conf_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    monkeypatch.setenv(cds.CACHE_ENV, str(tmp_path / "cache"))
    launched: list[str] = []
    # the process boundary: the spark-submit process itself is not started
    monkeypatch.setattr(SparkSubmitHook, "submit", lambda hook, application="", **_: launched.append(application))
    app = tmp_path / "app.py"
    app.write_text(APP)
    submit(
        app,
        {},
        properties_file=tmp_path / "off.properties",
        name="kappa-cds-off",
        master="local[1]",
        class_data_sharing=False,
    )
    assert launched == [str(app)]
    assert not (tmp_path / "cache").exists()
    assert "XX:" not in (tmp_path / "off.properties").read_text()


def test_archives_unused_for_a_month_are_removed_when_a_new_one_is_kept(tmp_path: Path, home: Path) -> None:
    folder = tmp_path / "cache"
    folder.mkdir()
    month = cds.UNUSED_ARCHIVE_SECONDS
    old = folder / "spark-0ldjdk.jsa"  # another JDK's archive, not mapped for over a month
    recent = folder / "spark-0thersp.jsa"  # another Spark's, mapped a week ago: still in use
    killed = folder / "spark-0ldjdk.123.456.jsa.tmp"  # left by a run killed while writing
    unrelated = folder / "notes.txt"
    for path, age in (
        (old, month + 60),
        (recent, 7 * 86400),
        (killed, 2 * cds.STALE_LOCK_SECONDS),
        (unrelated, 10 * month),
    ):
        path.write_bytes(b"x")
        os.utime(path, (time.time() - age, time.time() - age))

    first = cds.plan({}, home=home, folder=folder)
    assert first is not None and first.writing is not None
    first.writing.write_bytes(b"archive")
    first.keep()
    assert sorted(p.name for p in folder.iterdir()) == sorted([first.archive.name, recent.name, unrelated.name])

    # mapping an archive marks it used, so an old but used archive is kept by the next prune
    os.utime(first.archive, (time.time() - 2 * month, time.time() - 2 * month))
    assert cds.plan({}, home=home, folder=folder) is not None
    assert time.time() - first.archive.stat().st_mtime < 60
    assert cds.prune(folder, keep=folder / "spark-other.jsa") == []
