"""The docs' lists of backfill options and Params are what the table of parameters
(``backfill.params.PARAMS``) renders: README's "Backfill options" and Params list,
docs/airflow.md's Params table and its command-line synopsis."""

from __future__ import annotations

import re
from pathlib import Path

from airflow_provider_kappa.backfill.params import KEYS
from airflow_provider_kappa.backfill.params_docs import options_synopsis, params_table

ROOT = Path(__file__).parents[2]


def squash(text: str) -> str:
    """Whitespace runs as one space (the docs wrap the synopsis)."""
    return " ".join(text.split())


def test_readme_backfill_options_are_the_table_s() -> None:
    readme = (ROOT / "README.md").read_text()
    found = re.search(r"^Backfill options: `([^`]*)`", readme, re.MULTILINE)
    assert found, "README.md has no 'Backfill options: `...`' paragraph"
    assert squash(found.group(1)) == squash(options_synopsis()), f"README.md should read: {options_synopsis()}"


def test_readme_params_list_is_the_table_s() -> None:
    readme = squash((ROOT / "README.md").read_text())
    assert f"The DAG's Params form is the UI of a backfill ({', '.join(KEYS)})" in readme


def test_airflow_doc_params_table_is_the_table_s() -> None:
    doc = (ROOT / "docs" / "airflow.md").read_text()
    section = doc.split("### Params (the trigger form)\n", 1)[1]
    first = section.index("| param |")
    table = section[first : section.index("\n\n", first)]
    assert table == params_table(), f"docs/airflow.md's Params table should be:\n{params_table()}"


def test_airflow_doc_command_line_options_are_the_table_s() -> None:
    doc = (ROOT / "docs" / "airflow.md").read_text()
    found = re.search(r"^backfill options: (.*?)^```", doc, re.MULTILINE | re.DOTALL)
    assert found, "docs/airflow.md has no 'backfill options:' line in its command-line block"
    assert squash(found.group(1)) == squash(options_synopsis())
