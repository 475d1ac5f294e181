"""The Airflow UI of a real deployment, seen by headless Chromium (Debian's ``chromium``).

The deployment serves the repo's example DAGs (``dags/``). Chromium logs in through the login
form, opens the backfill DAG's trigger form, and the screenshot (saved under the test's tmp
folder, never committed) shows every backfill Param by its title, the basic ones in the form's
first section and the advanced ones in its "Advanced" section. Start and end are date-time
pickers: a date and time picked there reach the trigger request as UTC timestamps; a bad value
typed into the form is refused with the reason when the form is submitted, and creates no run.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from servers.airflow_server import AirflowClient, AirflowDeployment, airflow_deployment
from servers.browser import Chromium, Page, headless_chromium, login_airflow

from airflow_provider_kappa.backfill.params import BY_NAME, PARAMS

REPO = Path(__file__).resolve().parents[2]
DAG_ID = "kappa_backfill_rmi"
BASIC = [p.label for p in PARAMS if p.section == "basic"]  # the form's first section, open at first
ADVANCED = [p.label for p in PARAMS if p.section == "advanced"]  # its "Advanced" section
FORM = "Run Parameters"  # text of the trigger dialog's first Params section
WINDOW = (1280, 2400)  # tall enough for a whole section of the form in one screenshot


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowDeployment]:
    """Airflow serving the repo's dags/ (no lake is needed to show a form: DAG files do no I/O)."""
    root = tmp_path_factory.mktemp("airflow-ui")
    with airflow_deployment(
        root / "home", REPO / "dags", extra_env={"KAPPA_LAKE": str(root / "lake"), "PYTHONDONTWRITEBYTECODE": "1"}
    ) as af:
        yield af


@pytest.fixture(scope="module")
def client(airflow: AirflowDeployment) -> AirflowClient:
    c = airflow.client()
    c.wait_for_dag(DAG_ID, timeout=120)
    return c


@pytest.fixture(scope="module")
def browser(
    tmp_path_factory: pytest.TempPathFactory, airflow: AirflowDeployment, client: AirflowClient
) -> Iterator[Chromium]:
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
        f"[...document.querySelectorAll('[role=dialog]')].some(d => d.innerText.includes('{FORM}') && d.innerText.includes({json.dumps(BASIC[-1])}))",
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


def test_trigger_form_screenshot_shows_every_param(
    browser: Chromium, airflow: AirflowDeployment, tmp_path: Path
) -> None:
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
        off = {
            p: box
            for p, box in boxes.items()
            if box is None or not (box[0] >= 0 and box[1] <= height and box[3] <= width)
        }
        assert not off, f"labels not visible in a {width}x{height} screenshot: {off}"
        shot = page.screenshot(tmp_path / f"trigger-form-{section}.png", full_page=False)
        assert png_size(shot) == WINDOW
        assert shot.stat().st_size > 20_000, "screenshot looks blank"
        print(f"screenshot: {shot}")


def field(label: str) -> str:
    """JavaScript: the trigger form's field (its ``[role=group]``) whose label reads ``label``."""
    return (
        "[...document.querySelectorAll('[role=dialog] [role=group]')].find(g => { const l = g.querySelector('label'); "
        f"return l && l.childNodes[0] && l.childNodes[0].textContent.trim() === {json.dumps(label)}; }})"
    )


