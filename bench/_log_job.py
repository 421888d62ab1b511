"""A cheap stand-in training job for ``bench_daemons``: one JSON-lines progress record per tick.

Run by path with ``python -I -S`` (standard library only, so ~100 of them stay cheap):
every ``--interval`` seconds it appends ``{"step": N, "loss": X, "ts": T}`` to
``$SPECON_PROGRESS_FILE`` with a single ``O_APPEND`` write, the loss following a noisy
exponential decay (``--tau`` steps), so the agent sees real curves to classify. It exits by
itself after ``--seconds``, so a benchmark that dies before its teardown leaves nothing
running for long; SIGTERM ends it at once.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--interval", type=float, default=0.2)
    p.add_argument("--seconds", type=float, default=600.0)
    p.add_argument("--tau", type=float, default=1000.0, help="loss decay constant, in steps")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    path = os.environ.get("SPECON_PROGRESS_FILE")
    if not path:
        print("SPECON_PROGRESS_FILE is not set", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda _s, _f: sys.exit(0))
    rng = random.Random(args.seed)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    start = time.monotonic()
    due = start
    step = 0
    while due - start < args.seconds:
        step += 1
        loss = 2.0 * math.exp(-step / args.tau) + 0.1 + rng.gauss(0.0, 0.002)
        record = {"step": step, "loss": round(loss, 6), "ts": round(time.time(), 3)}
        os.write(fd, (json.dumps(record) + "\n").encode())
        due += args.interval
        time.sleep(max(0.0, due - time.monotonic()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
