"""``kappa land --config kappa.yaml [--sources a,b] [--available-now]``: Kafka -> Iceberg landing.

Lands each selected dynamic source's ``kafka`` candidate into its ``iceberg`` candidate's table
(:mod:`airflow_provider_kappa.engine.landing`, the application :mod:`airflow_provider_kappa.spark.landing`)
with spark-submit, like ``kappa run``: one landing per ``land.interval`` until stopped (Ctrl-C or
SIGTERM end it and its Spark driver; exit 0), or, with ``--available-now``, what the topics hold
now, then exit. Restartable: the checkpoint is ``<checkpoint_root>/<job>/land/<source>``.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from airflow_provider_kappa.engine.jvm import kafka_connector_conf
from airflow_provider_kappa.engine.landing import check_tables, describe, land_checkpoint, land_conf, landings, selected
from airflow_provider_kappa.engine.launch import write_catalogs_file
from airflow_provider_kappa.engine.processes import sigterm_raises
from airflow_provider_kappa.engine.submit import submit
from airflow_provider_kappa.job.catalogs import job_catalogs
from airflow_provider_kappa.job.config import load_config
from airflow_provider_kappa.timeparse import format_duration

APPLICATION = "airflow_provider_kappa.spark.landing"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``kappa land``."""
    parser.add_argument("--config", required=True, help="path to the job's kappa.yaml")
    parser.add_argument(
        "--sources",
        help="dynamic sources to land, comma-separated (default: every one with a kafka and an iceberg candidate)",
    )
    parser.add_argument("--available-now", action="store_true", help="land what the topics hold now, then exit")
    parser.add_argument("--checkpoint", help="checkpoint folder (default <checkpoint_root>/<job>/land)")


def application() -> Path:
    """The landing application's file (found without importing pyspark)."""
    spec = importlib.util.find_spec(APPLICATION)
    assert spec is not None and spec.origin is not None
    return Path(spec.origin)


def run(args: argparse.Namespace) -> int:
    """Land until stopped (or, ``--available-now``, until the topics are landed)."""
    # imported when the verb runs (not when the CLI's parser is built), like the other verbs' steps

    cfg = load_config(args.config)
    items = landings(cfg, selected(args.sources))
    check_tables(cfg, items, job_catalogs(cfg))
    checkpoint = args.checkpoint or land_checkpoint(cfg)
    private = Path(checkpoint) / "_kappa"
    catalogs_file = write_catalogs_file(cfg, private / "catalogs.json", sorted({i.iceberg.catalog for i in items}))
    conf = kafka_connector_conf(
        land_conf(cfg, items, catalogs_file, checkpoint=checkpoint, available_now=args.available_now)
    )
    every = "what the topics hold now" if args.available_now else f"every {format_duration(cfg.land.interval)}"
    print(
        f"kappa land: {cfg.job.name} on {cfg.job.master}, {every}, checkpoint {checkpoint}\n{describe(items)}",
        flush=True,
    )
    try:
        with sigterm_raises(lambda signum: KeyboardInterrupt(f"signal {signum}")):  # stopped: its normal end
            submit(
                application(),
                conf,
                properties_file=private / "spark.properties",
                name=f"kappa-{cfg.job.name}-land",
                master=cfg.job.master,
                class_data_sharing=cfg.job.class_data_sharing,
            )
    except KeyboardInterrupt:
        print("kappa land: stopped; a restart lands from the checkpoint", flush=True)
    return 0
