"""`kappa demo`: lake generator, live reference, the story and its report.

Installed with the ``[demo]`` extra; Airflow workers never need it.
"""
