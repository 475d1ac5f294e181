"""Extra links of the backfill operators: buttons on a task instance in the Airflow UI.

- **Backfill report** (validate and publish tasks; verify, drift and verify_gate of a verification): the backfill's HTML report
  (:meth:`airflow_provider_kappa.job.checkpoints.CheckpointStore.report_file`,
  ``<checkpoint_root>/<job>/backfill/<backfill_id>/report.html``).
- **Spark UI** (each slice task): while the slice runs, the Spark UI of its application; once it
  has finished, the Spark History Server when one is configured.

An extra link is a URL the browser opens, and the report is a file beside the checkpoints, so
where it is served from is configuration, in Airflow's own config (section ``[kappa]``, or
``AIRFLOW__KAPPA__<OPTION>`` environment variables, declared by the provider):

``report_base_url``
    A URL serving ``job.checkpoint_root`` (a static web server, a bucket website, a reverse
    proxy): the link is ``<report_base_url>/<job>/backfill/<backfill_id>/report.html``. Unset,
    a local checkpoint root gives a ``file://`` URL (opens on the machine that holds it; browsers
    open ``file://`` links from a web page only when copied into the address bar), and a
    remote one (``s3://``, ...) gives no link.
``spark_ui_url``
    The Spark UI of a running slice. Placeholders: ``{job}``, ``{backfill_id}``, ``{slice_id}``,
    ``{app_name}`` (the slice's Spark application name, ``kappa-<job>-<backfill_id>-<slice_id>``).
    Unset: ``http://<host>:<spark.ui.port or 4040>``, the host being the Spark Connect server's
    (engine ``connect`` with ``job.connect``) or the worker's; no link when ``job.spark_conf``
    sets ``spark.ui.enabled`` to false.
``spark_history_url``
    The Spark History Server (same placeholders), the link of a finished slice. Unset: a
    finished slice of engine ``connect`` keeps the UI link (the server outlives the slice);
    of engine ``submit``, no link (its driver and UI are gone).

The task computes its URLs while it runs and keeps them in XCom (``kappa_links``); at the end
Airflow stores each link's URL under the link's XCom key, which the UI reads. The slice task
also stores its running link at start, so that the button works while Spark runs.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from airflow.sdk import BaseOperatorLink

from airflow_provider_kappa.engine.connect_server import configured_url
from airflow_provider_kappa.exceptions import KappaConfigError
from airflow_provider_kappa.job.config import CONNECT

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator, Context
    from airflow.sdk.types import TaskInstanceKey

    from airflow_provider_kappa.backfill.backfill import Backfill

#: The provider's section of the Airflow config.
SECTION = "kappa"
#: The XCom key holding a task's link URLs (link name -> URL).
LINKS_XCOM = "kappa_links"
PLACEHOLDERS = ("job", "backfill_id", "slice_id", "app_name")


def option(name: str) -> str:
    """The value of ``[kappa] <name>`` in the Airflow config ('' when unset).

    :param name: the option, e.g. ``report_base_url``.
    """
    from airflow_provider_kappa.compat.airflow import conf

    return str(conf.get(SECTION, name, fallback="") or "").strip()


def _fill(name: str, template: str, fields: dict[str, str]) -> str:
    try:
        return template.format_map(fields)
    except (KeyError, IndexError, ValueError) as e:
        raise KappaConfigError(
            f"[{SECTION}] {name}: {template!r} has a bad placeholder ({type(e).__name__}: {e}); "
            f"allowed: {', '.join('{' + p + '}' for p in PLACEHOLDERS)}"
        ) from e


def report_url(bf: Backfill) -> str:
    """The URL of ``bf``'s report (see the module docstring); '' when no browser can open it.

    :param bf: the backfill.
    """

    uri = bf.store().report_file()
    base = option("report_base_url")
    root = bf.cfg.job.checkpoint_root.rstrip("/")
    if base:
        if not uri.startswith(root + "/"):
            raise KappaConfigError(
                f"[{SECTION}] report_base_url: the report {uri!r} is not under job.checkpoint_root {root!r}"
            )
        return f"{base.rstrip('/')}/{uri[len(root) + 1 :]}"
    if uri.startswith("file://"):
        return uri
    if "://" not in uri:
        return Path(uri).resolve().as_uri()
    return ""


def _configured(name: str, bf: Backfill, slice_id: str) -> str:
    """Option ``name`` with the slice's placeholders filled in ('' when unset)."""
    template = option(name)
    job = bf.cfg.job.name
    fields = {"job": job, "backfill_id": bf.id, "slice_id": slice_id, "app_name": f"kappa-{job}-{bf.id}-{slice_id}"}
    return _fill(name, template, fields) if template else ""


