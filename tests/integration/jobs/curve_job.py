"""A torch-free training job with a scripted loss curve, honouring the job contract via jobkit.

``converge``: loss = 1 / (1 + 0.2·step) (steep, then flat: converges in seconds);
``linear``: loss = 10 - 0.015·step (keeps progressing at a constant rate).

Each sample also records ``trained``, the number of steps the job's (checkpointed) state
has counted: equal to ``step`` unless the job was restored from the wrong state.

Fault knobs for the fault-injection tests (all off by default):
``--save-seconds S`` makes the checkpoint written on SIGTERM take S seconds (a slow save,
announced by a ``{"event": "saving"}`` record when it begins); ``--ignore-sigterm`` makes
the job deaf to SIGTERM, so a save can only end by the grace period's SIGKILL;
``--save-gate FILE`` (with ``--save-seconds``) ends that slow save as soon as FILE exists, so a
test holds a save in flight for exactly as long as it needs, ``--save-seconds`` at most;
``--restore-seconds S`` makes loading a checkpoint take S seconds (a slow restore: the job's
process exists, its ``started`` record comes S seconds later); ``--crash-on-restore FILE``
makes the next checkpoint load fail while FILE exists (it is removed first, so only one copy
crashes): the copy exits 1 before its first record, as one that cannot load its state on its
new host would.

``--step-cpu S`` spends S CPU-seconds (the thread's own clock) training each step besides the
``--step-seconds`` sleep: a step of a sleeping job costs ~0.2 ms of CPU and a checkpoint a few
ms, so a rule that weighs remaining work by the CPU per step measured over a few steps can
find one such job twice as costly as another; a set CPU cost per step settles it.

``--until-released FILE`` hands the job's end to the test: it trains its ``--steps`` and then
goes on training (the same curve, so a converged job still looks converged) until FILE exists,
finishing at the first step boundary after that. A test that must act on a running job
(move it, kill it, cut its host) releases it only once it has, so no loaded machine can end
the job first. Its ``finished`` record and ``done.json`` say how many steps it trained.
"""

from __future__ import annotations

import argparse
import json
import signal
import time
from pathlib import Path

from specon import jobkit

# The step budget of a held job: far more than any test waits for.
HELD_STEPS = 10**9

CURVES = {
    "converge": lambda s: 1.0 / (1.0 + 0.2 * s),
    "linear": lambda s: 10.0 - 0.015 * s,
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--curve", choices=sorted(CURVES), default="converge")
    p.add_argument("--step-seconds", type=float, default=0.05)
    p.add_argument("--step-cpu", type=float, default=0.0, metavar="S")
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--save-seconds", type=float, default=0.0)
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument("--save-gate", type=Path, default=None)
    p.add_argument("--restore-seconds", type=float, default=0.0)
    p.add_argument("--crash-on-restore", type=Path, default=None, metavar="FILE")
    p.add_argument("--until-released", type=Path, default=None, metavar="FILE")
    args = p.parse_args()
    curve = CURVES[args.curve]
    state = {"trained": 0}

    def save() -> bytes:
        payload = json.dumps(state).encode()
        if job.should_stop and args.save_seconds > 0:
            job.progress.event("saving", step=job.completed)
            until = time.monotonic() + args.save_seconds
            while time.monotonic() < until and not (args.save_gate and args.save_gate.exists()):
                time.sleep(min(0.05, max(0.0, until - time.monotonic())))
        return payload

    def restore(payload: bytes) -> None:
        if args.crash_on_restore is not None and args.crash_on_restore.exists():
            args.crash_on_restore.unlink()
            raise RuntimeError("injected: the checkpoint cannot be loaded here")
        time.sleep(args.restore_seconds)
        state.update(json.loads(payload))

    release = args.until_released
    with jobkit.Job(
        steps=HELD_STEPS if release is not None else args.steps,
        save=save,
        restore=restore,
        checkpoint_every=args.checkpoint_every,
    ) as job:
        if args.ignore_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # after jobkit installed its handler
        for step in job.steps():
            time.sleep(args.step_seconds)
            busy_until = time.thread_time() + args.step_cpu
            while time.thread_time() < busy_until:
                pass
            state["trained"] += 1
            job.log(step, curve(step), trained=state["trained"])
            if release is not None and step >= args.steps and release.exists():
                job.total = step  # the loop ends here: checkpoint, `finished`, done.json


if __name__ == "__main__":
    main()
