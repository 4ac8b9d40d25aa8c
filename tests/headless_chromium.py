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

    async def _send(self, method: str, params: dict) -> dict:
        message_id = next(self.ids)
        await self.socket.send_str(json.dumps({"id": message_id, "method": method, "params": params}))
        while True:  # events arrive in between: skipped
            reply = json.loads((await self.socket.receive(timeout=120)).data)
            if reply.get("id") == message_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def send(self, method: str, **params: Any) -> dict:
        return self.loop.run_until_complete(self._send(method, params))

    def goto(self, url: str) -> None:
        self.send("Page.navigate", url=url)

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} threw: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 60.0, what: str = "") -> Any:
        """The expression's first truthy value, polled twice a second."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                text = self.evaluate("document.body ? document.body.innerText.slice(0, 1500) : ''")
                raise TimeoutError(f"not within {timeout_s:.0f} s: {what or expression}\n--- page text ---\n{text}")
            time.sleep(0.5)

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
