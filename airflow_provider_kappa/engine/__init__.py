"""How Spark is started and driven: one class per engine behind one interface
(:class:`~airflow_provider_kappa.engine.base.Engine`: start, run a slice, stop, kill), the
spark.kappa.* conf of a run (launch), spark-submit and its arguments, Spark Connect (a server kappa
owns, client sessions and their runner), the processes they start, the JVM artifacts, progress
records, and the landing's conf.

Plain Python: no Airflow import at module level; nothing here imports ``backfill/``.
"""
