"""``make test-compat``: both ends of the supported Python range, and Spark 4.1, tested from the wheel, not the checkout.

1. Builds the wheel once from a copy of the checkout's files (tracked and untracked, not ignored), with a
   fixed ``SOURCE_DATE_EPOCH`` so that the same sources give the same wheel and the same hash.
2. For each end, a venv of its own under ``.cache/compat/<end>`` (git-ignored): the wheel with its
   ``[test,demo]`` extras, the low end under ``tests/compat/lowest.txt`` (the lowest versions setup.cfg
   declares), the high end with the newest releases pip finds; then pyspark reinstalled last, as the
   Makefile does (pyspark-client overwrites part of the ``pyspark`` package). A venv whose stamp names the
   same wheel hash, constraints and interpreter is reused as it is. Both ends install at once.
3. Resolves what the tests take from Spark's Ivy (:func:`warm`: Iceberg's Spark runtime where one is built, the
   Kafka broker, Spark's Kafka connector at the end's Spark release), so that the tests download nothing.
   The low end's connector goes to its tests as local jars (``$KAPPA_TEST_KAFKA_CONNECTOR_JARS``, the job's
   ``spark.jars``) with the token provider this machine's Maven registry serves (:attr:`End.token_provider`).
4. Runs :data:`TESTS` with the end's Python from a copy of the checkout without the package (so only the
   installed wheel can be imported: ``tests/conftest.py`` checks it under ``KAPPA_TEST_INSTALLED_IN``),
   both ends at once (each end's tests one after the other: Spark 4.0's Python workers must connect
   back within a fixed 10 s, which a busier machine misses).
5. Then, once an end is done (never three at once), the Spark 4.1 end (:data:`SPARK41_TESTS`: Iceberg's own
   SparkCatalog in a job, on the newest Spark Iceberg builds a runtime for, with Python 3.12).

``--jobs 1`` installs and tests one end at a time, in that order (CI: the ends run beside ``make test``).
``--wait-for PATH`` installs every end first, one after the other, then waits until PATH exists before any
test (CI: the ends install with the machine's Python while ``make install`` builds .venv, and PATH is the file
CI writes once that is done: the tests need the JVM jars and Spark's Ivy cache ``make install`` fetches).

Usage: ``python tests/compat/run.py [--end low|high|spark41]... [--fresh] [--jobs 1|2] [--wait-for PATH]
[pytest args...]``. Exit non-zero when
an end fails to install or its tests fail. Standard library only: runs under any supported Python.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CACHE = ROOT / ".cache" / "compat"
PACKAGE = "airflow_provider_kappa"
#: a fixed build time (1980-01-01, the zip format's first day): the same sources give the same wheel
SOURCE_DATE_EPOCH = "315532800"


@dataclass(frozen=True)
class End:
    """One end of the supported range: a Python minor version and, for the low end, the constraints
    pinning the lowest versions setup.cfg declares (None: the newest pip finds)."""

    name: str
    python: str
    constraints: Path | None
    #: the release of ``spark-token-provider-kafka-0-10_2.13`` put beside the end's Kafka connector when the
    #: connector's own is not served (None: the connector's own, the product's normal path). The low end's:
    #: this machine's Maven registry serves no token provider at 4.0.1-4.0.4 (404), which
    #: spark-sql-kafka 4.0.4 depends on; 4.0.0 is served. A registry limitation of this machine, not what a
    #: user does.
    token_provider: str | None = None
    #: the tests it runs (None: :data:`TESTS`, whose CLI backfills write the digests :func:`compare_digests` compares)
    tests: tuple[str, ...] | None = None

    @property
    def digests(self) -> bool:
        """Whether its tests write the digests the ends compare (:data:`TESTS` do)."""
        return self.tests is None


#: Iceberg's own SparkCatalog in the job on both engines, where Iceberg has a Spark runtime (4.0, 4.1)
SPARK41_TESTS = (
    "tests/integration/test_iceberg_spark_catalog.py::"
    "test_a_job_joining_an_iceberg_dimension_through_sparkcatalog_backfills_exactly_or_is_refused",
)

ENDS = {
    "low": End("py3.10", "3.10", HERE / "lowest.txt", token_provider="4.0.0"),
    "high": End("py3.13", "3.13", None),
    # after the two ends (main): not a range end, the newest Spark with an Iceberg runtime (4.1), on Python 3.12;
    # this machine's Maven registry serves the token provider at 4.1.1, not at 4.1.3
    "spark41": End("py3.12-spark4.1", "3.12", HERE / "spark41.txt", token_provider="4.1.1", tests=SPARK41_TESTS),
}

#: the unit tier, one CLI backfill per engine checked row for row against the correct (live) rows,
#: and one ``dag.test()`` backfill
TESTS = [
    "tests/unit",
    "tests/integration/test_cli.py::test_backfill_replaces_the_bad_window_end_to_end[submit]",
    "tests/integration/test_cli.py::test_backfill_replaces_the_bad_window_end_to_end[connect]",
    "tests/integration/test_dag.py::test_dag_run_replaces_the_bad_window_with_the_correct_rows[sequential]",
    # Iceberg's SparkCatalog in the job: an exact backfill where Iceberg has a runtime (low end), refused on 4.2
    "tests/integration/test_iceberg_spark_catalog.py::"
    "test_a_job_joining_an_iceberg_dimension_through_sparkcatalog_backfills_exactly_or_is_refused[submit]",
    # Kafka live (`kappa run` on a real broker) -> `kappa land` -> `kappa backfill --ledger`, equal to live
    "tests/integration/test_kafka_live.py::test_a_backfill_with_the_ledger_reproduces_kafka_live_row_for_row",
]

#: the environment variable naming the local jars of Spark's Kafka connector the tests give their jobs
#: (``spark.jars`` in ``job.spark_conf``, tests/servers/kafka.py); unset: the product's own connector
KAFKA_JARS_ENV = "KAPPA_TEST_KAFKA_CONNECTOR_JARS"
TOKEN_PROVIDER = "org.apache.spark:spark-token-provider-kafka-0-10_2.13"

#: pytest-timeout per test on an end, seconds (the suite's own is 900)
COMPAT_TIMEOUT = 1800

#: one end's output line at a time
_PRINT = threading.Lock()

#: distributions whose installed versions each end prints
SHOWN = (
    "apache-airflow",
    "apache-airflow-providers-apache-spark",
    "apache-airflow-providers-apache-iceberg",
    "pyspark",
    "pyspark-client",
    "pyiceberg",
    "pandas",
    "pyarrow",
)


def log(message: str) -> None:
    print(f"[test-compat {time.strftime('%H:%M:%S')}] {message}", flush=True)


def run(argv: list[str], **kwargs: object) -> None:
    subprocess.run(argv, check=True, **kwargs)  # type: ignore[call-overload]


def find_python(minor: str) -> Path:
    """The interpreter of Python ``minor``: ``$KAPPA_COMPAT_PYTHON_3_10`` (etc.), the newest pyenv
    ``versions/<minor>.*``, else ``python<minor>`` on PATH."""
    override = os.environ.get(f"KAPPA_COMPAT_PYTHON_{minor.replace('.', '_')}")
    if override:
        return Path(override)
    try:
        pyenv = subprocess.run(["pyenv", "root"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        pyenv = ""
    found = glob.glob(os.path.join(pyenv, "versions", f"{minor}.*", "bin", "python")) if pyenv else []
    if found:
        return Path(max(found, key=lambda p: [int(x) for x in Path(p).parents[1].name.split(".") if x.isdigit()]))
    on_path = shutil.which(f"python{minor}")
    if on_path:
        return Path(on_path)
    raise SystemExit(
        f"test-compat: Python {minor} is missing (pyenv install {minor}, or set KAPPA_COMPAT_PYTHON_{minor.replace('.', '_')})"
    )


def checkout_files() -> list[str]:
    """The checkout's files as git sees them: tracked, and untracked but not ignored."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    return [f for f in out.decode().split("\0") if f and (ROOT / f).is_file()]


