"""Agent file safety: /healthz while a 200 MB progress log is read; checkpoint verification memory.

An agent (fake runtime, real ``AgentDaemon`` loops, its real aiohttp app on loopback)
adopts a job, then the job's log grows by 200 MB (quick: 20 MB) of JSON lines at once. A
probe in another process asks ``/healthz`` every 10 ms until the agent has read it all.
Measured: ``/healthz`` p50/p99/max while the log is read (target max < 100 ms), the
catch-up rate, and, as the baseline, the same with the log read the old way (one uncapped
poll inside ``tick``, on the event loop). Then a 400 MB (quick: 64 MB) checkpoint is
verified under ``tracemalloc``: its peak traced memory (target < 4 MiB) and MB/s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog
from aiohttp import web
from specon_agent.app import create_app
from specon_agent.client import ManagerClient
from specon_agent.core import Agent
from specon_agent.daemon import AgentDaemon

from bench.figures import Figure
from specon import checkpoint
from specon.config import parse_policy
from specon.model import ContainerId, Resources
from specon.runtime import JobSpec
from specon.testing.fake_runtime import FakeClock, FakeRuntime, FakeVolume, JobScript

HEALTHZ_TARGET = 0.100  # s
MEMORY_TARGET = 4 << 20  # bytes
PROBE = """\
import http.client, json, pathlib, sys, time
port, stop = int(sys.argv[1]), pathlib.Path(sys.argv[2])
out = []
while not stop.exists():
    t0, t = time.time(), time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/healthz")
    c.getresponse().read()
    c.close()
    out.append((t0, time.perf_counter() - t))
    time.sleep(0.01)
print(json.dumps(out))
"""


def _policy(max_poll_bytes: int) -> str:
    return (
        "apiVersion: specon/v1alpha1\nkind: Policy\n"
        f"progress: {{format: jsonl, max_poll_bytes: {max_poll_bytes}}}\n"
        "monitor: {interval: 0.2}\nmessaging: {heartbeat_interval: 1}\n"
    )


def _write_log(path: Path, mb: int) -> int:
    line = '{"step": %d, "loss": %.6f, "lr": 0.001, "note": "padding to a typical record size"}\n'
    with path.open("a") as fh:
        i = 0
        while fh.tell() < mb * 1_000_000:
            fh.write("".join(line % (j, 1.0 / (j + 1)) for j in range(i, i + 10_000)))
            i += 10_000
    return path.stat().st_size


def _quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


async def _while_probed(port: int, tmp: Path, work: Callable[[], Awaitable[None]]) -> list[float]:
    """/healthz latencies (s) of the probe's requests sent while ``work`` ran."""
    stop = tmp / "stop"
    stop.unlink(missing_ok=True)
    probe = subprocess.Popen([sys.executable, "-c", PROBE, str(port), str(stop)], stdout=subprocess.PIPE)
    await asyncio.sleep(0.5)  # the probe is up and asking
    began = time.time()
    await work()
    ended = time.time()
    await asyncio.sleep(0.1)
    stop.touch()
    out, _ = await asyncio.to_thread(probe.communicate)
    # Every request in flight while the work ran: one sent just before a blocked loop
    # waits for all of it, and is the figure that matters.
    return [lat for t0, lat in json.loads(out) if t0 <= ended and t0 + lat >= began]


async def _case(tmp: Path, mb: int, *, off_loop: bool) -> tuple[list[float], float, int]:
    """Latencies while ``mb`` MB are read, the seconds the reading took, and the bytes."""
    volume = FakeVolume(FakeClock(1000.0, autojump=True), root=tmp / f"volume-{off_loop}")
    runtime = FakeRuntime("w0", volume, capacity=Resources(cpu=1.0))
    policy = parse_policy(_policy(1 << 21 if off_loop else 1 << 40))
    volume.script("big", JobScript(loss=lambda step: 1.0 / (step + 1)))
    await runtime.start(JobSpec(id=ContainerId("big"), command=("train",)))
    daemon = AgentDaemon(Agent(runtime=runtime, policy=policy), ManagerClient("http://127.0.0.1:9", "unused"))
    await daemon.agent.refresh()  # adopted: its (empty) log's end is found
    watched = daemon.agent.watched[ContainerId("big")]
    size = await asyncio.to_thread(_write_log, watched.info.progress_path, mb)
    runner = web.AppRunner(create_app(daemon))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    took = 0.0

    async def read() -> None:
        nonlocal took
        t = time.perf_counter()
        if off_loop:
            daemon.start()  # the real monitor loop: reading in a worker thread, capped per poll
            while watched.tailer.offset < size:
                await asyncio.sleep(0.005)
        else:
            daemon.agent.tick(runtime.now())  # before: one uncapped poll on the event loop
        took = time.perf_counter() - t

    try:
        latencies = await _while_probed(port, tmp, read)
    finally:
        if daemon._tasks:
            await daemon.stop(goodbye=False)
        watched.tailer.close()
        await runner.cleanup()
    return latencies, took, size


def _verify_memory(tmp: Path, mb: int) -> tuple[int, float]:
    chunk = bytes(range(256)) * 4096
    directory = tmp / "ckpt"
    payload = chunk * (mb * 1_000_000 // len(chunk))
    info = checkpoint.write(directory, 1, payload)
    del payload
    tracemalloc.start()
    try:
        t = time.perf_counter()
        checkpoint.verify(info.manifest)
        took = time.perf_counter() - t
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak, info.size / 1e6 / took


def run(quick: bool) -> list[Figure]:
    mb = 20 if quick else 200
    ckpt_mb = 64 if quick else 400
    figures: list[Figure] = []
    # The probe's timing is the point; the agent's own logs (a manager that is not there) are noise.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    try:
        with tempfile.TemporaryDirectory(prefix="specon-bench-files-") as name:
            tmp = Path(name)
            for off_loop in (True, False):
                lat, took, size = asyncio.run(_case(tmp, mb, off_loop=off_loop))
                how = "tailing off the loop, capped polls" if off_loop else "before: one poll on the loop"
                detail = (
                    f"{size / 1e6:.0f} MB read in {took:.2f} s ({size / 1e6 / took:.0f} MB/s); "
                    f"{len(lat)} probes: p50 {_quantile(lat, 0.5) * 1e3:.1f} ms, "
                    f"p99 {_quantile(lat, 0.99) * 1e3:.1f} ms"
                )
                figures.append(
                    Figure(
                        name=f"/healthz max while a {mb} MB log is read ({how})",
                        value=max(lat) * 1e3 if lat else float("nan"),
                        unit="ms",
                        target=HEALTHZ_TARGET * 1e3 if off_loop else None,
                        better="max",
                        detail=detail,
                    )
                )
            peak, rate = _verify_memory(tmp, ckpt_mb)
            figures.append(
                Figure(
                    name=f"checkpoint verify of {ckpt_mb} MB: peak traced memory",
                    value=peak / 2**20,
                    unit="MiB",
                    target=MEMORY_TARGET / 2**20,
                    better="max",
                    detail=f"hashed in {checkpoint.CHUNK >> 20} MiB chunks at {rate:.0f} MB/s",
                )
            )
    finally:
        with contextlib.suppress(Exception):
            structlog.reset_defaults()
    return figures
