"""The backfill steps as plain Python, used by the CLI and the Airflow operators.

Config, params, planning, catalogs, checkpoints, lock, launching, validate and publish.
Imports no Airflow at module level and pyspark/pyiceberg only inside functions.
"""