def copy_files(names: list[str], source: Path, dest: Path) -> None:
    for name in names:
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / name, target)


def snapshot(work: Path, ends: list[End]) -> tuple[Path, dict[str, Path]]:
    """One copy of the checkout's files (the wheel is built from it) and, for each end, a copy of that
    without the package (its tests run there): edits made while the ends run change neither."""
    names, source = checkout_files(), work / "source"
    copy_files(names, ROOT, source)
    outside = [n for n in names if n.split("/", 1)[0] != PACKAGE]
    trees = {end.name: work / f"tree-{end.name}" for end in ends}
    for tree in trees.values():
        copy_files(outside, source, tree)
    return source, trees


def build_wheel(source: Path) -> Path:
    """One wheel of ``source`` (a copy: the checkout gets no build/ or egg-info)."""
    out = CACHE / "wheel"
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH}
    argv = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(source)]
    built = subprocess.run(argv, env=env, capture_output=True, text=True)
    if built.returncode != 0:  # setuptools' warnings are long: shown only when the build fails
        print(built.stdout + built.stderr, file=sys.stderr)
        raise SystemExit(f"test-compat: the wheel build failed (exit {built.returncode})")
    (wheel,) = out.glob("*.whl")
    return wheel


def pyspark_requirement() -> str:
    """setup.cfg's ``pyspark`` requirement (a range: each end installs one release of it)."""
    for line in (ROOT / "setup.cfg").read_text().splitlines():
        if line.strip().startswith("pyspark") and not line.strip().startswith("pyspark-client"):
            return line.strip().replace(" ", "")
    raise SystemExit("test-compat: setup.cfg declares no pyspark requirement")


