"""The cold launcher's signals: it outlives the group's SIGTERM, the job it execs starts with
the defaults and nothing held back (``fork_job``: held across the fork, let through before
the exec, since a signal mask survives exec)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from specon.runtime.local import launcher

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
