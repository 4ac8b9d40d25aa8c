"""A headless Chromium driven through the DevTools protocol over one websocket (aiohttp's client):
enough for the browser tests to open pages, wait for what they show, read the DOM and take screenshots,
with the system's ``chromium`` and nothing downloaded."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp

WIDTH, HEIGHT = 1600, 1000
"""The window the pages are laid out and screenshotted in, in CSS pixels."""


def chromium_executable() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class HeadlessChromium:
    """One browser process and its first page. ``evaluate`` runs JavaScript in the page and returns
    its value; ``wait_for`` polls an expression until it is truthy."""

    def __init__(self, executable: str, profile: Path, startup_timeout_s: float = 60.0) -> None:
        profile.mkdir(parents=True, exist_ok=True)
        (profile / "DevToolsActivePort").unlink(missing_ok=True)  # a previous browser's port
        self.process = subprocess.Popen(
            [executable, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--no-default-browser-check", "--remote-debugging-port=0",
             f"--user-data-dir={profile}", f"--window-size={WIDTH},{HEIGHT}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self.ids = itertools.count(1)
        self.events: list[dict] = []  # the DevTools events read while waiting for replies (Runtime.enable: errors)
        self.loop = asyncio.new_event_loop()
        try:
            port = self._devtools_port(profile / "DevToolsActivePort", startup_timeout_s)
            self.session, self.socket = self.loop.run_until_complete(self._connect(port))
            self.send("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT, deviceScaleFactor=1,
                      mobile=False)
            self.send("Page.enable")
        except BaseException:
            self.close()
            raise

    def _devtools_port(self, port_file: Path, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"chromium exited with code {self.process.returncode} before it listened")
            if port_file.is_file() and port_file.read_text().strip():
                return int(port_file.read_text().split()[0])
            time.sleep(0.2)
        raise TimeoutError(f"chromium wrote no {port_file.name} within {timeout_s:.0f} s")

    async def _connect(self, port: int):
        session = aiohttp.ClientSession()
        async with session.get(f"http://127.0.0.1:{port}/json/list") as response:
            targets = await response.json()
        [page] = [t for t in targets if t["type"] == "page"][:1]
        socket = await session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        return session, socket

    async def _send(self, method: str, params: dict, session_id: str | None = None) -> dict:
        message_id = next(self.ids)
        message = {"id": message_id, "method": method, "params": params}
        if session_id is not None:  # a target attached with flatten=True: an out-of-process frame's
            message["sessionId"] = session_id
        await self.socket.send_str(json.dumps(message))
        while True:  # events arrive in between: kept in ``events``
            reply = json.loads((await self.socket.receive(timeout=120)).data)
            if "method" in reply and "id" not in reply:
                self.events.append(reply)
            elif reply.get("id") == message_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def send(self, method: str, **params: Any) -> dict:
        return self.loop.run_until_complete(self._send(method, params))

    def send_to(self, session_id: str, method: str, **params: Any) -> dict:
        """``send`` to an attached target (``Target.attachToTarget(flatten=True)``'s session)."""
        return self.loop.run_until_complete(self._send(method, params, session_id))

    def goto(self, url: str) -> None:
        self.send("Page.navigate", url=url)

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} threw: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 60.0, what: str = "") -> Any:
        """The expression's first truthy value, polled twice a second. An expression that throws counts as not
        yet (a page still navigating has no ``document.body``); its last error goes into the timeout's message."""
        deadline = time.monotonic() + timeout_s
        error = ""
        while True:
            try:
                value = self.evaluate(expression)
            except RuntimeError as thrown:
                value, error = None, f"\n--- last error ---\n{thrown}"
            if value:
                return value
            if time.monotonic() > deadline:
                text = self.evaluate("document.body ? document.body.innerText.slice(0, 1500) : ''")
                raise TimeoutError(f"not within {timeout_s:.0f} s: {what or expression}{error}"
                                   f"\n--- page text ---\n{text}")
            time.sleep(0.5)

    def click(self, element: str, what: str = "", settle_s: float = 10.0) -> None:
        """Click the element the JavaScript expression ``element`` finds as a user would: scrolled
        into view, the mouse pressed and released at its centre (real input events, which MLflow's
        tabs and tree need: a scripted ``.click()`` does not switch a tab), once the element has
        stopped moving (a page still laying itself out would take the click elsewhere). Refused when
        something else lies on top of that point."""
        where = f"""(() => {{
            const e = {element};
            if (!e) return null;
            e.scrollIntoView({{block: 'nearest', inline: 'nearest'}});
            const r = e.getBoundingClientRect(), x = r.left + r.width / 2, y = r.top + r.height / 2;
            const top = document.elementFromPoint(x, y);
            return top && (e === top || e.contains(top) || top.contains(e)) ? [x, y] : null;
        }})()"""
        deadline = time.monotonic() + settle_s
        centre = self.evaluate(where)
        while True:
            time.sleep(0.3)
            again = self.evaluate(where)
            if again is not None and again == centre or time.monotonic() > deadline:
                break
            centre = again
        if again is None or again != centre:
            raise LookupError(f"nothing to click (absent, covered or still moving): {what or element}")
        x, y = centre
        self.send("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def console_errors(self, session_id: str | None = None) -> list[str]:
        """The page's uncaught exceptions and console errors seen so far (after ``Runtime.enable``); with
        ``session_id``, an attached target's (its ``Runtime.enable`` reports those before it too)."""
        self.evaluate("0")  # reads the events waiting on the socket
        found = []
        for event in self.events:
            if event.get("sessionId") != session_id:
                continue
            params = event.get("params", {})
            if event["method"] == "Runtime.exceptionThrown":
                found.append(str(params.get("exceptionDetails", {}).get("exception", {}).get("description")
                                 or params.get("exceptionDetails", {}).get("text")))
            elif event["method"] == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append(" ".join(str(a.get("value", a.get("description"))) for a in params.get("args", [])))
            elif event["method"] == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                found.append(params["entry"].get("text", ""))
        return found

    def hover(self, x: float, y: float) -> None:
        """The mouse moved to ``(x, y)`` (CSS pixels of the viewport): a real input event."""
        self.send("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)

    def pages(self) -> list[dict]:
        """The browser's pages (tabs): DevTools' target infos, each with its ``url`` and, for one a
        link opened, its ``openerId``."""
        return [t for t in self.send("Target.getTargets")["targetInfos"] if t["type"] == "page"]

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        if getattr(self, "socket", None) is not None:
            self.loop.run_until_complete(self.socket.close())
        if getattr(self, "session", None) is not None:
            self.loop.run_until_complete(self.session.close())
        self.loop.close()
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
