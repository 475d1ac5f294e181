"""Headless Chromium (Debian's ``chromium`` package) driven over the DevTools protocol.

No downloaded browser and no Playwright: the system ``chromium`` runs headless with a fresh
profile in its own process group, its DevTools endpoint on a kernel-chosen loopback port
(read back from ``DevToolsActivePort`` in the profile), and a tiny synchronous CDP client
over the ``websockets`` package drives one page.

Typical use::

    with headless_chromium(tmp / "chromium") as browser:
        page = browser.new_page()
        login_airflow(page, base_url, "admin", password)
        page.navigate(f"{base_url}/dags/my_dag")
        page.screenshot(tmp / "shot.png")
"""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

from servers import DeploymentError, DeploymentTimeout, ServerProcess, venv_env, wait_until

#: Flags for a root user in a container, with no network other than loopback.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-features=Translate,MediaRouter,OptimizationHints",
    "--metrics-recording-only",
    "--mute-audio",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
)


def chromium_binary() -> str:
    """Path of the system Chromium (``apt-get install -y chromium`` on Debian)."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    raise DeploymentError("no chromium on PATH: install Debian's package with 'apt-get install -y chromium'")


class CdpSession:
    """Commands and events of one DevTools target session (flattened) over the browser websocket.

    :param ws: the browser-level websocket.
    :param session_id: the target session (None: the browser itself).
    :param browser: the owning browser (for log tails in errors).
    """

    _ids = itertools.count(1)

    def __init__(self, ws: ClientConnection, session_id: str | None, browser: Chromium) -> None:
        self.ws = ws
        self.session_id = session_id
        self.browser = browser
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict[str, Any] | None = None, timeout: float = 30.0) -> dict[str, Any]:
        """Send one command and wait for its reply; raise on a protocol error.

        :param method: CDP method, e.g. ``Page.navigate``.
        :param params: its parameters.
        :param timeout: seconds to wait for the reply.
        """
        msg_id = next(self._ids)
        msg: dict[str, Any] = {"id": msg_id, "method": method, "params": params or {}}
        if self.session_id:
            msg["sessionId"] = self.session_id
        self.ws.send(json.dumps(msg))
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DeploymentTimeout(
                    f"no DevTools reply to {method} within {timeout:.0f}s\n{self.browser.process.describe()}"
                )
            try:
                raw = self.ws.recv(timeout=remaining)
            except TimeoutError:
                continue
            reply = json.loads(raw)
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise DeploymentError(f"DevTools {method}({params}) failed: {reply['error']}")
                return dict(reply.get("result", {}))
            if "method" in reply:
                self.events.append(reply)


class Page:
    """One browser tab.

    :param session: its CDP session.
    """

    def __init__(self, session: CdpSession) -> None:
        self.cdp = session

    def evaluate(self, expression: str, timeout: float = 30.0) -> Any:
        """Evaluate JavaScript in the page (promises awaited) and return its JSON value.

        :param expression: a JavaScript expression.
        :param timeout: seconds.
        """
        result = self.cdp.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
            timeout=timeout,
        )
        if "exceptionDetails" in result:
            raise DeploymentError(f"JavaScript {expression[:200]!r} threw: {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    def navigate(self, url: str, timeout: float = 60.0) -> None:
        """Open ``url`` and wait until the document has loaded.

        :param url: the address.
        :param timeout: seconds.
        """
        reply = self.cdp.send("Page.navigate", {"url": url}, timeout=timeout)
        if reply.get("errorText"):
            raise DeploymentError(f"navigation to {url} failed: {reply['errorText']}")
        self.wait_for(
            "document.readyState === 'complete' && location.href !== 'about:blank'",
            timeout=timeout,
            what=f"{url} to load",
        )

    def wait_for(self, predicate_js: str, *, timeout: float = 60.0, what: str) -> Any:
        """Poll a JavaScript predicate until it is truthy; return its value.

        :param predicate_js: JavaScript expression.
        :param timeout: seconds; the timeout error shows the page's URL and text.
        :param what: what is awaited, for the error.
        """
        try:
            return wait_until(
                lambda: self.evaluate(predicate_js) or None,
                timeout=timeout,
                what=what,
                servers=[self.cdp.browser.process],
                interval=0.3,
            )
        except DeploymentTimeout as e:
            raise DeploymentTimeout(f"{e}\npage {self.url()}:\n{self.text()[:3000]}") from e

    def wait_for_text(self, text: str, timeout: float = 60.0) -> None:
        """Wait until the page's visible text contains ``text``.

        :param text: the text.
        :param timeout: seconds.
        """
        self.wait_for(
            f"document.body && document.body.innerText.includes({json.dumps(text)})",
            timeout=timeout,
            what=f"text {text!r}",
        )

    def url(self) -> str:
        """The page's current address."""
        return str(self.evaluate("location.href"))

    def text(self) -> str:
        """The page's visible text (``document.body.innerText``, dialogs included)."""
        return str(self.evaluate("document.body ? document.body.innerText : ''"))

    def dialog_text(self, containing: str) -> str | None:
        """Visible text of the open dialog whose text contains ``containing`` (None if none is open).

        :param containing: text identifying the dialog, e.g. its title.
        """
        js = f"""(() => {{
            const ds = [...document.querySelectorAll('[role=dialog], [role=alertdialog]')]
                .filter(d => d.innerText && d.innerText.includes({json.dumps(containing)}));
            return ds.length ? ds[ds.length - 1].innerText : null;
        }})()"""
        value = self.evaluate(js)
        return None if value is None else str(value)

    def text_boxes(self, texts: list[str], within: str | None = None) -> dict[str, list[float] | None]:
        """Where each text is drawn: ``[top, bottom, left, right]`` in viewport pixels of the first
        visible element whose own text (trimmed) equals it; None if there is none.

        :param texts: exact texts (for example form labels).
        :param within: only inside the dialog whose text contains this.
        """
        js = f"""(() => {{
            let root = document.body;
            const within = {json.dumps(within)};
            if (within !== null) {{
                const ds = [...document.querySelectorAll('[role=dialog], [role=alertdialog]')]
                    .filter(d => d.innerText && d.innerText.includes(within));
                if (!ds.length) return null;
                root = ds[ds.length - 1];
            }}
            const out = {{}};
            for (const t of {json.dumps(texts)}) out[t] = null;
            const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
            while (walker.nextNode()) {{
                const node = walker.currentNode, key = node.nodeValue.trim();
                if (!(key in out) || out[key] !== null) continue;
                const r = node.parentElement.getBoundingClientRect();
                const style = getComputedStyle(node.parentElement);
                if (r.width > 0 && r.height > 0 && style.visibility !== 'hidden' && style.display !== 'none')
                    out[key] = [r.top, r.bottom, r.left, r.right];
            }}
            return out;
        }})()"""
        value = self.evaluate(js)
        if value is None:
            raise DeploymentError(f"no open dialog containing {within!r} on {self.url()}:\n{self.text()[:2000]}")
        return dict(value)

    def viewport(self) -> tuple[int, int]:
        """The page's viewport size (``innerWidth``, ``innerHeight``) in CSS pixels."""
        width, height = self.evaluate("[innerWidth, innerHeight]")
        return int(width), int(height)

    def fill(self, selector: str, value: str) -> None:
        """Type ``value`` into the input matching ``selector`` (React-controlled inputs included).

        :param selector: CSS selector.
        :param value: the text.
        """
        js = f"""(() => {{
            const el = document.querySelector({json.dumps(selector)});
            if (!el) return false;
            el.focus();
            const proto = el instanceof HTMLTextAreaElement ? HTMLTextAreaElement.prototype : HTMLInputElement.prototype;
            Object.getOwnPropertyDescriptor(proto, 'value').set.call(el, {json.dumps(value)});
            el.dispatchEvent(new Event('input', {{bubbles: true}}));
            el.dispatchEvent(new Event('change', {{bubbles: true}}));
            return true;
        }})()"""
        if not self.evaluate(js):
            raise DeploymentError(f"no element matches {selector!r} on {self.url()}")

    def click(self, selector: str | None = None, *, text: str | None = None, within: str | None = None) -> None:
        """Click the first element matching ``selector``, or the first button/link whose text is ``text``.

        :param selector: CSS selector.
        :param text: exact visible text (trimmed) of a button, link or ``[role=button]``.
        :param within: only inside the open dialog whose text contains this.
        """
        root = "document"
        if within is not None:
            root = (
                "([...document.querySelectorAll('[role=dialog], [role=alertdialog]')]"
                f".filter(d => d.innerText && d.innerText.includes({json.dumps(within)})).pop() || null)"
            )
        if text is not None:
            find = (
                f"[...r.querySelectorAll('button, a, [role=button], [role=menuitem]')]"
                f".find(e => e.innerText && e.innerText.trim() === {json.dumps(text)} && !e.disabled)"
            )
        else:
            find = f"r.querySelector({json.dumps(selector)})"
        js = f"(() => {{ const r = {root}; if (!r) return false; const el = {find}; if (!el) return false; el.click(); return true; }})()"
        if not self.evaluate(js):
            raise DeploymentError(f"nothing to click for {selector or text!r} on {self.url()}:\n{self.text()[:2000]}")

    def mouse_click(self, selector: str) -> None:
        """Click the centre of the first element matching ``selector`` with real mouse events
        (pointer down/up, as a person does): widgets that listen to pointer events, not to
        ``click()``, react to it.

        :param selector: CSS selector.
        """
        box = self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null; "
            "e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect(); "
            "return [r.left + r.width / 2, r.top + r.height / 2]; })()"
        )
        if box is None:
            raise DeploymentError(f"nothing to click for {selector!r} on {self.url()}:\n{self.text()[:2000]}")
        x, y = box
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.cdp.send("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1})

    def screenshot(self, path: Path, *, full_page: bool = True) -> Path:
        """Save a PNG screenshot.

        :param path: where to write it.
        :param full_page: capture beyond the viewport.
        """
        result = self.cdp.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": full_page})
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(result["data"]))
        return path


