"""Progress log reading: parse+tail throughput of one Tailer, in lines/s on one core.

Each case writes a log of ~1,000,000 lines (quick: 100,000) to a temporary directory, then
a fresh ``Tailer`` polls it in full (the file is in the page cache by then). The figure is
the best of three runs, so other load on the machine disturbs it less; the detail gives
the CPU time of that run.
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.figures import Figure
from specon.config import ProgressConfig
from specon.progress import Tailer

RUNS = 3
JSONL_TARGET = 300_000.0  # lines/s, one core


def _jsonl(i: int, loss: float) -> str:
    return f'{{"step": {i}, "loss": {loss:.6f}}}\n'


def _jsonl_ts(i: int, loss: float) -> str:
    return f'{{"step": {i}, "loss": {loss:.6f}, "lr": 0.001, "ts": {1.7e9 + i / 10:.3f}}}\n'


def _lightning_csv(i: int, loss: float) -> str:
    # Every tenth row logs validation only, as Lightning's metrics.csv does.
    if i % 10 == 9:
        return f"{i // 100},{i},,{loss:.6f}\r\n"
    return f"{i // 100},{i},{loss:.6f},\r\n"


def _pytorch_text(i: int, loss: float) -> str:
    return f"Train Epoch: {i // 1000} [{i % 1000 * 64}/60000 ({i % 1000 / 10:.0f}%)]\tLoss: {loss:.6f}\n"


# name, line writer, header, config, target
CASES: list[tuple[str, Callable[[int, float], str], str, ProgressConfig, float | None]] = [
    ("jsonl {step, loss}, format auto", _jsonl, "", ProgressConfig(), JSONL_TARGET),
    ("jsonl {step, loss, lr, ts}", _jsonl_ts, "", ProgressConfig(format="jsonl"), None),
    (
        "csv Lightning metrics.csv",
        _lightning_csv,
        "epoch,step,train_loss,val_loss\r\n",
        ProgressConfig(format="csv", metric="train_loss"),
        None,
    ),
    ("text PyTorch 'Loss: x' prints", _pytorch_text, "", ProgressConfig(format="text"), None),
]


def _write(path: Path, lines: int, line: Callable[[int, float], str], header: str) -> int:
    rng = random.Random(0)
    with path.open("w", newline="") as f:
        f.write(header)
        chunk: list[str] = []
        for i in range(lines):
            chunk.append(line(i, 2.5 * 0.99999**i + rng.random() * 0.1))
            if len(chunk) == 10_000:
                f.write("".join(chunk))
                chunk.clear()
        f.write("".join(chunk))
    return path.stat().st_size


def _measure(path: Path, config: ProgressConfig) -> tuple[float, float, int]:
    """Wall and CPU seconds of one full poll, and the samples it returned."""
    with Tailer(path, config, capped=False) as tailer:  # one poll of the whole file: the reading speed
        wall, cpu = time.perf_counter(), time.process_time()
        samples = tailer.poll()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return wall, cpu, len(samples)


def run(quick: bool) -> list[Figure]:
    lines = 100_000 if quick else 1_000_000
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory(prefix="specon-bench-progress-") as tmp:
        for i, (name, line, header, config, target) in enumerate(CASES):
            path = Path(tmp) / f"log{i}"
            size = _write(path, lines, line, header)
            expected = lines - lines // 10 if "Lightning" in name else lines
            best: tuple[float, float, int] | None = None
            for _ in range(RUNS):
                result = _measure(path, config)
                if result[2] != expected:
                    raise RuntimeError(f"{name}: read {result[2]} samples, expected {expected}")
                if best is None or result[0] < best[0]:
                    best = result
            assert best is not None
            wall, cpu, _ = best
            figures.append(
                Figure(
                    name=f"progress tail+parse: {name}",
                    value=lines / wall,
                    unit="lines/s",
                    target=target,
                    better="min",
                    detail=f"{lines:,} lines, {size / 1e6:.1f} MB, best of {RUNS}: "
                    f"{wall:.3f} s wall, {cpu:.3f} s CPU",
                )
            )
            path.unlink()
    return figures
