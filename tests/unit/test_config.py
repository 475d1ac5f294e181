"""kappa.yaml loading: every bad config gets one clear error naming the key and the value."""

from __future__ import annotations

import copy
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from paths import EXAMPLES

from airflow_provider_kappa.exceptions import KappaConfigError
from airflow_provider_kappa.job.config import (
    DynamicSourceConfig,
    IcebergSourceConfig,
    KafkaSourceConfig,
    load_config,
)

BASE: dict[str, Any] = {
    "job": {"name": "rmi", "application": "job.py", "checkpoint_root": "/tmp/ckpt", "spark_conf": {"a": "1"}},
    "catalogs": {"lake": {"type": "sql", "uri": "sqlite:////tmp/c.db", "warehouse": "file:///tmp/w"}},
    "sources": {
        "impressions": {
            "type": "dynamic",
            "selected": "live-impressions",
            "candidates": ["live-impressions", "backfill-impressions"],
        },
        "live-impressions": {"type": "kafka", "topics": "impressions", "bootstrap_servers": "kafka:9092"},
        "backfill-impressions": {
            "type": "iceberg",
            "catalog": "lake",
            "table": "raw.impressions",
            "ingestion_column": "ingestion_ts",
            "max_misalignment_threshold": "15min",
        },
    },
    "sinks": {
        "summary": {"type": "iceberg", "catalog": "lake", "table": "prod.summary", "time_column": "window_start"}
    },
}


def write(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "kappa.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def with_change(path: list[str], value: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    node = data
    for key in path[:-1]:
        node = node[key]
    if value is DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return data


DELETE = object()


def test_loads_design_example(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, BASE))
    assert cfg.job.application == tmp_path / "job.py"
    assert cfg.job_sources() == ["impressions"]
    assert isinstance(cfg.sources["impressions"], DynamicSourceConfig)
    live = cfg.resolve("impressions", backfill=False)
    assert isinstance(live, KafkaSourceConfig) and live.topics == "impressions"
    back = cfg.resolve("impressions", backfill=True)
    assert isinstance(back, IcebergSourceConfig)
    assert back.table == "raw.impressions" and back.max_misalignment_threshold == timedelta(minutes=15)
    assert cfg.sink("summary").time_column == "window_start"


@pytest.mark.parametrize("name", ["rmi", "playback_sessions"])
def test_packaged_examples_load(name: str) -> None:
    cfg = load_config(EXAMPLES / name / "kappa.yaml")
    assert cfg.job.name == name
    assert cfg.job.application.is_file()
    for src in cfg.job_sources():
        assert isinstance(cfg.resolve(src, backfill=True), IcebergSourceConfig)


def test_env_expansion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAPPA_TEST_LAKE", "/data/lake")
    data = with_change(["job", "checkpoint_root"], "${KAPPA_TEST_LAKE}/ckpt")
    data["catalogs"]["lake"]["warehouse"] = "file://${UNSET_KAPPA_VAR:-/fallback}/w"
    cfg = load_config(write(tmp_path, data))
    assert cfg.job.checkpoint_root == "/data/lake/ckpt"
    assert cfg.catalogs["lake"].properties is not None
    assert cfg.catalogs["lake"].properties["warehouse"] == "file:///fallback/w"


def test_conn_id_catalog(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, with_change(["catalogs", "lake"], {"conn_id": "my_iceberg"})))
    assert cfg.catalogs["lake"].conn_id == "my_iceberg" and cfg.catalogs["lake"].properties is None


@pytest.mark.parametrize(
    ("path", "value", "match"),
    [
        (["job", "nmae"], "x", r"job: unknown key\(s\) \['nmae'\]"),
        (
            ["sources", "backfill-impressions", "tabel"],
            "x",
            r"sources.backfill-impressions: unknown key\(s\) \['tabel'\]",
        ),
        (["sources", "backfill-impressions", "table"], DELETE, r"sources.backfill-impressions.table: missing"),
        (
            ["sources", "backfill-impressions", "table"],
            "impressions",
            r"table: 'impressions' must be 'namespace.table'",
        ),
        (
            ["sources", "backfill-impressions", "max_misalignment_threshold"],
            "0s",
            r"max_misalignment_threshold: '0s' must be positive",
        ),
        (
            ["sources", "backfill-impressions", "max_misalignment_threshold"],
            "-5min",
            r"max_misalignment_threshold: '-5min' is not a duration",
        ),
        (["sources", "backfill-impressions", "max_misalignment_threshold"], "soon", r"'soon' is not a duration"),
        (["sources", "backfill-impressions", "catalog"], "nope", r"catalog: 'nope' is not a defined catalog"),
        (["sources", "backfill-impressions", "type"], "kinesis", r"type: 'kinesis' is not a source type"),
        (
            ["sources", "impressions", "candidates"],
            ["live-impressions", "ghost"],
            r"candidates: 'ghost' is not a defined source",
        ),
        (["sources", "impressions", "selected"], "ghost", r"selected: 'ghost' is not one of its candidates"),
        (
            ["sources", "impressions", "candidates"],
            "live-impressions",
            r"candidates: 'live-impressions' must be a non-empty list",
        ),
        (["sinks", "summary", "catalog"], "nope", r"sinks.summary.catalog: 'nope' is not a defined catalog"),
        (["sinks", "summary", "time_column"], DELETE, r"sinks.summary.time_column: missing"),
        (["sinks", "summary", "type"], "kafka", r"sinks.summary.type: 'kafka' is not a sink type"),
        (["job", "spark_conf"], ["a"], r"job.spark_conf: \['a'\] must be a mapping"),
        (["job", "name"], 12.5, r"job.name: '12.5' is not a valid name"),
        (["job", "name"], {"x": 1}, r"job.name: \{'x': 1\} must be a non-empty string"),
        (["sinks"], DELETE, r"sinks: missing or empty"),
        (["backfill"], {"mode": "fast"}, r"backfill.mode: 'fast' is not a mode"),
        (["backfill"], {"slice": "0s"}, r"backfill.slice: '0s' must be positive"),
        (["backfill"], {"min_match": 120}, r"backfill.min_match: 120 must be a percentage"),
        (
            ["job", "checkpoint_root"],
            "${KAPPA_SURELY_UNSET_VAR}/x",
            r"uses \$\{KAPPA_SURELY_UNSET_VAR\}, which is not set",
        ),
    ],
)
def test_bad_config(tmp_path: Path, path: list[str], value: Any, match: str) -> None:
    with pytest.raises(KappaConfigError, match=match):
        load_config(write(tmp_path, with_change(path, value)))


