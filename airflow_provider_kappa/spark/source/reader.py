"""The ``kappa_iceberg`` stream reader: pinned, sliced, aligned, ordered reads of Iceberg.

Two modes (option ``mode``):

``bounded`` (backfill)
    Reads one pinned snapshot, rows whose ingestion column lies in ``[read_start, read_end)``.
    Offsets are ingestion-time positions ``{"pos": micros}``; a micro-batch reads ``[start.pos,
    end.pos)``. Batch ends lie on a grid of multiples of ``max_misalignment_threshold`` from the
    epoch; empty stretches (where no file of any aligned table may hold rows) are skipped inside
    the batch that follows them, so every aligned source computes the same batch ends.

``bounded`` with option ``ledger`` (a backfill replaying live's micro-batches)
    Micro-batch k reads the landed rows live's micro-batch k read, by Kafka topic, partition and
    offset (:mod:`.replay`).

``tail`` (live)
    Follows the snapshots committed to the table. Offsets are ``{"snapshot_id", "sequence_number"}``
    of the last snapshot read; a micro-batch reads every data file added by the snapshots after
    its start offset, up to its end offset, whatever their ingestion times.

The modes' driver-side state is in :mod:`.bounded` and :mod:`.tail`; executors read with :mod:`.read`.

How the code is hosted (PySpark 4.2): Spark runs the reader's offset methods (``initialOffset``,
``latestOffset``, ``partitions``, ``commit``...) in ONE long-lived Python process on the driver
per source and query, so its files (manifests read once) are kept on the reader object there.
The reader is also constructed and pickled for planning and for executors, where only
:meth:`KappaIcebergStreamReader.read` runs: it uses nothing but the pickled partition
(file paths, range, projected schema, FileIO properties). The driver-side state is never pickled.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from airflow_provider_kappa.exceptions import KappaSourceError
from airflow_provider_kappa.spark.source.bounded import BoundedState
from airflow_provider_kappa.spark.source.offsets import default_limit
from airflow_provider_kappa.spark.source.options import BOUNDED, IcebergReadSpec
from airflow_provider_kappa.spark.source.partitions import FilePartition
from airflow_provider_kappa.spark.source.read import read_partition
from airflow_provider_kappa.spark.source.replay import ReplayState
from airflow_provider_kappa.spark.source.tail import TailState

if TYPE_CHECKING:
    import pyarrow as pa


class KappaIcebergStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The ``kappa_iceberg`` stream reader (see the module docstring for the two modes).

    :param schema: the stream's schema (the table's, or a projection given by the job).
    :param options: the reader options (docs/architecture.md, "kappa_iceberg reader options").
    """

    def __init__(self, schema: StructType, options: Mapping[str, str]) -> None:
        self.schema = schema
        self.options = {str(k): str(v) for k, v in options.items()}
        self.opts = IcebergReadSpec.from_options(self.options)
        self._state: BoundedState | ReplayState | TailState | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_state"] = None  # the driver-side state never travels to executors
        return state

    def _driver(self) -> BoundedState | ReplayState | TailState:
        if self._state is None:
            if self.opts.mode != BOUNDED:
                self._state = TailState(self.schema, self.opts, self.options)
            elif self.opts.ledger is not None:
                self._state = ReplayState(self.schema, self.opts, self.options)
            else:
                self._state = BoundedState(self.schema, self.opts, self.options)
        return self._state

    def initialOffset(self) -> dict[str, Any]:
        return self._driver().initial_offset()

    def getDefaultReadLimit(self) -> ReadLimit:
        return default_limit(self.opts)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        return self._driver().latest_offset(start, limit)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return self._driver().report_latest()

    def prepareForTriggerAvailableNow(self) -> None:
        self._driver().prepare_available_now()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return self._driver().partitions(start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, FilePartition):
            raise KappaSourceError(f"kappa_iceberg: unexpected partition type {type(partition).__name__}")
        return read_partition(partition, self.schema)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the driver-side state is immutable for the query."""

    def stop(self) -> None:
        self._state = None
