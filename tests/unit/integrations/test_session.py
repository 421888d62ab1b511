"""The contract for a framework-driven loop: records, checkpoints, exits, signals."""

from __future__ import annotations

import errno
import json
import os
import signal
from pathlib import Path

import pytest

from specon import checkpoint, jobkit
from specon.integrations import session as session_mod
from specon.integrations.session import Session, newest
from tests.unit.integrations.conftest import events, records


def payload(step: int) -> bytes:
    return json.dumps({"trained": step}).encode()


def test_begin_declares_the_total_and_samples_follow(job_env: Path) -> None:
    s = Session()
    s.begin(0, 120)
    s.log(1, 0.5, lr=0.1)
    s.close()
    started, sample = records(job_env / "progress.jsonl")
    assert started["event"] == "started" and started["steps"] == 120 and started["resumed"] is False
    assert started["job"] == "job-1"
    assert sample["step"] == 1 and sample["loss"] == 0.5 and sample["lr"] == 0.1


def test_an_undeclared_total_is_left_out(job_env: Path) -> None:
    s = Session()
    s.begin(7, None)
    s.close()
    (started,) = records(job_env / "progress.jsonl")
    assert "steps" not in started and started["resumed"] is True and started["step"] == 7


def test_stop_checkpoints_records_and_exits_75(job_env: Path) -> None:
    s = Session(checkpoint_every=None, checkpoint_interval=None)
    s.begin(0, 10)
    s.completed = 4
    with pytest.raises(SystemExit) as exit_:
        s.stop(lambda: payload(4))
    assert exit_.value.code == jobkit.EXIT_CHECKPOINTED
    assert newest(job_env / "checkpoints") == (4, payload(4))
    assert events(job_env / "progress.jsonl")[-1]["event"] == "checkpointed"
    assert s.outcome == "checkpointed"


def test_a_stop_right_after_a_resume_writes_nothing_new(job_env: Path) -> None:
    checkpoint.write(job_env / "checkpoints", 6, payload(6))
    s = Session()
    s.begin(6, 10)

    def never() -> bytes:
        raise AssertionError("nothing was trained since the checkpoint")

    with pytest.raises(SystemExit):
        s.stop(never)
    assert [e["event"] for e in events(job_env / "progress.jsonl")] == ["started", "checkpointed"]


def test_a_full_disk_at_stop_exits_1_and_claims_nothing(job_env: Path) -> None:
    s = Session()
    s.begin(0, 10)
    s.completed = 3

    def full() -> bytes:
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(SystemExit) as exit_:
        s.stop(full)
    assert exit_.value.code == 1
    assert events(job_env / "progress.jsonl")[-1] == {
        "event": "checkpoint_failed",
        "step": 3,
        "ts": events(job_env / "progress.jsonl")[-1]["ts"],
    }
    assert newest(job_env / "checkpoints") is None


def test_periodic_checkpoints_by_steps_and_by_time(job_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(session_mod.time, "monotonic", lambda: now[0])
    s = Session(checkpoint_every=5, checkpoint_interval=30.0)
    s.begin(0, 100)
    s.completed = 4
    assert not s.due()
    s.completed = 5
    assert s.due() and s.checkpoint(lambda: payload(5))
    s.completed = 6
    assert not s.due()
    now[0] += 31
    assert s.due()  # the interval passed, though 5 steps did not
    s.close()
    assert [e["event"] for e in events(job_env / "progress.jsonl")] == ["started", "checkpoint"]


def test_a_full_disk_postpones_the_periodic_checkpoint(
    job_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [0.0]
    monkeypatch.setattr(session_mod.time, "monotonic", lambda: now[0])
    s = Session(checkpoint_every=1, checkpoint_interval=None)
    s.begin(0, 10)
    s.completed = 1

    def full() -> bytes:
        raise OSError(errno.EDQUOT, "Disk quota exceeded")

    assert s.due() and not s.checkpoint(full)
    assert not s.due()  # not every step: after RETRY_AFTER_FULL
    now[0] += jobkit.RETRY_AFTER_FULL
    assert s.due()


def test_finish_writes_the_final_checkpoint_and_the_done_marker(job_env: Path) -> None:
    s = Session()
    s.begin(0, 10)
    s.completed = 10
    s.finish(lambda: payload(10))
    s.close()
    assert newest(job_env / "checkpoints") == (10, payload(10))
    done = jobkit.read_done(job_env / "checkpoints")
    assert done is not None and done["steps"] == 10 and done["job"] == "job-1"
    assert events(job_env / "progress.jsonl")[-1]["event"] == "finished"
    assert events(job_env / "progress.jsonl")[-1]["steps"] == 10


def test_an_early_finish_reports_the_steps_done_when_none_were_declared(job_env: Path) -> None:
    s = Session()
    s.begin(0, None)
    s.completed = 7
    s.finish(None)
    s.close()
    assert events(job_env / "progress.jsonl")[-1]["steps"] == 7


def test_outside_specon_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (jobkit.ENV_PROGRESS_FILE, jobkit.ENV_CHECKPOINT_DIR):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    s = Session()
    s.begin(0, 5)
    s.completed = 5
    s.finish(lambda: payload(5))
    assert newest() is None and list(tmp_path.iterdir()) == []


def test_signals_request_a_stop_and_are_put_back(job_env: Path) -> None:
    def before(signum: int, frame: object) -> None:
        raise AssertionError("replaced")

    signal.signal(signal.SIGTERM, before)
    s = Session()
    s.install_signals()
    s.install_signals()  # again, as after a framework's own handler: the first one is kept
    os.kill(os.getpid(), signal.SIGTERM)
    assert s.stop_requested
    s.restore_signals()
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_second_ctrl_c_means_now(job_env: Path) -> None:
    s = Session()
    s.install_signals()
    os.kill(os.getpid(), signal.SIGINT)
    assert s.stop_requested
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
    s.restore_signals()


def test_newest_skips_a_corrupt_checkpoint(job_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = job_env / "checkpoints"
    checkpoint.write(directory, 3, payload(3))
    info = checkpoint.write(directory, 6, payload(6))
    info.payload.write_bytes(b"torn")
    assert newest(directory) == (3, payload(3))
    err = capsys.readouterr().err
    assert "skipping checkpoint" in err and "ckpt-000000000006.bin" in err


def test_bad_knobs_are_refused() -> None:
    for kwargs in ({"checkpoint_every": 0}, {"checkpoint_interval": 0.0}, {"keep": 0}):
        with pytest.raises(ValueError):
            Session(**kwargs)  # type: ignore[arg-type]
