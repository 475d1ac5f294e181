"""``kappa run --config kappa.yaml``: the job live.

Sources resolve to their ``selected`` candidate; an ``iceberg`` candidate runs in tail
mode (following new snapshots), so the live path works locally without Kafka. A ``kafka``
candidate gets Spark's Kafka connector from the jars fetched at install time (``engine/jvm.py``),
and the run records its live ledger (``job.ledger``, ``spark.kappa.ledger``): every micro-batch's
Kafka offsets per topic partition, written by the sink as it commits the batch
(:mod:`airflow_provider_kappa.spark.ledger`); ``kappa backfill --ledger`` replays those batches.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from airflow_provider_kappa.engine.jvm import kafka_connector_conf
from airflow_provider_kappa.engine.launch import live_conf, write_catalogs_file
from airflow_provider_kappa.engine.processes import sigterm_raises
from airflow_provider_kappa.engine.submit import submit
from airflow_provider_kappa.job.checkpoints import live_checkpoint
from airflow_provider_kappa.job.config import KafkaSourceConfig, load_config
from airflow_provider_kappa.spark.conf_keys import PREFIX


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``kappa run``."""
    parser.add_argument("--config", required=True, help="path to the job's kappa.yaml")
    parser.add_argument("--checkpoint", help="checkpoint folder (default <checkpoint_root>/<job>/live)")


def run(args: argparse.Namespace) -> int:
    """Run the job live until it is stopped (Ctrl-C or SIGTERM end it and its Spark driver; exit 0)
    or fails."""
    # imported when the verb runs (not when the CLI's parser is built), like the other verbs' steps

    cfg = load_config(args.config)
    checkpoint = args.checkpoint or live_checkpoint(cfg.job.checkpoint_root, cfg.job.name)
    private = Path(checkpoint) / "_kappa"
    catalogs_file = write_catalogs_file(cfg, private / "catalogs.json")
    conf = live_conf(cfg, catalogs_file, checkpoint)
    ledger = ""
    if any(isinstance(cfg.resolve(n, backfill=False), KafkaSourceConfig) for n in cfg.job_sources()):
        conf = kafka_connector_conf(conf)  # the connector fetched at install time, as local jars
        conf[PREFIX + "ledger"] = cfg.job.ledger
        ledger = f", live ledger {cfg.job.ledger}"
    print(f"kappa run: {cfg.job.name} live on {cfg.job.master}, checkpoint {checkpoint}{ledger}", flush=True)
    try:
        with sigterm_raises(lambda signum: KeyboardInterrupt(f"signal {signum}")):  # stopped: its normal end
            submit(
                cfg.job.application,
                conf,
                properties_file=private / "spark.properties",
                name=f"kappa-{cfg.job.name}-live",
                master=cfg.job.master,
                class_data_sharing=cfg.job.class_data_sharing,
            )
    except KeyboardInterrupt:  # its spark-submit was stopped cleanly (SIGTERM, then its process group)
        print("kappa run: stopped; a restart runs from the checkpoint", flush=True)
    return 0
