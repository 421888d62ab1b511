"""The job contract helper with plain Python loops (no torch): progress, checkpoints, signals."""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from specon import checkpoint, jobkit

# A plain-Python training job: "training step k" adds k and a random draw to its state, so the
# final state proves every step 1..N ran exactly once after the last restore, in order, with
# the RNG continuing where it stopped.
JOB_SCRIPT = textwrap.dedent(
    """
    import json, random, sys, time
    from specon import jobkit

    steps, delay, every = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    random.seed(7)
    state = {"sum": 0, "noise": 0.0}

    def save():
        return json.dumps({"state": state, "rng": jobkit.rng_state()}).encode()

    def restore(payload):
        data = json.loads(payload)
        state.update(data["state"])
        jobkit.set_rng_state(data["rng"])

    with jobkit.Job(steps=steps, save=save, restore=restore, checkpoint_every=every) as job:
        for step in job.steps():
            time.sleep(delay)
            state["sum"] += step
            state["noise"] += random.random()
            job.log(step, 1.0 / step)
        print(json.dumps(state), flush=True)  # inside: a late SIGTERM cannot cut it short
    """
)


def _records(path: Path) -> list[dict[str, Any]]:
    """The complete records: a reader polling a running job may see a line being written."""
    lines = path.read_text().split("\n")
    return [json.loads(line) for line in lines[:-1]]  # the last is "" or still being written


def _events(path: Path, name: str) -> list[dict[str, Any]]:
    return [r for r in _records(path) if r.get("event") == name]


class Loop:
    """An in-process job over a dict state, stoppable after a given step."""

    def __init__(self, tmp_path: Path, *, steps: int, checkpoint_every: int | None = None) -> None:
        self.dir = tmp_path / "ckpt"
        self.progress = tmp_path / "progress.jsonl"
        self.steps = steps
        self.checkpoint_every = checkpoint_every
        self.state: dict[str, int] = {"sum": 0}

    def job(self) -> jobkit.Job:
        return jobkit.Job(
            steps=self.steps,
            save=lambda: json.dumps(self.state).encode(),
            restore=lambda b: self.state.update(json.loads(b)),
            checkpoint_dir=self.dir,
            progress=self.progress,
            job_id="job-1",
            checkpoint_every=self.checkpoint_every,
            checkpoint_interval=None,
            exit_on_stop=False,
        )

    def run(self, *, stop_after: int | None = None) -> jobkit.Job:
        self.state = {"sum": 0}  # a fresh process: state only comes back through restore
        with self.job() as job:
            for step in job.steps():
                self.state["sum"] += step
                job.log(step, 1.0 / step)
                if step == stop_after:
                    job.request_stop()
        return job


