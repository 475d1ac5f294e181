"""The private attributes of the Airflow Spark provider's ``SparkSubmitHook`` kappa reads: the one
module that names them.

- ``_connection``: the connection the hook resolved (master, deploy mode, from the Airflow connection,
  its extras and the hook's arguments). kappa builds the run's properties for that master and deploy
  mode before the hook starts spark-submit; the hook resolves them in ``__init__`` and has no public
  accessor, and resolving them again from the connection would copy its rules (URI vs form
  connections, the ``deploy-mode`` extra) and drift from them.
- ``_submit_sp``: the running spark-submit process. ``on_kill`` is public but SIGKILLs spark-submit
  alone; a graceful stop (SIGTERM, so the JVM runs Spark's shutdown hooks, then the whole process group)
  needs the process, and ``submit`` blocks and returns nothing of it.
- ``_yarn_application_id``, ``_kubernetes_driver_pod``, ``_driver_id``: what a cluster-mode spark-submit
  started on its cluster, parsed by the hook from spark-submit's output; its public ``on_kill`` acts
  on them and nothing public tells whether there is one.

The hook sets every one of them in ``__init__``, so they are read plainly: a release that renames one
fails here with an ``AttributeError`` naming it, and ``tests/unit/test_compat_spark_provider.py``
checks them on a hook of the installed provider first. Airflow is never imported here: each function
takes the hook.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from typing import Any


def resolved_connection(hook: Any) -> Mapping[str, Any]:
    """The connection ``hook`` (a ``SparkSubmitHook``) resolved: ``master``, ``deploy_mode`` (``None``
    when neither the hook's argument nor the connection sets one) and the provider's other keys."""
    connection: Mapping[str, Any] = hook._connection
    return connection


def submit_process(hook: Any) -> subprocess.Popen[str] | None:
    """The spark-submit process ``hook.submit`` started, ``None`` before it did."""
    proc: subprocess.Popen[str] | None = hook._submit_sp
    return proc


def cluster_application(hook: Any) -> str | None:
    """The application a cluster-mode spark-submit of ``hook`` started on its cluster (a YARN
    application id, a Kubernetes driver pod, a standalone driver id), as the hook read it from
    spark-submit's output; ``None`` in client mode or before the cluster answered."""
    found = hook._yarn_application_id or hook._kubernetes_driver_pod or hook._driver_id
    return str(found) if found else None