class Chromium:
    """A headless Chromium process with a fresh profile and one browser-level DevTools connection.

    :param root: folder for the profile and the log.
    :param window: window size (width, height) in CSS pixels.
    """

    def __init__(self, root: Path, window: tuple[int, int] = (1400, 1100)) -> None:
        self.root = Path(root)
        self.window = window
        self.profile = self.root / "profile"
        self.process: ServerProcess
        self.ws: ClientConnection | None = None
        self._stack = ExitStack()

    def start(self, timeout: float = 60.0) -> Chromium:
        """Launch Chromium and connect to its DevTools endpoint.

        :param timeout: seconds allowed for the endpoint to appear.
        """
        self.profile.mkdir(parents=True, exist_ok=True)
        argv = [
            chromium_binary(),
            *CHROMIUM_FLAGS,
            f"--user-data-dir={self.profile}",
            f"--window-size={self.window[0]},{self.window[1]}",
            "about:blank",
        ]
        self.process = ServerProcess("chromium", argv, self.root / "chromium.log", venv_env(), cwd=self.root)
        port_file = self.profile / "DevToolsActivePort"

        def endpoint() -> str | None:
            lines = port_file.read_text().split("\n") if port_file.exists() else []
            if len(lines) >= 2 and lines[0].strip() and lines[1].strip():
                return f"ws://127.0.0.1:{lines[0].strip()}{lines[1].strip()}"
            return None

        url = wait_until(
            endpoint, timeout=timeout, what="Chromium's DevTools endpoint", servers=[self.process], interval=0.2
        )
        self.ws = self._stack.enter_context(connect(url, max_size=64 * 1024 * 1024, open_timeout=timeout))
        return self

    def new_page(self) -> Page:
        """A new tab with Page and Runtime domains enabled, sized to the window."""
        if self.ws is None:
            raise DeploymentError("Chromium is not started")
        browser = CdpSession(self.ws, None, self)
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session_id = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(CdpSession(self.ws, session_id, self))
        page.cdp.send("Page.enable")
        page.cdp.send("Runtime.enable")
        width, height = self.window
        page.cdp.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        return page

    def stop(self) -> None:
        """Close the DevTools connection and stop the browser's process group."""
        try:
            self._stack.close()
        finally:
            self.process.stop(grace=5)


