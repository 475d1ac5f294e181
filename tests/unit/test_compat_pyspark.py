"""The pyspark adapter (``airflow_provider_kappa/compat/pyspark.py``): the ``SparkFiles`` class attributes
it reads and the worker modules the warm daemon preloads are still there in the installed pyspark, and
the adapter tells where shipped files are exactly when pyspark's own worker set-up says so. No Spark
session: a Python worker's set-up is pyspark's own, fed the stream a Spark executor sends."""

from __future__ import annotations

import importlib.util
import io
import sys
from pathlib import Path

import pytest
from private_api import changed, require_attributes

from airflow_provider_kappa.compat.pyspark import WORKER_MODULES, spark_files_root


def test_the_installed_pyspark_has_the_spark_files_attributes_kappa_reads() -> None:
    from pyspark import SparkFiles

    require_attributes(
        "pyspark", SparkFiles, "pyspark.SparkFiles", ("_is_running_on_worker", "_sc", "getRootDirectory"), "pyspark"
    )


@pytest.mark.parametrize("module", WORKER_MODULES)
def test_the_installed_pyspark_has_the_worker_modules_the_warm_daemon_preloads(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.fail(
            changed("pyspark", module, "is gone (the warm daemon's processes running it start cold)", "pyspark")
        )


def test_shipped_files_are_found_only_where_sparkfiles_knows_their_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspark import SparkFiles
    from pyspark.serializers import write_int, write_with_length

    # what the test changes in this process is put back afterwards
    monkeypatch.setattr(SparkFiles, "_is_running_on_worker", SparkFiles._is_running_on_worker)
    monkeypatch.setattr(SparkFiles, "_root_directory", SparkFiles._root_directory)
    monkeypatch.setattr(sys, "path", list(sys.path))
    # a plain process: no SparkContext (in the whole suite an earlier test's local Spark lives in this
    # pytest process, and its driver rightly finds its files folder), not a worker
    monkeypatch.setattr(SparkFiles, "_sc", None)

    assert spark_files_root() is None

    try:
        from pyspark.worker_util import setup_spark_files
    except ImportError as e:
        pytest.fail(changed("pyspark", "pyspark.worker_util.setup_spark_files", f"is gone ({e})", "pyspark"))
    stream = io.BytesIO()
    write_with_length(str(tmp_path).encode(), stream)  # the executor's files folder
    write_int(0, stream)  # no Python includes
    stream.seek(0)
    setup_spark_files(stream)  # what every Python worker runs first
    assert spark_files_root() == str(tmp_path)


def test_the_streaming_source_api_is_the_installed_pyspark_s_own_or_kappa_s_stand_ins() -> None:
    """pyspark 4.2+ has read limits and availableNow for Python sources: kappa uses its classes (Spark
    checks them with isinstance); 4.0 and 4.1 have neither: kappa's stand-ins, and the drained default
    trigger instead of availableNow. A release that drops or renames them fails here, naming them."""
    import pyspark

    from airflow_provider_kappa.compat import pyspark as adapter

    api = adapter.streaming_source_api()
    version = _pyspark_version()
    assert version[:2] == tuple(int(x) for x in pyspark.__version__.split(".")[:2])
    names = ("ReadLimit", "ReadAllAvailable", "ReadMaxRows", "ReadMaxFiles", "ReadMaxBytes")
    if version >= (4, 2, 0):
        try:
            from pyspark.sql.streaming import datasource
        except ImportError as e:
            pytest.fail(changed("pyspark", "pyspark.sql.streaming.datasource", f"is gone ({e})", "pyspark"))
        require_attributes(
            "pyspark",
            datasource,
            "pyspark.sql.streaming.datasource",
            (*names, "SupportsTriggerAvailableNow"),
            "pyspark",
        )
        assert api.admission_control
        assert api.SupportsTriggerAvailableNow is datasource.SupportsTriggerAvailableNow
        assert all(getattr(api, n) is getattr(datasource, n) for n in names)
    else:
        assert not api.admission_control
        assert all(getattr(api, n) is getattr(adapter, n) for n in names)
    # the kinds of limit kappa reads (offsets.caps) keep their fields on every release
    assert api.ReadMaxFiles(3).max_files == 3
    assert api.ReadMaxRows(4).max_rows == 4
    assert api.ReadMaxBytes(5).max_bytes == 5
    assert isinstance(api.ReadAllAvailable(), api.ReadLimit)


def test_arrow_schema_gives_utc_timestamps_on_every_release() -> None:
    import pyarrow as pa
    from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

    from airflow_provider_kappa.compat.pyspark import arrow_schema

    schema = StructType(
        [StructField("id", StringType()), StructField("ts", TimestampType()), StructField("n", LongType())]
    )
    assert arrow_schema(schema) == pa.schema(
        [("id", pa.string()), ("ts", pa.timestamp("us", tz="UTC")), ("n", pa.int64())]
    )


def test_the_stream_arrow_writer_is_a_streaming_writer_pyspark_feeds_arrow() -> None:
    from pyspark.sql import datasource

    from airflow_provider_kappa.compat.pyspark import stream_arrow_writer

    base = stream_arrow_writer()
    assert issubclass(base, datasource.DataSourceStreamWriter)
    if hasattr(datasource, "DataSourceStreamArrowWriter"):  # 4.1+
        assert base is datasource.DataSourceStreamArrowWriter
    else:  # 4.0: its write worker hands Arrow batches to a DataSourceArrowWriter
        assert issubclass(base, datasource.DataSourceArrowWriter)


def _pyspark_version() -> tuple[int, int, int]:
    """The installed pyspark's ``(major, minor, patch)`` (a suffix such as ``.dev0`` ignored)."""
    import pyspark

    parts = [int("".join(c for c in p if c.isdigit()) or 0) for p in pyspark.__version__.split(".")[:3]]
    return (parts[0], (parts + [0])[1], (parts + [0, 0])[2])