def test_no_iceberg_candidate_when_backfilling(tmp_path: Path) -> None:
    data = with_change(["sources", "impressions", "candidates"], ["live-impressions"])
    cfg = load_config(write(tmp_path, data))
    assert isinstance(cfg.resolve("impressions", backfill=False), KafkaSourceConfig)
    with pytest.raises(KappaConfigError, match=r"sources.impressions: a backfill needs a candidate of type 'iceberg'"):
        cfg.resolve("impressions", backfill=True)


def test_unknown_source_and_sink(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, BASE))
    with pytest.raises(KappaConfigError, match=r"source 'clicks' is not defined"):
        cfg.resolve("clicks", backfill=True)
    with pytest.raises(KappaConfigError, match=r"sink 'totals' is not defined"):
        cfg.sink("totals")


def test_malformed_yaml_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "kappa.yaml"
    bad.write_text("job: [unclosed\n")
    with pytest.raises(KappaConfigError, match=r"is not valid YAML"):
        load_config(bad)
    with pytest.raises(KappaConfigError, match=r"cannot be read"):
        load_config(tmp_path / "missing.yaml")
    bad.write_text("- a list\n")
    with pytest.raises(KappaConfigError, match=r"expected a mapping"):
        load_config(bad)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (
            "job: [unclosed\n",
            "line 2, column 1: expected ',' or ']', but got '<stream end>' (while parsing a flow sequence)",
        ),
        ("job:\n  name: rmi\n   application: job.py\n", "line 3, column 15: mapping values are not allowed here"),
        (
            "job: {name: rmi}\njob\tx: 1: 2\n",
            "line 2, column 4: found character '\\t' that cannot start any token (while scanning for the next token)",
        ),
    ],
)
def test_malformed_yaml_is_refused_in_one_line_naming_the_file_line_column_and_problem(
    tmp_path: Path, text: str, where: str
) -> None:
    bad = tmp_path / "kappa.yaml"
    bad.write_text(text)
    with pytest.raises(KappaConfigError) as e:
        load_config(bad)
    message = str(e.value)
    assert message.startswith(f"config {str(bad)!r} is not valid YAML at {where}"), message
    assert "\n" not in message and "^" not in message and "<unicode string>" not in message, message


@pytest.mark.parametrize("value", ["Kappa-Staging", "kappa.staging", "staging ns", "[a-z0-9_]"])
def test_a_staging_namespace_outside_the_staging_tables_rule_is_refused_at_load(tmp_path: Path, value: str) -> None:
    with pytest.raises(KappaConfigError) as e:
        load_config(write(tmp_path, with_change(["job", "staging_namespace"], value)))
    assert str(e.value) == f"job.staging_namespace: {value!r} must match [a-z0-9_]+ (e.g. 'kappa_staging')"


@pytest.mark.parametrize("value", ["kappa_staging", "staging2", "2staging"])
def test_a_staging_namespace_the_staging_tables_accept_loads(tmp_path: Path, value: str) -> None:
    assert load_config(write(tmp_path, with_change(["job", "staging_namespace"], value))).job.staging_namespace == value


def test_job_class_data_sharing_is_a_boolean_defaulting_to_true(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, BASE)).job.class_data_sharing is True
    assert (
        load_config(write(tmp_path, with_change(["job", "class_data_sharing"], False))).job.class_data_sharing is False
    )
    with pytest.raises(KappaConfigError, match=r"job\.class_data_sharing: 'yes' must be true or false"):
        load_config(write(tmp_path, with_change(["job", "class_data_sharing"], "yes")))
