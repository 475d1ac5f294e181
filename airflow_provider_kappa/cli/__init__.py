"""The ``kappa`` command: demo, run, land, plan, backfill, cleanup.

Each verb lives in its own module exposing ``add_arguments(parser)`` and ``run(args) -> int``;
modules are imported only when their verb runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from airflow_provider_kappa import __version__
from airflow_provider_kappa.engine.processes import UNFINALIZED_EXIT
from airflow_provider_kappa.exceptions import KappaCatalogConflictError, KappaCatalogUnavailableError, KappaError
from airflow_provider_kappa.faults import one_line, root_transient_cause

VERBS = {
    "demo": "embedded default: local lake, live run, incident, backfill, report",
    "run": "run the job live (selected candidates, processing-time trigger)",
    "land": "land the kafka candidates of dynamic sources into their iceberg tables",
    "plan": "print the slices a backfill would run, from manifests only",
    "backfill": "snapshot, plan, run slices, validate and publish a window",
    "cleanup": "remove staging tables, checkpoints, plan files and tags of backfills past the retention",
    "jars": "resolve the JVM packages kappa uses (Spark's Kafka connector, the demo's broker) into Spark's Ivy cache",
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every verb."""
    parser = argparse.ArgumentParser(prog="kappa", description="Kappa backfills of unchanged PySpark streaming jobs.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="{" + ",".join(VERBS) + "}")
    for verb, help_text in VERBS.items():
        p = sub.add_parser(verb, help=help_text, description=help_text)
        importlib.import_module(f"airflow_provider_kappa.cli.{verb}").add_arguments(p)
    return parser


def console() -> None:
    """The ``kappa`` console script: :func:`main`, then the process ends with its code without the
    interpreter's finalization (:data:`~airflow_provider_kappa.engine.processes.UNFINALIZED_EXIT`: 0.9 s
    at the end of a backfill), every exit hook run and the output flushed first."""
    UNFINALIZED_EXIT.register()  # before any verb's imports register exit hooks: this one runs last
    UNFINALIZED_EXIT.code = main()
    sys.exit(UNFINALIZED_EXIT.code)


def main(argv: list[str] | None = None) -> int:
    """The ``kappa`` command's verbs (:func:`console` runs it); returns the exit code."""
    args = build_parser().parse_args(argv)
    module = importlib.import_module(f"airflow_provider_kappa.cli.{args.verb}")
    try:
        return int(module.run(args))
    except (KappaCatalogConflictError, KappaCatalogUnavailableError) as e:  # transient: a rerun may succeed
        print(f"kappa {args.verb}: error: {e}", file=sys.stderr)
        return 1
    except KappaError as e:
        print(f"kappa {args.verb}: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # a catalog or storage fault a step did not wrap: one line, not a traceback
        cause = root_transient_cause(e)
        if cause is None:
            raise
        print(
            f"kappa {args.verb}: error: {one_line(cause)}: a catalog or storage fault that may pass; "
            "rerun the same command (kappa backfill: with --resume)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    console()
