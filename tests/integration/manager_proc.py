"""A real ``specon-manager`` process for the integration tests, and headless Chromium beside it.

:func:`running_manager` starts the manager on a loopback port picked for it (``listening``:
started again when another process took the port first), with no ``SPECON_TOKEN`` from the
caller's environment, and stops it at the end (SIGTERM, then SIGKILL after 10 s).
:func:`wait_healthy` waits until ``/healthz`` says so. :func:`chromium_or_skip` is the
browser for a module fixture: installed when missing, skipped only where that is impossible.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from cdp_client import Chromium, ChromiumImpossibleError, ensure_chromium, start_chromium, stop_chromium
from listening import serve_on_free_port

MANAGER = Path(sys.executable).with_name("specon-manager")


@dataclass
class Running:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path
    state_dir: Path


def manager_env(**extra: str) -> dict[str, str]:
    """The caller's environment without ``SPECON_TOKEN`` (a test names its tokens), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k != "SPECON_TOKEN"}
    env.update(extra)
    return env


@contextlib.contextmanager
def running_manager(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[Running]:
    """``specon-manager --listen 127.0.0.1:PORT *args --state-dir tmp_path/state``; its stderr
    in ``tmp_path/manager.log``. Stopped (if still running) when the block ends."""
    log = tmp_path / "manager.log"
    state = tmp_path / "state"
    argv = [str(MANAGER), "--listen", "127.0.0.1:{port}", *args, "--state-dir", str(state)]

    def start(port: int) -> subprocess.Popen[bytes]:
        with log.open("ab") as err:
            return subprocess.Popen(
                [a.replace("{port}", str(port)) for a in argv],
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=env if env is not None else manager_env(),
            )

    proc, port = serve_on_free_port(start, log)
    try:
        yield Running(proc, f"http://127.0.0.1:{port}", log, state)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def wait_healthy(m: Running, session: aiohttp.ClientSession, tries: int = 300) -> None:
    """Until ``/healthz`` answers 200 with ``ok``; fails the test if the manager exits or never does."""
    for _ in range(tries):
        if m.proc.poll() is not None:
            pytest.fail(f"specon-manager exited with {m.proc.returncode}:\n{m.log.read_text()}")
        try:
            async with session.get(f"{m.url}/healthz") as resp:
                if resp.status == 200 and (await resp.json())["ok"]:
                    return
        except aiohttp.ClientConnectionError:
            pass
        await asyncio.sleep(0.1)
    pytest.fail(f"specon-manager never became healthy:\n{m.log.read_text()}")


@contextlib.contextmanager
def chromium_or_skip(base: Path) -> Iterator[Chromium]:
    """Headless Chromium (its profile and log under ``base``), stopped with its helpers at the end."""
    try:
        binary = ensure_chromium()
    except ChromiumImpossibleError as exc:
        pytest.skip(f"impossible here: {exc}")
    browser = start_chromium(binary, base / "profile", base / "chromium.log")
    try:
        yield browser
    finally:
        stop_chromium(browser.proc)
