"""Cheap, guarded reads: /healthz latency while 20 clients read the status of 100k containers.

The real ``python -m specon_manager`` (pinned to one core, with a read token) first learns a
cluster of 100 workers x 1,000 containers from real heartbeats over loopback; then 20
clients read ``GET /v1/status`` (default page: 1,000 entries, with the read token) as fast
as it answers, for a window, while a probe asks ``/healthz`` every 50 ms. Measured:
``/healthz`` p50/p99/max (target p99 < 50 ms), status pages read per second and their
p50 latency, and the manager's RSS before and after the reads (pages must not grow it).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from bench._proc import rss_bytes
from bench.bench_daemons import _cores, _manager, _sigterm_interrupts
from bench.figures import Figure
from specon.model import Category, ContainerId, Resources, WorkerId
from specon.wire import protocol
from specon.wire.protocol import ContainerReport, Heartbeat

WORKERS, PER_WORKER = 100, 1_000
READERS = 20
POLICY = """\
apiVersion: specon/v1alpha1
kind: Policy
messaging: {heartbeat_interval: 5, worker_timeout: 600, max_body_bytes: 4194304,
            max_containers_per_heartbeat: 1000}
rebalance: {mode: "off"}
"""


def _heartbeat(w: int, per_worker: int) -> bytes:
    cats = (Category.PROGRESSING, Category.WATCHING, Category.CONVERGED)
    return protocol.encode(
        Heartbeat(
            worker=WorkerId(f"w{w:04d}"),
            address=f"127.0.0.1:{9000 + w}",
            seq=time.time_ns() // 1000,
            sent_at=time.time(),
            capacity=Resources(cpu=8.0, memory=32 << 30),
            usage=0.5,
            containers=tuple(
                ContainerReport(id=ContainerId(f"w{w:04d}-job-{i:04d}"), category=cats[i % 3], step=i)
                for i in range(per_worker)
            ),
        )
    )


def _quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


async def _load(url: str, token: str, workers: int, per_worker: int) -> None:
    headers = {protocol.AUTH_HEADER: f"Bearer {token}", "Content-Type": protocol.CONTENT_TYPE}
    async with aiohttp.ClientSession() as s:
        for w in range(workers):
            async with s.post(
                url + protocol.HEARTBEAT_PATH, data=_heartbeat(w, per_worker), headers=headers
            ) as r:
                if r.status != 200:
                    raise RuntimeError(f"heartbeat {w}: {r.status} {await r.text()}")


# The probe runs in a process of its own: in the readers' process its timings would
# include their JSON parsing, not the manager's answer.
_PROBE = """
import json, sys, time, urllib.request
url, until = sys.argv[1], time.monotonic() + float(sys.argv[2])
out = []
while time.monotonic() < until:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url + "/healthz", timeout=30) as r:
        r.read()
    out.append(time.perf_counter() - t0)
    time.sleep(0.05)
print(json.dumps(out))
"""


async def _reads(url: str, read_token: str, window: float) -> tuple[list[float], list[float], int]:
    """(healthz latencies, status latencies, failed reads) over ``window`` seconds."""
    status: list[float] = []
    failed = 0
    stop = time.monotonic() + window
    headers = {protocol.AUTH_HEADER: f"Bearer {read_token}"}

    async def reader(s: aiohttp.ClientSession) -> None:
        nonlocal failed
        after: str | None = None
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            params = {} if after is None else {"after": after}
            async with s.get(url + protocol.STATUS_PATH, headers=headers, params=params) as r:
                body = await r.read()
            if r.status != 200:
                failed += 1
                continue
            status.append(time.perf_counter() - t0)
            after = json.loads(body).get("next")  # walk the pages, then start over

    probe = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _PROBE, url, str(window), stdout=asyncio.subprocess.PIPE
    )
    conn = aiohttp.TCPConnector(limit=READERS)
    async with aiohttp.ClientSession(connector=conn) as s:
        await asyncio.gather(*(reader(s) for _ in range(READERS)))
    out, _ = await probe.communicate()
    health: list[float] = json.loads(out)
    return health, status, failed


def run(quick: bool) -> list[Figure]:
    workers, window = (20, 5.0) if quick else (WORKERS, 20.0)
    manager_cpu, _, note = _cores()
    with _sigterm_interrupts(), tempfile.TemporaryDirectory(prefix="specon-bench-status-") as tmp:
        root = Path(tmp)
        token, read = root / "token", root / "read"
        token.write_text(secrets.token_urlsafe(32))
        read.write_text(secrets.token_urlsafe(32))
        with _manager(root / "m", token, POLICY, manager_cpu, extra=["--read-token-file", str(read)]) as mgr:
            asyncio.run(_load(mgr.url, token.read_text(), workers, PER_WORKER))
            time.sleep(2.0)  # a ticker pass: the manager freezes its grown heap (manager/heap.py)
            before = rss_bytes(mgr.proc.pid) or 0
            print(
                f"  learned {workers * PER_WORKER:,} containers; {READERS} readers for {window:g} s",
                flush=True,
            )
            health, status, failed = asyncio.run(_reads(mgr.url, read.read_text(), window))
            after = rss_bytes(mgr.proc.pid) or 0
    n = workers * PER_WORKER
    detail = f"{n:,} containers, {READERS} status readers, {note}"
    return [
        Figure("healthz p50 under status reads", _quantile(health, 0.5) * 1e3, "ms", detail=detail),
        Figure(
            "healthz p99 under status reads", _quantile(health, 0.99) * 1e3, "ms", target=50.0, detail=detail
        ),
        Figure("healthz max under status reads", max(health) * 1e3, "ms", detail=f"{len(health)} probes"),
        Figure(
            "status pages read", len(status) / window, "pages/s", better="min", detail="1,000 entries a page"
        ),
        Figure("status page p50", _quantile(status, 0.5) * 1e3, "ms"),
        Figure("status reads failed", float(failed), "reads", target=0.0),
        Figure(
            "manager RSS growth during reads",
            (after - before) / 2**20,
            "MiB",
            detail=f"{before / 2**20:.0f} MiB before",
        ),
    ]
