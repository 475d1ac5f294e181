"""A real backfill's report, seen by headless Chromium, and the extra links of its task instances.

One ``dag.test()`` run of the example playback-sessions DAG (real local Spark; one parallel
slice, the cheapest real backfill) repairs a seeded incident; its validate task writes the HTML report beside the
backfill's checkpoints. Chromium opens the report at the URL of the validate task's
**Backfill report** link (read from the real task instance, through the serialized DAG as the
API server does), saves a screenshot into the test's folder (path printed), and measures in the
page: no two axis labels' boxes overlap, and the shaded windows are exactly the windows the
validation found differing, all inside the incident. The slice tasks' **Spark UI** links hold
the configured Spark history URL of each slice.
"""

from __future__ import annotations

import json
import runpy
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import airflow_env  # noqa: F401  (sets AIRFLOW_HOME before Airflow is imported)
import pytest
from airflow_env import REPO, airflow_db  # noqa: F401  (fixture)
from lake import INCIDENT_END, INCIDENT_START, seed_sessions_incident
from paths import EXAMPLES
from servers.browser import headless_chromium

DAG_FILE = REPO / "dags" / "playback_sessions_backfill.py"
RUN_CONF = {
    "start": INCIDENT_START.isoformat(),
    "end": INCIDENT_END.isoformat(),
    "mode": "parallel",
    "slice": "3h",  # one cell of the grid holds the whole window: one slice
    "warmup": "30min",
    "tail": "45min",
}
HISTORY = "http://127.0.0.1:18080/history-of/{app_name}"

#: Every pair of axis labels (SVG text of class ``tick``) drawn on the same chart whose
#: bounding boxes intersect by more than half a pixel either way.
OVERLAPS_JS = """(() => {
  const out = [];
  for (const svg of document.querySelectorAll('svg.chart')) {
    const boxes = [...svg.querySelectorAll('text.tick')].map(t => [t.textContent, t.getBoundingClientRect()]);
    for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
      const [a, r] = boxes[i], [b, s] = boxes[j];
      if (Math.min(r.right, s.right) - Math.max(r.left, s.left) > 0.5 && Math.min(r.bottom, s.bottom) - Math.max(r.top, s.top) > 0.5)
        out.push([svg.getAttribute('class'), a, b]);
    }
  }
  return out;
})()"""

BANDS_JS = """[...document.querySelectorAll('svg.windows rect.diff-band')].map(r => {
  const b = r.getBoundingClientRect();
  return {start: r.dataset.start, end: r.dataset.end, width: b.width, height: b.height,
          fill: getComputedStyle(r).fill};
})"""


@pytest.fixture(scope="module")
def backfill(tmp_path_factory: pytest.TempPathFactory, airflow_db: None) -> Iterator[dict[str, Any]]:  # noqa: F811
    """The DAG run, the lake, the validation XCom, and the Spark history URL configured for the links."""
    from pyiceberg.catalog import load_catalog

    lake = tmp_path_factory.mktemp("report-lake")
    (lake / "warehouse").mkdir()
    catalog = load_catalog("lake", type="sql", uri=f"sqlite:///{lake}/catalog.db", warehouse=f"file://{lake}/warehouse")
    seed_sessions_incident(catalog)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KAPPA_LAKE", str(lake))
        mp.setenv("AIRFLOW__KAPPA__SPARK_HISTORY_URL", HISTORY)
        dag = runpy.run_path(str(DAG_FILE))["dag"]
        t0 = time.monotonic()
        dr = dag.test(run_conf=RUN_CONF)
        print(f"backfill DAG run in {time.monotonic() - t0:.1f}s")
        tis = {(ti.task_id, ti.map_index): ti for ti in dr.get_task_instances()}
        assert dr.state == "success", {k: ti.state for k, ti in tis.items()}
        yield {
            "dag": dag,
            "run": dr,
            "tis": tis,
            "lake": lake,
            "report": tis[("validate", -1)].xcom_pull(task_ids="validate"),
        }


def served_links(dag: Any, ti: Any) -> dict[str, str | None]:
    """The extra links of ``ti`` as the API server computes them: the DAG deserialized, each link's URL from XCom."""
    from airflow.serialization.serialized_objects import DagSerialization

    task = DagSerialization.from_dict(DagSerialization.to_dict(dag)).get_task(ti.task_id)
    return {name: task.get_extra_links(ti, name) for name in task.extra_links}


def test_extra_links_of_the_real_task_instances(backfill: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_kappa.backfill.backfill import Backfill
    from airflow_provider_kappa.job.config import load_config

    monkeypatch.setenv("KAPPA_LAKE", str(backfill["lake"]))  # the example config's ${KAPPA_LAKE}
    bf = Backfill.create(load_config(EXAMPLES / "playback_sessions" / "kappa.yaml"), RUN_CONF)
    report = Path(bf.store().report_file())
    assert report.is_file() and report.parent.parent.name == "backfill"
    tis = backfill["tis"]
    for task_id in ("validate", "publish"):
        assert served_links(backfill["dag"], tis[(task_id, -1)]) == {"Backfill report": report.as_uri()}
    slices = sorted(i for (task_id, i) in tis if task_id == "slice_parallel")
    assert slices == [0]
    app = f"kappa-playback_sessions-{bf.id}-s0000"
    assert served_links(backfill["dag"], tis[("slice_parallel", 0)]) == {"Spark UI": HISTORY.format(app_name=app)}


def test_report_in_chromium_has_no_overlapping_labels_and_shades_the_incident(
    backfill: dict[str, Any], tmp_path: Path
) -> None:
    from datetime import datetime, timedelta

    tis = backfill["tis"]
    url = served_links(backfill["dag"], tis[("validate", -1)])["Backfill report"]
    assert url and url.startswith("file://")
    (report,) = backfill["report"].values()
    windows = report["windows"]
    first, step = datetime.fromisoformat(windows["first"]), timedelta(seconds=windows["step_seconds"])
    differing = [i for i, (s, t) in enumerate(zip(windows["only_staged"], windows["only_target"])) if s or t]
    assert differing, "the seeded incident must show in the validation"
    with headless_chromium(tmp_path / "chromium", window=(1280, 1000)) as browser:
        page = browser.new_page()
        page.navigate(url)
        page.wait_for("document.querySelectorAll('svg.chart').length === 3", what="the report's three charts")
        shot = page.screenshot(tmp_path / "report.png")
        print(f"report screenshot: {shot}")
        assert page.evaluate(OVERLAPS_JS) == []
        bands = page.evaluate(BANDS_JS)
        assert page.evaluate("document.querySelectorAll('svg.chart text.tick').length") > 10
        text = page.text()
    assert shot.stat().st_size > 20_000
    # shaded runs of windows = the windows the validation found differing, all inside the incident
    shaded = set()
    for band in bands:
        assert band["width"] >= 1 and band["height"] > 100 and band["fill"] != "none", band
        a, b = datetime.fromisoformat(band["start"]), datetime.fromisoformat(band["end"])
        assert INCIDENT_START <= a < b <= INCIDENT_END
        shaded |= {round((a - first) / step) + k for k in range(round((b - a) / step))}
    assert shaded == set(differing)
    assert f"{report['match_rate']:.3f}%" in text and "s0000" in text
    assert json.dumps(report["only_target_sample"][0]["account_id"]) in text