def pick(page: Page, label: str, date: str, hhmm: str) -> str:
    """Pick a date (``YYYY/MM/DD``) and a time (``HH:mm``) in the date-time picker of the field
    ``label``, as a person types them into the picker's popover; return what the field shows."""
    picker = f"{field(label)}.querySelector('[data-testid=datetime-input]')"
    # the form re-renders its fields after every change: find the field afresh, each time until it is there
    found = (
        f"(() => {{ const f = {field(label)}; return !!(f && f.querySelector('[data-testid=datetime-input]')); }})()"
    )
    page.wait_for(found, what=f"the field {label}", timeout=15)
    page.evaluate(f"{picker}.click()")
    popover = "document.querySelector('[data-scope=popover][data-part=content][data-state=open]')"
    page.wait_for(f"{popover} && {popover}.querySelectorAll('input').length === 2", what=f"the picker of {label}")
    page.evaluate(
        f"""(() => {{
        const [d, t] = {popover}.querySelectorAll('input');
        for (const [el, v] of [[d, {json.dumps(date)}], [t, {json.dumps(hhmm)}]]) {{
            el.focus();
            Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value').set.call(el, v);
            el.dispatchEvent(new Event('input', {{bubbles: true}}));
            el.dispatchEvent(new Event('change', {{bubbles: true}}));
            el.blur();
        }}
        document.dispatchEvent(new KeyboardEvent('keydown', {{key: 'Escape', bubbles: true}}));
    }})()"""
    )
    page.wait_for(f"!{popover}", what=f"the picker of {label} closed")
    shown = (
        f"(() => {{ const f = {field(label)}; const p = f && f.querySelector('[data-testid=datetime-input]'); "
        "const t = p && p.innerText.trim(); return t && !t.includes('Select date') ? t : null; })()"
    )
    return str(page.wait_for(shown, what=f"the field {label} showing the picked value", timeout=15))


def record_requests(page: Page) -> None:
    """Keep the body of every XHR/fetch the page sends from now on (``window.__sent``)."""
    page.evaluate(
        """(() => {
        window.__sent = [];
        const send = XMLHttpRequest.prototype.send;
        XMLHttpRequest.prototype.send = function (body) { window.__sent.push(body); return send.call(this, body); };
        const fetch0 = window.fetch;
        window.fetch = (url, init) => { window.__sent.push(init && init.body); return fetch0(url, init); };
    })()"""
    )


def trigger_button_enabled(page: Page) -> bool:
    return bool(
        page.evaluate(
            f"[...document.querySelectorAll('[role=dialog] button')].some(b => b.innerText.trim() === 'Trigger' && !b.disabled "
            f"&& b.closest('[role=dialog]').innerText.includes({json.dumps(FORM)}))"
        )
    )


def test_start_and_end_are_date_time_pickers_and_a_bad_value_is_refused(
    browser: Chromium, airflow: AirflowDeployment, client: AirflowClient, tmp_path: Path
) -> None:
    runs_before = client.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns").json()["total_entries"]
    page = open_trigger_form(browser, airflow)
    start, end = BY_NAME["start"].label, BY_NAME["end"].label
    for label in (start, end):
        kinds = page.evaluate(
            f"(() => {{ const f = {field(label)}; return f && [f.querySelectorAll('[data-testid=datetime-input]').length, "
            "f.querySelectorAll('input, textarea').length, f.innerText]; })()"
        )
        assert kinds is not None, f"no field labelled {label!r}:\n{page.dialog_text(FORM)}"
        pickers, text_inputs, text = kinds
        assert (pickers, text_inputs) == (1, 0), f"{label}: expected a date-time picker and no text box: {kinds}"
        assert "Select date and time" in text and "This field is required" in text, text
    assert not trigger_button_enabled(page), "the form must not trigger while start and end are empty"

    assert pick(page, start, "2026/11/01", "01:00") == "Nov 01, 2026 01:00"
    assert pick(page, end, "2026/11/01", "03:00") == "Nov 01, 2026 03:00"
    page.screenshot(tmp_path / "trigger-picked.png", full_page=False)
    open_advanced(page)
    page.fill("#element_slice", "0s")  # a slice must be positive
    record_requests(page)
    page.click(text="Trigger", within=FORM)
    page.wait_for_text("Invalid input for param slice")
    page.screenshot(tmp_path / "trigger-refused.png", full_page=False)
    text = page.dialog_text(FORM) or ""
    assert "400 Bad Request" in text and "'0s' does not match" in text, text
    sent: list[Any] = [json.loads(b) for b in page.evaluate("window.__sent") if isinstance(b, str) and '"conf"' in b]
    assert len(sent) == 1, sent
    conf = sent[0]["conf"]
    assert (conf["start"], conf["end"], conf["slice"]) == ("2026-11-01T01:00:00.000Z", "2026-11-01T03:00:00.000Z", "0s")
    after = client.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns").json()["total_entries"]
    assert after == runs_before, "a refused trigger must not create a dag run"