# -- ProgressLog ----------------------------------------------------------------------------
def test_progress_lines_are_complete_json_and_appended(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "p.jsonl"
    with jobkit.ProgressLog(path) as log:
        log.log(1, 0.5, acc=0.25)
        log.event("started", step=0)
    with jobkit.ProgressLog(path) as log:  # a restored job continues the same file
        log.log(2, float("nan"))
    text = path.read_text()
    assert text.endswith("\n")
    first, event, nan = (json.loads(line) for line in text.splitlines())
    assert first["step"] == 1 and first["loss"] == 0.5 and first["acc"] == 0.25 and first["ts"] > 0
    assert event["event"] == "started" and "loss" not in event
    assert nan["step"] == 2 and nan["loss"] != nan["loss"]  # NaN survives for the reader to count


def test_progress_path_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(jobkit.ENV_PROGRESS_FILE, str(tmp_path / "env.jsonl"))
    with jobkit.ProgressLog() as log:
        log.log(3, 1.5)
    assert _records(tmp_path / "env.jsonl")[0]["step"] == 3


def test_progress_without_a_path_is_a_silent_sink(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(jobkit.ENV_PROGRESS_FILE, raising=False)
    log = jobkit.ProgressLog()
    log.log(1, 1.0)
    assert log.path is None
    log.close()


# -- checkpoint, resume, finish -------------------------------------------------------------
def test_uninterrupted_job_finishes_with_marker_and_final_checkpoint(tmp_path: Path) -> None:
    loop = Loop(tmp_path, steps=10)
    job = loop.run()
    assert job.outcome == "finished" and job.completed == 10
    assert loop.state["sum"] == 55
    assert _events(loop.progress, "finished")[-1]["steps"] == 10
    assert jobkit.read_done(loop.dir) == {
        "job": "job-1",
        "steps": 10,
        "finished": pytest.approx(time.time(), abs=60),
    }
    loaded = checkpoint.load(loop.dir)
    assert loaded is not None and loaded[0].step == 10


def test_stop_request_checkpoints_and_resume_continues(tmp_path: Path) -> None:
    loop = Loop(tmp_path, steps=10)
    job = loop.run(stop_after=4)
    assert job.outcome == "checkpointed" and job.completed == 4
    assert _records(loop.progress)[-1] == {
        "event": "checkpointed",
        "step": 4,
        "ts": pytest.approx(time.time(), abs=60),
    }
    assert jobkit.read_done(loop.dir) is None

    job = loop.run()
    assert job.outcome == "finished"
    assert loop.state["sum"] == 55  # steps 5..10 trained on top of the restored 1..4
    started = _events(loop.progress, "started")
    assert [(s["step"], s["resumed"]) for s in started] == [(0, False), (4, True)]
    trained = [r["step"] for r in _records(loop.progress) if "loss" in r]
    assert trained == list(range(1, 11))


def test_restart_after_finishing_trains_nothing(tmp_path: Path) -> None:
    loop = Loop(tmp_path, steps=5)
    loop.run()
    job = loop.run()
    assert job.outcome == "finished" and loop.state["sum"] == 15
    assert len([r for r in _records(loop.progress) if "loss" in r]) == 5


def test_periodic_checkpoints(tmp_path: Path) -> None:
    loop = Loop(tmp_path, steps=25, checkpoint_every=10)
    loop.run()
    assert [e["step"] for e in _events(loop.progress, "checkpoint")] == [10, 20]


def test_time_based_checkpoints(tmp_path: Path) -> None:
    state = {"n": 0}
    with jobkit.Job(
        steps=3,
        save=lambda: b"x",
        checkpoint_dir=tmp_path,
        progress=tmp_path / "p.jsonl",
        checkpoint_every=None,
        checkpoint_interval=0.01,
    ) as job:
        for _ in job.steps():
            state["n"] += 1
            time.sleep(0.02)
    assert [e["step"] for e in _events(tmp_path / "p.jsonl", "checkpoint")] == [1, 2]


def test_corrupt_newest_checkpoint_falls_back_to_previous(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loop = Loop(tmp_path, steps=30, checkpoint_every=10)
    loop.run(stop_after=25)  # checkpoints at 10, 20 (pruned to keep 2) and 25
    newest = loop.dir / "ckpt-000000000025.bin"
    newest.write_bytes(newest.read_bytes()[:-1] + b"!")
    job = loop.run()
    assert "checksum mismatch" in capsys.readouterr().err
    assert _events(loop.progress, "started")[-1]["step"] == 20
    assert job.outcome == "finished" and loop.state["sum"] == sum(range(31))


def test_resume_without_any_checkpoint(tmp_path: Path) -> None:
    with jobkit.Job(steps=3, checkpoint_dir=tmp_path / "none", progress=tmp_path / "p.jsonl") as job:
        assert job.resume() == (0, None)
        assert job.resume() == (0, None)  # idempotent: one "started" record
    assert len(_events(tmp_path / "p.jsonl", "started")) == 1


def test_resume_returns_payload_for_scripts_that_restore_themselves(tmp_path: Path) -> None:
    checkpoint.write(tmp_path, 3, b"weights")
    with jobkit.Job(steps=5, checkpoint_dir=tmp_path, progress=tmp_path / "p.jsonl") as job:
        assert job.resume() == (3, b"weights")
        assert list(job.steps()) == [4, 5]


def test_checkpoint_without_restore_is_refused(tmp_path: Path) -> None:
    checkpoint.write(tmp_path, 3, b"weights")
    with (
        jobkit.Job(steps=5, checkpoint_dir=tmp_path, progress=tmp_path / "p.jsonl") as job,
        pytest.raises(RuntimeError, match="restore"),
    ):
        next(job.steps())


def test_checkpoint_beyond_configured_steps_is_refused(tmp_path: Path) -> None:
    checkpoint.write(tmp_path, 9, b"weights")
    with (
        jobkit.Job(steps=5, checkpoint_dir=tmp_path, restore=lambda b: None) as job,
        pytest.raises(ValueError, match="beyond"),
    ):
        job.resume()


def test_steps_outside_the_context_manager_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="with Job"):
        next(jobkit.Job(steps=1, checkpoint_dir=tmp_path).steps())


@pytest.mark.parametrize(
    "kwargs",
    [
        {"steps": -1},
        {"steps": 1, "checkpoint_every": 0},
        {"steps": 1, "checkpoint_interval": 0.0},
        {"steps": 1, "keep": 0},
    ],
)
def test_bad_arguments(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        jobkit.Job(**kwargs)


# -- signals --------------------------------------------------------------------------------
def test_sigterm_in_process_stops_at_the_step_boundary(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    with jobkit.Job(
        steps=100,
        save=lambda: b"s",
        checkpoint_dir=tmp_path,
        progress=tmp_path / "p.jsonl",
        exit_on_stop=False,
    ) as job:
        for step in job.steps():
            if step == 5:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.01)  # the handler runs between bytecodes; give it the chance
    assert job.outcome == "checkpointed" and job.completed == 5
    assert signal.getsignal(signal.SIGTERM) is before
    latest = checkpoint.latest_complete(tmp_path)
    assert latest is not None and latest.step == 5


def test_exit_on_stop_raises_system_exit_with_the_documented_code(tmp_path: Path) -> None:
    with (
        pytest.raises(SystemExit) as exc,
        jobkit.Job(
            steps=10, save=lambda: b"s", checkpoint_dir=tmp_path, progress=tmp_path / "p.jsonl"
        ) as job,
    ):
        for _ in job.steps():
            job.request_stop()
    assert exc.value.code == jobkit.EXIT_CHECKPOINTED == 75


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SPECON_")}


def _start(script: Path, tmp_path: Path, *, steps: int, delay: float, every: int) -> subprocess.Popen[str]:
    env = {
        **_clean_env(),
        jobkit.ENV_PROGRESS_FILE: str(tmp_path / "progress.jsonl"),
        jobkit.ENV_CHECKPOINT_DIR: str(tmp_path / "ckpt"),
        jobkit.ENV_JOB_ID: "sub-1",
    }
    return subprocess.Popen(
        [sys.executable, str(script), str(steps), str(delay), str(every)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_until_started(progress: Path, starts: int, deadline: float) -> None:
    """Wait for the job's ``started`` record number ``starts`` (its handlers are in place)."""
    while time.monotonic() < deadline:
        if progress.exists() and len(_events(progress, "started")) >= starts:
            return
        time.sleep(0.01)
    raise AssertionError("the job did not start in time")


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "job.py"
    path.write_text(JOB_SCRIPT)
    return path


def _reference(script: Path, tmp_path: Path, steps: int) -> dict[str, Any]:
    ref_dir = tmp_path / "reference"
    ref_dir.mkdir()
    done = subprocess.run(
        [sys.executable, str(script), str(steps), "0", "1000"],
        env={**_clean_env(), jobkit.ENV_CHECKPOINT_DIR: str(ref_dir)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_sigterm_subprocess_exits_with_a_checkpoint(script: Path, tmp_path: Path) -> None:
    proc = _start(script, tmp_path, steps=10_000, delay=0.002, every=1000)
    progress = tmp_path / "progress.jsonl"
    _wait_until_started(progress, 1, time.monotonic() + 20)
    deadline = time.monotonic() + 20  # a step trained (a loaded machine may not have yet)
    while not any("loss" in r for r in _records(progress)):
        assert time.monotonic() < deadline, "no step trained in time"
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=20)  # and its pipes closed
    assert proc.returncode == jobkit.EXIT_CHECKPOINTED
    last = _records(tmp_path / "progress.jsonl")[-1]
    assert last["event"] == "checkpointed"
    latest = checkpoint.latest_complete(tmp_path / "ckpt")
    assert latest is not None and latest.step == last["step"] > 0
    assert jobkit.read_done(tmp_path / "ckpt") is None


@pytest.mark.slow
def test_many_sigterms_end_with_exactly_the_configured_steps(script: Path, tmp_path: Path) -> None:
    steps = 400
    rng = random.Random(11)
    progress = tmp_path / "progress.jsonl"
    stops = 0
    for attempt in range(1, 32):
        proc = _start(script, tmp_path, steps=steps, delay=0.003, every=1000)
        _wait_until_started(progress, attempt, time.monotonic() + 20)
        if attempt == 31:  # stopped 30 times and not done (a slow machine): let it finish
            out, err = proc.communicate(timeout=60)
            break
        time.sleep(rng.uniform(0.0, 0.15))
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
        if proc.returncode != jobkit.EXIT_CHECKPOINTED:
            # Finished; a SIGTERM after the loop (handlers restored) may kill it on its way
            # out, which is why runtimes look for done.json before the exit code.
            assert proc.returncode in (0, -signal.SIGTERM), err
            break
        stops += 1
    assert proc.returncode in (0, -signal.SIGTERM) and stops >= 3
    assert _records(progress)[-1]["event"] == "finished" and _records(progress)[-1]["steps"] == steps
    # Every step trained exactly once across all the restarts, and the RNG never repeated.
    assert [r["step"] for r in _records(progress) if "loss" in r] == list(range(1, steps + 1))
    assert json.loads(out) == _reference(script, tmp_path, steps)
    assert jobkit.read_done(tmp_path / "ckpt") is not None


@pytest.mark.slow
def test_sigkill_redoes_only_the_steps_after_the_last_checkpoint(script: Path, tmp_path: Path) -> None:
    steps = 200
    progress = tmp_path / "progress.jsonl"
    proc = _start(script, tmp_path, steps=steps, delay=0.003, every=25)
    deadline = time.monotonic() + 20
    while not (progress.exists() and any(e["step"] >= 50 for e in _events(progress, "checkpoint"))):
        assert time.monotonic() < deadline, "no checkpoint at step 50 in time"
        time.sleep(0.01)
    proc.kill()
    proc.communicate(timeout=20)
    proc = _start(script, tmp_path, steps=steps, delay=0.0, every=25)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    resumed = _events(progress, "started")[-1]
    assert resumed["resumed"] and resumed["step"] % 25 == 0 and resumed["step"] >= 50
    assert json.loads(out) == _reference(script, tmp_path, steps)  # redone steps left no trace
    assert _records(progress)[-1]["steps"] == steps


def test_second_sigint_interrupts_at_once(tmp_path: Path) -> None:
    with (
        pytest.raises(KeyboardInterrupt),
        jobkit.Job(
            steps=10, save=lambda: b"s", checkpoint_dir=tmp_path, progress=tmp_path / "p.jsonl"
        ) as job,
    ):
        for _ in job.steps():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
            assert job.should_stop
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)


# -- a full disk (transient) ------------------------------------------------------------------
class _FullDisk:
    """Makes ``os.write`` (progress records) and ``checkpoint.write`` fail with ENOSPC while on."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.on = False
        real_write, real_ckpt = os.write, checkpoint.write

        def write(fd: int, data: bytes) -> int:
            if self.on:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_write(fd, data)

        def ckpt(*args: Any, **kwargs: Any) -> checkpoint.CheckpointInfo:
            if self.on:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_ckpt(*args, **kwargs)

        monkeypatch.setattr(jobkit.os, "write", write)
        monkeypatch.setattr(jobkit.checkpoint, "write", ckpt)


def test_progress_records_refused_by_a_full_disk_are_written_later_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = _FullDisk(monkeypatch)
    log = jobkit.ProgressLog(tmp_path / "p.jsonl")
    log.log(1, 1.0)
    disk.on = True
    log.log(2, 0.5)
    log.log(3, 0.25)
    assert [r["step"] for r in _records(tmp_path / "p.jsonl")] == [1]
    disk.on = False
    log.log(4, 0.125)
    log.close()
    assert [r["step"] for r in _records(tmp_path / "p.jsonl")] == [1, 2, 3, 4]
    assert log.dropped == 0


def test_a_job_trains_through_a_full_disk_and_skipped_checkpoints_are_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = _FullDisk(monkeypatch)
    monkeypatch.setattr(jobkit, "RETRY_AFTER_FULL", 0.0)
    loop = Loop(tmp_path, steps=30, checkpoint_every=10)
    with loop.job() as job:
        for step in job.steps():
            disk.on = 8 <= step <= 12  # full around the checkpoint due at 10
            loop.state["sum"] += step
            job.log(step, 1.0 / step)
    assert job.outcome == "finished" and loop.state["sum"] == 465
    # The checkpoint due at 10 failed; it was retried once the disk had room again.
    assert [e["step"] for e in _events(loop.progress, "checkpoint")] == [13, 23]
    assert [r["step"] for r in _records(loop.progress) if "loss" in r] == list(range(1, 31))


def test_a_stop_on_a_full_disk_claims_no_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    disk = _FullDisk(monkeypatch)
    loop = Loop(tmp_path, steps=30, checkpoint_every=10)
    with pytest.raises(SystemExit) as stopped, loop.job() as job:
        for step in job.steps():
            loop.state["sum"] += step
            job.log(step, 1.0 / step)
            if step == 15:
                disk.on = True
                job.request_stop()
    assert stopped.value.code == 1
    disk.on = False
    events = [r.get("event") for r in _records(loop.progress)]
    # Its last record ("checkpoint_failed") could not be written either: nothing claims a save.
    assert "checkpointed" not in events
    loop.run()  # restarted: from the complete checkpoint at 10, steps 11.. redone
    assert _events(loop.progress, "started")[-1]["step"] == 10


def test_a_short_write_on_a_full_disk_leaves_no_half_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the chaos run: the disk took part of a record, refused the rest, and a later
    run appended to the half line. The part is cut off again and written whole later."""
    real_write = os.write
    calls = {"n": 0}

    def short_then_full(fd: int, data: bytes) -> int:
        calls["n"] += 1
        if calls["n"] == 2:
            return real_write(fd, data[:7])  # the disk had room for 7 bytes ...
        if calls["n"] == 3:
            raise OSError(errno.ENOSPC, "No space left on device")  # ... and then none
        return real_write(fd, data)

    monkeypatch.setattr(jobkit.os, "write", short_then_full)
    log = jobkit.ProgressLog(tmp_path / "p.jsonl")
    log.log(1, 1.0)
    log.log(2, 0.5)  # 7 bytes written, then refused: cut off again
    assert (tmp_path / "p.jsonl").read_bytes().endswith(b"\n")
    log.log(3, 0.25)
    log.close()
    assert [r["step"] for r in _records(tmp_path / "p.jsonl")] == [1, 2, 3]
