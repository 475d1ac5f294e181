"""The primary resource of :func:`~airflow_provider_kappa.engine.jvm.resolve`'s spark-submit (run as a
file, never imported by kappa): spark-submit has resolved ``spark.jars.packages`` before it runs this,
and put the jars on ``spark.jars``; this prints them on one line and exits. No Spark is started: it only
reads a JVM system property through the gateway spark-submit opened for it."""

from __future__ import annotations

MARK = "KAPPA_RESOLVED_JARS="  # engine.jvm.PROBE_MARK


def main() -> None:
    """Print ``spark.jars`` after :data:`MARK`."""
    from pyspark.java_gateway import launch_gateway

    gateway = launch_gateway()  # type: ignore[no-untyped-call]
    print(MARK + (gateway.jvm.java.lang.System.getProperty("spark.jars") or ""), flush=True)


if __name__ == "__main__":
    main()
