"""The Airflow UI of a real deployment, seen by headless Chromium (Debian's ``chromium``).

The deployment serves the repo's example DAGs (``dags/``). Chromium logs in through the login
form, opens the backfill DAG's trigger form, and the screenshot (saved under the test's tmp
folder, never committed) shows every backfill Param; a bad value typed into the form is refused
with the reason when the form is submitted.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Iterator

import pytest

from servers.airflow_server import AirflowClient, AirflowDeployment, airflow_deployment
from servers.browser import Chromium, Page, headless_chromium, login_airflow

REPO = Path(__file__).resolve().parents[2]
DAG_ID = "kappa_backfill_rmi"
BASIC = ["start", "end", "sources", "mode", "dry_run", "publish", "min_match"]
ADVANCED = ["slice", "max_misalignment_threshold", "warmup", "tail"]  # the form's "Advanced" section
FORM = "Run Parameters"  # text of the trigger dialog's Params section
WINDOW = (1280, 2400)  # tall enough for a whole section of the form in one screenshot


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowDeployment]:
    """Airflow serving the repo's dags/ (no lake is needed to show a form: DAG files do no I/O)."""
    root = tmp_path_factory.mktemp("airflow-ui")
    with airflow_deployment(root / "home", REPO / "dags", extra_env={"KAPPA_LAKE": str(root / "lake"), "PYTHONDONTWRITEBYTECODE": "1"}) as af:
        yield af


@pytest.fixture(scope="module")
def client(airflow: AirflowDeployment) -> AirflowClient:
    c = airflow.client()
    c.wait_for_dag(DAG_ID, timeout=120)
    return c


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory, airflow: AirflowDeployment, client: AirflowClient) -> Iterator[Chromium]:
    """One headless Chromium, logged into the UI through the login form."""
    t0 = time.monotonic()
    with headless_chromium(tmp_path_factory.mktemp("chromium"), window=WINDOW) as b:
        login_airflow(b.new_page(), airflow.base_url, "admin", airflow.password)
        print(f"chromium started and logged in in {time.monotonic() - t0:.1f}s")
        yield b


def open_trigger_form(browser: Chromium, airflow: AirflowDeployment) -> Page:
    page = browser.new_page()
    page.navigate(f"{airflow.base_url}/dags/{DAG_ID}")
    page.wait_for_text("Trigger")
    page.click(text="Trigger")
    page.wait_for(
        f"[...document.querySelectorAll('[role=dialog]')].some(d => d.innerText.includes('{FORM}') && d.innerText.includes('min_match'))",
        what="the trigger form with its Params",
    )
    return page


def open_advanced(page: Page) -> None:
    """Open the form's collapsed Advanced section (the form shows one section at a time)."""
    selector = "[role=dialog] [id$=':trigger:Advanced']"
    trigger = f"document.querySelector({json.dumps(selector)})"
    for _ in range(10):  # a click before the dialog's widgets are live is lost: click until it opens
        if page.evaluate(f"{trigger}.getAttribute('aria-expanded') === 'true'"):
            break
        page.mouse_click(selector)
        time.sleep(1)
    page.wait_for(f"{trigger}.getAttribute('aria-expanded') === 'true'", what="the Advanced section open")


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


def test_trigger_form_screenshot_shows_every_param(browser: Chromium, airflow: AirflowDeployment, tmp_path: Path) -> None:
    page = open_trigger_form(browser, airflow)
    for section, params in (("basic", BASIC), ("advanced", ADVANCED)):
        if section == "advanced":
            open_advanced(page)
        text = page.dialog_text(FORM) or ""
        assert f"Trigger Dag - {DAG_ID}" in text, text
        missing = [p for p in params if p not in text.split("\n")]
        assert not missing, f"Params missing from the form's {section} section: {missing}\n{text}"
        # Every label is drawn inside the viewport, so the screenshot shows it.
        width, height = page.viewport()
        boxes = page.text_boxes(params, within=FORM)
        off = {p: box for p, box in boxes.items() if box is None or not (0 <= box[0] and box[1] <= height and box[3] <= width)}
        assert not off, f"labels not visible in a {width}x{height} screenshot: {off}"
        shot = page.screenshot(tmp_path / f"trigger-form-{section}.png", full_page=False)
        assert png_size(shot) == WINDOW
        assert shot.stat().st_size > 20_000, "screenshot looks blank"
        print(f"screenshot: {shot}")


def test_bad_value_typed_in_the_form_is_refused_with_the_reason(
    browser: Chromium, airflow: AirflowDeployment, client: AirflowClient, tmp_path: Path
) -> None:
    runs_before = client.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns").json()["total_entries"]
    page = open_trigger_form(browser, airflow)
    page.fill("#element_start", "2026-11-01T00:00:00")  # naive: no offset
    page.fill("#element_end", "2026-11-01T03:00:00+00:00")
    page.click(text="Trigger", within=FORM)
    page.wait_for_text("Invalid input for param start")
    page.screenshot(tmp_path / "trigger-refused.png", full_page=False)
    text = page.dialog_text(FORM) or ""
    assert "400 Bad Request" in text and "'2026-11-01T00:00:00' does not match" in text, text
    after = client.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns").json()["total_entries"]
    assert after == runs_before, "a refused trigger must not create a dag run"
