"""Headless Chromium, driven over the Chrome DevTools Protocol: just what the browser tests need.

Debian's ``chromium`` package is the browser (installed when missing, where that is possible:
:func:`ensure_chromium`); playwright and pyppeteer would download a browser of their own from
the internet instead. The protocol is JSON over one WebSocket (aiohttp's client): commands
carry an id and get a reply with it, events arrive in between and are kept in
:attr:`CDP.events`. Each :class:`Page` is a tab in a browser context of its own (its own
cookies), attached in "flat" mode, so its commands travel on the browser's socket with
its session id.

The DevTools server listens on 127.0.0.1 only, on a port Chromium picks (``--remote-debugging-port=0``,
read back from ``DevToolsActivePort`` in the profile); the profile is a fresh directory.
Nothing reaches the network: background services, updates and metrics are off.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

APT_LOCK_WAIT = 600  # seconds apt-get waits for another apt's dpkg lock (a fresh machine often holds it)
STARTUP_TIMEOUT = 60.0
COMMAND_TIMEOUT = 30.0

FLAGS = (
    "--headless",
    "--no-sandbox",  # as root, where the sandbox cannot start
    "--remote-debugging-port=0",
    "--remote-debugging-address=127.0.0.1",
    "--window-size=1400,1000",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-sync",
    "--disable-domain-reliability",
    "--metrics-recording-only",
    "--no-pings",
    "--password-store=basic",
    "--use-mock-keychain",
)


class ChromiumImpossibleError(RuntimeError):
    """Chromium is missing and cannot be installed here (tests should skip, not fail)."""


class CDPError(RuntimeError):
    """A command the browser answered with an error."""


def ensure_chromium() -> str:
    """The chromium binary, installed from Debian's package when missing (as root, with apt)."""
    found = shutil.which("chromium")
    if found is not None:
        return found
    if shutil.which("apt-get") is None:
        raise ChromiumImpossibleError("chromium is missing and there is no apt-get to install it")
    if os.geteuid() != 0:
        raise ChromiumImpossibleError("chromium is missing and installing it needs root")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    apt = ["apt-get", "-o", f"DPkg::Lock::Timeout={APT_LOCK_WAIT}"]
    install = [*apt, "install", "-y", "--no-install-recommends", "chromium"]
    if subprocess.run(install, env=env, check=False, timeout=1800).returncode != 0:
        # The package lists may be missing or stale (a fresh image): once more after an update.
        subprocess.run([*apt, "update"], env=env, check=True, timeout=600)
        subprocess.run(install, env=env, check=True, timeout=1800)
    found = shutil.which("chromium")
    if found is None:
        raise RuntimeError("apt-get installed chromium but no chromium binary is on PATH")
    return found


@dataclass
class Chromium:
    proc: subprocess.Popen[bytes]
    ws_url: str  # the browser's DevTools WebSocket
    log: Path


def start_chromium(binary: str, profile: Path, log: Path) -> Chromium:
    """Start headless Chromium with a fresh ``profile``; return once its DevTools server is up."""
    profile.mkdir(parents=True, exist_ok=True)
    port_file = profile / "DevToolsActivePort"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdout=out,
            stderr=out,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its helpers (zygote, renderers) in a group of its own, stopped with it
        )
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while True:
        lines = port_file.read_text().split() if port_file.exists() else []
        if len(lines) == 2:
            return Chromium(proc, f"ws://127.0.0.1:{lines[0]}{lines[1]}", log)
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_chromium(proc)
            tail = log.read_text(errors="replace")[-3000:]
            raise RuntimeError(
                f"chromium did not start its DevTools server (exit {proc.returncode}):\n{tail}"
            )
        time.sleep(0.05)


