"""At most one writer: a run that finds a newer generation of its job stops before writing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specon import checkpoint, jobkit
from specon import fence as fence_module
from specon.fence import (
    ENV_AWAIT_PREVIOUS,
    ENV_GENERATION,
    ENV_RUN_LOCK,
    EXIT_FENCED,
    GENERATION_FILE,
    Fence,
    Fenced,
    await_previous,
)
from specon.model import ContainerId, WorkerId
from specon.runtime.base import JobSpec
from specon.runtime.volume import JobPaths
from specon.testing.progress_log import progress_records


def _bump(job_dir: Path, n: int) -> None:
    tmp = job_dir / "g.tmp"
    tmp.write_text(json.dumps({"generation": n}))
    tmp.replace(job_dir / GENERATION_FILE)  # atomically, as the runtime does


def test_a_fence_is_stale_only_once_a_newer_generation_is_written(tmp_path: Path) -> None:
    assert not Fence(None).stale()  # outside specon: never stale
    _bump(tmp_path, 3)
    fence = Fence(tmp_path / GENERATION_FILE)
    assert fence.own == 3 and not fence.stale()
    _bump(tmp_path, 3)  # rewritten, same generation (a CRIU restore continues the run)
    assert not fence.stale()
    _bump(tmp_path, 4)
    assert fence.stale()
    with pytest.raises(Fenced) as caught:
        fence.check()
    assert caught.value.code == EXIT_FENCED and (caught.value.own, caught.value.newer) == (3, 4)
    (tmp_path / GENERATION_FILE).write_text("garbage")  # unreadable: never lowers what was seen
    assert fence.stale()


def test_a_run_without_a_generation_is_stale_once_any_run_starts_with_one(tmp_path: Path) -> None:
    fence = Fence(tmp_path / GENERATION_FILE)
    assert fence.own == 0 and not fence.stale()
    _bump(tmp_path, 1)
    assert fence.stale()


def test_a_stale_job_writes_no_record_and_no_checkpoint_after_the_newer_generation(tmp_path: Path) -> None:
    paths = JobPaths(tmp_path, "j")  # type: ignore[arg-type]
    paths.create()
    assert paths.bump_generation() == 1  # this run's start
    job = jobkit.Job(steps=50, save=lambda: b"x", restore=lambda b: None, checkpoint_dir=paths.checkpoints,
                     progress=paths.progress, checkpoint_every=5)  # fmt: skip
    trained = 0
    with pytest.raises(SystemExit) as caught, job:
        for step in job.steps():
            if step == 12:
                assert paths.bump_generation() == 2  # another host starts the job now
            job.log(step, 1.0)
            trained = step
    assert caught.value.code == EXIT_FENCED
    assert trained == 11  # the step the newer generation began in was never logged
    steps = [r["step"] for r in progress_records(paths.progress) if "loss" in r]
    assert steps == list(range(1, 12))
    newest = checkpoint.latest_complete(paths.checkpoints)
    assert newest is not None and newest.step == 10


def test_a_slow_starting_copy_keeps_the_generation_its_runtime_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Launched in generation 3; a newer start bumped to 4 before this copy's Job began: read
    # at start it would take 4 for its own and two copies would share it, neither fenced.
    _bump(tmp_path, 4)
    monkeypatch.setenv(ENV_GENERATION, "3")
    fence = Fence.of_job(tmp_path / "checkpoints")
    assert fence.own == 3 and fence.stale()
    monkeypatch.setenv(ENV_GENERATION, "not a number")  # an older runtime's run: the file's
    assert Fence.of_job(tmp_path / "checkpoints").own == 4


def test_the_runtime_names_the_runs_generation_in_its_environment(tmp_path: Path) -> None:
    paths = JobPaths(tmp_path, ContainerId("j"))
    spec = JobSpec(id=ContainerId("j"), command=("train",))
    assert paths.env(spec, WorkerId("w0"), 7)[ENV_GENERATION] == "7"
    assert ENV_GENERATION not in paths.env(spec, WorkerId("w0"))


_HOLDER = """
import sys, time
from pathlib import Path
from specon.fence import Fence
fence = Fence.of_job(Path(sys.argv[1]))
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def test_a_replacement_waits_for_the_previous_copy_to_end_before_it_reads_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run lock: held by a run with ``$SPECON_RUN_LOCK`` (a Job's pod); a copy started while
    the previous one still runs (its replacement for an evicted pod) waits for it with
    ``$SPECON_AWAIT_PREVIOUS`` (a while without it). Without either variable the lock is let go
    at once (CRIU dumps no process that holds one)."""
    checkpoints = tmp_path / "job" / "checkpoints"
    checkpoints.mkdir(parents=True)
    monkeypatch.delenv(ENV_RUN_LOCK, raising=False)
    monkeypatch.delenv(ENV_AWAIT_PREVIOUS, raising=False)
    unlocked = Fence.of_job(checkpoints)
    free = subprocess.run(
        [sys.executable, "-c", _HOLDER, str(checkpoints), "0"],
        env={**os.environ, ENV_AWAIT_PREVIOUS: "0.3"},
        capture_output=True,
        check=False,
    )
    assert free.returncode == 0, "a run without the variables holds no lock"
    del unlocked
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(checkpoints), "1.5"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, ENV_RUN_LOCK: "1"},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        # Without the variables a copy waits too (a replacement the webhook did not answer for).
        monkeypatch.setattr(fence_module, "DEFAULT_AWAIT_S", 0.2)
        with pytest.raises(SystemExit) as stopped:
            Fence.of_job(checkpoints)
        assert stopped.value.code == EXIT_FENCED
        t0 = time.monotonic()
        monkeypatch.setenv(ENV_AWAIT_PREVIOUS, "30")
        fence = Fence.of_job(checkpoints)
        assert time.monotonic() - t0 >= 1.0, "it waited until the previous copy ended"
        holder.wait(timeout=10)
        assert fence.own == 0
        # Now this run holds it: the next copy waits for this one, and gives up after its time.
        monkeypatch.setenv(ENV_AWAIT_PREVIOUS, "0.3")
        late = subprocess.run(
            [sys.executable, "-c", _HOLDER, str(checkpoints), "0"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert late.returncode == EXIT_FENCED
        assert "still runs after 0.3 s" in late.stderr and "held" not in late.stdout
        del fence  # the run ends: its lock goes with it
        again = subprocess.run([sys.executable, "-c", _HOLDER, str(checkpoints), "0"], check=False)
        assert again.returncode == 0
    finally:
        holder.kill()
        holder.wait()


def test_await_previous_reads_only_sane_seconds() -> None:
    assert await_previous({ENV_AWAIT_PREVIOUS: "150"}) == 150.0
    for bad in ("", "soon", "-1", "nan", "1e9"):
        assert await_previous({ENV_AWAIT_PREVIOUS: bad}) is None
    assert await_previous({}) is None
