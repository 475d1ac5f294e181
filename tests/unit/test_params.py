"""Backfill parameters: parsing, defaults, precise errors, the deterministic id, the Airflow
Params JSON schema agreeing with the parser, and the CLI flags derived from the same table."""

from __future__ import annotations

import argparse
import re
from dataclasses import fields
from datetime import timedelta
from pathlib import Path

import jsonschema
import pytest
from paths import EXAMPLES

from airflow_provider_kappa.backfill.params import (
    CLI_PARAMS,
    DURATION_PATTERN,
    KEYS,
    PARAMS,
    POSITIVE_DURATION_PATTERN,
    TIMESTAMP_PATTERN,
    BackfillParams,
    backfill_id,
    param_schemas,
    parse_params,
    to_argv,
)
from airflow_provider_kappa.cli.plan import add_backfill_arguments, params_from_args
from airflow_provider_kappa.exceptions import KappaConfigError
from airflow_provider_kappa.job.config import load_config
from airflow_provider_kappa.timeparse import human_duration, parse_duration, parse_timestamp

START = "2026-11-01T00:00:00+00:00"
END = "2026-11-01T03:00:00+00:00"


@pytest.fixture()
def rmi():  # type: ignore[no-untyped-def]
    return load_config(EXAMPLES / "rmi" / "kappa.yaml")


def test_defaults_come_from_the_job_config(rmi) -> None:  # type: ignore[no-untyped-def]
    p = parse_params(rmi, {"start": START, "end": "2026-11-01T03:00:00+01:00"})
    assert p.end - p.start == timedelta(hours=2)
    assert p.sources == ("impressions", "playbacks")
    assert p.slice == timedelta(hours=1)
    assert p.warmup == timedelta(minutes=30)
    assert p.tail == timedelta(minutes=15)
    assert p.max_misalignment_threshold == timedelta(minutes=15)
    assert (p.mode, p.dry_run, p.publish, p.min_match, p.ledger) == ("sequential", False, True, None, "auto")
    assert (p.min_match_for(False), p.min_match_for(True)) == (0.0, 0.0)  # publishes: no gate by default
    assert p.read_start == p.start - timedelta(minutes=30)
    assert p.read_end == p.end + timedelta(minutes=15)
    assert p.publishes


def test_tail_defaults_to_the_threshold_when_the_config_has_none(tmp_path: Path) -> None:
    text = (EXAMPLES / "playback_sessions" / "kappa.yaml").read_text().replace("  tail: 15min\n", "")
    path = tmp_path / "kappa.yaml"
    path.write_text(
        text.replace(
            "application: playback_sessions.py", f"application: {EXAMPLES}/playback_sessions/playback_sessions.py"
        )
    )
    cfg = load_config(path)
    p = parse_params(cfg, {"start": START, "end": END, "max_misalignment_threshold": "5min"})
    assert p.tail == timedelta(minutes=5)


