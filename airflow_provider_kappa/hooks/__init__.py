"""Airflow hooks of airflow-provider-kappa (import Airflow; loaded by tasks, never by the Spark side)."""
