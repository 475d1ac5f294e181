"""Adapters over the private APIs of kappa's dependencies: one module per library, the only place
that names them (docs/architecture.md, Private APIs). Each module says why no public API serves;
``tests/unit/test_compat_*.py`` fail, naming the library, its version and the name, when an
installed release changes one. Imports nothing of the package and nothing heavy at import time; only
``compat/airflow.py`` (the Airflow 3.1 names outside ``airflow.sdk``) imports Airflow, for the operators and
the DAG factory, never for ``spark/``.
"""