def test_round_trip_through_to_dict(rmi) -> None:  # type: ignore[no-untyped-def]
    p = parse_params(
        rmi,
        {
            "start": START,
            "end": END,
            "sources": "playbacks, impressions",
            "slice": "PT30M",
            "max_misalignment_threshold": "5min",
            "warmup": "0s",
            "tail": "0s",
            "mode": "parallel",
            "dry_run": "true",
            "publish": False,
            "min_match": "99.9",
        },
    )
    assert p.sources == ("playbacks", "impressions")
    assert (p.slice, p.warmup, p.tail) == (timedelta(minutes=30), timedelta(0), timedelta(0))
    assert (p.mode, p.dry_run, p.publish, p.min_match, p.publishes) == ("parallel", True, False, 99.9, False)
    assert parse_params(rmi, p.to_dict()) == p
    assert p.to_dict()["slice"] == "30min"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"start": None}, "backfill parameter start: missing"),
        ({"start": "2026-11-01T00:00:00", "end": END}, "naive timestamp"),
        ({"start": "yesterday", "end": END}, "'yesterday' is not an ISO-8601 timestamp"),
        ({"end": START, "start": END}, f"end: '{START}' is not after start '{END}'"),
        ({"end": START}, f"end: '{START}' is not after start '{START}'"),
        ({"sources": ["clicks"]}, "unknown source(s) ['clicks'] for job 'rmi'; allowed: ['impressions', 'playbacks']"),
        ({"sources": "live-playbacks"}, "unknown source(s) ['live-playbacks']"),
        ({"sources": []}, "names no source"),
        ({"slice": "0s"}, "backfill parameter slice: '0s' must be positive"),
        ({"slice": "-1h"}, "backfill parameter slice: '-1h' is not a duration"),
        ({"max_misalignment_threshold": "0min"}, "max_misalignment_threshold: '0min' must be positive"),
        ({"max_misalignment_threshold": "2h"}, "max_misalignment_threshold: 2h exceeds slice 1h"),
        ({"slice": "5h"}, "slice: 5h is larger than the range read [start - warmup, end + tail) = 225min"),
        ({"warmup": "-5min"}, "backfill parameter warmup: '-5min' is not a duration"),
        ({"tail": "soon"}, "backfill parameter tail: 'soon' is not a duration"),
        ({"mode": "fast"}, "mode: 'fast' is not a mode; allowed: ['sequential', 'parallel']"),
        ({"min_match": 101}, "min_match: 101 must be between 0 and 100"),
        ({"min_match": "most"}, "min_match: 'most' is not a number"),
        ({"dry_run": "maybe"}, "dry_run: 'maybe' is not a boolean"),
        ({"colour": "red"}, "unknown key(s) ['colour']"),
    ],
)
def test_bad_values_are_refused_with_the_key_value_and_what_is_allowed(rmi, raw, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(KappaConfigError) as err:
        parse_params(rmi, {"start": START, "end": END, **raw})
    assert message in str(err.value)


def test_backfill_id_is_deterministic_and_changes_with_what_is_computed(rmi) -> None:  # type: ignore[no-untyped-def]
    base = {"start": START, "end": END}
    a = backfill_id(rmi, parse_params(rmi, base))
    assert a == backfill_id(rmi, parse_params(rmi, {**base, "start": "2026-11-01T01:00:00+01:00"}))
    assert a == backfill_id(rmi, parse_params(rmi, {**base, "dry_run": True, "min_match": 99, "publish": False}))
    assert a == backfill_id(rmi, parse_params(rmi, {**base, "sources": ["playbacks", "impressions"]}))
    assert re.fullmatch(r"bf_202611010000_[0-9a-f]{10}", a)
    others = {
        backfill_id(rmi, parse_params(rmi, {**base, **change}))
        for change in (
            {"mode": "parallel"},
            {"slice": "30min"},
            {"warmup": "0s"},
            {"tail": "20min"},
            {"max_misalignment_threshold": "5min"},
            {"sources": ["playbacks"]},
            {"end": "2026-11-01T04:00:00+00:00"},
        )
    }
    assert a not in others and len(others) == 7


DURATIONS = [
    "0s",
    "0min",
    "PT0S",
    "15min",
    "1h",
    "2d",
    "500ms",
    "0.5h",
    "PT15M",
    "pt1h",
    "P1D",
    "P1DT2H",
    " 30 s ",
    "1.5min",
    "P",
    "PT",
    "x",
    "15",
    "-1h",
    "1 hour",
    "",
    "0.0s",
]


@pytest.mark.parametrize("value", DURATIONS)
def test_duration_patterns_agree_with_the_parser(value: str) -> None:
    def accepts(allow_zero: bool) -> bool:
        try:
            parse_duration(value, "x", allow_zero=allow_zero)
        except KappaConfigError:
            return False
        return True

    assert bool(re.match(DURATION_PATTERN, value)) == accepts(True)
    assert bool(re.match(POSITIVE_DURATION_PATTERN, value)) == accepts(False)


@pytest.mark.parametrize(
    "value",
    [
        "2026-11-01T00:00:00+00:00",
        "2026-11-01T00:00:00Z",
        "2026-11-01T00:00:00z",
        "2026-11-01 00:00+01:00",
        "2026-11-01T00:00:00.5-05:00",
        "2026-11-01T00:00:00",
        "2026-11-01",
        "tomorrow",
        "2026-13-01T00:00:00Z",
    ],
)
def test_timestamp_pattern_refuses_what_the_parser_refuses(value: str) -> None:
    try:
        parse_timestamp(value, "x")
        ok = True
    except KappaConfigError:
        ok = False
    if ok:
        assert re.match(TIMESTAMP_PATTERN, value)
    elif value != "2026-13-01T00:00:00Z":  # a well-formed but impossible date: refused by the first task
        assert not re.match(TIMESTAMP_PATTERN, value)


def test_param_schemas_validate_defaults_and_refuse_bad_single_values(rmi) -> None:  # type: ignore[no-untyped-def]
    schemas = param_schemas(rmi)
    assert list(schemas) == [
        "start",
        "end",
        "sources",
        "slice",
        "max_misalignment_threshold",
        "warmup",
        "tail",
        "mode",
        "dry_run",
        "publish",
        "min_match",
        "allow_open_end",
        "ledger",
    ]
    for schema in schemas.values():
        body = {k: v for k, v in schema.items() if k not in ("default", "title", "description")}
        if "default" in schema:
            jsonschema.validate(schema["default"], body)
    assert schemas["sources"]["examples"] == ["impressions", "playbacks"]
    assert schemas["slice"]["default"] == "1h" and schemas["tail"]["default"] == "15min"
    bad = {
        "sources": ["clicks"],
        "max_misalignment_threshold": "0s",
        "slice": "PT0S",
        "start": "2026-11-01T00:00:00",
        "mode": "fast",
        "min_match": 120,
        "warmup": "-1min",
    }
    for name, value in bad.items():
        body = {k: v for k, v in schemas[name].items() if k not in ("default", "title", "description")}
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(value, body)


def test_human_duration() -> None:
    assert [human_duration(timedelta(seconds=s)) for s in (0, 90, 900, 3600, 86400, 0.5)] == [
        "0s",
        "90s",
        "15min",
        "1h",
        "1d",
        "500ms",
    ]


def test_backfill_id_values_are_stable(rmi) -> None:  # type: ignore[no-untyped-def]
    """Ids name existing tags, staging tables and checkpoints: their values must not change."""
    base = {"start": START, "end": END}
    assert backfill_id(rmi, parse_params(rmi, base)) == "bf_202611010000_308e0936b8"
    assert backfill_id(rmi, parse_params(rmi, {**base, "mode": "parallel"})) == "bf_202611010000_e7085d5038"


def test_the_table_names_what_design_md_names() -> None:
    assert (
        KEYS
        == tuple(f.name for f in fields(BackfillParams))
        == (
            "start",
            "end",
            "sources",
            "slice",
            "max_misalignment_threshold",
            "warmup",
            "tail",
            "mode",
            "dry_run",
            "publish",
            "min_match",
            "allow_open_end",
            "ledger",
        )
    )
    assert sorted(p.name for p in CLI_PARAMS) == sorted(KEYS)
    assert [p.flag for p in CLI_PARAMS] == [
        "--start",
        "--end",
        "--mode",
        "--slice",
        "--warmup",
        "--tail",
        "--max-misalignment",
        "--sources",
        "--dry-run",
        "--no-publish",
        "--min-match",
        "--allow-open-end",
        "--ledger",
    ]
    assert [p.name for p in PARAMS if p.identity is None] == ["dry_run", "publish", "min_match", "allow_open_end"]


def cli(argv: list[str]) -> dict[str, object]:
    parser = argparse.ArgumentParser()
    add_backfill_arguments(parser)
    return params_from_args(parser.parse_args(["--config", "kappa.yaml", *argv]))


def test_cli_flags_come_from_the_table(rmi) -> None:  # type: ignore[no-untyped-def]
    assert cli(["--start", START, "--end", END]) == {
        "start": START,
        "end": END,
        "dry_run": False,
        "publish": True,
        "allow_open_end": False,
    }
    raw = cli(
        [
            "--start",
            START,
            "--end",
            END,
            "--mode",
            "parallel",
            "--slice",
            "30min",
            "--warmup",
            "0s",
            "--tail",
            "1h",
            "--max-misalignment",
            "5min",
            "--sources",
            "playbacks",
            "--dry-run",
            "--no-publish",
            "--min-match",
            "99.9",
            "--allow-open-end",
            "--ledger",
        ]
    )
    assert raw == {
        "start": START,
        "end": END,
        "mode": "parallel",
        "slice": "30min",
        "warmup": "0s",
        "tail": "1h",
        "max_misalignment_threshold": "5min",
        "sources": "playbacks",
        "dry_run": True,
        "publish": False,
        "min_match": "99.9",
        "allow_open_end": True,
        "ledger": "true",  # a bare --ledger
    }
    p = parse_params(rmi, raw)
    assert parse_params(rmi, cli(to_argv(p))) == p
    assert parse_params(rmi, cli(to_argv(parse_params(rmi, {"start": START, "end": END})))).publishes


def test_release_flags_are_those_of_the_backfill_id(rmi) -> None:  # type: ignore[no-untyped-def]
    p = parse_params(rmi, {"start": START, "end": END, "dry_run": True, "publish": False, "min_match": 50})
    assert to_argv(p, identity_only=True) == [
        "--start",
        START,
        "--end",
        END,
        "--mode",
        "sequential",
        "--slice",
        "1h",
        "--warmup",
        "30min",
        "--tail",
        "15min",
        "--max-misalignment",
        "15min",
        "--sources",
        "impressions,playbacks",
        "--ledger",
        "auto",
    ]
    again = parse_params(rmi, cli(to_argv(p, identity_only=True)))
    assert backfill_id(rmi, again) == backfill_id(rmi, p)


def test_the_form_has_a_basic_and_an_advanced_section(rmi) -> None:  # type: ignore[no-untyped-def]
    """Basic fields stay in the form's first section (Airflow's own, open when the form opens),
    advanced ones in the collapsed "Advanced" section."""
    schemas = param_schemas(rmi)
    sections = {name: schema.get("section") for name, schema in schemas.items()}
    assert set(sections.values()) == {None, "Advanced"}
    advanced = {n for n, s in sections.items() if s == "Advanced"}
    assert {"slice", "max_misalignment_threshold", "warmup", "tail", "allow_open_end", "ledger"} <= advanced
    assert not advanced & {"start", "end", "sources", "mode", "dry_run", "publish", "min_match"}


def test_every_field_has_its_own_title_and_help_naming_its_key(rmi) -> None:  # type: ignore[no-untyped-def]
    schemas = param_schemas(rmi)
    titles = [schema["title"] for schema in schemas.values()]
    assert len(set(titles)) == len(titles) and all(t and t[0].isupper() for t in titles)
    assert (
        schemas["start"]["title"] == "Window start"
        and schemas["max_misalignment_threshold"]["title"] == "Max misalignment threshold"
    )
    for name, schema in schemas.items():
        assert schema["description"].startswith(PARAMS[KEYS.index(name)].help), name
        assert schema["description"].endswith(f"Run conf key: {name}."), name


@pytest.mark.parametrize("name", ["start", "end"])
def test_start_and_end_get_a_date_time_picker_that_still_refuses_bad_values(rmi, name: str) -> None:  # type: ignore[no-untyped-def]
    """format date-time: Airflow's form draws a picker and checks RFC 3339 when a run is
    triggered (jsonschema's FormatChecker, as Airflow's Param validation uses it)."""
    schema = param_schemas(rmi)[name]
    assert (schema["type"], schema["format"]) == ("string", "date-time")
    body = {k: v for k, v in schema.items() if k not in ("default", "title", "description", "section")}
    check = jsonschema.FormatChecker()
    # what the picker sends (UTC, milliseconds), and ISO-8601 with an offset typed by hand
    for good in ("2026-11-01T00:00:00.000Z", "2026-11-01T00:00:00+00:00", "2026-11-01T02:00:00+02:00"):
        jsonschema.validate(good, body, format_checker=check)
        parse_timestamp(good, name)
    for bad in ("2026-11-01T00:00:00", "2026-11-01", "yesterday", "2026-13-01T00:00:00Z", "2026-11-01T00:00+00:00"):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, body, format_checker=check)
