"""``kappa demo``: the embedded default story (events through Kafka, lake, live run, incident, backfill, report)."""

from __future__ import annotations

import argparse
from pathlib import Path

from airflow_provider_kappa.backfill.params import MODES
from airflow_provider_kappa.examples import JOBS
from airflow_provider_kappa.exceptions import KappaConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``kappa demo``."""
    parser.add_argument("--workdir", type=Path, default=None, help="demo folder (default ./kappa-demo; wiped each run)")
    parser.add_argument("--hours", type=float, default=2.0, help="hours of landed events (default 2, at least 2)")
    parser.add_argument("--rate", type=float, default=10.0, help="impressions per second (default 10; playbacks 1/10)")
    parser.add_argument("--seed", type=int, default=7, help="lake generator seed (default 7)")
    parser.add_argument(
        "--jobs", default=",".join(JOBS), help=f"example jobs, comma separated (default {','.join(JOBS)})"
    )
    parser.add_argument("--modes", default=",".join(MODES), help=f"backfill modes (default {','.join(MODES)})")
    parser.add_argument("--landing", default="10min", help="landing interval of the generated lake (default 10min)")
    parser.add_argument(
        "--max-misalignment",
        default=None,
        help="backfill threshold (default: the landing interval, which reproduces live micro-batches exactly)",
    )
    parser.add_argument("--slice", default="1h", help="slice length (default 1h)")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=2,
        help="example jobs run at once, for the live references and for the backfill stories (default 2, at least 1)",
    )
    parser.add_argument(
        "--no-kafka",
        action="store_true",
        help="skip the Kafka story (broker, kappa land, live from Kafka): the jobs run live over the lake in "
        "iceberg tail mode, as when no broker can start",
    )


def run(args: argparse.Namespace) -> int:
    """Run the demo; exit 0 when every backfill ran and published."""
    try:
        import numpy  # noqa: F401  (the lake generator's one extra dependency)
    except ImportError as e:
        raise KappaConfigError(
            "kappa demo needs the [demo] extra: pip install 'airflow-provider-kappa[demo]' (or make demo)"
        ) from e
    from airflow_provider_kappa.demo.options import DemoOptions, default_workdir
    from airflow_provider_kappa.demo.run import run_demo

    opts = DemoOptions(
        workdir=args.workdir or default_workdir(),
        hours=args.hours,
        rate=args.rate,
        seed=args.seed,
        jobs=tuple(j for j in args.jobs.split(",") if j),
        modes=tuple(m for m in args.modes.split(",") if m),
        threshold=args.max_misalignment or args.landing,
        landing=args.landing,
        slice=args.slice,
        concurrency=args.concurrency,
        kafka=not args.no_kafka,
    )
    run_demo(opts)
    return 0
