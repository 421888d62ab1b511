"""The parameter server: holds the model, applies workers' gradients one at a time (FCFS).

Asynchronous SGD without barriers: each worker's connection has a thread that receives its
gradients (the uplink: all of them share the PS's link) and sends the parameters back (the
downlink), while one updater thread applies gradients strictly in arrival order (a FIFO queue:
the FCFS server station of the paper's model) and snapshots the parameters for the reply. A
gradient computed on an older version is applied all the same (its staleness is logged).

Per update, one JSON line in ``--log`` with ``time.monotonic()`` stamps: ``recv_start`` (the
gradient's header arrived), ``recv_end`` (its last byte), ``apply_start``/``apply_end`` (the
update and the snapshot) and ``send_end`` (the reply handed to the kernel). Processes on one
machine share that clock, which is what lets ``profile`` line them up with the worker's.
"""

from __future__ import annotations

import contextlib
import json
import queue
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

import numpy as np
import structlog

from specon.workloads.asgd import mlp
from specon.workloads.asgd.wire import Frame, Kind, WireError, recv_frame, send_frame, tune

log = structlog.get_logger()

Optimizer = Literal["sgd", "momentum", "adam"]
OPTIMIZERS: tuple[Optimizer, ...] = ("sgd", "momentum", "adam")


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """What ``python -m specon.workloads.asgd ps`` is given."""

    host: str
    port: int
    shape: mlp.Shape
    duration: float  # seconds of training, from the first worker's hello
    log_path: Path
    lr: float = 0.005
    optimizer: Optimizer = "momentum"
    seed: int = 0
    timeout: float = 30.0  # per frame
    max_updates: int = 0  # 0: no limit
    wait_workers: int = 1  # the ``duration`` clock starts once this many workers have joined
    congestion: str | None = None  # TCP congestion control of its connections (None: the system's)
    idle_timeout: float = 60.0  # give up when they have not by then


@dataclass(slots=True)
class _Request:
    worker: int
    frame: Frame  # HELLO (answered with the parameters) or GRAD
    queued: float
    done: threading.Event = field(default_factory=threading.Event)
    reply: bytes | None = None  # the parameters' snapshot; None: say BYE
    version: int = 0
    apply_start: float = 0.0
    apply_end: float = 0.0
    staleness: int = 0


class _Model:
    """Parameters and optimizer state; only the updater thread touches them."""

    def __init__(self, cfg: ServerConfig) -> None:
        self.cfg = cfg
        self.params = mlp.init(cfg.shape, cfg.seed)
        self.initial = self.params.copy()
        self.version = 0
        self.m = np.zeros_like(self.params) if cfg.optimizer != "sgd" else None
        self.v = np.zeros_like(self.params) if cfg.optimizer == "adam" else None
        self.lr = np.float32(cfg.lr)

    def apply(self, grad: mlp.F32) -> None:
        if self.cfg.optimizer == "sgd":
            self.params -= self.lr * grad
        elif self.cfg.optimizer == "momentum":
            assert self.m is not None
            self.m *= np.float32(0.9)
            self.m += grad
            self.params -= self.lr * self.m
        else:
            assert self.m is not None and self.v is not None
            t = self.version + 1
            self.m *= np.float32(0.9)
            self.m += np.float32(0.1) * grad
            self.v *= np.float32(0.999)
            self.v += np.float32(0.001) * grad * grad
            step = self.lr * np.float32(np.sqrt(1 - 0.999**t) / (1 - 0.9**t))
            self.params -= step * self.m / (np.sqrt(self.v) + np.float32(1e-8))
        self.version += 1

    def moved(self) -> float:
        """How far training moved the parameters: ||p - p0|| / ||p0||."""
        return float(np.linalg.norm(self.params - self.initial) / np.linalg.norm(self.initial))