def installed_version(python: Path, dist: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({dist!r}))"
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def install(end: End, wheel: Path, fresh: bool) -> Path:
    """The end's venv with the wheel installed; reused when its stamp matches. Returns its Python."""
    venv, python = CACHE / end.name, find_python(end.python)
    stamp = {
        "wheel": wheel.name,
        "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
        "constraints": end.constraints.read_text() if end.constraints else None,
        "python": str(python),
        "pyspark": pyspark_requirement(),
    }
    stamp_file = venv / "kappa-compat.json"
    if not fresh and stamp_file.is_file() and json.loads(stamp_file.read_text()) == stamp:
        log(f"{end.name}: venv {venv} already has this wheel ({stamp['sha256'][:12]}), reused")
        return venv / "bin" / "python"
    started = time.monotonic()
    shutil.rmtree(venv, ignore_errors=True)
    run([str(python), "-m", "venv", str(venv)])
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    run([*pip, "install", "--quiet", "--upgrade", "pip"])
    constraints = ["-c", str(end.constraints)] if end.constraints else []
    # --no-compile: bytecode is written on first import, for the modules the tests load, not at install for
    # every module of Airflow and its dependencies
    run([*pip, "install", "--quiet", "--no-compile", *constraints, f"{wheel}[test,demo]"])
    # pyspark-client (from the Spark provider) overwrites part of the pyspark package; reinstall
    # pyspark last, at pyspark-client's release (PyPI may hold a newer pyspark patch than pyspark-client,
    # e.g. 4.2.1 beside 4.2.0), so that every file is pyspark's own and both are one release
    client = installed_version(venv / "bin" / "python", "pyspark-client")
    run([*pip, "install", "--quiet", "--no-compile", "--no-deps", "--force-reinstall", f"pyspark=={client}"])
    stamp_file.write_text(json.dumps(stamp, indent=1))
    log(f"{end.name}: installed in {time.monotonic() - started:.0f} s")
    return venv / "bin" / "python"


#: what an end's tests resolve through Spark's Ivy, resolved (from Maven at the first run, then from the cache
#: the product remembers: no spark-submit) before they run, so that the tests download nothing: Iceberg's
#: Spark runtime and the sqlite JDBC driver (none on a Spark without an Iceberg build), the Kafka broker,
#: and Spark's Kafka connector at the running Spark's release (``kappa jars``'s sets); with a substituted
#: token provider, the connector without its own token provider plus that release's, printed as one list
WARM = """
import sys
from airflow_provider_kappa.engine import jvm
from airflow_provider_kappa.engine.iceberg_spark import warm_packages
iceberg = warm_packages(jvm.spark_version())
if iceberg:
    jvm.resolve_cached(iceberg)
jvm.broker_classpath()
token = sys.argv[1]
if not token:
    jvm.connector_jars()
else:
    provider = "{provider}"
    jars = jvm.resolve_cached([jvm.connector_package()], [*jvm.WHEEL_ARTIFACTS, provider])
    jars += jvm.resolve_cached([provider + ":" + token], [*jvm.WHEEL_ARTIFACTS, "org.apache.kafka:kafka-clients"])
    print(",".join(str(j) for j in jars))
""".replace("{provider}", TOKEN_PROVIDER)


