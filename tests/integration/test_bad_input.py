"""Bad input given to ``kappa backfill`` is refused before any Spark run: exit code 2, an error
naming what is wrong (the key or table, the bad value, what is expected), and nothing written:
the target keeps its rows, no tag is added to the source, no checkpoint folder and no staging
table are created.

Complements the parameter cases of ``test_cli.py`` (naive timestamps, end before start,
unknown source, zero threshold, negative slice, slice larger than the range read, min_match out of
range, window outside the data) and the unit cases of ``test_config.py`` / ``test_params.py``.
Every case runs the real CLI in-process on a real sqlite catalog; spark-submit is replaced by a
function that fails the test if it is ever reached (the process boundary).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import airflow_env  # noqa: F401  (sets AIRFLOW_HOME before Airflow is imported)
import pytest
import yaml
from airflow_env import patch_spark_submit, write_job_config
from lake import INCIDENT_END, INCIDENT_START, seed_sessions_incident, sorted_rows

from airflow_provider_kappa.cli import main

WINDOW = ["--start", INCIDENT_START.isoformat(), "--end", INCIDENT_END.isoformat()]
SOURCE, TARGET = "raw.playbacks", "prod.playback_sessions"

#: Changes the job's kappa.yaml (a dict) in place; gets the test's folder.
Edit = Callable[[dict[str, Any], Path], None]


def put(path: str, value: Any) -> Edit:
    """An edit setting the dotted ``path`` of the YAML to ``value``."""

    def edit(raw: dict[str, Any], folder: Path) -> None:
        *parents, last = path.split(".")
        node = raw
        for key in parents:
            node = node[key]
        node[last] = value(folder) if callable(value) else value

    return edit


def drop_table(identifier: str) -> Callable[[Any], None]:
    def change(catalog: Any) -> None:
        catalog.drop_table(identifier)

    return change


CASES: list[tuple[str, Edit | None, Callable[[Any], None] | None, list[str], str]] = [
    # id, kappa.yaml edit, lake change, extra CLI args, expected message
    (
        "unknown-sink-type",
        put("sinks.sessions.type", "delta"),
        None,
        [],
        "sinks.sessions.type: 'delta' is not a sink type; allowed: ['iceberg']",
    ),
    (
        "sink-with-undefined-catalog",
        put("sinks.sessions.catalog", "warehouse"),
        None,
        [],
        "sinks.sessions.catalog: 'warehouse' is not a defined catalog; defined: ['lake']",
    ),
    (
        "missing-source-table",
        None,
        drop_table(SOURCE),
        [],
        "source playbacks (backfill-playbacks): table 'raw.playbacks' does not exist in catalog 'lake'",
    ),
    (
        "missing-target-table",
        None,
        drop_table(TARGET),
        [],
        "sink sessions: target table 'prod.playback_sessions' does not exist in catalog 'lake'",
    ),
    (
        "ingestion-column-missing",
        put("sources.backfill-playbacks.ingestion_column", "landed_at"),
        None,
        [],
        "table 'raw.playbacks': ingestion column 'landed_at' does not exist; columns: ['event_id', 'account_id'",
    ),
    (
        "ingestion-column-wrong-type",
        put("sources.backfill-playbacks.ingestion_column", "event_id"),
        None,
        [],
        "table 'raw.playbacks': ingestion column 'event_id' has type string; expected timestamptz",
    ),
    (
        "sink-time-column-missing",
        put("sinks.sessions.time_column", "window_start"),
        None,
        [],
        "sink sessions: time_column 'window_start' is not a column of 'prod.playback_sessions'",
    ),
    (
        "sink-time-column-wrong-type",
        put("sinks.sessions.time_column", "plays"),
        None,
        [],
        "sink sessions: time_column 'plays' of 'prod.playback_sessions' has type long; expected timestamptz",
    ),
    (
        "unknown-top-level-key",
        put("sink", {"sessions": {}}),
        None,
        [],
        "unknown key(s) ['sink']; allowed: ['backfill', 'catalogs', 'job', 'land', 'sinks', 'sources']",
    ),
    ("unknown-job-key", put("job.aplication", "x.py"), None, [], "job: unknown key(s) ['aplication']"),
    (
        "unknown-source-key",
        put("sources.backfill-playbacks.ingestion_col", "ingestion_ts"),
        None,
        [],
        "sources.backfill-playbacks: unknown key(s) ['ingestion_col']",
    ),
    (
        "sources-not-a-mapping",
        put("sources", ["playbacks"]),
        None,
        [],
        "sources: expected a mapping of source names, got ['playbacks']",
    ),
    (
        "spark-conf-not-a-mapping",
        put("job.spark_conf", "spark.sql.shuffle.partitions=2"),
        None,
        [],
        "job.spark_conf: 'spark.sql.shuffle.partitions=2' must be a mapping of strings",
    ),
    (
        "threshold-not-a-duration",
        put("sources.backfill-playbacks.max_misalignment_threshold", 15),
        None,
        [],
        "sources.backfill-playbacks.max_misalignment_threshold: 15 is not a duration",
    ),
    (
        "min-match-not-a-number",
        put("backfill.min_match", "high"),
        None,
        [],
        "backfill.min_match: 'high' must be a percentage between 0 and 100",
    ),
    (
        "application-does-not-exist",
        put("job.application", "jobs/nope.py"),
        None,
        [],
        "job.application: '{folder}/jobs/nope.py' does not exist; expected the job's Python file",
    ),
    (
        "application-is-a-folder",
        put("job.application", "."),
        None,
        [],
        "job.application: '{folder}' is a folder; expected the job's Python file",
    ),
    (
        "catalog-unreachable",
        put("catalogs.lake.uri", lambda f: f"sqlite:///{f}/no-such-dir/catalog.db"),
        None,
        [],
        "catalog 'lake': sqlite file '{folder}/no-such-dir/catalog.db' does not exist (uri of a type: sql catalog)",
    ),
    (
        "threshold-larger-than-slice",
        None,
        None,
        ["--slice", "1h", "--max-misalignment", "90min"],
        "backfill parameter max_misalignment_threshold: 90min exceeds slice 1h; it must be at most the slice",
    ),
    (
        "threshold-larger-than-the-window",
        None,
        None,
        ["--max-misalignment", "3h"],
        "backfill parameter max_misalignment_threshold: 3h exceeds slice 1h",
    ),
]


@pytest.fixture()
def no_spark_submit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if a slice ever reaches spark-submit (bad input must be refused before)."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"spark-submit was reached with bad input: {args[:1]}")

    patch_spark_submit(monkeypatch, refuse)


@pytest.mark.parametrize(("edit", "lake_change", "argv", "reason"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_refused_before_spark_and_writes_nothing(
    tmp_path: Path,
    catalog: Any,
    catalog_props: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    no_spark_submit: None,
    edit: Edit | None,
    lake_change: Callable[[Any], None] | None,
    argv: list[str],
    reason: str,
) -> None:
    assert_refused(tmp_path, catalog, catalog_props, capsys, edit, lake_change, argv, reason)


@pytest.mark.parametrize("spark_conn_id", [None, "spark_yarn"])
def test_a_kubernetes_master_without_the_kubernetes_provider_is_refused(
    tmp_path: Path,
    catalog: Any,
    catalog_props: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    no_spark_submit: None,
    no_kubernetes_provider: None,
    monkeypatch: pytest.MonkeyPatch,
    spark_conn_id: str | None,
) -> None:
    """SparkSubmitHook would fail at the first slice with ``NameError: kube_client``, after the tag
    and the checkpoint: kappa refuses a k8s:// job.master with the other bad input. With a Spark
    connection, whose master wins over job.master, job.master is not refused up front (the slice
    reaches the submit step, here the test's stand-in for spark-submit)."""
    k8s = put("job.master", "k8s://https://127.0.0.1:6443")
    if spark_conn_id is None:
        reason = (
            "job.master 'k8s://https://127.0.0.1:6443' is a Kubernetes master (k8s://), and Airflow's Kubernetes "
            "provider, which SparkSubmitHook needs for it, is not installed here; install it with: "
            "pip install 'airflow-provider-kappa[kubernetes]'"
        )
        assert_refused(tmp_path, catalog, catalog_props, capsys, k8s, None, [], reason)
        return
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_YARN", '{"conn_type": "spark", "host": "yarn"}')
    config = incident_config(tmp_path, catalog, catalog_props, k8s)
    code = main(["backfill", "--config", str(config), *WINDOW, "--spark-conn-id", spark_conn_id])
    out, err = capsys.readouterr()
    assert code == 1, out + err
    assert "spark-submit was reached with bad input" in out, out + err
    assert "Kubernetes" not in out + err


def incident_config(tmp_path: Path, catalog: Any, catalog_props: dict[str, str], edit: Edit | None) -> Path:
    """The incident seeded in ``catalog`` and the job's kappa.yaml, with ``edit`` applied."""
    seed_sessions_incident(catalog, SOURCE, TARGET)
    # engine submit: the guard (no_spark_submit) is the submit engine's process boundary
    config = write_job_config(tmp_path, catalog_props, engine="submit")
    if edit is not None:
        raw = yaml.safe_load(config.read_text())
        edit(raw, tmp_path)
        config.write_text(yaml.safe_dump(raw, sort_keys=False))
    return config


def assert_refused(
    tmp_path: Path,
    catalog: Any,
    catalog_props: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    edit: Edit | None,
    lake_change: Callable[[Any], None] | None,
    argv: list[str],
    reason: str,
) -> None:
    """``kappa backfill`` of the incident with ``edit`` and ``lake_change`` applied exits 2 with
    ``reason`` and leaves the lake and the checkpoint folder as they were."""
    config = incident_config(tmp_path, catalog, catalog_props, edit)
    if lake_change is not None:
        lake_change(catalog)
    before = _lake_state(catalog)

    code = main(["backfill", "--config", str(config), *WINDOW, *argv])
    out, err = capsys.readouterr()

    assert code == 2, out + err
    assert err.startswith("kappa backfill: error: "), err
    assert reason.format(folder=tmp_path) in err, err
    assert _lake_state(catalog) == before
    assert not (tmp_path / "checkpoints").exists()


def test_malformed_yaml_is_refused(
    tmp_path: Path, catalog: Any, capsys: pytest.CaptureFixture[str], no_spark_submit: None
) -> None:
    seed_sessions_incident(catalog, SOURCE, TARGET)
    before = _lake_state(catalog)
    config = tmp_path / "kappa.yaml"
    config.write_text("job:\n  name: playback_sessions\n  spark_conf: {unclosed: 1\n")
    code = main(["backfill", "--config", str(config), *WINDOW])
    err = capsys.readouterr().err
    assert code == 2 and f"kappa backfill: error: config '{config}' is not valid YAML" in err, err
    assert _lake_state(catalog) == before


def _lake_state(catalog: Any) -> dict[str, Any]:
    """Everything a refused backfill must leave alone: tables, their rows, refs and snapshots."""
    state: dict[str, Any] = {"namespaces": sorted(catalog.list_namespaces())}
    for ns in state["namespaces"]:
        for ident in catalog.list_tables(ns):
            table = catalog.load_table(ident)
            name = ".".join(ident)
            state[name] = {
                "refs": sorted(table.metadata.refs),
                "snapshots": [s.snapshot_id for s in table.snapshots()],
                "rows": sorted_rows(table),
            }
    return state