class ParameterServer:
    """One training job's server; ``serve()`` returns its summary once training ends."""

    def __init__(self, cfg: ServerConfig) -> None:
        self.cfg = cfg
        self.model = _Model(cfg)
        self.requests: queue.Queue[_Request] = queue.Queue()
        self.stopping = threading.Event()
        self.updates: dict[int, int] = {}
        self.losses: list[float] = []
        self.errors: list[str] = []
        self._conns: list[threading.Thread] = []
        self._socks: list[socket.socket] = []
        self._write_lock = threading.Lock()
        self._out: IO[str] | None = None
        self._joined: list[int] = []

    def _record(self, rec: dict[str, Any]) -> None:
        with self._write_lock:
            assert self._out is not None
            self._out.write(json.dumps(rec) + "\n")

    def serve(self) -> dict[str, Any]:
        cfg = self.cfg
        wall0, cpu0 = time.monotonic(), time.process_time()
        with (
            socket.create_server((cfg.host, cfg.port), backlog=64) as listener,
            open(cfg.log_path, "w", buffering=1) as self._out,
        ):
            listener.settimeout(0.2)
            tune(listener, cfg.congestion)  # refused here, before any worker joins
            acceptor = threading.Thread(target=self._accept, args=(listener,), daemon=True)
            acceptor.start()
            log.info(
                "specon.asgd.ps_started",
                address=f"{cfg.host}:{cfg.port}",
                params=cfg.shape.params,
                nbytes=cfg.shape.nbytes,
                optimizer=cfg.optimizer,
            )
            self._update_loop()
            self.stopping.set()
            acceptor.join(timeout=2)
            for t in self._conns:
                t.join(timeout=cfg.timeout)
            for s in self._socks:
                with contextlib.suppress(OSError):
                    s.close()
            summary = {
                "event": "done",
                "updates": self.model.version,
                "by_worker": {str(k): v for k, v in sorted(self.updates.items())},
                "moved": self.model.moved(),
                "first_loss": self.losses[0] if self.losses else None,
                "last_loss": float(np.mean(self.losses[-10:])) if self.losses else None,
                "errors": self.errors,
                # The PS's own CPU use (all its threads): near one core, it is the bottleneck.
                "cpu_s": time.process_time() - cpu0,
                "wall_s": time.monotonic() - wall0,
            }
            self._record(summary)
        log.info("specon.asgd.ps_done", **{k: v for k, v in summary.items() if k != "event"})
        return summary

    def _accept(self, listener: socket.socket) -> None:
        while not self.stopping.is_set():
            try:
                sock, peer = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                tune(sock, self.cfg.congestion)
            except WireError as exc:
                self.errors.append(f"{peer[0]}:{peer[1]}: {exc}")
                sock.close()
                continue
            self._socks.append(sock)
            t = threading.Thread(target=self._connection, args=(sock, f"{peer[0]}:{peer[1]}"), daemon=True)
            self._conns.append(t)
            t.start()

    def _update_loop(self) -> None:
        """The FCFS station: one request at a time, in arrival order, until the deadline."""
        cfg = self.cfg
        started = time.monotonic()
        deadline: float | None = None
        while not (cfg.max_updates and self.model.version >= cfg.max_updates):
            now = time.monotonic()
            if deadline is None and len(self._joined) >= cfg.wait_workers:
                deadline = now + cfg.duration
                self._record({"event": "clock", "t": now, "joined": len(self._joined)})
            if deadline is None and now - started > cfg.idle_timeout:
                self.errors.append(
                    f"{len(self._joined)} of {cfg.wait_workers} workers joined in {cfg.idle_timeout:g}s"
                )
                log.error(
                    "specon.asgd.ps_workers_missing", joined=len(self._joined), expected=cfg.wait_workers
                )
                break
            if deadline is not None and now >= deadline:
                break
            try:
                req = self.requests.get(timeout=0.05)
            except queue.Empty:
                continue
            req.apply_start = time.monotonic()
            if req.frame.kind is Kind.GRAD:
                grad = np.frombuffer(req.frame.payload, dtype="<f4")
                req.staleness = self.model.version - req.frame.version
                self.model.apply(grad)
                self.losses.append(req.frame.value)
                self.updates[req.worker] = self.updates.get(req.worker, 0) + 1
            req.reply = self.model.params.tobytes()
            req.version = self.model.version
            req.apply_end = time.monotonic()
            req.done.set()
        self.stopping.set()
        # Whoever is still waiting, or arrives before its connection sees ``stopping``: BYE.
        end = time.monotonic() + cfg.timeout
        while any(t.is_alive() for t in self._conns) and time.monotonic() < end:
            try:
                req = self.requests.get(timeout=0.05)
            except queue.Empty:
                continue
            req.done.set()

    def _connection(self, sock: socket.socket, peer: str) -> None:
        cfg = self.cfg
        buf = bytearray(cfg.shape.nbytes)
        worker = -1
        try:
            hello = recv_frame(sock, timeout=cfg.timeout, buffer=buf, max_payload=0)
            if hello.kind is not Kind.HELLO:
                raise WireError(f"expected HELLO first, got {hello.kind.name}")
            worker = hello.seq
            log.info("specon.asgd.worker_joined", worker=worker, peer=peer)
            self._record({"event": "hello", "worker": worker, "peer": peer, "t": hello.ended})
            self._joined.append(worker)
            frame: Frame = hello
            while True:
                req = _Request(worker, frame, time.monotonic())
                if self.stopping.is_set():
                    req.done.set()
                else:
                    self.requests.put(req)
                    req.done.wait()
                if req.reply is None:
                    send_frame(sock, Frame(Kind.BYE), timeout=cfg.timeout)
                    return
                send_frame(
                    sock, Frame(Kind.PARAMS, version=req.version, payload=req.reply), timeout=cfg.timeout
                )
                if frame.kind is Kind.GRAD:
                    self._record(
                        {
                            "event": "update",
                            "worker": worker,
                            "seq": frame.seq,
                            "version": req.version,
                            "staleness": req.staleness,
                            "loss": frame.value,
                            "recv_start": frame.started,
                            "recv_end": frame.ended,
                            "apply_start": req.apply_start,
                            "apply_end": req.apply_end,
                            "send_end": time.monotonic(),
                        }
                    )
                frame = recv_frame(sock, timeout=cfg.timeout, buffer=buf, max_payload=cfg.shape.nbytes)
                if frame.kind is not Kind.GRAD:
                    raise WireError(f"expected GRAD, got {frame.kind.name}")
                if len(frame.payload) != cfg.shape.nbytes:
                    raise WireError(
                        f"a gradient of {cfg.shape.nbytes} bytes expected, got {len(frame.payload)}"
                    )
        except WireError as exc:
            if not self.stopping.is_set():
                self.errors.append(f"worker {worker} ({peer}): {exc}")
                log.warning("specon.asgd.worker_dropped", worker=worker, peer=peer, error=str(exc))
        finally:
            with contextlib.suppress(OSError):
                sock.close()