def spark_ui_url(bf: Backfill, slice_id: str) -> str:
    """The Spark UI of slice ``slice_id`` while it runs (see the module docstring).

    :param bf: the backfill.
    :param slice_id: the slice.
    """

    configured = _configured("spark_ui_url", bf, slice_id)
    if configured:
        return configured
    conf = bf.cfg.job.spark_conf
    if str(conf.get("spark.ui.enabled", "true")).strip().lower() == "false":
        return ""
    host = socket.getfqdn()
    if bf.cfg.job.engine == CONNECT and bf.cfg.job.connect is not None:
        url = configured_url(bf.cfg) or ""
        host = urlparse("http://" + url.split("://", 1)[-1].split(";", 1)[0]).hostname or host
    return f"http://{host}:{conf.get('spark.ui.port', '4040')}"


def spark_finished_url(bf: Backfill, slice_id: str) -> str:
    """The link of slice ``slice_id`` once it has finished (see the module docstring).

    :param bf: the backfill.
    :param slice_id: the slice.
    """

    finished = _configured("spark_history_url", bf, slice_id)
    if finished or bf.cfg.job.engine != CONNECT:
        return finished
    return spark_ui_url(bf, slice_id)


class _KappaLink(BaseOperatorLink):
    """A link whose URL the task put in its XCom ``kappa_links`` while it ran."""

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        """The URL the task instance recorded ('' when it recorded none).

        :param operator: the task.
        :param ti_key: the task instance.
        """
        from airflow.sdk.execution_time.xcom import XCom

        links: Any = XCom.get_value(ti_key=ti_key, key=LINKS_XCOM)
        return str(links.get(self.name) or "") if isinstance(links, dict) else ""


class KappaReportLink(_KappaLink):
    """Opens the backfill's HTML report (validate and publish tasks)."""

    name = "Backfill report"


class KappaSparkLink(_KappaLink):
    """Opens the slice's Spark UI while it runs, its Spark history once it has finished."""

    name = "Spark UI"


def record_report_link(context: Context, bf: Backfill) -> str:
    """Keep the report's URL for the task's :class:`KappaReportLink`; return it.

    :param context: the task's context.
    :param bf: the backfill.
    """
    return record_report_url(context, report_url(bf))


def record_report_url(context: Context, url: str) -> str:
    """Keep ``url`` (a report's URL, '' for none) for the task's :class:`KappaReportLink`; return it.

    :param context: the task's context.
    :param url: the report's URL.
    """
    context["ti"].xcom_push(key=LINKS_XCOM, value={KappaReportLink.name: url})
    return url


def record_slice_links(context: Context, bf: Backfill, slice_id: str) -> str:
    """Before a slice runs: show its Spark UI link now, and keep the link of the finished slice
    for the end of the task (Airflow then replaces the first). Returns the running link.

    :param context: the task's context.
    :param bf: the backfill.
    :param slice_id: the slice.
    """
    running, finished = spark_ui_url(bf, slice_id), spark_finished_url(bf, slice_id)
    ti = context["ti"]
    ti.xcom_push(key=KappaSparkLink().xcom_key, value=running)
    ti.xcom_push(key=LINKS_XCOM, value={KappaSparkLink.name: finished})
    return running
