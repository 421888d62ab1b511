"""Load generator for ``bench_daemons``: many simulated agents heartbeating one manager.

Run as its own process (the benchmark pins it to a core of its own)::

    python -m bench._heartbeat_load --url http://127.0.0.1:PORT --token-file F \\
        --agents 1000 --containers 8 --concurrency 64 --duration 10 [--rate 200] --out result.json

Every agent has a distinct worker id and ``--containers`` containers in a realistic mix of
categories. Bodies come from ``specon.wire.protocol.encode``: each agent's heartbeat is encoded
once with sentinel ``seq``/``sent_at`` values, and only those two numbers are substituted
per send (checked by decoding one at start-up). The HTTP client is a minimal HTTP/1.1 one
(``Connection``, below): one keep-alive connection per request in flight, each request
written as one precomputed head plus the body, each answer read by its ``Content-Length``.
An aiohttp client spent more CPU per heartbeat than the manager it measured, so the client,
not the manager, set the rate. ``seq`` increases for every send, so no heartbeat is dropped
as stale.

One untimed warm-up beat per agent comes first (the manager creates its records then);
the timed phase follows: as fast as the manager answers with ``--concurrency`` requests in
flight, or, with ``--rate``, at that many heartbeats per second in total (latency then
counts from each beat's due time, so a slow answer is not hidden by a delayed send).
Only 200 answers count; everything else is tallied as an error. Progress goes to stdout
once a second; the result, one JSON object, goes to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

from bench._proc import cpu_seconds
from specon.model import Category, ContainerId, Resources, WorkerId
from specon.wire import protocol
from specon.wire.protocol import CommandBatch, ContainerReport, Heartbeat

SEQ_SENTINEL = 918273645546372819
SENT_AT_SENTINEL = 123456789.25
MODELS = ("vae", "gru", "birnn", "rnn", "dynrnn", "mnist_cnn")
# Share of containers per category in a cluster that has been running a while.
REQUEST_TIMEOUT = 30.0  # seconds; an answer later than this counts as an error
CATEGORY_MIX = ((Category.PROGRESSING, 0.6), (Category.WATCHING, 0.2), (Category.CONVERGED, 0.2))


@dataclasses.dataclass(frozen=True, slots=True)
class Template:
    """One agent's encoded heartbeat, split around the two numbers that change per send."""

    worker: WorkerId
    parts: tuple[bytes, bytes, bytes]

    def body(self, seq: int, sent_at: float) -> bytes:
        head, mid, tail = self.parts
        return b"".join((head, str(seq).encode(), mid, repr(sent_at).encode(), tail))


def heartbeat(
    i: int, containers: int, rng: random.Random, now: float, *, requesting: bool = False
) -> Heartbeat:
    """Agent ``i``'s heartbeat (with sentinel seq and sent_at; converged ``now - 0..600 s`` ago).
    ``requesting``: its converged containers ask to move (``pending_request``)."""
    worker = WorkerId(f"sim-{i:05d}")
    reports = []
    for j in range(containers):
        category = rng.choices([c for c, _ in CATEGORY_MIX], [w for _, w in CATEGORY_MIX])[0]
        steps = rng.choice((2000, 5000, 10000))
        reports.append(
            ContainerReport(
                id=ContainerId(f"job-{i:05d}-{j:02d}"),
                category=category,
                last_g=rng.uniform(0.0, 0.05),
                t_cc=now - rng.uniform(0, 600) if category is Category.CONVERGED else None,
                pending_request=requesting and category is Category.CONVERGED,
                step=rng.randrange(steps),
                requests=Resources(cpu=rng.choice((0.5, 1.0, 2.0)), memory=rng.choice((1, 2, 4)) << 30),
                job={
                    "model": rng.choice(MODELS),
                    "steps": str(steps),
                    "submitted": f"{rng.uniform(0, 1e5):.3f}",
                },
            )
        )
    return Heartbeat(
        worker=worker,
        address=f"10.0.{i // 250}.{i % 250 + 1}:7701",
        seq=SEQ_SENTINEL,
        sent_at=SENT_AT_SENTINEL,
        capacity=Resources(cpu=8.0, memory=32 << 30),
        usage=rng.random(),
        containers=tuple(reports),
        labels={"zone": f"z{i % 3}"},
    )


def template(msg: Heartbeat) -> Template:
    raw = protocol.encode(msg)
    seq, sent = str(SEQ_SENTINEL).encode(), repr(SENT_AT_SENTINEL).encode()
    head, rest = _split_once(raw, b'"seq":' + seq)
    mid, tail = _split_once(rest, b'"sent_at":' + sent)
    t = Template(msg.worker, (head + b'"seq":', mid + b'"sent_at":', tail))
    probe = t.body(SEQ_SENTINEL + 1, SENT_AT_SENTINEL + 1.0)
    expected = dataclasses.replace(msg, seq=SEQ_SENTINEL + 1, sent_at=SENT_AT_SENTINEL + 1.0)
    if protocol.decode(probe, Heartbeat) != expected:
        raise RuntimeError("heartbeat template does not round-trip through protocol.decode")
    return t