@contextmanager
def headless_chromium(root: Path, window: tuple[int, int] = (1400, 1100)) -> Iterator[Chromium]:
    """Start a :class:`Chromium`, yield it, and always stop it.

    :param root: folder for the profile and the log.
    :param window: window size.
    """
    browser = Chromium(root, window)
    try:
        browser.start()
        yield browser
    finally:
        if hasattr(browser, "process"):
            browser.stop()


def login_airflow(page: Page, base_url: str, username: str, password: str, timeout: float = 60.0) -> None:
    """Log into the Airflow 3 UI through its login form (simple auth manager).

    :param page: the tab.
    :param base_url: ``http://host:port`` of the API server.
    :param username: user name.
    :param password: password.
    :param timeout: seconds for each step.
    """
    page.navigate(f"{base_url}/")
    page.wait_for(
        "!!document.querySelector('input[name=username], input#username, input[autocomplete=username]')",
        timeout=timeout,
        what="the login form",
    )
    page.fill("input[name=username], input#username, input[autocomplete=username]", username)
    page.fill("input[type=password]", password)
    page.click("button[type=submit]")
    page.wait_for(
        "!location.pathname.includes('/auth/login') && !document.querySelector('input[type=password]')",
        timeout=timeout,
        what="the UI after login",
    )
