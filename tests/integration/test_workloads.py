"""The five real PyTorch workloads, run as jobs in subprocesses under the job contract."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from specon import jobkit

pytest.importorskip("torch")

from specon.workloads.registry import WORKLOADS, build  # after the torch check

SHORT_STEPS = 60
HELD = 10**6  # a job's steps when the test, not the job, decides where it ends


@dataclass
class Run:
    proc: subprocess.Popen[str]
    progress: Path
    checkpoints: Path
    #: Records the progress file held when this run started (an earlier run's).
    earlier: int = 0

    def records(self) -> list[dict[str, Any]]:
        if not self.progress.exists():
            return []
        return [json.loads(line) for line in self.progress.read_text().splitlines()]

    def samples(self) -> list[dict[str, Any]]:
        return [r for r in self.records() if "loss" in r]

    def own_samples(self) -> list[dict[str, Any]]:
        """This run's samples only."""
        return [r for r in self.records()[self.earlier :] if "loss" in r]


def _start(tmp: Path, model: str, steps: int, *extra: str) -> Run:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECON_")}
    env |= {
        jobkit.ENV_PROGRESS_FILE: str(tmp / "progress.jsonl"),
        jobkit.ENV_CHECKPOINT_DIR: str(tmp / "ckpt"),
        jobkit.ENV_JOB_ID: f"{model}-test",
        "OMP_NUM_THREADS": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "specon.workloads",
        "--model",
        model,
        "--steps",
        str(steps),
        "--log-every",
        "1",
    ]
    progress = tmp / "progress.jsonl"
    earlier = len(progress.read_text().splitlines()) if progress.exists() else 0
    proc = subprocess.Popen(
        [*cmd, *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    return Run(proc, progress, tmp / "ckpt", earlier)


@pytest.fixture(scope="module")
def short_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Run]]:
    """One short job per model, all started together (they take a few seconds each)."""
    runs = {name: _start(tmp_path_factory.mktemp(name), name, SHORT_STEPS) for name in WORKLOADS}
    for run in runs.values():
        run.proc.wait(timeout=240)
    yield runs


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(WORKLOADS))
def test_short_job_trains_and_finishes(short_runs: dict[str, Run], model: str) -> None:
    run = short_runs[model]
    assert run.proc.returncode == 0, run.proc.stderr.read() if run.proc.stderr else ""
    samples = run.samples()
    assert [s["step"] for s in samples] == list(range(1, SHORT_STEPS + 1))
    losses = [s["loss"] for s in samples]
    assert sum(losses[:10]) / 10 > sum(losses[-10:]) / 10
    assert run.records()[-1]["event"] == "finished" and run.records()[-1]["steps"] == SHORT_STEPS
    assert jobkit.read_done(run.checkpoints) is not None


def _wait_for_step(run: Run, step: int, *, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    # Its own samples: an earlier run (stopped late) may have passed ``step`` already, and a
    # SIGTERM sent before this run installed its handler would kill it.
    while not any(s["step"] >= step for s in run.own_samples()):
        assert run.proc.poll() is None, f"job exited early with {run.proc.returncode}"
        assert time.monotonic() < deadline, f"job did not reach step {step} in time"
        time.sleep(0.05)


@pytest.mark.slow
def test_vae_stopped_twice_ends_with_exactly_its_steps(tmp_path: Path, short_runs: dict[str, Run]) -> None:
    # The stopped runs have no end of their own (HELD steps): the test's SIGTERM ends them,
    # however late a loaded machine lets it land. The last run is the 120-step job (stopped
    # past step 120, one of that many steps).
    for stop_at in (20, 55):  # the second stop comes after the periodic checkpoint at 50
        run = _start(tmp_path, "vae", HELD, "--checkpoint-every", "50")
        _wait_for_step(run, stop_at)
        run.proc.send_signal(signal.SIGTERM)
        assert run.proc.wait(timeout=60) == jobkit.EXIT_CHECKPOINTED
        assert run.records()[-1]["event"] == "checkpointed"
    steps = max(120, int(run.records()[-1]["step"]))
    run = _start(tmp_path, "vae", steps, "--checkpoint-every", "50")
    assert run.proc.wait(timeout=120) == 0
    records = run.records()

    assert records[-1] == {"event": "finished", "step": steps, "steps": steps, "ts": records[-1]["ts"]}
    samples = run.samples()
    assert [s["step"] for s in samples] == list(range(1, steps + 1))  # none lost, none twice
    checkpoint_steps = [
        r["step"] for r in records if r.get("event") in ("checkpoint", "checkpointed") or r.get("resumed")
    ]
    assert len(checkpoint_steps) >= 5 and checkpoint_steps == sorted(checkpoint_steps)
    # Model, optimizer, data order and sampling noise all came back: the stopped-and-resumed
    # job trains exactly as the uninterrupted one did.
    reference = [s["loss"] for s in short_runs["vae"].samples()]
    assert [s["loss"] for s in samples[:SHORT_STEPS]] == reference


def test_build_rejects_unknown_models_and_bad_sizes() -> None:
    with pytest.raises(ValueError, match="unknown workload"):
        build("resnet", seed=0)
    with pytest.raises(ValueError, match="batch size"):
        build("gru", seed=0, batch_size=0)


def test_build_is_repeatable_in_process() -> None:
    first = [build("gru", seed=3, batch_size=8).train_step() for _ in range(2)]
    assert first[0] == first[1]
