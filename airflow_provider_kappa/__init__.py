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
                    "airflow_provider_kappa.operators.cleanup",
                ],
            }
        ],
        "hooks": [
            {
                "integration-name": "Kappa backfill",
                "python-modules": ["airflow_provider_kappa.hooks.iceberg"],
            }
        ],
        "extra-links": [
            "airflow_provider_kappa.operators.links.KappaReportLink",
            "airflow_provider_kappa.operators.links.KappaSparkLink",
        ],
        "config": {
            "kappa": {
                "description": "Where the extra links of Kappa backfill tasks point (airflow_provider_kappa.operators.links).",
                "options": {
                    "report_base_url": {
                        "description": "URL serving job.checkpoint_root: the Backfill report link is "
                        "<report_base_url>/<job>/backfill/<backfill_id>/report.html. Empty: a file:// URL for a local "
                        "checkpoint root, no link for a remote one.",
                        "version_added": None,
                        "type": "string",
                        "example": "https://reports.example.com/kappa-checkpoints",
                        "default": "",
                    },
                    "spark_ui_url": {
                        "description": "Spark UI of a running slice; placeholders {job}, {backfill_id}, {slice_id}, "
                        "{app_name}. Empty: http://<Spark Connect host or worker>:<spark.ui.port or 4040>.",
                        "version_added": None,
                        "type": "string",
                        "example": "https://spark-proxy.example.com/{app_name}",
                        "default": "",
                    },
                    "spark_history_url": {
                        "description": "Spark History Server, the link of a finished slice (same placeholders). "
                        "Empty: engine connect keeps the Spark UI link, engine submit has none.",
                        "version_added": None,
                        "type": "string",
                        "example": "http://spark-history:18080",
                        "default": "",
                    },
                },
            }
        },
    }