def stop_chromium(proc: subprocess.Popen[bytes]) -> None:
    """Stop the browser and every helper process it started (its own process group)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)
    # Helpers that outlived the browser (the group's id stays theirs while any of them lives).
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@dataclass
class CDP:
    """One DevTools connection: commands (to the browser or to a page's session) and events."""

    ws: aiohttp.ClientWebSocketResponse
    http: aiohttp.ClientSession
    events: list[dict[str, Any]] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _pending: dict[int, asyncio.Future[dict[str, Any]]] = field(default_factory=dict)
    _reader: asyncio.Task[None] | None = None

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(cls, ws_url: str) -> AsyncIterator[CDP]:
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(ws_url, max_msg_size=64 << 20)
            cdp = cls(ws, http)
            cdp._reader = asyncio.create_task(cdp._read())
            try:
                yield cdp
            finally:
                cdp._reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await cdp._reader
                await ws.close()

    async def _read(self) -> None:
        async for msg in self.ws:
            if msg.type is not aiohttp.WSMsgType.TEXT:
                break
            data = json.loads(msg.data)
            future = self._pending.pop(data["id"], None) if "id" in data else None
            if future is not None and not future.done():
                future.set_result(data)
            elif "method" in data:
                self.events.append(data)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(CDPError("the DevTools connection closed"))

    async def send(
        self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None
    ) -> dict[str, Any]:
        """Run ``method`` and return its result; :class:`CDPError` if the browser refused it."""
        msg_id = next(self._ids)
        message: dict[str, Any] = {"id": msg_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[msg_id] = future
        await self.ws.send_str(json.dumps(message))
        reply = await asyncio.wait_for(future, COMMAND_TIMEOUT)
        if "error" in reply:
            raise CDPError(f"{method}: {reply['error'].get('message')} ({reply['error'].get('code')})")
        result: dict[str, Any] = reply.get("result", {})
        return result

    def events_of(self, method: str, session: str | None = None) -> list[dict[str, Any]]:
        """The params of every ``method`` event so far (of ``session`` only, when given)."""
        return [
            e["params"]
            for e in self.events
            if e["method"] == method and (session is None or e.get("sessionId") == session)
        ]

    @contextlib.asynccontextmanager
    async def page(self) -> AsyncIterator[Page]:
        """A new tab in a browser context of its own (no cookies but its own), closed after."""
        context = (await self.send("Target.createBrowserContext"))["browserContextId"]
        target = (
            await self.send("Target.createTarget", {"url": "about:blank", "browserContextId": context})
        )["targetId"]
        try:
            attached = await self.send("Target.attachToTarget", {"targetId": target, "flatten": True})
            page = Page(self, attached["sessionId"])
            for domain in ("Page", "Runtime", "Network"):
                await page.send(f"{domain}.enable")
            yield page
        finally:
            with contextlib.suppress(CDPError, TimeoutError):
                await self.send("Target.closeTarget", {"targetId": target})
                await self.send("Target.disposeBrowserContext", {"browserContextId": context})


@dataclass
class Page:
    """One tab: navigate, read the DOM by JavaScript, type and click as a person would."""

    cdp: CDP
    session: str

    async def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self.cdp.send(method, params, session=self.session)

    def events(self, method: str) -> list[dict[str, Any]]:
        return self.cdp.events_of(method, self.session)

    async def navigate(self, url: str) -> None:
        result = await self.send("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise CDPError(f"navigating to {url}: {result['errorText']}")

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-serialisable)."""
        result = await self.send(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}
        )
        if "exceptionDetails" in result:
            raise CDPError(f"{expression}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = 20.0) -> Any:
        """The first truthy value of ``expression``, polled while pages load and navigate."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            with contextlib.suppress(CDPError):  # a context destroyed by a navigation under way
                last = await self.evaluate(expression)
                if last:
                    return last
            await asyncio.sleep(0.1)
        text = await self.evaluate("document.documentElement ? document.documentElement.outerHTML : ''")
        raise TimeoutError(f"{expression} stayed {last!r} for {timeout} s; the page:\n{str(text)[:3000]}")

    async def type_text(self, selector: str, text: str) -> None:
        """Focus ``selector`` and type ``text`` key by key."""
        focused = await self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); "
            "if (!e) return false; e.focus(); return document.activeElement === e; })()"
        )
        if not focused:
            raise CDPError(f"cannot focus {selector}")
        for char in text:
            await self.send("Input.dispatchKeyEvent", {"type": "keyDown", "text": char, "key": char})
            await self.send("Input.dispatchKeyEvent", {"type": "keyUp", "key": char})

    async def click(self, selector: str) -> None:
        """Press and release the mouse at the middle of ``selector``'s box."""
        box = await self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null; "
            "e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect(); "
            "return {x: r.left + r.width / 2, y: r.top + r.height / 2}; })()"
        )
        if not box:
            raise CDPError(f"no {selector} to click")
        point = {"x": box["x"], "y": box["y"]}
        await self.send("Input.dispatchMouseEvent", {"type": "mouseMoved", **point})
        for kind in ("mousePressed", "mouseReleased"):
            await self.send(
                "Input.dispatchMouseEvent", {"type": kind, "button": "left", "clickCount": 1, **point}
            )

    async def cookies(self, url: str) -> list[dict[str, Any]]:
        """The cookies this tab's browser context holds for ``url`` (HttpOnly ones too)."""
        found: list[dict[str, Any]] = (await self.send("Network.getCookies", {"urls": [url]}))["cookies"]
        return found

    async def screenshot(self, path: Path) -> None:
        data = (await self.send("Page.captureScreenshot", {"format": "png"}))["data"]
        path.write_bytes(base64.b64decode(data))
