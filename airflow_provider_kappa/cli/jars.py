"""``kappa jars [--ivy DIR] [--repositories URLS]``: resolve the JVM packages kappa uses into Spark's
Ivy cache, once, with Spark's own resolution (``spark.jars.packages``; see
:mod:`airflow_provider_kappa.engine.jvm`): Spark's Kafka connector for the installed pyspark, the
Kafka broker of ``kappa demo``, and where Iceberg has a build for the installed Spark (4.0, 4.1), Iceberg's
Spark runtime with the sqlite JDBC driver (:mod:`airflow_provider_kappa.engine.iceberg_spark`). Later runs
find them there and need no network. ``make install`` runs it; a pip user runs it once (e.g. in an image
build) where Maven Central, or the repositories given, can be reached.

Prints one line per package set: its jars and where they are. Exits 0 when every set resolved, 2 when
one did not (the error names the package and Ivy's first errors).
"""

from __future__ import annotations

import argparse
import time

from airflow_provider_kappa.engine.iceberg_spark import warm_packages
from airflow_provider_kappa.engine.jvm import IVY, resolve_cached, spark_version, warm


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``kappa jars``."""
    parser.add_argument("--ivy", help=f"Spark's Ivy folder ({IVY}; default Spark's own, ~/.ivy2.5.2)")
    parser.add_argument(
        "--repositories",
        help="comma-separated Maven repositories searched after Maven Central (spark.jars.repositories)",
    )


def run(args: argparse.Namespace) -> int:
    """Resolve every package set; print what each brought."""
    settings = {IVY: args.ivy or "", "spark.jars.repositories": args.repositories or ""}
    steer = {k: v for k, v in settings.items() if v}
    began = time.monotonic()
    sets = warm(steer)
    iceberg = warm_packages(spark_version())
    if iceberg:
        sets["Iceberg's Spark runtime " + iceberg[0]] = resolve_cached(iceberg, (), steer, refresh=True)
    else:
        print(f"kappa jars: no Iceberg Spark runtime is built for Spark {spark_version()}: none warmed", flush=True)
    for what, jars in sets.items():
        folders = sorted({str(j.parent) for j in jars})
        print(f"kappa jars: {what}: {len(jars)} jars in {', '.join(folders)}", flush=True)
    print(f"kappa jars: Spark's Ivy cache is warm ({time.monotonic() - began:.1f} s)", flush=True)
    return 0
