"""An asynchronous-SGD worker: pull the parameters, compute a gradient, push it, repeat.

The cycle of the paper's Fig. 4 with real data on the wire: the PS answers each gradient with
the parameters after applying it (the downlink), the worker computes the gradient of its next
mini-batch on them (``mlp.loss_and_grad``: real forward and backward passes) and sends it (the
uplink). It stops when the PS says BYE.

Per mini-batch, one JSON line in ``--log`` with ``time.monotonic()`` stamps: ``recv_start``/
``recv_end`` (the parameters' header and last byte arrived), ``compute_end`` (the gradient is
ready; sending starts) and ``send_end`` (the gradient handed to the kernel).
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import structlog

from specon.workloads.asgd import mlp
from specon.workloads.asgd.wire import Frame, Kind, WireError, recv_frame, send_frame, tune

log = structlog.get_logger()


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """What ``python -m specon.workloads.asgd worker`` is given."""

    host: str
    port: int
    worker: int
    shape: mlp.Shape
    batch: int
    log_path: Path
    seed: int = 0
    timeout: float = 30.0  # per frame
    connect_timeout: float = 20.0  # the PS may start after its workers
    congestion: str | None = None  # TCP congestion control of its connection (None: the system's)


def connect(host: str, port: int, timeout: float, congestion: str | None = None) -> socket.socket:
    """A connection to the PS, retried until ``timeout`` (it may not listen yet)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=min(5.0, timeout))
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise WireError(f"cannot reach the parameter server at {host}:{port}: {exc}") from None
            time.sleep(0.05)
            continue
        try:
            tune(sock, congestion)
        except WireError:
            sock.close()
            raise
        return sock


def run(cfg: WorkerConfig) -> int:
    """Train until the PS says BYE; the number of mini-batches this worker pushed."""
    if cfg.batch < 1:
        raise ValueError(f"batch must be >= 1, got {cfg.batch}")
    data = mlp.Data(cfg.shape, seed=cfg.seed * 1000 + cfg.worker)
    grad = np.empty(cfg.shape.params, dtype=np.float32)
    buf = bytearray(cfg.shape.nbytes)
    seq = 0
    with (
        connect(cfg.host, cfg.port, cfg.connect_timeout, cfg.congestion) as sock,
        open(cfg.log_path, "w", buffering=1) as out,
    ):
        log.info(
            "specon.asgd.worker_started", worker=cfg.worker, ps=f"{cfg.host}:{cfg.port}", batch=cfg.batch
        )
        send_frame(sock, Frame(Kind.HELLO, seq=cfg.worker), timeout=cfg.timeout)
        while True:
            frame = recv_frame(sock, timeout=cfg.timeout, buffer=buf, max_payload=cfg.shape.nbytes)
            if frame.kind is Kind.BYE:
                break
            if frame.kind is not Kind.PARAMS or len(frame.payload) != cfg.shape.nbytes:
                raise WireError(
                    f"expected PARAMS of {cfg.shape.nbytes} bytes, got {frame.kind.name} "
                    f"of {len(frame.payload)}"
                )
            params = np.frombuffer(frame.payload, dtype="<f4")
            x, y = data.batch(cfg.batch)
            loss = mlp.loss_and_grad(params, cfg.shape, x, y, grad)
            compute_end = time.monotonic()
            send_frame(
                sock,
                Frame(
                    Kind.GRAD, seq=seq, version=frame.version, value=loss, payload=grad.view(np.uint8).data
                ),
                timeout=cfg.timeout,
            )
            out.write(
                json.dumps(
                    {
                        "event": "minibatch",
                        "worker": cfg.worker,
                        "seq": seq,
                        "version": frame.version,
                        "loss": loss,
                        "recv_start": frame.started,
                        "recv_end": frame.ended,
                        "compute_end": compute_end,
                        "send_end": time.monotonic(),
                    }
                )
                + "\n"
            )
            seq += 1
    log.info("specon.asgd.worker_done", worker=cfg.worker, minibatches=seq)
    return seq
