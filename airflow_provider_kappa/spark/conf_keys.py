"""Names shared by every reader of the ``spark.kappa.*`` conf: its prefix and the values of
``spark.kappa.mode`` and ``spark.kappa.trigger`` (the key list is in :mod:`.settings`).

Its own module so that :mod:`.settings` and :mod:`.source.options` (which both read the conf)
share them without importing each other. Pure Python.
"""

from __future__ import annotations

PREFIX = "spark.kappa."
LIVE = "live"
BACKFILL = "backfill"
AVAILABLE_NOW = "availableNow"
PROCESSING_TIME = "processingTime"
#: ``kappa land``: the comma-separated sources the landing application lands (spark/landing.py)
LAND_SOURCES = PREFIX + "land.sources"
#: the Kafka record's topic, partition and offset, as kappa land writes them into a landed table
KAFKA_COLUMNS = ("kafka_topic", "kafka_partition", "kafka_offset")
