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

How the code is hosted (PySpark 4.0 to 4.2): Spark runs the reader's offset methods (``initialOffset``,
``latestOffset``, ``partitions``, ``commit``...) in ONE long-lived Python process on the driver
per source and query, so its files (manifests read once) are kept on the reader object there.
The reader is also constructed and pickled for planning and for executors, where only
:meth:`KappaIcebergStreamReader.read` runs: it uses nothing but the pickled partition
(file paths, range, projected schema, FileIO properties). The driver-side state is never pickled.

Releases without read limits (pyspark 4.0, 4.1: :func:`~airflow_provider_kappa.compat.pyspark.streaming_source_api`)
call ``latestOffset()`` with no start and no limit, once per trigger. The reader then keeps the start
itself: the offset it last answered (each answer past the query's offset starts exactly one
micro-batch), else the end of the last ``partitions(start, end)`` Spark asked for (on a restart Spark
calls ``partitions(latest, latest)`` with the checkpoint's latest offset first:
``AcceptsLatestSeenOffset``), else the initial offset. Its limit is :func:`~.offsets.default_limit`,
what 4.2 passes. So every release cuts the same micro-batches. Under option ``available_now=true``
(``spark/resolve.py`` sets it where ``Trigger.AvailableNow`` is replaced) it prepares for availableNow
itself before its first answer.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from airflow_provider_kappa.exceptions import KappaSourceError
from airflow_provider_kappa.spark.source.bounded import BoundedState
from airflow_provider_kappa.spark.source.offsets import API, default_limit
from airflow_provider_kappa.spark.source.options import AVAILABLE_NOW_OPTION, BOUNDED, IcebergReadSpec
from airflow_provider_kappa.spark.source.partitions import FilePartition
from airflow_provider_kappa.spark.source.read import read_partition
from airflow_provider_kappa.spark.source.replay import ReplayState
from airflow_provider_kappa.spark.source.tail import TailState

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.streaming.datasource import ReadLimit


class KappaIcebergStreamReader(DataSourceStreamReader, API.SupportsTriggerAvailableNow):  # type: ignore[misc]
    """The ``kappa_iceberg`` stream reader (see the module docstring for the two modes).

    :param schema: the stream's schema (the table's, or a projection given by the job).
    :param options: the reader options (docs/architecture.md, "kappa_iceberg reader options").
    """

    def __init__(self, schema: StructType, options: Mapping[str, str]) -> None:
        self.schema = schema
        self.options = {str(k): str(v) for k, v in options.items()}
        self.opts = IcebergReadSpec.from_options(self.options)
        self._state: BoundedState | ReplayState | TailState | None = None
        # releases without read limits: the query's position, and whether availableNow was prepared
        self._position: dict[str, Any] | None = None
        self._initial: dict[str, Any] | None = None
        self._prepared = self.options.get(AVAILABLE_NOW_OPTION, "false").lower() != "true"

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
        if self._initial is None:  # once: a tail read starting at "latest" answers the same each time
            self._initial = self._driver().initial_offset()
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        return default_limit(self.opts)

    def latestOffset(self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None) -> dict[str, Any]:
        """The end of the next micro-batch from ``start`` under ``limit`` (``start`` itself: nothing
        to read). Without arguments (pyspark 4.0, 4.1), from the query's position under the default
        limit (see the module docstring)."""
        if start is not None and limit is not None:
            return self._driver().latest_offset(start, limit)
        if not self._prepared:
            self._prepared = True
            self.prepareForTriggerAvailableNow()
        if self._position is None:
            self._position = self.initialOffset()
        self._position = self._driver().latest_offset(self._position, self.getDefaultReadLimit())
        return self._position

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return self._driver().report_latest()

    def prepareForTriggerAvailableNow(self) -> None:
        self._driver().prepare_available_now()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        self._position = end  # the query's position (it planned this batch, or restarts from ``end``)
        return self._driver().partitions(start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, FilePartition):
            raise KappaSourceError(f"kappa_iceberg: unexpected partition type {type(partition).__name__}")
        return read_partition(partition, self.schema)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the driver-side state is immutable for the query."""

    def stop(self) -> None:
        self._state = None
