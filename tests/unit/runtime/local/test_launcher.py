"""The cold launcher's signals: it outlives the group's SIGTERM, the job it execs starts with
the defaults and nothing held back (``fork_job``: held across the fork, let through before
the exec, since a signal mask survives exec); and its fence: a newer generation of the job
kills the job with its group."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from specon.fence import ENV_GENERATION, GENERATION_FILE
from specon.runtime.local import launcher
from specon.runtime.local.procfs import group_members

PROBE = """
import json, signal, sys
held = signal.pthread_sigmask(signal.SIG_BLOCK, [])
print(json.dumps({
    "held": sorted(int(s) for s in held),
    "term": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
    "hup": signal.getsignal(signal.SIGHUP) == signal.SIG_DFL,
}))
"""


def test_the_job_starts_with_default_signals_and_none_held(tmp_path: Path) -> None:
    exits = tmp_path / "exits.jsonl"
    argv = [*launcher.launcher_argv(sys.executable, exits, "run-1", "w0"), sys.executable, "-c", PROBE]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(out.stdout) == {"held": [], "term": True, "hup": True}
    (record,) = [json.loads(line) for line in exits.read_text().splitlines()]
    assert record["exit_code"] == 0 and record["run_id"] == "run-1"


FORKED = """
import json, os, signal, sys
from specon.runtime.local.launcher import JOB_SIGNALS, fork_job, ignore_job_signals
ignore_job_signals()
child = fork_job()
if child == 0:
    held = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    ok = all(signal.getsignal(s) == signal.SIG_DFL for s in JOB_SIGNALS) and not held
    os._exit(0 if ok else 3)
_, status = os.waitpid(child, 0)
held = signal.pthread_sigmask(signal.SIG_BLOCK, [])
os.kill(os.getpid(), signal.SIGTERM)  # the launcher's own: ignored
print(json.dumps({"child": os.waitstatus_to_exitcode(status), "held": sorted(int(s) for s in held)}))
"""


def test_fork_job_gives_the_child_the_defaults_and_leaves_the_launcher_deaf(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", FORKED], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(out.stdout) == {"child": 0, "held": []}


# A job that ignores SIGTERM and never looks at its generation, with a child of its own.
STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print("up", flush=True)
time.sleep(600)
"""


def _launch(tmp_path: Path, job: str) -> tuple[subprocess.Popen[str], Path]:
    exits = tmp_path / "exits.jsonl"
    argv = [*launcher.launcher_argv(sys.executable, exits, "run-1", "w0"), sys.executable, "-c", job]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline() == "up\n"
    return proc, exits


def test_a_newer_generation_kills_the_job_and_its_group_and_records_it_fenced(tmp_path: Path) -> None:
    generation = tmp_path / GENERATION_FILE
    generation.write_text('{"generation": 3}')
    proc, exits = _launch(tmp_path, STUBBORN)
    generation.write_text('{"generation": 4}')  # another copy started elsewhere
    record = _only_exit_record(proc, exits)
    assert record["reason"] == launcher.REASON_FENCED and record["signal"] == signal.SIGKILL
    assert not _alive_in_group(proc.pid), "the job's own child goes with the group"


def _alive_in_group(pgid: int) -> set[int]:
    """Processes of group ``pgid`` not dead (a killed orphan may wait a moment to be reaped)."""
    return group_members([pgid])[pgid]


def _only_exit_record(proc: subprocess.Popen[str], exits: Path) -> dict[str, Any]:
    """The one record the launcher wrote, once it ended (killed with its group at 30 s)."""
    try:
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    (record,) = [json.loads(line) for line in exits.read_text().splitlines()]
    return dict(record)


def test_the_same_generation_rewritten_or_unreadable_leaves_the_job_alone(tmp_path: Path) -> None:
    generation = tmp_path / GENERATION_FILE
    generation.write_text('{"generation": 3}')
    proc, exits = _launch(tmp_path, STUBBORN)
    try:
        generation.write_text('{"generation":3} ')  # changed on disk, not newer
        time.sleep(1.5 * launcher.FENCE_POLL_S)
        generation.write_text("{half")
        time.sleep(1.5 * launcher.FENCE_POLL_S)
        assert proc.poll() is None
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not exits.exists()


def test_a_launcher_fences_by_the_generation_its_runtime_named_not_the_files_at_its_start(
    tmp_path: Path,
) -> None:
    # A newer start bumped generation.json before this launcher began: it is stale from birth.
    (tmp_path / GENERATION_FILE).write_text('{"generation": 5}')
    exits = tmp_path / "exits.jsonl"
    argv = [*launcher.launcher_argv(sys.executable, exits, "run-1", "w0"), sys.executable, "-c", STUBBORN]
    env = {**os.environ, ENV_GENERATION: "4"}
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, text=True, start_new_session=True, env=env)
    record = _only_exit_record(proc, exits)
    assert record["reason"] == launcher.REASON_FENCED