def warm(end: End, python: Path, tree: Path) -> dict[str, str]:
    """Resolve what the end's tests need from Spark's Ivy (:data:`WARM`, run in ``tree``, the copy without
    the package, so that it imports the installed wheel: ``python -c`` puts its working folder first on the
    path); the environment its tests get for it: with a substituted token provider, :data:`KAFKA_JARS_ENV`
    naming the connector's local jars."""
    started = time.monotonic()
    venv = python.parents[1]
    printed = subprocess.run(
        [str(python), "-c", WARM, end.token_provider or ""],
        cwd=tree,
        env={**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"},
        capture_output=True,
        text=True,
    )
    if printed.returncode != 0:
        print(printed.stdout + printed.stderr, file=sys.stderr)
        raise SystemExit(f"test-compat: {end.name}: the JVM packages could not be resolved (exit {printed.returncode})")
    log(f"{end.name}: JVM packages resolved in {time.monotonic() - started:.0f} s")
    if not end.token_provider:
        return {}
    jars = printed.stdout.strip().splitlines()[-1]
    log(f"{end.name}: Kafka connector as local jars ({TOKEN_PROVIDER} {end.token_provider}): {jars}")
    return {KAFKA_JARS_ENV: jars}


def versions(python: Path) -> str:
    code = (
        "import importlib.metadata as m, platform\n"
        f"print('Python ' + platform.python_version() + ', ' + ', '.join(d + ' ' + m.version(d) for d in {SHOWN!r}))"
    )
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_env(python: Path) -> dict[str, str]:
    """The environment of an end's tests: its venv first on PATH, nothing that points at the checkout (nor
    a Kafka connector of the caller's: :func:`warm` gives the end's own)."""
    venv = python.parents[1]
    # PYTHONDONTWRITEBYTECODE: the venvs are installed --no-compile, so bytecode must be written on first import
    dropped = ("PYTHONPATH", "SPARK_HOME", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONDONTWRITEBYTECODE", KAFKA_JARS_ENV)
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    jvm = Path(os.environ.get("KAPPA_JVM_DIR") or ROOT / ".cache" / "jvm")
    if not (jvm / "rest-catalog").is_dir():
        raise SystemExit(f"test-compat: the JVM artifacts are not in {jvm}: run `make install` (jvm/fetch.sh) first")
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        VIRTUAL_ENV=str(venv),
        PYSPARK_PYTHON=str(python),
        PYSPARK_DRIVER_PYTHON=str(python),
        SPARK_LOCAL_IP="127.0.0.1",
        KAPPA_JVM_DIR=str(jvm),
        KAPPA_TEST_INSTALLED_IN=site,
        KAPPA_COMPAT_DIGEST_DIR=str(digest_dir(venv.name)),
    )
    return env


def digest_dir(end_name: str) -> Path:
    """Where an end's tests write the digests of their fixed backfills (tests/integration/test_cli.py)."""
    return CACHE / "digests" / end_name


def compare_digests(ends: list[End], *, required: bool = True) -> list[str]:
    """The differences between the ends' digests of the same backfills (empty: identical staged rows
    and micro-batch counts on the lowest and the newest Spark), each naming the backfill, the ends and
    what differs (for rows, the first differing row of each end). ``required=False`` (a run given
    pytest arguments, such as ``-k``, which may select no digest-writing test): no digest at all is
    not a difference."""
    if len(ends) < 2:
        return []
    first, *others = ends
    base = digest_dir(first.name)
    names = sorted(p.stem for p in base.glob("*.json"))
    problems = [] if names or not required else [f"{first.name} wrote no digest in {base}"]
    for end in others:
        folder = digest_dir(end.name)
        for name in sorted(set(names) | {p.stem for p in folder.glob("*.json")}):
            a, b = base / f"{name}.json", folder / f"{name}.json"
            if not (a.is_file() and b.is_file()):
                problems.append(f"{name}: only {first.name if a.is_file() else end.name} wrote its digest")
                continue
            da, db = json.loads(a.read_text()), json.loads(b.read_text())
            for key in ("rows", "sha256", "micro_batches"):
                if da[key] != db[key]:
                    problems.append(f"{name}: {key} {first.name} {da[key]!r} != {end.name} {db[key]!r}")
            if da["sha256"] != db["sha256"]:
                ra = (base / f"{name}.rows").read_text().splitlines()
                rb = (folder / f"{name}.rows").read_text().splitlines()
                only_a, only_b = sorted(set(ra) - set(rb)), sorted(set(rb) - set(ra))
                problems.append(
                    f"{name}: {len(only_a)} row(s) only on {first.name} (first {only_a[:1]}), "
                    f"{len(only_b)} only on {end.name} (first {only_b[:1]})"
                )
    return problems


def test_end(end: End, python: Path, tree: Path, pytest_args: list[str]) -> bool:
    """The end's tests from ``tree``, a copy of the checkout without the package; True when they pass."""
    env = {**test_env(python), **warm(end, python, tree)}
    where = subprocess.run(
        [str(python), "-c", f"import {PACKAGE}; print({PACKAGE}.__file__)"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not Path(where).is_relative_to(env["KAPPA_TEST_INSTALLED_IN"]):
        raise SystemExit(f"test-compat: {end.name} imports {PACKAGE} from {where}, not from its venv")
    log(f"{end.name}: {versions(python)}; {PACKAGE} from {where}")
    started = time.monotonic()
    # both ends run at once on a shared machine: each test gets twice the suite's 900 s (pytest-timeout), unless
    # the caller gives its own --timeout (the Kafka test's live, landing and two backfills took 845 s alone at load 3-20)
    limit = [] if any(a.startswith("--timeout") for a in pytest_args) else ["--timeout", str(COMPAT_TIMEOUT)]
    tests = list(TESTS if end.tests is None else end.tests)
    argv = [str(python), "-m", "pytest", "-p", "no:cacheprovider", "-q", *limit, *tests, *pytest_args]
    # both ends run at once: each line of an end's output goes out whole, prefixed with the end's name
    proc = subprocess.Popen(argv, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        with _PRINT:
            print(f"[{end.name}] {line}", end="", flush=True)
    code = proc.wait()
    if code == 5 and pytest_args and not end.digests:  # pytest's "no tests ran": -k chose none of its own
        log(f"{end.name}: the pytest arguments select none of its tests")
        return True
    log(f"{end.name}: tests {'passed' if code == 0 else f'FAILED (exit {code})'} in {time.monotonic() - started:.0f} s")
    return code == 0


#: how long ``--wait-for`` waits for its file (CI: ``make install`` from nothing took 87-109 s)
WAIT_SECONDS = 1800


def wait_for(path: Path) -> None:
    """Return once ``path`` exists; exit after :data:`WAIT_SECONDS`."""
    started = time.monotonic()
    while not path.exists():
        if time.monotonic() - started > WAIT_SECONDS:
            raise SystemExit(f"test-compat: {path} did not appear within {WAIT_SECONDS} s")
        time.sleep(1)
    log(f"{path} is there (waited {time.monotonic() - started:.0f} s)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--end", action="append", choices=sorted(ENDS), help="an end to run (default: all)")
    parser.add_argument("--fresh", action="store_true", help="reinstall the venvs even when their stamp matches")
    parser.add_argument(
        "--jobs",
        type=int,
        choices=(1, 2),
        default=2,
        help="ends installed and tested at once (default 2; CI gives 1: it runs the ends beside `make test`)",
    )
    parser.add_argument(
        "--wait-for",
        type=Path,
        metavar="PATH",
        help="install every end first, then wait until PATH exists before testing (CI: stream 1's install is done)",
    )
    args, pytest_args = parser.parse_known_args(argv)
    CACHE.mkdir(parents=True, exist_ok=True)
    failed = []
    with tempfile.TemporaryDirectory(prefix="kappa-compat-") as tmp:
        work = Path(tmp)
        started = time.monotonic()
        ends = [ENDS[key] for key in args.end or list(ENDS)]
        source, trees = snapshot(work, ends)
        wheel = build_wheel(source)
        log(f"built {wheel.name} in {time.monotonic() - started:.0f} s")
        # two ends install and run their tests at once (--jobs 2, the default): the tests wait on JVM starts,
        # spark-submits and Airflow more than they compute, so two ends overlap well even on two cores; the Spark
        # 4.1 end (listed last) starts when one of them is done (a third at once would crowd Spark 4.0's 10-s
        # connect-back). --jobs 1 (CI, beside `make test`): one end after the other, in the order listed
        for end in ends:
            shutil.rmtree(digest_dir(end.name), ignore_errors=True)

        installed: dict[str, Path] = {}
        if args.wait_for is not None:
            for end in ends:
                installed[end.name] = install(end, wheel, args.fresh)
            wait_for(args.wait_for)

        def install_and_test(end: End) -> bool:
            python = installed.get(end.name) or install(end, wheel, args.fresh)
            return test_end(end, python, trees[end.name], pytest_args)

        with ThreadPoolExecutor(max_workers=min(args.jobs, len(ends))) as pool:
            results = list(zip(ends, pool.map(install_and_test, ends)))
        failed += [end.name for end, passed in results if not passed]
    if not failed:
        for problem in compare_digests([e for e in ends if e.digests], required=not pytest_args):
            log(f"the ends differ: {problem}")
            failed.append(f"digests ({problem})")
    log(f"failed: {', '.join(failed)}" if failed else f"passed: {', '.join(e.name for e in ends)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
