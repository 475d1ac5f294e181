"""airflow-provider-kappa: Kappa backfills of unchanged PySpark streaming jobs from Iceberg.

Importing this package imports neither pyspark nor pyiceberg (nor Airflow).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def get_provider_info() -> dict[str, Any]:
    """Provider metadata read by Airflow through the ``apache_airflow_provider`` entry point."""
    return {
        "package-name": "airflow-provider-kappa",
        "name": "Kappa backfill",
        "description": "Backfill unchanged PySpark Structured Streaming jobs from Apache Iceberg, the Kappa way.",
        "versions": [__version__],
        "operators": [
            {
                "integration-name": "Kappa backfill",
                "python-modules": [
                    "airflow_provider_kappa.operators.snapshot",
                    "airflow_provider_kappa.operators.plan",
                    "airflow_provider_kappa.operators.slice_run",
                    "airflow_provider_kappa.operators.validate",
                    "airflow_provider_kappa.operators.publish",
                ],
            }
        ],
        "hooks": [
            {
                "integration-name": "Kappa backfill",
                "python-modules": ["airflow_provider_kappa.hooks.iceberg"],
            }
        ],
    }
