"""The backfill parameters as the docs write them, derived from
:data:`~airflow_provider_kappa.backfill.params.PARAMS`: the CLI synopsis (README.md, DESIGN.md) and
the Params table (docs/airflow.md, the DAG's doc). A unit test checks the docs hold them.
"""

from __future__ import annotations

from airflow_provider_kappa.backfill.params import CLI_PARAMS, PARAMS


def options_synopsis() -> str:
    """The backfill options as DESIGN.md writes them (``--mode sequential|parallel  --slice 1h  …``)."""
    parts = []
    for p in CLI_PARAMS:
        if not p.required:
            value = "|".join(p.choices) if p.kind == "enum" else p.example
            parts.append(f"{p.flag} {value}" if p.takes_value else p.flag)
    return "  ".join(parts)


def params_table() -> str:
    """The parameters as a Markdown table (docs/airflow.md, the DAG's doc)."""
    rows = ["| param | CLI flag | what it does | value | default | form section |", "|---|---|---|---|---|---|"]
    for p in PARAMS:
        rows.append(f"| `{p.name}` | `{p.flag}` | {p.help} | {p.value_doc()} | {p.default_doc} | {p.section} |")
    return "\n".join(rows)