def _split_once(raw: bytes, marker: bytes) -> tuple[bytes, bytes]:
    if raw.count(marker) != 1:
        raise RuntimeError(f"sentinel {marker!r} found {raw.count(marker)} times in an encoded heartbeat")
    head, _, tail = raw.partition(marker)
    return head, tail


@dataclasses.dataclass(slots=True)
class Tally:
    ok: int = 0
    errors: Counter[str] = dataclasses.field(default_factory=Counter)
    latencies: list[float] = dataclasses.field(default_factory=list)


class HttpError(Exception):
    """The connection broke or the answer was not HTTP/1.1 as the manager writes it."""


class Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection, one request at a time: ``post`` -> (status, body)."""

    def __init__(self) -> None:
        self.transport: asyncio.BaseTransport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._fail(HttpError(f"connection closed: {exc}"))

    def _fail(self, exc: Exception) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0 or self.waiter is None:
            return
        head = bytes(self.buffer[:end]).split(b"\r\n")
        length = next((int(h.split(b":", 1)[1]) for h in head if h[:15].lower() == b"content-length:"), None)
        if length is None or not head[0].startswith(b"HTTP/1.1 "):
            self._fail(HttpError(f"unexpected answer head {head[0]!r}"))
            if self.transport is not None:
                self.transport.close()  # out of step with the stream: the next send reconnects
            return
        if len(self.buffer) < end + 4 + length:
            return
        body = bytes(self.buffer[end + 4 : end + 4 + length])
        del self.buffer[: end + 4 + length]
        if not self.waiter.done():
            self.waiter.set_result((int(head[0][9:12]), body))

    async def post(self, request: bytes) -> tuple[int, bytes]:
        if self.transport is None or self.transport.is_closing():
            raise HttpError("not connected")
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)  # type: ignore[attr-defined]  # a stream transport (any loop's)
        return await self.waiter


class Load:
    def __init__(self, args: argparse.Namespace, templates: Sequence[Template]) -> None:
        url = urlsplit(args.url)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 80
        token = Path(args.token_file).read_text().strip()
        self.head = (
            f"POST {protocol.HEARTBEAT_PATH} HTTP/1.1\r\nHost: {url.netloc}\r\n"
            f"{protocol.AUTH_HEADER}: Bearer {token}\r\nContent-Type: {protocol.CONTENT_TYPE}\r\n"
            "Content-Length: "
        ).encode()
        self.templates = templates
        self.concurrency: int = args.concurrency
        self.sources: list[str] = args.sources
        # Strictly increasing across every send of this process (and above any earlier
        # run's, being wall-clock microseconds at start-up).
        self.seq = itertools.count(time.time_ns() // 1000)
        self.connections: list[Connection] = []

    async def connect(self, k: int) -> Connection:
        """Connection ``k`` (from source address ``k mod len(sources)``), reconnecting if it broke."""
        while len(self.connections) <= k:
            self.connections.append(Connection())
        conn = self.connections[k]
        if conn.transport is None or conn.transport.is_closing():
            conn = self.connections[k] = Connection()
            local = (self.sources[k % len(self.sources)], 0)
            transport, _ = await asyncio.get_running_loop().create_connection(
                lambda: conn, self.host, self.port, local_addr=local
            )
            conn.transport = transport  # an event loop may call connection_made later (uvloop)
        return conn

    async def close(self) -> None:
        for conn in self.connections:
            if conn.transport is not None:
                conn.transport.close()

    def request(self, t: Template, seq: int) -> bytes:
        body = t.body(seq, time.time())
        return b"".join((self.head, str(len(body)).encode(), b"\r\n\r\n", body))

    async def send(self, k: int, t: Template, tally: Tally, since: float) -> None:
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT):
                conn = await self.connect(k)
                status, _ = await conn.post(self.request(t, next(self.seq)))
        except (HttpError, OSError, TimeoutError) as exc:
            tally.errors[type(exc).__name__] += 1
            return
        if status == 200:
            tally.ok += 1
            tally.latencies.append(time.perf_counter() - since)
        else:
            tally.errors[f"HTTP {status}"] += 1

    async def warm_up(self) -> Tally:
        """One beat per agent, untimed; checks that the answer is a CommandBatch acking it."""
        tally = Tally()
        todo = iter(self.templates)

        async def worker(k: int) -> None:
            for t in todo:
                await self.send(k, t, tally, time.perf_counter())

        await asyncio.gather(*(worker(k) for k in range(self.concurrency)))
        seq = next(self.seq)
        status, body = await (await self.connect(0)).post(self.request(self.templates[0], seq))
        if status != 200:
            raise RuntimeError(f"the manager answered {status}: {body[:200]!r}")
        batch = protocol.decode(body, CommandBatch)
        if batch.ack != seq:
            raise RuntimeError(f"the manager acked {batch.ack}, expected {seq}")
        return tally

    async def run(
        self, duration: float, rate: float | None, manager_pid: int | None, front_pids: Sequence[int] = ()
    ) -> dict[str, object]:
        tally = Tally()
        slots = itertools.count()
        n = len(self.templates)
        t0 = time.perf_counter()
        stop_at = t0 + duration
        cpu0 = cpu_seconds(manager_pid) if manager_pid else None
        fronts0 = _total_cpu(front_pids)
        client0 = time.process_time()

        async def worker(k: int) -> None:
            while True:
                i = next(slots)
                due = t0 + i / rate if rate else time.perf_counter()
                if due >= stop_at:
                    return
                if rate:
                    await asyncio.sleep(max(0.0, due - time.perf_counter()))
                await self.send(k, self.templates[i % n], tally, due)

        async def progress() -> None:
            while True:
                await asyncio.sleep(1.0)
                dt = time.perf_counter() - t0
                errs = sum(tally.errors.values())
                print(
                    f"    load: {dt:4.1f} s  {tally.ok:>7,} ok ({tally.ok / dt:,.0f}/s)  {errs} errors",
                    flush=True,
                )

        ticker = asyncio.create_task(progress())
        try:
            await asyncio.gather(*(worker(k) for k in range(self.concurrency)))
        finally:
            ticker.cancel()
        elapsed = time.perf_counter() - t0
        cpu1 = cpu_seconds(manager_pid) if manager_pid else None
        fronts1 = _total_cpu(front_pids)
        lat = sorted(tally.latencies)
        return {
            "ok": tally.ok,
            "errors": dict(tally.errors),
            "seconds": elapsed,
            "rate": tally.ok / elapsed,
            "offered_rate": rate,
            "concurrency": self.concurrency,
            "p50_ms": _quantile(lat, 0.50) * 1000,
            "p90_ms": _quantile(lat, 0.90) * 1000,
            "p99_ms": _quantile(lat, 0.99) * 1000,
            "max_ms": (lat[-1] if lat else float("nan")) * 1000,
            "manager_cpu_s": None if cpu0 is None or cpu1 is None else cpu1 - cpu0,
            "fronts_cpu_s": None if fronts0 is None or fronts1 is None else fronts1 - fronts0,
            "client_cpu_s": time.process_time() - client0,
        }


def _total_cpu(pids: Sequence[int]) -> float | None:
    """The CPU seconds of ``pids`` together (None: none given, or one is gone)."""
    times = [cpu_seconds(pid) for pid in pids]
    return None if not times or None in times else sum(t for t in times if t is not None)


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    rng = random.Random(args.seed)
    now = time.time()
    # Which agents ask: their own draws, so the default load's templates do not change.
    asking = random.Random(args.seed + 1)
    templates = [
        template(heartbeat(i, args.containers, rng, now, requesting=asking.random() < args.requesting))
        for i in range(args.agents)
    ]
    load = Load(args, templates)
    try:
        try:
            warm = await asyncio.wait_for(load.warm_up(), args.warmup_timeout)
        except TimeoutError:
            raise RuntimeError(
                f"warm-up (one beat per agent) took over {args.warmup_timeout:g} s: the manager is too slow"
            ) from None
        if warm.errors:
            raise RuntimeError(f"warm-up failed: {dict(warm.errors)}")
        result = await load.run(args.duration, args.rate, args.manager_pid, args.front_pids)
    finally:
        await load.close()
    result["agents"] = args.agents
    result["containers_per_agent"] = args.containers
    result["body_bytes"] = len(templates[0].body(SEQ_SENTINEL, SENT_AT_SENTINEL))
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench._heartbeat_load", description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True, help="manager base URL (loopback)")
    p.add_argument("--token-file", required=True)
    p.add_argument("--agents", type=int, default=1000)
    p.add_argument("--containers", type=int, default=8, help="containers per agent")
    p.add_argument("--concurrency", type=int, default=64, help="requests in flight")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of timed load")
    p.add_argument("--rate", type=float, help="heartbeats per second in total (default: as fast as answered)")
    p.add_argument("--sources", nargs="+", default=["127.0.0.1"], help="loopback source addresses")
    p.add_argument("--manager-pid", type=int, help="to report the manager's CPU time in the timed phase")
    p.add_argument(
        "--front-pids",
        type=int,
        nargs="*",
        default=(),
        help="the manager's fronts (--fronts), their CPU time too",
    )
    p.add_argument("--warmup-timeout", type=float, default=120.0, help="seconds allowed for the warm-up")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--requesting", type=float, default=0.0, help="share of agents whose converged containers ask to move"
    )
    p.add_argument("--out", type=Path, required=True, help="where to write the JSON result")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.url.startswith("http://127."):
        print("refusing: the load generator only talks to loopback addresses", file=sys.stderr)
        return 2
    result = asyncio.run(main_async(args))
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
